"""Measure this GPU's matmul ceiling per precision once per pipeline run: the denominator of measured MFU."""

from __future__ import annotations

import argparse

from amprepro.files import write_json


def measure() -> dict:
    import torch

    from amprepro import precisions
    from amprepro.train import flops

    if not torch.cuda.is_available():
        return {"status": "skipped", "reason": "no CUDA GPU: MFU is reported for GPUs only", "tflops": {}}
    device = torch.device("cuda")
    name = torch.cuda.get_device_name(device)
    tflops = flops.measure_matmul_peak(device)
    fp8_skipped = flops.fp8_peak_skip_reason(device)  # the fp8 row: measured from compute capability 8.9 on
    if fp8_skipped is None:
        tflops["fp8"] = flops.measure_fp8_peak(device)
    return {
        "status": "ok",
        "gpu": name,
        "method": "8192^3 matmul, 3 warm-up then 10 timed, CUDA events",
        "tflops": tflops,
        "fp8": {"status": "skipped", "reason": fp8_skipped} if fp8_skipped else {"status": "ok",
                                                                                  "method": flops.FP8_PEAK_METHOD},
        "datasheet_tflops": {p.peak_kind: flops.datasheet_peak(name, p.name) for p in precisions.REGISTRY.values()},
        "datasheet_product": flops.datasheet_product(name),
        "datasheet_note": flops.datasheet_note(name),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    record = measure()
    write_json(args.out, record)
    print(f"peak: {record['status']} {record.get('tflops')}")


if __name__ == "__main__":
    main()

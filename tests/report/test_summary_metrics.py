"""The summary's figures that come from other records: MFU against the measured peak (one GPU's, so a cell on several
GPUs divides by all of them) and against the datasheet, energy per item, speedups and memory ratios; and the peak
record on a machine without CUDA. Hand-computed values, CPU only."""

from __future__ import annotations

import pytest

from amprepro.analysis import summary
from amprepro.env import peak

PEAK = {"status": "ok", "tflops": {"fp32": 50.0, "tf32": 400.0, "fp16": 800.0, "bf16": 800.0}}


def row(precision="fp32", model="m", seed=0, status="ok", **values):
    return {"model": model, "precision": precision, "seed": seed, "status": status, **values}


@pytest.mark.parametrize("world_size, precision, expected", [
    (None, "fp32", 25.0 / 50.0),   # no world size recorded: one GPU
    (1, "tf32", 25.0 / 400.0),
    (2, "amp_bf16", 25.0 / (800.0 * 2)),
    (8, "amp_fp16", 25.0 / (800.0 * 8)),
    (4, "apex_o2", 25.0 / (800.0 * 4)),  # apex O2 computes in fp16
])
def test_mfu_against_the_measured_peak_counts_every_gpu_of_the_cell(world_size, precision, expected):
    metrics = {"achieved_tflops": 25.0, "world_size": world_size, "datasheet_peak_tflops": 100.0,
               "energy_j_per_item": 0.125}
    [out] = summary.add_mfu([row(precision)], [metrics], PEAK)
    assert out["mfu_vs_measured_peak"] == pytest.approx(expected, rel=1e-12)
    assert out["achieved_tflops"] == 25.0 and out["energy_j_per_item"] == 0.125
    # metrics.json's datasheet peak is already summed over the cell's GPUs: not multiplied again
    assert out["mfu_vs_datasheet"] == pytest.approx(0.25, rel=1e-12)


def test_mfu_is_absent_where_there_is_no_peak_or_no_achieved_figure():
    [no_peak] = summary.add_mfu([row()], [{"achieved_tflops": 25.0, "world_size": 2}], {"status": "skipped"})
    assert no_peak["mfu_vs_measured_peak"] is None and no_peak["mfu_vs_datasheet"] is None
    [no_flops] = summary.add_mfu([row()], [{"achieved_tflops": None, "world_size": 2, "datasheet_peak_tflops": 9.0}],
                                 PEAK)
    assert no_flops["mfu_vs_measured_peak"] is None and no_flops["mfu_vs_datasheet"] is None
    assert no_flops["achieved_tflops"] is None and no_flops["energy_j_per_item"] is None


def test_speedups_and_memory_ratio_are_against_the_same_model_and_seed():
    rows = summary.add_relative([
        row("fp32", throughput_per_s=100.0, peak_allocated_bytes=1000),
        row("tf32", throughput_per_s=250.0, peak_allocated_bytes=900),
        row("amp_fp16", throughput_per_s=400.0, peak_allocated_bytes=600),
        row("fp32", seed=1, throughput_per_s=50.0, peak_allocated_bytes=500),
        row("amp_fp16", seed=1, throughput_per_s=400.0, peak_allocated_bytes=400),
        row("amp_bf16", status="failed", throughput_per_s=999.0, peak_allocated_bytes=1),
    ])
    by = {(r["precision"], r["seed"]): r for r in rows}
    assert by["amp_fp16", 0]["speedup_vs_fp32"] == pytest.approx(4.0)
    assert by["amp_fp16", 0]["speedup_vs_tf32"] == pytest.approx(1.6)
    assert by["amp_fp16", 0]["memory_ratio_vs_fp32"] == pytest.approx(0.6)
    assert by["amp_fp16", 1]["speedup_vs_fp32"] == pytest.approx(8.0)  # seed 1's own fp32, not seed 0's
    assert by["amp_fp16", 1]["speedup_vs_tf32"] is None  # seed 1 has no tf32 cell
    assert by["fp32", 0]["speedup_vs_fp32"] == 1.0 and by["tf32", 0]["speedup_vs_tf32"] == 1.0
    failed = by["amp_bf16", 0]
    assert failed["speedup_vs_fp32"] is failed["speedup_vs_tf32"] is failed["memory_ratio_vs_fp32"] is None


def test_on_the_cpu_the_memory_ratio_is_of_process_peaks():
    rows = summary.add_relative([row("fp32", throughput_per_s=10.0, peak_rss_bytes=400),
                                 row("amp_bf16", throughput_per_s=5.0, peak_rss_bytes=300)])
    assert rows[1]["memory_ratio_vs_fp32"] == pytest.approx(0.75) and rows[1]["speedup_vs_fp32"] == pytest.approx(0.5)


def test_a_baseline_that_failed_gives_no_speedup():
    rows = summary.add_relative([row("fp32", status="failed", throughput_per_s=100.0),
                                 row("amp_fp16", throughput_per_s=300.0)])
    assert rows[1]["speedup_vs_fp32"] is None


def test_the_peak_record_without_cuda_is_skipped_with_the_reason_and_no_number():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU: tests/gpu/test_measurement.py checks the measured peak")
    record = peak.measure()
    assert record == {"status": "skipped", "reason": "no CUDA GPU: MFU is reported for GPUs only", "tflops": {}}
    [out] = summary.add_mfu([row()], [{"achieved_tflops": 1.0, "world_size": 1}], record)
    assert out["mfu_vs_measured_peak"] is None

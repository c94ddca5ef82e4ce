"""Model FLOPs, the GPU's matmul peak (measured and datasheet) and energy from NVML: the inputs of MFU."""

from __future__ import annotations

import os

import torch

# Dense (no sparsity) Tensor Core peaks from NVIDIA datasheets, TFLOP/s. SXM parts. fp32 is the CUDA-core figure.
DATASHEET_TFLOPS = {
    "H200": {"fp32": 67.0, "tf32": 494.5, "fp16": 989.5, "bf16": 989.5},
    "H100": {"fp32": 67.0, "tf32": 494.5, "fp16": 989.5, "bf16": 989.5},
    "A100": {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0},
    "V100": {"fp32": 15.7, "tf32": None, "fp16": 125.0, "bf16": None},
}
# Which matmul dtype dominates each precision's compute.
PEAK_KIND = {"fp32": "fp32", "tf32": "tf32", "amp_fp16": "fp16", "amp_bf16": "bf16", "apex_o1": "fp16",
             "apex_o2": "fp16"}


def datasheet_peak(gpu_name: str | None, precision: str) -> float | None:
    for model, peaks in DATASHEET_TFLOPS.items():
        if gpu_name and model in gpu_name:
            return peaks[PEAK_KIND[precision]]
    return None


def count_training_flops(step_fn) -> int:
    """FLOPs of one forward+backward, counted by PyTorch's FlopCounterMode (matmuls, convolutions, attention)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        step_fn()
    return counter.get_total_flops()


def measure_matmul_peak(device: torch.device, size: int = 8192, repeats: int = 10) -> dict:
    """TFLOP/s of a size³ matmul per dtype, CUDA events, after warm-up: the achievable ceiling MFU is measured against."""
    results = {}
    for kind, dtype, tf32 in [("fp32", torch.float32, False), ("tf32", torch.float32, True),
                              ("fp16", torch.float16, False), ("bf16", torch.bfloat16, False)]:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        a = torch.randn(size, size, device=device, dtype=dtype)
        b = torch.randn(size, size, device=device, dtype=dtype)
        for _ in range(3):
            a @ b
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            a @ b
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1000 / repeats
        results[kind] = 2 * size**3 / seconds / 1e12
    torch.backends.cuda.matmul.allow_tf32 = False
    return results


def gpu_uuid(device: torch.device) -> str | None:
    uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    return f"GPU-{uuid}" if uuid is not None else None


def nvml_handle(nvml, uuid: str | None, index: int, visible: str | None):
    """NVML's handle for this process's GPU. NVML numbers GPUs as the machine does and ignores CUDA_VISIBLE_DEVICES,
    so torch's cuda:0 may be NVML's GPU 1: match by UUID; by index only when nothing is hidden; else None."""
    if uuid:
        return nvml.nvmlDeviceGetHandleByUUID(uuid)
    if visible is None:
        return nvml.nvmlDeviceGetHandleByIndex(index)
    return None


class EnergyMeter:
    """GPU energy over a window from NVML's total-energy counter (millijoules); None where NVML is unavailable."""

    def __init__(self, device: torch.device):
        self.handle = None
        if device.type != "cuda":
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nvml = pynvml
            self.handle = nvml_handle(pynvml, gpu_uuid(device), device.index or 0,
                                      os.environ.get("CUDA_VISIBLE_DEVICES"))
            if self.handle is not None:
                pynvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)
        except Exception:  # no pynvml, no driver support: energy is simply not reported
            self.handle = None

    def read_joules(self) -> float | None:
        if self.handle is None:
            return None
        return self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle) / 1000.0

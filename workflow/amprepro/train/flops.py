"""Model FLOPs, the GPU's matmul peak (measured and datasheet) and energy from NVML: the inputs of MFU."""

from __future__ import annotations

import os
import re

import torch

from amprepro import precisions

# Dense (no sparsity) peaks from NVIDIA's datasheets, TFLOP/s, per product: SXM, PCIe and NVL parts differ in clocks
# and power. fp32 is the CUDA-core figure; tf32/fp16/bf16/fp8 are Tensor Core figures (datasheets print the sparse
# ones with a *, twice these). None: the product has no such Tensor Core path (FP8 needs Ada or Hopper, compute
# capability 8.9/9.0). FP8 from the same datasheets, sparse figure halved: H100/H200 SXM 3,958*, H100 PCIe 3,026*,
# H100/H200 NVL 3,341*, L40S 1,466*, L4 485*.
DATASHEET_TFLOPS = {
    "H200 SXM": {"fp32": 67.0, "tf32": 494.5, "fp16": 989.5, "bf16": 989.5, "fp8": 1979.0},
    "H200 NVL": {"fp32": 60.0, "tf32": 417.5, "fp16": 835.5, "bf16": 835.5, "fp8": 1670.5},
    "H100 SXM": {"fp32": 67.0, "tf32": 494.5, "fp16": 989.5, "bf16": 989.5, "fp8": 1979.0},
    "H100 PCIe": {"fp32": 51.0, "tf32": 378.0, "fp16": 756.5, "bf16": 756.5, "fp8": 1513.0},
    "H100 NVL": {"fp32": 60.0, "tf32": 417.5, "fp16": 835.5, "bf16": 835.5, "fp8": 1670.5},
    "A100 SXM": {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0, "fp8": None},
    "A100 PCIe": {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0, "fp8": None},
    "L40S": {"fp32": 91.6, "tf32": 183.0, "fp16": 362.05, "bf16": 362.05, "fp8": 733.0},
    "L4": {"fp32": 30.3, "tf32": 60.0, "fp16": 121.0, "bf16": 121.0, "fp8": 242.5},
    "A10": {"fp32": 31.2, "tf32": 62.5, "fp16": 125.0, "bf16": 125.0, "fp8": None},
    "V100 SXM2": {"fp32": 15.7, "tf32": None, "fp16": 125.0, "bf16": None, "fp8": None},
    "V100 PCIe": {"fp32": 14.0, "tf32": None, "fp16": 112.0, "bf16": None, "fp8": None},
}
# The product behind the exact name torch.cuda.get_device_name reports (whole name; "NVIDIA H200" is the SXM part).
PRODUCT_NAMES = [
    (r"NVIDIA H200", "H200 SXM"),
    (r"NVIDIA H200 NVL", "H200 NVL"),
    (r"NVIDIA H100 80GB HBM3|NVIDIA H100 SXM5 (64|80|94)GB", "H100 SXM"),
    (r"NVIDIA H100 PCIe", "H100 PCIe"),
    (r"NVIDIA H100 NVL", "H100 NVL"),
    (r"NVIDIA A100-SXM4-(40|80)GB", "A100 SXM"),
    (r"NVIDIA A100-PCIE-40GB|NVIDIA A100 80GB PCIe", "A100 PCIe"),
    (r"NVIDIA L40S", "L40S"),
    (r"NVIDIA L4", "L4"),
    (r"NVIDIA A10", "A10"),
    (r"Tesla V100-SXM2-(16|32)GB", "V100 SXM2"),
    (r"Tesla V100-PCIE-(16|32)GB", "V100 PCIe"),
]


def datasheet_product(gpu_name: str | None) -> str | None:
    """The datasheet product of this exact GPU name; None for a name not in PRODUCT_NAMES (no guessing by substring)."""
    for pattern, product in PRODUCT_NAMES:
        if gpu_name and re.fullmatch(pattern, gpu_name.strip()):
            return product
    return None


def datasheet_peak(gpu_name: str | None, precision: str) -> float | None:
    product = datasheet_product(gpu_name)
    return DATASHEET_TFLOPS[product][precisions.get(precision).peak_kind] if product else None


def datasheet_note(gpu_name: str | None) -> str:
    """Which datasheet the peak comes from, or why there is none (the report shows it next to MFU)."""
    if gpu_name is None:
        return "no GPU: no datasheet peak"
    product = datasheet_product(gpu_name)
    if product is None:
        return (f"no datasheet peak for {gpu_name!r}: not a product amprepro.train.flops knows by exact name, so no "
                "datasheet MFU (MFU against the measured matmul peak is still given)")
    return f"{gpu_name} is the {product}: NVIDIA datasheet, dense Tensor Core figures"


def count_training_flops(step_fn) -> int:
    """FLOPs of one forward+backward, counted by PyTorch's FlopCounterMode (matmuls, convolutions, attention)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        step_fn()
    return counter.get_total_flops()


def measure_matmul_peak(device: torch.device, size: int = 8192, repeats: int = 10) -> dict:
    """TFLOP/s of a size³ matmul per dtype, CUDA events, after warm-up: the achievable ceiling MFU is measured
    against."""
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


FP8_PEAK_METHOD = ("torch._scaled_mm, float8_e4m3fn x float8_e4m3fn (second operand column-major), tensorwise "
                   "scales, bf16 out, use_fast_accum=True (torchao's forward GEMM)")


def fp8_peak_skip_reason(device) -> str | None:
    """Why the FP8 matmul ceiling cannot be measured on this device; None when it can."""
    if device.type != "cuda":
        return "no CUDA GPU: torch._scaled_mm's FP8 path needs compute capability >= 8.9"
    if not hasattr(torch, "_scaled_mm"):
        return f"torch {torch.__version__} has no torch._scaled_mm"
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (8, 9):
        return f"FP8 matmuls need compute capability >= 8.9 (Ada, Hopper); this GPU is {major}.{minor}"
    return None


def measure_fp8_peak(device: torch.device, size: int = 8192, repeats: int = 10) -> float:
    """TFLOP/s of a size³ FP8 matmul through torch._scaled_mm (FP8_PEAK_METHOD), timed like measure_matmul_peak."""
    a = torch.randn(size, size, device=device).to(torch.float8_e4m3fn)
    b = torch.randn(size, size, device=device).to(torch.float8_e4m3fn).t()  # column-major, as cuBLASLt wants
    one = torch.ones((), device=device, dtype=torch.float32)

    def matmul():
        return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=True)

    for _ in range(3):
        matmul()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        matmul()
    end.record()
    end.synchronize()
    return 2 * size**3 / (start.elapsed_time(end) / 1000 / repeats) / 1e12


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

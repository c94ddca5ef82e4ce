"""What a cell does about memory: the allocator cap of an emulated smaller card, the check that skips a cell which
cannot fit before it is built, and an allocation failure read as a skip for memory (not a crash). The training run
(amprepro.train.train) and the largest-batch search (amprepro.train.batchsearch) both use it."""

from __future__ import annotations

from amprepro.cellspec import CellSpec

# What CUDA, cuBLAS and cuDNN say when an allocation fails: memory, not a crash (issue 21: cublasCreate at 11.5 GiB).
ALLOCATION_FAILURES = ("CUDA out of memory", "CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED",
                       "CUSOLVER_STATUS_ALLOC_FAILED", "CUFFT_ALLOC_FAILED", "CUSPARSE_STATUS_ALLOC_FAILED",
                       "cudaErrorMemoryAllocation", "CUDA error: out of memory")


def out_of_memory(exc: BaseException) -> bool:
    import torch

    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    text = f"{exc}"
    return isinstance(exc, RuntimeError) and any(marker in text for marker in ALLOCATION_FAILURES)


def out_of_memory_record(base: dict, message: str) -> dict:
    """The record of a cell that ran out of memory: skipped for the machine, with what it held and was estimated."""
    return {**base, "status": "skipped", "skip_cause": "machine", "skip_needs": "more GPU memory",
            "reason": f"out of GPU memory at batch size {CellSpec.of(base['spec']).batch_size}: "
                      f"{message}{measured_need(base)}. The memory plan (results/plan/plan.json) sizes the "
                      "presets' batches; a batch written in your config is kept as written: lower it"}


def measured_need(base: dict) -> str:
    """What an out-of-memory cell had allocated at its peak, next to what it was estimated to need."""
    import torch

    from amprepro import memory

    parts = []
    if torch.cuda.is_available():
        parts.append(f"allocator peak before the failure {memory.gib(torch.cuda.max_memory_allocated())}")
    if base.get("memory_estimate"):
        parts.append(memory.describe_record(base["memory_estimate"]))
    if base.get("memory_limit_bytes"):
        parts.append(f"this cell's allocator limit {memory.gib(base['memory_limit_bytes'])}")
    return f" ({'; '.join(parts)})" if parts else ""


def apply_memory_limit(plan: dict | None, device) -> int | None:
    """An emulated smaller card (gpu_memory_limit_gib): cap this process's caching allocator before the model is
    built. Returns the limit in bytes, or None."""
    limit = (plan or {}).get("allocator_limit_bytes")
    if device.type != "cuda" or not limit:
        return None
    import torch

    index = torch.cuda.current_device() if device.index is None else device.index  # the call wants an index
    total = torch.cuda.get_device_properties(index).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, limit / total), index)
    return limit


def available_memory_bytes() -> int | None:
    """The memory this machine can still give a process (Linux's MemAvailable), or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def does_not_fit(spec: CellSpec, base: dict, plan: dict | None, device) -> dict | None:
    """The skip record of a cell that cannot fit: the plan said so (a batch written in the config), or, run without a
    plan, its estimate exceeds the GPU's free memory, or, on a CPU (where the plan fits nothing), its estimate exceeds
    the machine's available memory (the 7B shape of the fp8 presets on a laptop: killed by the kernel otherwise, with
    an empty log)."""
    from amprepro import memory

    estimate = base["memory_estimate"]
    if device.type == "cpu":
        available = available_memory_bytes()
        if available is not None and estimate["total_bytes"] > available:
            return {**base, "status": "skipped", "skip_cause": "machine", "skip_needs": "more memory (a GPU)",
                    "reason": f"does not fit: {memory.describe_record(estimate)} exceeds the {memory.gib(available)} "
                              "of memory available on this machine, which has no GPU for it; run it on a GPU"}
    if plan is not None and not plan.get("fits", True):
        return {**base, "status": "skipped", "skip_cause": "machine", "skip_needs": "more GPU memory",
                "reason": f"{plan['why']}; run it on a GPU with more memory or lower its batch_size"}
    if plan is None and device.type == "cuda":
        import torch

        free = torch.cuda.mem_get_info(device)[0]
        base["free_bytes_at_start"] = free
        if estimate["total_bytes"] > free:
            return {**base, "status": "skipped", "skip_cause": "machine", "skip_needs": "more GPU memory",
                    "reason": f"does not fit: {memory.describe_record(estimate)} exceeds the {memory.gib(free)} "
                              "free on this GPU at start; run it on a GPU with more memory"}
    return None

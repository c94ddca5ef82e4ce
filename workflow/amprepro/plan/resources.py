"""What one train job asks its executor (Slurm, or the local machine) for, computed from the cell's own settings.

No torch import: the rules evaluate this when Snakemake builds the DAG, on a login node too.

- GPUs: the model's `gpus` on each of its `nodes` (default 1 and 1); none when the jobs have no GPU (gpu: false).
- CPUs: CPUS_PER_GPU for each GPU (data, the host side of the step), or the job's threads on the CPU.
- Host memory (--mem, per node): each process's base (torch, the CUDA context, libraries) plus the FP32 weights
  of the models built on the host before they move to the GPU. The LLaMA decoders are built on the meta device and
  materialised on the GPU (amprepro.train.models.place): their 6.7 B parameters never touch host memory. Their GPU
  memory
  (amprepro.memory's estimate) is a property of the GPU type, which the site chooses (gpu_model, partition).
- Time limit: a start-up allowance (imports, apex, torch.compile, materialising 7B weights) plus the cell's steps
  times a per-item budget, both times runtime_factor (config `resources: runtime_factor`) for slower GPUs.
"""

from __future__ import annotations

import math

from amprepro import archs

CPUS_PER_GPU = 8
HOST_MB_PER_PROCESS = 8000
HOST_MB_CPU_CELL = 4000
STARTUP_MINUTES = 10
# Per arch, in the arch registry (amprepro.archs):
# - host_built_parameters: parameters of the models built on the host first (FP32 weights in host memory until
#   .to(device)); LLaMA: meta, 0.
# - seconds_per_item: seconds per sample or token of a training step: ten times the slowest precision (strict FP32)
#   measured on the H200 at the paper preset's sizes (reference/nvidia-h200, 2026-11-30: e.g. llama 2.28 s for 2048
#   tokens, vit_b_16 0.34 s for 128 images), so an older GPU still fits.


def nodes(model: dict) -> int:
    return int(model.get("nodes", 1))


def processes_per_node(model: dict) -> int:
    """Data-parallel processes on each node: one per GPU (or per gloo process on the CPU)."""
    return int(model.get("gpus", 1))


def gpus_per_node(model: dict, gpu_jobs: bool) -> int:
    return processes_per_node(model) if gpu_jobs else 0


def cpus_per_gpu(model: dict, gpu_jobs: bool) -> int:
    return CPUS_PER_GPU if gpus_per_node(model, gpu_jobs) else 0


def host_mb(model: dict, gpu_jobs: bool) -> int:
    """--mem for each node of the job."""
    if not gpu_jobs:
        return HOST_MB_CPU_CELL * processes_per_node(model)
    weights_mb = 4 * archs.get(model["arch"]).host_built_parameters // 10**6
    return processes_per_node(model) * (HOST_MB_PER_PROCESS + weights_mb)


def items_per_step(model: dict) -> int:
    if model["data"] in ("synthetic_tokens", archs.TEXT_DATA):  # an unset seq_len counts as synthetic_tokens' (a
        return model["batch_size"] * model.get("seq_len", archs.SYNTHETIC_TOKENS_SEQ_LEN)  # bound over the text's)
    return model["batch_size"]


def runtime_minutes(model: dict, train: dict, factor: float) -> int:
    step_seconds = items_per_step(model) * archs.get(model["arch"]).seconds_per_item
    return math.ceil(factor * (STARTUP_MINUTES + train["steps"] * step_seconds / 60))


def apex_build_threads(cores: int, local_gpus: int) -> int:
    """The apex compile's threads. On one machine with GPUs (local_gpus > 0) the build runs beside the cells that need
    no apex: it leaves each GPU's cell its CPUS_PER_GPU, as long as that leaves the build at least half the cores
    (else it takes them all and runs alone). A cluster job (local_gpus 0) gets all it asks for."""
    free = cores - CPUS_PER_GPU * local_gpus
    return free if local_gpus and free >= max(1, cores // 2) else cores

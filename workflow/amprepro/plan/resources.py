"""What one train job asks its executor (Slurm, or the local machine) for, computed from the cell's own settings.

No torch import: the rules evaluate this when Snakemake builds the DAG, on a login node too.

- GPUs: the model's `gpus` on each of its `nodes` (default 1 and 1); none when the jobs have no GPU (gpu: false).
- CPUs: CPUS_PER_GPU for each GPU (data, the host side of the step), or the job's threads on the CPU.
- Host memory (--mem, per node): each process's base (torch, the CUDA context, libraries) plus the FP32 weights
  of the models built on the host before they move to the GPU. The LLaMA decoders are built on the meta device and
  materialised on the GPU (amprepro.train.models.place): their 6.7 B parameters never touch host memory. Their GPU
  memory
  (amprepro.memory's estimate) is a property of the GPU type, which the site chooses (gpu_model, partition).
- Sharing a GPU: a cell whose speed no claim judges (shares_gpu) runs beside up to CELLS_PER_SHARED_GPU - 1 others
  on one GPU, on this machine only (below).
- Time limit: a start-up allowance (imports, apex, torch.compile, materialising 7B weights) plus the cell's steps
  times a per-item budget, both times runtime_factor (config `resources: runtime_factor`) for slower GPUs.
"""

from __future__ import annotations

import math

from amprepro import archs, memory
from amprepro.cellspec import CellSpec
from amprepro.modelsettings import ModelSettings

CPUS_PER_GPU = 8
# Untimed cells that may run on one GPU together (amprepro.gpuslots --shared, Snakemake's gpu_share resource).
# The accuracy and risk cells (< 1 M parameters) take 8-17 s each on an H200, nearly all of it start-up and kernel
# launches, one after another; eight at once keep the GPU busier without any of them near its memory.
CELLS_PER_SHARED_GPU = 8
# A model that shares must be small: its predicted peak (amprepro.memory.estimate) under this. Eight such cells then
# take at most 32 GiB of an 80 GiB card; the real ones take well under 1 GiB each.
SHARED_CELL_MAX_GIB = 4.0
HOST_MB_PER_PROCESS = 8000
HOST_MB_CPU_CELL = 4000
STARTUP_MINUTES = 10
# Per arch, in the arch registry (amprepro.archs):
# - host_built_parameters: parameters of the models built on the host first (FP32 weights in host memory until
#   .to(device)); LLaMA: meta, 0.
# - seconds_per_item: seconds per sample or token of a training step: ten times the slowest precision (strict FP32)
#   measured on the H200 at the paper preset's sizes (reference/nvidia-h200, 2026-11-30: e.g. llama 2.28 s for 2048
#   tokens, vit_b_16 0.34 s for 128 images), so an older GPU still fits.


# Each function below takes the model's settings: its record, or its entry of the run matrix (runs.models.<name>, read
# as one: ModelSettings.of_entry) or a cell's model_config.


def nodes(model: ModelSettings | dict) -> int:
    return int(ModelSettings.of_entry(model).nodes)


def processes_per_node(model: ModelSettings | dict) -> int:
    """Data-parallel processes on each node: one per GPU (or per gloo process on the CPU)."""
    return int(ModelSettings.of_entry(model).gpus)


def gpus_per_node(model: ModelSettings | dict, gpu_jobs: bool) -> int:
    return processes_per_node(model) if gpu_jobs else 0


def cpus_per_gpu(model: ModelSettings | dict, gpu_jobs: bool) -> int:
    return CPUS_PER_GPU if gpus_per_node(model, gpu_jobs) else 0


def host_mb(model: ModelSettings | dict, gpu_jobs: bool) -> int:
    """--mem for each node of the job."""
    if not gpu_jobs:
        return HOST_MB_CPU_CELL * processes_per_node(model)
    weights_mb = 4 * ModelSettings.of_entry(model).arch_entry.host_built_parameters // 10**6
    return processes_per_node(model) * (HOST_MB_PER_PROCESS + weights_mb)


def items_per_step(model: ModelSettings | dict) -> int:
    settings = ModelSettings.of_entry(model)
    if settings.data in ("synthetic_tokens", archs.TEXT_DATA):
        return settings.batch_size * settings.budget_seq_len
    return settings.batch_size


def runtime_minutes(model: ModelSettings | dict, train: dict, factor: float) -> int:
    step_seconds = items_per_step(model) * ModelSettings.of_entry(model).arch_entry.seconds_per_item
    return math.ceil(factor * (STARTUP_MINUTES + train["steps"] * step_seconds / 60))


def apex_build_threads(cores: int, local_gpus: int) -> int:
    """The apex compile's threads. On one machine with GPUs (local_gpus > 0) the build runs beside the cells that need
    no apex: it leaves each GPU's cell its CPUS_PER_GPU and one thread more in Snakemake's count for the one-thread
    jobs beside it (the apex shell's build, the summary), as long as that leaves the build half the cores other than
    that one (else it takes them all and runs alone). Without it, the memory plan (a GPU job of CPUS_PER_GPU threads,
    before any timed cell) waited 10 s for the shell's build on a fresh 16-core H100 (results-reference/perf/
    99d30cf-h100). Where the jobs run is amprepro.env.cpushare's: the build on whole cores from the top (on two
    threads a core, 7 counted give 3 cores), the shell's build on the top CPU, at the same low priority. A cluster
    job (local_gpus 0) gets all it asks for."""
    free = cores - CPUS_PER_GPU * local_gpus - 1
    return free if local_gpus and free >= max(1, (cores - 1) // 2) else cores


def shares_gpu(spec) -> bool:
    """Whether this cell runs on a GPU it shares with other such cells (the one place this is decided; not part of
    the cell's spec, so its results path, digest and reference entry are those of a cell on a GPU of its own).

    Yes for a small model on real data on one GPU: no claim judges its throughput (config/claims.yaml: the speed
    claims read the benchmark models, on synthetic data, or name synthetic ones; [benchmark] excludes real data,
    amprepro.analysis.claims.matching_models), while its loss, accuracy and allocator peak do not depend on who else
    runs on the GPU (max_memory_allocated is per process). No for synthetic data (the models measured for speed),
    for a cell of several GPUs or nodes, for the LLaMA family (7B shapes, LoRA fine-tuning on real text) and for any
    model whose predicted peak is SHARED_CELL_MAX_GIB or more."""
    cell = CellSpec.of(spec)
    model = cell.settings
    if str(model.data).startswith("synthetic_") or model.nodes != 1 or model.gpus != 1:
        return False
    if memory.is_llama(model) or model.lora is not None:
        return False
    return memory.estimate(model, cell.precision, cell.optimizer).total < SHARED_CELL_MAX_GIB * memory.GIB


def shared_threads() -> int:
    """CPU threads of a cell on a shared GPU: its share of the GPU's CPUS_PER_GPU."""
    return max(1, CPUS_PER_GPU // CELLS_PER_SHARED_GPU)

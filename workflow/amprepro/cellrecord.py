"""A cell's metrics.json as a typed record: one field per key the writer (amprepro.train.record, amprepro.train.loop)
can put there, each with what it holds and where it comes from.

`CellRecord.from_dict(d).as_dict() == d` for every metrics.json: a key the record does not know is refused (the message
names it), a key the file does not have stays absent (ABSENT, not None: None is a value metrics.json writes), and
values are kept as they are (nested records stay dicts). The JSON is written with sorted keys (amprepro.files.
write_json), so the bytes of a metrics.json do not depend on the order the fields are declared in; they follow the
order a finished run writes them. Only model, precision, seed and status are required: every reader keys a cell by
the first three, and status says which of the rest a record has (an ok or collapsed run: the measurements; a skipped
or failed cell: skip_cause, skip_needs and the reason)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class _Absent:
    """The value of a field whose key a metrics.json does not have."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "ABSENT"

    def __bool__(self) -> bool:
        return False


ABSENT: Any = _Absent()


class CellRecordError(ValueError):
    """A dict that is not a cell's record: unknown keys, or a required key missing. The message names them."""


@dataclass(frozen=True, kw_only=True)
class CellRecord:
    # --- the cell (amprepro.train.record.base_record): in every record ---
    #: The model's name (its key under the config's models), from the cell's spec.
    model: str
    #: The precision's name (amprepro.precisions), from the cell's spec.
    precision: str
    #: The cell's seed (int), from the cell's spec.
    seed: int
    #: The cell's settings as it ran (amprepro.cellspec.CellSpec.as_dict, after the plan's batch and shape).
    spec: dict = ABSENT
    #: The memory plan's view for this model (results/plan/models/<model>.json: batch, shape, why, cap_gib), or None
    #: where the cell ran without one.
    plan: dict | None = ABSENT
    #: Where it ran (amprepro.train.measure.hardware): device, GPU name, count, capability, driver, CPU, ...
    hardware: dict = ABSENT
    #: The software it ran with (amprepro.train.measure.software): python, prefix, torch, CUDA, cuDNN, apex.
    software: dict = ABSENT
    #: Processes (ranks) that ran it; 0 in the record of a cell its launcher did not start.
    world_size: int = ABSENT
    #: Nodes its ranks ran on; 0 in the record of a cell its launcher did not start.
    nodes: int = ABSENT
    #: GPUs it computed on: world_size on CUDA, 0 on the CPU.
    gpus_used: int = ABSENT
    #: The host name of each rank, in rank order (amprepro.train.distributed.Dist.hosts).
    rank_nodes: list = ABSENT
    #: Which process ran it: the environment's AMPREPRO_CELL_PROCESS (a cell server's fork), else "a fresh interpreter".
    process: str = ABSENT
    #: {"cells_per_gpu": K} where it shared its GPU with up to K-1 other untimed cells (amprepro.gpuslots --shared);
    #: absent where it had its GPU to itself (amprepro.train.record.gpu_sharing).
    gpu_shared: dict = ABSENT
    # --- before training (amprepro.train.train.train_cell): a cell that got as far as its memory check ---
    #: The pre-allocation memory estimate (amprepro.memory.estimate(...).as_record(); bytes per part and total_bytes).
    memory_estimate: dict = ABSENT
    #: The allocator limit of an emulated smaller card, bytes (amprepro.train.oom.apply_memory_limit), or None.
    memory_limit_bytes: int | None = ABSENT
    #: The GPU's free memory at the start, bytes (torch.cuda.mem_get_info), read by amprepro.train.oom.does_not_fit for
    #: a cell on a GPU without a memory plan; absent otherwise.
    free_bytes_at_start: int = ABSENT
    # --- what became of it: every record ---
    #: "ok" (trained, finite), "collapsed" (non-finite loss or loss scale below 1), "skipped" (never trained: the
    #: machine or the software could not run it) or "failed" (broke while running; the traceback is in its log).
    status: str
    # --- a cell that did not run (amprepro.train.record.not_run_record, amprepro.train.oom, skip_cause) ---
    #: What kept it from running: "machine" (too few GPUs, nodes or memory) or "software".
    skip_cause: str = ABSENT
    #: What it would need to run, in words ("more GPU memory", "2 GPUs", ...).
    skip_needs: str = ABSENT
    #: Why the status is what it is, in words; "" for an ok run.
    reason: str = ABSENT
    # --- a finished run (amprepro.train.loop.train_loop): status ok or collapsed ---
    #: The unit of throughput_per_s: "<items>/s", the items a step trains on (images, tokens, samples).
    throughput_unit: str = ABSENT
    #: Steps timed (all after the warm-up) (amprepro.train.measure.step_stats).
    timed_steps: int = ABSENT
    #: Warm-up steps left out of the timing (the spec's train.warmup_steps).
    warmup_steps: int = ABSENT
    #: Median time of a timed step, seconds (amprepro.train.measure.StepTimer).
    step_time_median_s: float = ABSENT
    #: 90th percentile of a timed step's time, seconds.
    step_time_p90_s: float = ABSENT
    #: Mean of a timed step's time, seconds.
    step_time_mean_s: float = ABSENT
    #: Items per second over all ranks: items_per_step / step_time_median_s.
    throughput_per_s: float = ABSENT
    #: The process's peak resident set, bytes (getrusage ru_maxrss * 1024).
    peak_rss_bytes: int = ABSENT
    #: The CUDA caching allocator's peak allocated bytes over the run (torch.cuda.max_memory_allocated); None on CPU.
    peak_allocated_bytes: int | None = ABSENT
    #: The CUDA caching allocator's peak reserved bytes (torch.cuda.max_memory_reserved); None on CPU.
    peak_reserved_bytes: int | None = ABSENT
    #: What the first optimizer step holds, bytes by part (amprepro.train.measure.Breakdown): weights, gradients,
    #: optimizer state, master weights, activations and workspace; None where not counted (CPU).
    memory_breakdown_bytes: dict | None = ABSENT
    #: Steps whose loss was not finite (amprepro.train.record.numerics).
    nonfinite_steps: int = ABSENT
    #: The first step with a non-finite loss, or None.
    first_nonfinite_step: int | None = ABSENT
    #: Optimizer steps the loss scaler skipped (inf/NaN gradients).
    skipped_steps: int = ABSENT
    #: The loss scale at the first step with one, or None for a precision without loss scaling.
    loss_scale_initial: float | None = ABSENT
    #: The loss scale at the last step with one, or None.
    loss_scale_final: float | None = ABSENT
    #: The smallest loss scale over the run, or None; below 1.0 marks the run collapsed.
    loss_scale_min: float | None = ABSENT
    #: The last step's training loss (mean over ranks).
    final_loss: float = ABSENT
    #: The mean training loss of the last 10 steps (fewer where the run had fewer).
    final_loss_mean10: float = ABSENT
    #: Accuracy on the data's test set after training, a fraction (amprepro.train.loop.evaluate); None under data
    #: parallelism or where the data has no test set.
    eval_accuracy: float | None = ABSENT
    #: The held-out loss curve, [{"step", "loss"}, ...] (amprepro.train.heldout.Curve; with eval_every, one process).
    heldout_curve: list = ABSENT
    #: The curve's last held-out loss, None where not finite.
    heldout_loss_final: float | None = ABSENT
    #: How the curve was computed: {"every": steps between points, "what": the data it is measured on}.
    heldout_eval: dict = ABSENT
    #: The data's own record (what the batches were made from), where the data source keeps one.
    data_record: dict = ABSENT
    #: Parameters of the model, all of them (amprepro.train.models.parameter_count).
    parameters: int = ABSENT
    #: A LoRA cell's adapter rank (amprepro.train.lora.record).
    lora_rank: int = ABSENT
    #: A LoRA cell's adapter alpha.
    lora_alpha: float = ABSENT
    #: The modules its adapters wrap, joined with "+".
    lora_targets: str = ABSENT
    #: The dtype the frozen base is held in ("bf16", "fp32").
    lora_base: str = ABSENT
    #: Parameters that train (the adapters').
    trainable_parameters: int = ABSENT
    #: The dtypes of the frozen parameters, sorted.
    frozen_parameter_dtypes: list = ABSENT
    #: A LoRA cell's first step's training loss.
    initial_loss: float = ABSENT
    #: A LoRA cell's held-out loss before the first step, or None without a curve point at step 0.
    heldout_loss_initial: float | None = ABSENT
    #: FLOPs of one global step (all ranks), or None where counting failed (amprepro.train.loop.step_flops).
    flops_per_step: float | None = ABSENT
    #: How flops_per_step was counted: "analytic", "analytic (LoRA: ...)" or "FlopCounterMode".
    flops_method: str = ABSENT
    #: flops_per_step / step_time_median_s / 1e12, TFLOP/s; None without a FLOP count.
    achieved_tflops: float | None = ABSENT
    #: Items one global step trains on (all ranks), in throughput_unit's items.
    items_per_step: int = ABSENT
    #: The datasheet's dense peak for this precision, TFLOP/s, summed over the cell's GPUs (amprepro.train.flops);
    #: None without one.
    datasheet_peak_tflops: float | None = ABSENT
    #: Which datasheet the peak comes from, or why there is none.
    datasheet_note: str = ABSENT
    #: Energy per item over the timed steps, joules, summed over ranks (NVML's total-energy counter,
    #: amprepro.train.flops.EnergyMeter); None where unread.
    energy_j_per_item: float | None = ABSENT
    #: The preset's stated token count for an epoch (the model's epoch_tokens), or None.
    epoch_tokens: int | None = ABSENT
    #: epoch_tokens / throughput_per_s / 3600, hours (token models only); None otherwise.
    epoch_hours_derived: float | None = ABSENT
    #: The TF32 switches as the process set them: {"matmul_allow_tf32", "cudnn_allow_tf32"}
    #: (amprepro.train.precision.configure_tf32).
    tf32: dict = ABSENT
    #: The optimizer's name, from the spec (amprepro.train.cell.Cell.settings).
    optimizer: str = ABSENT
    #: Whether apex O1's weight-cast cache was on (amprepro.train.precision), or None (no apex O1).
    apex_cast_cache: Any = ABSENT
    #: Which apex build the cell used, or None for a cell without apex.
    apex_build: Any = ABSENT
    #: The apex fused kernels the cell used, or None.
    apex_fused_kernels: Any = ABSENT
    #: The FP8 conversion's record (amprepro.train.float8), or None for a precision without FP8.
    float8: dict | None = ABSENT
    #: Where the initial weights came from (amprepro.train.initcache.record): {"source": "built" or "cache", "key":
    #: the cache's key or None, "seconds": the build or the read, "note": why a file was not used or not kept}.
    init_weights: dict | None = ABSENT
    #: How the model was compiled (amprepro.train.float8.compile_model, via amprepro.train.cell.Cell.compile).
    compiled: Any = ABSENT
    #: How busy the host was: {"cpus", "load_1min"} right after the timed steps (amprepro.train.measure.host_load),
    #: and over them {"timed_seconds", "busy_cpus_all", "busy_cpus_others"}: CPUs' worth of other processes' work,
    #: "others" without the cell's own other ranks on this host (measure.busy_during).
    host_load: dict = ABSENT
    #: The host threads it computed with: {"torch", "pools"} (amprepro.train.measure.thread_pools).
    host_threads: dict = ABSENT
    #: Wall time from just before the first training step to the end of the run's measurements, seconds.
    wall_seconds: float = ABSENT
    #: Where the cell's process spent its seconds before writing this record (amprepro.train.measure.Phases):
    #: process_start_to_run (since its start or fork, from /proc; None elsewhere), device_and_provenance (the device,
    #: its CUDA context and the base record), fit_check, build, data, loop (train_loop, wall_seconds and more).
    phase_seconds: dict = ABSENT

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """Every key a metrics.json may have, in the order a finished run writes them."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def required(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING)

    @classmethod
    def from_dict(cls, data: dict, source: str = "a cell's record") -> CellRecord:
        """The record of a metrics.json's dict; CellRecordError naming any key it does not know or any it needs."""
        known = set(cls.keys())
        unknown = [key for key in data if key not in known]
        if unknown:
            raise CellRecordError(f"{source} has keys a cell's record does not know: {', '.join(sorted(unknown))} "
                                  "(amprepro.cellrecord.CellRecord lists every key metrics.json may have)")
        missing = [key for key in cls.required() if key not in data]
        if missing:
            raise CellRecordError(f"{source} lacks the keys every cell's record has: {', '.join(missing)}")
        return cls(**data)

    @classmethod
    def read(cls, path: str | Path) -> CellRecord:
        """The record of a metrics.json file."""
        return cls.from_dict(json.loads(Path(path).read_text()), source=str(path))

    def as_dict(self) -> dict:
        """The dict metrics.json holds: every field that is not ABSENT, values as they are."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) is not ABSENT}

    def has(self, key: str) -> bool:
        """Whether the record has the key (a field not ABSENT)."""
        return getattr(self, key) is not ABSENT

    def with_fields(self, **changes) -> CellRecord:
        """The record with these keys set (a key not a field: CellRecordError naming it)."""
        unknown = [key for key in changes if key not in self.keys()]
        if unknown:
            raise CellRecordError(f"a cell's record has no keys {', '.join(sorted(unknown))}")
        return dataclasses.replace(self, **changes)


def metrics_files(runs_dir: str | Path | None) -> list[tuple[Path, dict]]:
    """Every cell's metrics.json under a results/runs directory, in path order, as read (a dict); a file that cannot
    be read or parsed is left out (a cell still running, or killed mid-write before files.py's atomic writes)."""
    found = []
    if runs_dir and Path(runs_dir).is_dir():
        for path in sorted(Path(runs_dir).glob("*/*/seed*/metrics.json")):
            try:
                found.append((path, json.loads(path.read_text())))
            except (OSError, ValueError):
                continue
    return found

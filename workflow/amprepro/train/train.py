"""One training run (one cell of the matrix) in its own process; writes a per-step CSV and a metrics JSON.

A cell this hardware or build cannot run writes status "skipped" with the reason. A run whose loss goes non-finite
is a finding (status "collapsed", first non-finite step recorded), not a crash.

The cell is built by amprepro.train.cell.build_cell (the one factory the largest-batch search uses too), trained by
amprepro.train.loop, recorded by amprepro.train.record; amprepro.train.oom caps its memory and reads an allocation
failure. Their public names are importable from here as well, as they were when this module held them all.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass

from amprepro import gpuslots
from amprepro.cellspec import CellSpec
from amprepro.train.cell import (
    build_cell,
    cross_entropy,
    make_data,
    make_optimizer,
    prepare_model,
    seed_everything,
    swap_layer_norms,
)
from amprepro.train.cellsupport import skip_cause
from amprepro.train.loop import (
    COSINE_FLOOR,
    PROGRESS_EVERY,
    PROGRESS_LAG,
    evaluate,
    items_per_step,
    lr_at,
    set_lr,
    step_flops,
    train_loop,
)
from amprepro.train.oom import (
    ALLOCATION_FAILURES,
    apply_memory_limit,
    available_memory_bytes,
    does_not_fit,
    measured_need,
    out_of_memory,
)
from amprepro.train.record import (
    NO_APEX,
    STEP_FIELDS,
    base_record,
    cell_apex,
    cell_plan,
    epoch_fields,
    failure_record,
    gpu_sharing,
    lora_fields,
    not_run_record,
    numerics,
    write_results,
)

__all__ = ["ALLOCATION_FAILURES", "COSINE_FLOOR", "NO_APEX", "PROGRESS_EVERY", "PROGRESS_LAG", "STEP_FIELDS",
           "apply_memory_limit", "available_memory_bytes", "base_record", "build_cell", "cell_apex", "cell_plan",
           "cross_entropy", "does_not_fit", "epoch_fields", "evaluate", "failure_record", "gpu_sharing",
           "items_per_step", "lora_fields", "lr_at", "main", "make_data", "make_optimizer", "measured_need",
           "not_run_record", "numerics", "out_of_memory", "parse_args", "prepare_model", "put_apex_on_path", "run",
           "seed_everything", "set_lr", "step_flops", "swap_layer_norms", "train_cell", "train_loop",
           "write_not_run", "write_results"]


def put_apex_on_path(apex: dict) -> None:
    """Apex lives in a verified target directory (see docs/apex.md), not in the env: this process adds it."""
    if apex.get("status") == "built" and apex.get("site_dir"):
        sys.path.insert(0, apex["site_dir"])


def run(spec: CellSpec | dict, apex: dict, threads: int, dist=None, plan: dict | None = None, init_cache=None
        ) -> tuple[dict, list[dict]]:
    """One cell. plan: its model's view of the memory plan (amprepro.plan.memplan): the batch and shape it runs at,
    whether that fits, and the allocator limit of an emulated smaller card. init_cache: the directory of initial
    weights earlier cells built (amprepro.train.initcache); None: build them."""
    import torch

    from amprepro.train import distributed, measure

    phases = measure.Phases()
    spec = CellSpec.of(spec).planned(plan)
    dist = dist or distributed.Dist()
    torch.set_num_threads(threads)
    staged = stage(spec, init_cache, phases) if gpuslots.claim_pending() else Staged(None)
    device = dist.device()
    base = base_record(spec, apex, device, dist, plan)
    skip = skip_cause(spec, device, apex)
    if skip:
        cause, needs, reason = skip
        return {**base, "status": "skipped", "reason": reason, "skip_cause": cause, "skip_needs": needs}, []
    phases.mark("device_and_provenance")
    try:
        return train_cell(spec, apex, dist, device, base, plan, phases, init_cache, staged)
    except Exception as exc:
        if dist.active:  # torchrun stops the other ranks; a half-written DDP record would be worse than none
            raise
        return failure_record(base, exc), []


@dataclass
class Staged:
    """What a cell made before its GPU was free (stage): build_weights' model and record, and its batch where that is
    one synthetic image batch drawn from the cell's own generator (None: made after, as always)."""

    built: tuple | None
    batches: object | None = None


def stage(spec: CellSpec, init_cache, phases) -> Staged:
    """For a cell that locks its GPU itself (amprepro.gpuslots --defer): while the cell before it still trains, seed
    and build the model on the CPU (build_weights: what train_cell would do first) and draw a synthetic image batch,
    then wait for the GPU. train_cell goes on from the model and the random state the build left. Where the build
    failed, built is None: train_cell builds again once the GPU is free, and the cell's record says why it failed.
    Nothing here starts CUDA."""
    import traceback

    import torch

    from amprepro.train.cell import build_weights

    staged = Staged(None)
    try:
        seed_cell(spec)
        staged.built = build_weights(spec.settings, init_cache)
        if spec.settings.data == "synthetic_images":  # drawn from its own generator: not from the one the build left
            staged.batches = make_data(spec.settings, spec.seed, torch.device("cpu"), staged.built[0])
    except Exception:
        traceback.print_exc()
        print("amprepro.train: building the model before the GPU was free failed; building it again after",
              file=sys.stderr, flush=True)
    phases.mark("staged_build")
    gpuslots.claim_deferred()
    phases.mark("gpu_wait")
    return staged


def seed_cell(spec: CellSpec) -> None:
    """The cell's random state, before anything draws from it (the build first)."""
    if spec.train.get("deterministic"):
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    seed_everything(spec.seed, spec.train.get("deterministic", False))


def train_cell(spec: CellSpec, apex: dict, dist, device, base: dict, plan: dict | None = None, phases=None,
               init_cache=None, staged: Staged | None = None) -> tuple[dict, list[dict]]:
    """Seed, set TF32, cap the allocator and skip a cell that cannot fit; then build the cell (build_cell), its
    memory breakdown and its batches, and train it (train_loop). phases (measure.Phases): a finished cell's record
    says in phase_seconds how long each of these took. staged: what stage() made before the GPU was free; this goes
    on from its model and the random state the build left (no seeding again)."""
    from amprepro import memory
    from amprepro.train import measure, precision

    phases = phases or measure.Phases()  # a caller without the run's phases: timed from here
    settings = spec.settings
    built = staged.built if staged is not None else None
    if built is None:
        seed_cell(spec)
    tf32 = precision.configure_tf32(spec.precision)
    # in place: failure_record names them when the cell runs out of memory anyway
    base["memory_estimate"] = memory.estimate(settings, spec.precision, spec.optimizer).as_record()
    base["memory_limit_bytes"] = apply_memory_limit(plan, device)
    skipped = does_not_fit(spec, base, plan, device)
    if skipped:
        return skipped, []
    phases.mark("fit_check")
    # compiled in the loop, after the step-0 eval
    cell = build_cell(spec, device, plan, dist, compile_now=False, init_cache=init_cache, built=built)
    breakdown = measure.Breakdown(cell.model, cell.trainer.optimizer, enabled=device.type == "cuda")
    phases.mark("build")
    if built is not None and staged.batches is not None:
        batches = staged.batches.to(device)
    else:
        batches = make_data(settings, spec.seed, device, cell.model)
    phases.mark("data")
    metrics, rows = train_loop(spec, dist, device, base, cell, batches, breakdown, {"tf32": tf32, **cell.settings()})
    phases.mark("loop")  # its steps, warm-up included, the held-out losses, the compile, FLOP count and evaluation
    return {**metrics, "phase_seconds": phases.seconds}, rows


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spec", required=True, help="JSON of this cell's settings")
    parser.add_argument("--apex", help="results/apex/runs.json, for a cell that uses apex")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--metrics", required=True)
    parser.add_argument("--steps", required=True)
    parser.add_argument("--plan", help="results/plan/models/<model>.json: the memory plan's view for this model")
    parser.add_argument("--init-cache", help="directory of initial weights that cells share (amprepro.train.initcache)")
    return parser.parse_args(argv)


def write_not_run(argv: list[str], cause: str, needs: str, reason: str) -> None:
    """For the launcher (amprepro.plan.launcher): write the cell as skipped, with the reason, without running it."""
    args = parse_args(argv)
    record = not_run_record(CellSpec.from_json(args.spec), cell_apex(args.apex), cause, needs, reason,
                            cell_plan(args.plan))
    write_results(args, record, [])


def main(argv=None) -> None:
    args = parse_args(argv)
    spec, apex, plan = CellSpec.from_json(args.spec), cell_apex(args.apex), cell_plan(args.plan)
    put_apex_on_path(apex)
    from amprepro.train import distributed

    dist = distributed.setup()
    metrics, rows = run(spec, apex, args.threads, dist, plan, args.init_cache)
    dist.close()
    if dist.is_main:
        write_results(args, metrics, rows)


if __name__ == "__main__":
    main()

"""A cell's run record: what every metrics.json says (the cell, where it ran, the software, the plan's decision), the
records of a cell that did not run or broke, the fields a finished run adds about its numerics, epoch and LoRA, and
the writing of steps.csv and metrics.json (metrics last: it exists only once the run is complete)."""

from __future__ import annotations

import math
import os

from amprepro.cellid import CellId
from amprepro.cellrecord import CellRecord
from amprepro.cellspec import CellSpec
from amprepro.modelsettings import ModelSettings

STEP_FIELDS = ["step", "loss", "loss_scale", "skipped", "step_time_s"]
# The apex record of a cell that uses no apex (cellsupport.needs_apex): its job does not wait for the apex build.
NO_APEX = {"status": "not used", "reason": "this cell uses no apex", "commit": None}


def base_record(spec: CellSpec, apex: dict, device, dist, plan: dict | None = None) -> dict:
    """What every record of a cell says: the cell, where it ran (nodes, GPUs, the node of each rank), the software,
    and the memory plan's decision for its model (the batch and shape it ran at, and why)."""
    from amprepro.train import measure

    return {"model": spec.model, "precision": spec.precision, "seed": spec.seed, "spec": spec.as_dict(),
            "plan": plan,
            "hardware": measure.hardware(device), "software": measure.software(apex), "world_size": dist.world,
            "nodes": dist.nodes, "gpus_used": dist.world if device.type == "cuda" else 0, "rank_nodes": dist.hosts,
            "process": os.environ.get("AMPREPRO_CELL_PROCESS", "a fresh interpreter"), **gpu_sharing(os.environ)}


def gpu_sharing(env) -> dict:
    """{"gpu_shared": {"cells_per_gpu": K}} for a cell that ran on a GPU shared with up to K-1 other untimed cells
    (amprepro.gpuslots --shared sets the variable): its throughput was measured while sharing, so the report marks
    it and verify does not compare it. {} for a cell that had its GPU to itself."""
    from amprepro.gpuslots import SHARED_ENV

    value = env.get(SHARED_ENV, "")
    return {"gpu_shared": {"cells_per_gpu": int(value)}} if value.isdigit() and int(value) > 0 else {}


def not_run_record(spec: CellSpec, apex: dict, cause: str, needs: str, reason: str, plan: dict | None = None
                   ) -> CellRecord:
    """The record of a cell its launcher found it cannot start (too few GPUs or nodes): no worker ever ran."""
    import torch

    from amprepro.train import distributed

    base = base_record(spec.planned(plan), apex, torch.device("cpu"), distributed.Dist(hosts=[]), plan)
    return CellRecord.from_dict({**base, "world_size": 0, "nodes": 0, "status": "skipped", "skip_cause": cause,
                                 "skip_needs": needs, "reason": reason})


def failure_record(base: dict, exc: Exception) -> dict:
    """A cell that broke is a result the report shows (with the reason), not a hole that stops the summary."""
    import traceback

    from amprepro.train import oom

    traceback.print_exc()  # the whole traceback goes to the cell's log
    message = (str(exc).strip().splitlines() or [""])[0][:300]
    if oom.out_of_memory(exc):
        return oom.out_of_memory_record(base, message)
    return {**base, "status": "failed",
            "reason": f"{type(exc).__name__}: {message} (traceback in the cell's log; after fixing, rerun with "
                      "snakemake --forcerun <this cell's metrics.json>)"}


def numerics(rows: list[dict]) -> dict:
    nonfinite = [r["step"] for r in rows if not math.isfinite(r["loss"])]
    scales = [r["loss_scale"] for r in rows if r["loss_scale"] is not None]
    return {
        "nonfinite_steps": len(nonfinite),
        "first_nonfinite_step": nonfinite[0] if nonfinite else None,
        "skipped_steps": sum(1 for r in rows if r["skipped"]),
        "loss_scale_initial": scales[0] if scales else None,
        "loss_scale_final": scales[-1] if scales else None,
        "loss_scale_min": min(scales) if scales else None,
    }


def epoch_fields(settings: ModelSettings, tokens_per_s: float) -> dict:
    """The derived epoch time for the preset's stated token count (token models only): tokens / (tokens/s)."""
    tokens = settings.epoch_tokens
    if not tokens or settings.data != "synthetic_tokens":
        return {"epoch_tokens": tokens, "epoch_hours_derived": None}
    return {"epoch_tokens": tokens, "epoch_hours_derived": tokens / tokens_per_s / 3600}


def lora_fields(settings: ModelSettings, model, rows: list[dict], curve) -> dict:
    """A LoRA cell's own record (amprepro.train.lora.record) and where its loss started: the first step's training
    loss and the held-out loss before the first step (with eval_every), beside final_loss and heldout_loss_final."""
    if settings.lora is None:
        return {}
    from amprepro.train import lora

    first = curve.rows[0]["loss"] if curve.rows and curve.rows[0]["step"] == 0 else None
    return {**lora.record(model, lora.setting(settings)), "initial_loss": rows[0]["loss"],
            "heldout_loss_initial": first}


def write_results(args, metrics: CellRecord | dict, rows: list[dict]) -> None:
    """Steps first, metrics last: metrics.json only exists once the run is complete. args: the cell's command line
    (amprepro.train.train.parse_args), with the paths --steps and --metrics. metrics: the cell's record, or its dict
    (train.run's result), which goes through CellRecord: a key it does not know is refused before anything is
    written."""
    from amprepro.files import write_csv, write_json

    record = metrics if isinstance(metrics, CellRecord) else CellRecord.from_dict(metrics, source="the cell's record")
    fields = record.as_dict()
    write_csv(args.steps, rows, STEP_FIELDS)
    write_json(args.metrics, fields)
    print(f"{CellId.of(fields)}: {record.status} "
          f"{fields.get('reason', '')}")


def cell_apex(path: str | None) -> dict:
    from amprepro.files import read_json

    return read_json(path) if path else NO_APEX


def cell_plan(path: str | None) -> dict | None:
    from amprepro.files import read_json

    return read_json(path) if path else None

"""One table of every cell (with speedups against strict FP32 and against TF32) plus the software versions."""

from __future__ import annotations

import argparse
import json
import os
import sys

from amprepro import precisions
from amprepro.analysis import claimmetrics, fp8
from amprepro.cellid import CellId
from amprepro.cellrecord import CellRecord
from amprepro.files import read_json, write_csv, write_json
from amprepro.modelsettings import ModelSettings

COLUMNS = [
    "model", "precision", "seed", "status", "reason", "throughput_per_s", "throughput_unit", "step_time_median_s",
    "step_time_p90_s", "peak_allocated_bytes", "peak_reserved_bytes", "peak_rss_bytes", "final_loss",
    "eval_accuracy", "skipped_steps", "first_nonfinite_step", "loss_scale_final", "speedup_vs_fp32",
    "speedup_vs_tf32", "memory_ratio_vs_fp32", "achieved_tflops", "mfu_vs_measured_peak", "mfu_vs_datasheet",
    "energy_j_per_item", "skip_cause", "skip_needs",
    "epoch_hours_derived", "mem_weights_bytes", "mem_gradients_bytes", "mem_optimizer_state_bytes",
    "mem_master_weights_bytes", "mem_activations_bytes", "mem_estimate_total_bytes",
    "batch_size", "preset_batch_size", "shape", "shape_name", "parameters", "plan_note", "heldout_loss_final",
    "steps", "warmup_steps",  # what the cell was set to run (its spec): verify from a summary alone reads them
    "largest_batch", "largest_batch_bound", "largest_batch_failing", "largest_batch_grid",
    # LoRA cells (amprepro.train.lora; the LoRA claim, amprepro.analysis.loraclaim) and the allocator limit of a cap
    "lora_base", "lora_shape", "lora_rank", "trainable_parameters", "initial_loss", "heldout_loss_initial",
    "memory_limit_bytes",
    "gpu_shared_cells_per_gpu",  # set where the cell shared its GPU (amprepro.plan.resources.shares_gpu)
    "host_busy_cpus",  # CPUs' worth of other processes' work during the timed steps (amprepro.train.measure)
    *fp8.COLUMNS,  # against the precision's own baseline (FP8 against compiled bf16): amprepro.analysis.fp8
]
# Flat columns from metrics.json's nested memory records: (column, record, key).
MEMORY_COLUMNS = [
    ("mem_weights_bytes", "memory_breakdown_bytes", "weights"),
    ("mem_gradients_bytes", "memory_breakdown_bytes", "gradients"),
    ("mem_optimizer_state_bytes", "memory_breakdown_bytes", "optimizer_state"),
    ("mem_master_weights_bytes", "memory_breakdown_bytes", "master_weights"),
    ("mem_activations_bytes", "memory_breakdown_bytes", "activations_and_workspace"),
    ("mem_estimate_total_bytes", "memory_estimate", "total_bytes"),
]
KEY_PACKAGES = ["torch", "torchvision", "numpy", "scikit-learn", "snakemake", "papermill", "nbconvert", "apex"]


def ratio(numerator, denominator):
    return numerator / denominator if numerator and denominator else None


def peak_memory(row: dict):
    """GPU allocator peak where there is one; on CPU the process peak RSS (a coarser measure, labelled as such)."""
    return row.get("peak_allocated_bytes") or row.get("peak_rss_bytes")


def add_relative(rows: list[dict]) -> list[dict]:
    baseline = {CellId.of(r): r for r in rows if r["status"] == "ok"}
    for row in rows:
        fp32 = baseline.get(CellId.of(row).at("fp32"))
        tf32 = baseline.get(CellId.of(row).at("tf32"))
        ok = row["status"] == "ok"
        row["speedup_vs_fp32"] = ratio(row.get("throughput_per_s"), fp32 and fp32["throughput_per_s"]) if ok else None
        row["speedup_vs_tf32"] = ratio(row.get("throughput_per_s"), tf32 and tf32["throughput_per_s"]) if ok else None
        row["memory_ratio_vs_fp32"] = ratio(peak_memory(row), fp32 and peak_memory(fp32)) if ok else None
    return rows


def add_memory(rows: list[dict], metrics: list[dict]) -> list[dict]:
    """The measured split of the allocator peak (first training step) and the pre-allocation estimate, flattened."""
    for row, m in zip(rows, metrics):
        for column, record, key in MEMORY_COLUMNS:
            row[column] = (m.get(record) or {}).get(key)
    return rows


def add_sharing(rows: list[dict], metrics: list[dict]) -> list[dict]:
    """K where the cell ran on a GPU shared with up to K-1 other untimed cells (its throughput was measured so); the
    CPUs other processes kept busy during its timed steps (a compile beside it)."""
    for row, m in zip(rows, metrics):
        row["gpu_shared_cells_per_gpu"] = (m.get("gpu_shared") or {}).get("cells_per_gpu")
        row["host_busy_cpus"] = (m.get("host_load") or {}).get("busy_cpus_others")
    return rows


def add_mfu(rows: list[dict], metrics: list[dict], peak: dict) -> list[dict]:
    """MFU against the matmul peak measured in this pipeline run and against the datasheet (summed over the cell's
    GPUs in metrics.json), both stated."""
    for row, m in zip(rows, metrics):
        achieved = m.get("achieved_tflops")
        row["achieved_tflops"] = achieved
        row["energy_j_per_item"] = m.get("energy_j_per_item")
        measured = peak.get("tflops", {}).get(precisions.get(row["precision"]).peak_kind)
        gpus = m.get("world_size") or 1  # peak.json is one GPU's; a data-parallel cell computes on all of them
        row["mfu_vs_measured_peak"] = ratio(achieved, measured and measured * gpus)
        row["mfu_vs_datasheet"] = ratio(achieved, m.get("datasheet_peak_tflops"))
    return rows


def add_plan(rows: list[dict], metrics: list[dict]) -> list[dict]:
    """The batch (and LLaMA shape) each cell ran at, and the memory plan's reason (amprepro.plan.memplan)."""
    for row, m in zip(rows, metrics):
        settings = ModelSettings.of((m.get("spec") or {}).get("model_config") or {})
        plan = m.get("plan") or {}
        row["batch_size"] = settings.batch_size
        row["preset_batch_size"] = plan.get("preset_batch_size", settings.batch_size)
        row["shape"] = settings.shape
        row["shape_name"] = plan.get("shape_name")
        row["parameters"] = m.get("parameters")
        row["plan_note"] = plan.get("why")
        train = (m.get("spec") or {}).get("train") or {}
        row["steps"], row["warmup_steps"] = train.get("steps"), train.get("warmup_steps")
        lora = settings.lora  # from the spec: a skipped cell has no record of its own
        row["lora_base"] = None if lora is None else lora.base
        row["lora_shape"] = None if lora is None else settings.shape or settings.arch
    return rows


def largest_batch(asked: dict, records: list[dict]) -> dict:
    """The largest-batch searches (amprepro.train.batchsearch): which models were asked for, each record, and why there
    are none where there are none."""
    models = asked.get("models", [])
    why = asked.get("note") or ""
    if not models:
        why = "runs.largest_batch.models names no model"
    return {"models": models, "records": records, "why_none": "" if records else why}


def add_largest_batch(rows: list[dict], records: list[dict]) -> list[dict]:
    """Each search's answer on the row of the cell it started from (that model, precision and seed)."""
    found = {CellId.of(r): r for r in records if r.get("status") == "ok"}
    for row in rows:
        record = found.get(CellId.of(row))
        row.update(claimmetrics.largest_batch_fields(record))
    return rows


def memory_limit(metrics: list[dict]) -> float | None:
    """The emulated card's size (gpu_memory_limit_gib) the cells ran under, from their plan views."""
    return next((m["plan"].get("cap_gib") for m in metrics if (m.get("plan") or {}).get("cap_gib")), None)


def versions(environment: dict, apex: dict, metrics: list[dict]) -> dict:
    hardware = next((m["hardware"] for m in metrics if m.get("hardware")), {})
    packages = environment.get("packages", {})
    return {
        "python": environment.get("python", {}).get("version"),
        "torch": environment.get("torch", {}).get("version"),
        "cuda": environment.get("torch", {}).get("cuda"),
        "cudnn": environment.get("torch", {}).get("cudnn"),
        "nccl": environment.get("torch", {}).get("nccl"),
        "apex_status": apex.get("status"),
        "apex_commit": apex.get("commit"),
        "gpu": hardware.get("gpu_name"),
        "gpu_count": hardware.get("gpu_count"),
        "driver": hardware.get("driver"),
        "cpu": hardware.get("cpu"),
        "isolation": environment.get("isolation", {}).get("mode"),
        "gpu_memory_limit_gib": memory_limit(metrics),
        "gpu_memory_bytes": hardware.get("gpu_memory_bytes"),
        "packages": {name: packages.get(name) for name in KEY_PACKAGES if name in packages},
    }


class EnvironmentMismatch(ValueError):
    """environment.json describes another interpreter than the one the cells ran in."""


def interpreter_of_record(environment: dict) -> dict:
    torch = environment.get("torch") or {}
    return {"python": (environment.get("python") or {}).get("version"), "torch": torch.get("version"),
            "cuda": torch.get("cuda"), "prefix": (environment.get("isolation") or {}).get("prefix")}


def interpreter_of_cell(metrics: dict) -> dict:
    software = metrics.get("software") or {}
    return {key: software.get(key) for key in ("python", "torch", "cuda", "prefix")}


def differences(recorded: dict, cell: dict) -> list[str]:
    """The fields where the record and the cell differ; a field the cell did not record is not compared."""
    found = []
    for key in ("python", "torch", "cuda", "prefix"):
        if key not in cell or (cell[key] is None and key in ("prefix", "python")):
            continue
        a, b = recorded.get(key), cell[key]
        if key == "prefix" and a and b:
            a, b = os.path.realpath(a), os.path.realpath(b)
        if a != b:
            found.append(key)
    return found


def describe(interpreter: dict) -> str:
    return (f"python {interpreter.get('python')} at {interpreter.get('prefix')}, torch {interpreter.get('torch')}, "
            f"CUDA {interpreter.get('cuda')}")


def check_environment(environment: dict, metrics: list[dict], env_path: str = "environment.json") -> None:
    """Every cell ran in the interpreter environment.json describes, or EnvironmentMismatch naming both: a report whose
    provenance describes another Python than the cells' is never written."""
    recorded = interpreter_of_record(environment)
    for m in metrics:
        if not m.get("software"):
            continue
        cell = interpreter_of_cell(m)
        if differences(recorded, cell):
            raise EnvironmentMismatch(
                f"{env_path} describes {describe(recorded)}, but cell {CellId.of(m)} "
                f"ran in {describe(cell)}. The record was made by another Python than the cells' (a run started "
                "with another `python` first on PATH). Fix: run `make run` again, or `snakemake --forcerun "
                "environment` from the shell the cells run in (venv active), to record the cells' interpreter.")


def summarize(metric_files: list[str], environment: dict, apex: dict, preset: dict, peak: dict | None = None,
              env_path: str = "environment.json", largest_batch_files: list[str] = (),
              largest_batch_asked: dict | None = None) -> dict:
    # every cell's metrics.json through its record: a key no writer puts there is refused, naming the file
    metrics = [CellRecord.read(path).as_dict() for path in metric_files]
    check_environment(environment, metrics, env_path)
    rows = add_relative([{c: m.get(c) for c in COLUMNS if c in m} | {"model": m["model"], "precision": m["precision"],
                                                                     "seed": m["seed"], "status": m["status"]}
                         for m in metrics])
    rows = add_sharing(add_plan(add_memory(add_mfu(rows, metrics, peak or {}), metrics), metrics), metrics)
    rows = fp8.add_baseline(rows, metrics, metric_files)
    searches = [read_json(path) for path in largest_batch_files]
    rows = add_largest_batch(rows, searches)
    counts = {status: sum(r["status"] == status for r in rows) for status in ("ok", "skipped", "collapsed", "failed")}
    return {"preset": preset, "cells": rows, "counts": counts, "versions": versions(environment, apex, metrics),
            "peak": peak or {}, "largest_batch": largest_batch(largest_batch_asked or {}, searches)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--metrics", nargs="+", required=True)
    parser.add_argument("--env", required=True)
    parser.add_argument("--apex", required=True)
    parser.add_argument("--peak", required=True)
    parser.add_argument("--preset", required=True, help="JSON: which preset ran and why")
    parser.add_argument("--largest-batch", nargs="*", default=[], help="results/largest_batch/<model>/<precision>.json")
    parser.add_argument("--largest-batch-asked", default="{}", help="JSON: runs.largest_batch.models and, where no "
                        "search runs, why")
    parser.add_argument("--csv", required=True)
    parser.add_argument("--json", required=True)
    args = parser.parse_args(argv)
    try:
        summary = summarize(args.metrics, read_json(args.env), read_json(args.apex), json.loads(args.preset),
                            read_json(args.peak), env_path=args.env, largest_batch_files=args.largest_batch,
                            largest_batch_asked=json.loads(args.largest_batch_asked))
    except EnvironmentMismatch as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        sys.exit(1)
    write_csv(args.csv, summary["cells"], COLUMNS)
    write_json(args.json, summary)
    print(f"summary: {len(summary['cells'])} cells, {summary['counts']}")


if __name__ == "__main__":
    main()

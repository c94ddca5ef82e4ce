"""The reference of one GPU model: several independent runs, and per cell their median and observed spread.

    reference/<gpu-slug>/runs/<run-id>/summary.csv      a run's results/summary/summary.csv, unchanged
    reference/<gpu-slug>/runs/<run-id>/provenance.json  GPU, driver, CUDA, cuDNN, torch, apex, machine, note, settings
    reference/<gpu-slug>/runs/<run-id>/steps.tar.gz     every cell's steps.csv (absent where the run did not keep them;
                                                         its provenance says so under "steps")
    reference/<gpu-slug>/aggregate.json                 per cell: median, min, max, n runs, n machines
                                                         (what verify reads)

A run id is the date the run was recorded and the first 8 hex digits of its summary.csv's sha256. A machine is named by
its host name and the UUIDs of the GPUs its cells ran on: runs of several processes on one machine are several runs
but one machine. aggregate.json lists every run's summary.csv hash, so a stale aggregate is refused, not used.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import jsonschema
import yaml

from amprepro.cellid import CellId
from amprepro.files import read_json, write_json
from amprepro.schemaerrors import bounded_message, field_name, first_error

RUN_ID = re.compile(r"^\d{4}-\d{2}-\d{2}-[0-9a-f]{8}$")
SOFTWARE_KEYS = ("torch", "cuda", "cudnn", "apex_commit")  # a change here can move every number
MACHINE_KEYS = ("driver", "gpu_count")
NUMERIC = {"throughput_per_s", "step_time_median_s", "step_time_p90_s", "peak_allocated_bytes", "peak_reserved_bytes",
           "peak_rss_bytes", "final_loss", "eval_accuracy", "skipped_steps", "first_nonfinite_step", "loss_scale_final",
           "speedup_vs_fp32", "speedup_vs_tf32", "memory_ratio_vs_fp32"}
AGGREGATED = ["throughput_per_s", "peak_allocated_bytes", "peak_reserved_bytes", "final_loss", "eval_accuracy",
              "step_time_median_s", "step_time_p90_s", "speedup_vs_fp32", "speedup_vs_tf32", "memory_ratio_vs_fp32"]
# Settings that change how long a cell runs but not what a timed step measures: the median step time and the allocator
# peak (reached in the first steps). A run that differs from the newest only in these still counts for the metrics
# below; its loss after the last step and its accuracy do not, and verify compares such a cell on these only. The
# warm-up counts too: over the committed runs, the median of steps 3-12 was within 5.7 % of that of steps 10-29 in
# all 238 compared cells, compiled and FP8 ones within 2.6 % (results-reference/perf/steps-budget-reference/).
STEP_COUNTS = ("steps", "warmup_steps")
STEP_COUNT_FREE = {"throughput_per_s", "peak_allocated_bytes", "peak_reserved_bytes", "step_time_median_s",
                   "step_time_p90_s", "speedup_vs_fp32", "speedup_vs_tf32", "memory_ratio_vs_fp32"}
# The others (the loss after the last step, the accuracy) hold only for the counts a run ran: a cell's aggregate keeps
# them for the newest run's counts (its "metrics") and, under "by_step_counts", for each other counts its runs ran, so
# that a run at older counts is still compared with the runs at its own (the 7B cells went from 3 + 7 steps to 2 + 4
# and back, 68b578b and 5706dee).
STEP_COUNT_BOUND = [metric for metric in AGGREGATED if metric not in STEP_COUNT_FREE]


def counts_key(steps, warmup_steps) -> str:
    """by_step_counts' key for (steps, warm-up steps): '10 steps, 3 warm-up'."""
    return f"{steps} steps, {warmup_steps} warm-up"


class ReferenceError(ValueError):
    """A reference folder or a results directory is wrong; the message names the file and the fix."""


def gpu_slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def _num(value):
    if value in (None, ""):
        return None
    try:
        number = float(value)
    except ValueError:
        return value
    return int(number) if number.is_integer() and abs(number) < 2**53 and "." not in str(value) else number


def parse_summary_csv(text: str, where: str) -> list[dict]:
    rows = []
    for line, row in enumerate(csv.DictReader(io.StringIO(text)), start=2):
        for key in ("model", "precision", "seed", "status"):
            if not row.get(key):
                raise ReferenceError(f"{where}:{line}: column {key!r} is empty.")
        parsed = {k: (_num(v) if k in NUMERIC else (v if v != "" else None)) for k, v in row.items()}
        parsed["seed"] = int(row["seed"])
        rows.append(parsed)
    return rows


# ----------------------------------------------------------------------------------------------------------------------
# Band rules (reference/tolerances.yaml) and the band of one cell


# Fallback where no tolerances.yaml exists (test fixtures); reference/tolerances.yaml states and justifies its own.
DEFAULT_TOLERANCES = {
    "metrics": {
        "throughput_per_s": {"rel_floor": 0.10, "k": 2.0},
        "peak_allocated_bytes": {"rel_floor": 0.05, "k": 2.0},
        "final_loss": {"rel_floor": 0.05, "k": 2.0},
    },
    "overrides": [],
}
_RULE = {
    "type": "object", "additionalProperties": False, "required": ["k"],
    "oneOf": [{"required": ["rel_floor"]}, {"required": ["abs_floor"]}],
    "properties": {
        "rel_floor": {"type": "number", "exclusiveMinimum": 0, "maximum": 1,
                      "description": "smallest half-width, relative to the reference median"},
        "abs_floor": {"type": "number", "exclusiveMinimum": 0,
                      "description": "smallest half-width, in the metric's unit"},
        "k": {"type": "number", "minimum": 0, "description": "half-width = max(floor, k x the runs' observed range)"},
    },
}
_METRIC_RULES = {"type": "object", "propertyNames": {"enum": AGGREGATED},
                 "additionalProperties": {"oneOf": [_RULE, {"type": "null"}]}}
TOLERANCE_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object", "additionalProperties": False,
    "properties": {
        "metrics": _METRIC_RULES,
        "overrides": {"type": "array", "items": {
            "type": "object", "additionalProperties": False, "required": ["match", "metrics"],
            "properties": {
                "match": {"type": "object", "additionalProperties": False, "minProperties": 1, "properties": {
                    "model": {"type": "array", "items": {"type": "string"}},
                    "precision": {"type": "array", "items": {"type": "string"}},
                    "seed": {"type": "array", "items": {"type": "integer"}}}},
                "metrics": _METRIC_RULES,
            }}},
        "note": {"type": "string"},
    },
}


def load_tolerances(reference_dir: Path, slug: str | None) -> dict:
    """Defaults, then reference/tolerances.yaml, then reference/<slug>/tolerances.yaml (metric by metric)."""
    merged = json.loads(json.dumps(DEFAULT_TOLERANCES))
    sources = ["built-in defaults"]
    for path in [Path(reference_dir) / "tolerances.yaml"] + ([Path(reference_dir) / slug / "tolerances.yaml"]
                                                             if slug else []):
        if not path.exists():
            continue
        data = yaml.safe_load(path.read_text()) or {}
        error = first_error(jsonschema.Draft202012Validator(TOLERANCE_SCHEMA), data)
        if error is not None:
            raise ReferenceError(f"{path}: field {field_name(error)}: {bounded_message(error)}; each metric takes "
                                 "{rel_floor: F, k: K} or {abs_floor: F, k: K}, or null.")
        merged["metrics"].update(data.get("metrics") or {})
        merged["overrides"] += data.get("overrides") or []
        sources.append(str(path))
    merged["metrics"] = {k: v for k, v in merged["metrics"].items() if v}
    merged["sources"] = sources
    return merged


def band_for(tolerances: dict, cell: dict) -> dict:
    """metric -> its band rule ({rel_floor|abs_floor, k}) for this cell, overrides applied in order."""
    rules = dict(tolerances["metrics"])
    for override in tolerances.get("overrides", []):
        match = override["match"]
        if all(cell.get(key) in values for key, values in match.items()):
            rules.update(override["metrics"])
    return {k: v for k, v in rules.items() if v}


def band(rule: dict, stats: dict) -> dict:
    """The band around the reference median: half-width max(floor, k x observed range), and which one won."""
    median, spread = stats["median"], stats["max"] - stats["min"]
    if "rel_floor" in rule:
        observed = spread / abs(median) if median else 0.0
        floor, kind = rule["rel_floor"], "relative"
    else:
        observed, floor, kind = spread, rule["abs_floor"], "absolute"
    half = max(floor, rule["k"] * observed)
    from_spread = rule["k"] * observed > floor
    why = (f"{rule['k']:g} x the observed range over {stats['n']} runs" if from_spread else
           "the floor: one run, no spread" if stats["n"] == 1 else
           f"the floor (the {stats['n']} runs' range x {rule['k']:g} is smaller)")
    return {"kind": kind, "half_width": half, "from": "spread" if from_spread else "floor", "why": why,
            "n_runs": stats["n"]}


# ----------------------------------------------------------------------------------------------------------------------
# One run


@dataclass
class Run:
    id: str
    provenance: dict
    rows: dict = field(default_factory=dict)  # cell key -> summary row

    @property
    def machine_id(self) -> str | None:
        return (self.provenance.get("machine") or {}).get("id")

    @property
    def specs(self) -> dict:
        return self.provenance.get("specs") or {}


def read_run(folder: Path) -> Run:
    if not RUN_ID.match(folder.name):
        raise ReferenceError(f"{folder}: a run folder is named <YYYY-MM-DD>-<8 hex digits>; rename or remove it.")
    for name in ("summary.csv", "provenance.json"):
        if not (folder / name).is_file():
            raise ReferenceError(f"{folder}/{name} is missing: every run keeps its summary.csv and provenance.json.")
    text = (folder / "summary.csv").read_text()
    rows = parse_summary_csv(text, str(folder / "summary.csv"))
    return Run(folder.name, read_json(folder / "provenance.json"),
               {CellId.of(r).reference_key: r for r in rows})  # as aggregate.json keys its cells


def read_runs(reference: Path) -> list[Run]:
    """Every run of a GPU model's reference, oldest first (by recording date, then id)."""
    runs = [read_run(p) for p in sorted((reference / "runs").iterdir()) if p.is_dir()] \
        if (reference / "runs").is_dir() else []
    return sorted(runs, key=lambda r: (r.provenance.get("created_utc", ""), r.id))


def summary_sha256(folder: Path) -> str:
    return hashlib.sha256((folder / "summary.csv").read_bytes()).hexdigest()


# ----------------------------------------------------------------------------------------------------------------------
# The aggregate


def value_stats(values: list[float]) -> dict | None:
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def ok_values(key: str, runs: list[Run], metric: str) -> list[float]:
    """The metric of the cell in the runs where it ran ok and recorded a number."""
    return [run.rows[key][metric] for run in runs
            if run.rows[key]["status"] == "ok" and isinstance(run.rows[key].get(metric), (int, float))]


def machine_count(runs: list[Run]) -> int:
    return len({run.machine_id for run in runs if run.machine_id})


def aggregate_cell(key: str, runs: list[Run]) -> dict:
    """The cell over the runs that measured it with the newest run's settings, on a machine that could run it."""
    present = [run for run in runs if key in run.rows]
    newest_spec = next((run.specs[key] for run in reversed(present) if run.specs.get(key)), None)
    used, excluded, partly = [], {}, {}
    for run in present:
        row, spec = run.rows[key], run.specs.get(key)
        if newest_spec and spec and spec != newest_spec and not differs_only_in_step_counts(spec, newest_spec):
            excluded[run.id] = "its settings differ from the newest run's"
        elif row["status"] == "skipped" and row.get("skip_cause") == "machine":
            excluded[run.id] = f"not comparable on that machine: {row.get('reason') or 'no reason given'}"
        elif row["status"] == "failed":  # a bug in that run, fixed or to be fixed: not what a cell should give
            excluded[run.id] = f"failed in that run: {row.get('reason') or 'no reason given'}"
        else:
            used.append(run)
            if newest_spec and spec and spec != newest_spec:
                partly[run.id] = f"{step_counts(spec, newest_spec)}: counted for step time, throughput and memory only"
    statuses = Counter(run.rows[key]["status"] for run in used)
    last = present[-1].rows[key]
    cell = {"model": last["model"], "precision": last["precision"], "seed": last["seed"], "spec": newest_spec,
            "runs": [run.id for run in used], "excluded_runs": excluded, "partly_used_runs": partly,
            "n_runs": len(used),
            "n_machines": machine_count(used),
            "statuses": dict(sorted(statuses.items())), "metrics": {}}
    if not used:
        last_left_out = next(run.rows[key] for run in reversed(present) if run.id in excluded)
        cell.update(status="failed" if last_left_out["status"] == "failed" else "skipped",
                    skip_cause=last_left_out.get("skip_cause"), reason=last_left_out.get("reason"))
        return cell
    cell["status"] = next(iter(statuses)) if len(statuses) == 1 else "mixed"
    cell["reason"] = "; ".join(sorted({run.rows[key]["reason"] for run in used if run.rows[key].get("reason")})) or None
    for metric in AGGREGATED:
        stats = value_stats(ok_values(key, [run for run in used if metric in STEP_COUNT_FREE or run.id not in partly],
                                      metric))
        if stats:
            cell["metrics"][metric] = stats
    by_counts = by_step_counts(key, [run for run in used if run.id in partly])
    if by_counts:
        cell["by_step_counts"] = by_counts
    return cell


def by_step_counts(key: str, runs: list[Run]) -> dict:
    """The step-count-bound metrics (STEP_COUNT_BOUND) of runs at other counts than the newest's, per counts."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        train = run.specs[key].get("train", {})
        groups.setdefault(counts_key(train.get("steps"), train.get("warmup_steps")), []).append(run)
    out = {}
    for counts, group in groups.items():
        metrics = {}
        for metric in STEP_COUNT_BOUND:
            stats = value_stats(ok_values(key, group, metric))
            if stats:
                metrics[metric] = stats
        if metrics:
            out[counts] = {"runs": [run.id for run in group], "n_machines": machine_count(group), "metrics": metrics}
    return out


def step_counts(spec: dict, newest: dict) -> str:
    """'50 steps, not 30'; with the warm-up where that differs too: '30 steps (10 warm-up), not 13 (3 warm-up)'."""
    this, that = spec.get("train", {}), newest.get("train", {})
    if this.get("warmup_steps") == that.get("warmup_steps"):
        return f"{this.get('steps')} steps, not {that.get('steps')}"
    return (f"{this.get('steps')} steps ({this.get('warmup_steps')} warm-up), not {that.get('steps')} "
            f"({that.get('warmup_steps')} warm-up)")


def differs_only_in_step_counts(spec: dict, newest: dict) -> bool:
    """Same model, precision, seed and settings; only the number of steps (warm-up or timed) differs."""
    def without_counts(s):
        return {**s, "train": {k: v for k, v in s.get("train", {}).items() if k not in STEP_COUNTS}}

    return without_counts(spec) == without_counts(newest)


def stack_of(provenance: dict) -> dict:
    machine = provenance.get("machine") or {}
    return {**{k: provenance.get(k) for k in SOFTWARE_KEYS}, "driver": provenance.get("driver"),
            "gpu_count": machine.get("gpu_count")}


def aggregate(runs: list[Run]) -> dict:
    keys = list(dict.fromkeys(key for run in runs for key in run.rows))
    return {
        "gpu": runs[-1].provenance.get("gpu") if runs else None,
        "n_runs": len(runs), "n_machines": machine_count(runs),
        "runs": {run.id: {"created_utc": run.provenance.get("created_utc"), "note": run.provenance.get("note", ""),
                          "machine": run.provenance.get("machine"), "stack": stack_of(run.provenance),
                          "summary_csv_sha256": run.provenance.get("summary_csv_sha256"),
                          "steps_kept": (run.provenance.get("steps") or {}).get("kept", False)}
                 for run in runs},
        "cells": {key: aggregate_cell(key, runs) for key in keys},
    }


def rebuild(reference: Path) -> dict:
    """Recompute aggregate.json from runs/ (after adding or removing a run)."""
    runs = read_runs(reference)
    if not runs:
        raise ReferenceError(f"{reference}/runs/ holds no run: add one with "
                             "`python -m amprepro.verify.verify promote`.")
    for run in runs:
        actual = summary_sha256(reference / "runs" / run.id)
        if run.provenance.get("summary_csv_sha256") not in (None, actual):
            raise ReferenceError(f"{reference}/runs/{run.id}/summary.csv does not match the sha256 in its "
                                 "provenance.json: a reference run is never edited; restore it from git.")
    result = aggregate(runs)
    write_json(reference / "aggregate.json", result)
    return result


def load_aggregate(reference: Path) -> dict:
    """aggregate.json, refused when runs/ changed since it was built (a run added, removed or edited)."""
    path = reference / "aggregate.json"
    if not path.exists():
        if (reference / "summary.csv").exists():
            raise ReferenceError(f"{reference} has the old one-run layout (summary.csv at the top); move it to "
                                 "runs/<run-id>/ as reference/README.md describes, then run "
                                 f"`python -m amprepro.verify.verify rebuild --reference {reference}`.")
        raise ReferenceError(f"{path} is missing: build it with `python -m amprepro.verify.verify rebuild --reference "
                             f"{reference}`.")
    data = read_json(path)
    on_disk = {p.name: summary_sha256(p) for p in sorted((reference / "runs").glob("*")) if p.is_dir()} \
        if (reference / "runs").is_dir() else {}
    recorded = {run_id: run.get("summary_csv_sha256") for run_id, run in data.get("runs", {}).items()}
    if on_disk != recorded:
        raise ReferenceError(f"{path} does not match {reference}/runs/ (a run was added, removed or edited since it "
                             "was built): rebuild it with "
                             f"`python -m amprepro.verify.verify rebuild --reference {reference}`.")
    return data

"""Compare this run, cell by cell, with the committed reference results of the same GPU model.

Reference layout (reference/README.md): ``reference/<gpu-slug>/summary.csv`` (a real run's results/summary/summary.csv)
and ``provenance.json`` (where, when and with what it was measured, plus every cell's settings), optionally
``tolerances.yaml``; ``reference/tolerances.yaml`` holds the default bands. The slug is the GPU name in lower case
with runs of other characters as '-': "NVIDIA H200" -> nvidia-h200.

Subcommands:
  compare   write results/verify/verify.json (+ .csv); exit 0 unless --strict and a cell is out of tolerance
  gate      read verify.json, print the outcome, exit 1 when a cell is out of tolerance (the `verify` target)
  promote   make reference/<gpu-slug>/ from a real GPU run's results (refuses a CPU run and an existing reference)

Statuses: pass, fail (a cell out of tolerance, or ran in one and not the other), no_reference (no reference for this
GPU model, or no GPU: exit 0 with a warning), not_comparable (a reference exists but no cell has the same settings).
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import yaml

from amprepro.files import read_json, write_csv, write_json

DEFAULT_TOLERANCES = {
    "metrics": {
        "throughput_per_s": {"ratio": [0.90, 1.10]},
        "peak_allocated_bytes": {"ratio": [0.95, 1.05]},
        "final_loss": {"ratio": [0.95, 1.05]},
    },
    "overrides": [],
}
METRIC_LABEL = {"throughput_per_s": "throughput", "peak_allocated_bytes": "peak GPU memory",
                "peak_reserved_bytes": "peak reserved GPU memory", "final_loss": "final loss",
                "eval_accuracy": "eval accuracy", "step_time_median_s": "median step time",
                "speedup_vs_fp32": "speedup vs strict FP32", "speedup_vs_tf32": "speedup vs TF32",
                "memory_ratio_vs_fp32": "memory ratio vs FP32"}
COMPARABLE = list(METRIC_LABEL)
_BAND = {
    "type": "object", "additionalProperties": False, "minProperties": 1,
    "properties": {
        "ratio": {"type": "array", "items": {"type": "number", "exclusiveMinimum": 0}, "minItems": 2, "maxItems": 2,
                  "description": "[low, high]: this run / reference must lie inside"},
        "abs": {"type": "number", "minimum": 0, "description": "|this run - reference| must be at most this"},
    },
}
TOLERANCE_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object", "additionalProperties": False,
    "properties": {
        "metrics": {"type": "object", "propertyNames": {"enum": COMPARABLE},
                    "additionalProperties": {"oneOf": [_BAND, {"type": "null"}]}},
        "overrides": {"type": "array", "items": {
            "type": "object", "additionalProperties": False, "required": ["match", "metrics"],
            "properties": {
                "match": {"type": "object", "additionalProperties": False, "minProperties": 1, "properties": {
                    "model": {"type": "array", "items": {"type": "string"}},
                    "precision": {"type": "array", "items": {"type": "string"}},
                    "seed": {"type": "array", "items": {"type": "integer"}}}},
                "metrics": {"type": "object", "propertyNames": {"enum": COMPARABLE},
                            "additionalProperties": {"oneOf": [_BAND, {"type": "null"}]}},
            }}},
        "note": {"type": "string"},
    },
}
NUMERIC = {"throughput_per_s", "step_time_median_s", "step_time_p90_s", "peak_allocated_bytes", "peak_reserved_bytes",
           "peak_rss_bytes", "final_loss", "eval_accuracy", "skipped_steps", "first_nonfinite_step", "loss_scale_final",
           "speedup_vs_fp32", "speedup_vs_tf32", "memory_ratio_vs_fp32"}
CSV_COLUMNS = ["model", "precision", "seed", "verdict", "status_here", "status_reference", "metric", "here",
               "reference", "ratio", "allowed", "deviation_pct", "note"]


class VerifyError(ValueError):
    """A reference or tolerance file is wrong; the message names the file and field."""


# ----------------------------------------------------------------------------------------------------------------------
# Reference files


def reference_inputs(reference_dir: str | Path = "reference") -> list[str]:
    """Every reference and tolerance file, for a rule's input: changing one re-runs the comparison."""
    folder = Path(reference_dir)
    if not folder.is_dir():
        return []
    return sorted(str(p) for p in folder.rglob("*") if p.is_file() and p.suffix in (".csv", ".json", ".yaml"))


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


def read_reference_rows(path: Path) -> list[dict]:
    rows = []
    with open(path, newline="") as handle:
        for line, row in enumerate(csv.DictReader(handle), start=2):
            for key in ("model", "precision", "seed", "status"):
                if not row.get(key):
                    raise VerifyError(f"{path}:{line}: column {key!r} is empty.")
            parsed = {k: (_num(v) if k in NUMERIC else (v if v != "" else None)) for k, v in row.items()}
            parsed["seed"] = int(row["seed"])
            rows.append(parsed)
    return rows


def load_tolerances(reference_dir: Path, slug: str | None) -> dict:
    """Defaults, then reference/tolerances.yaml, then reference/<slug>/tolerances.yaml (metric by metric)."""
    merged = json.loads(json.dumps(DEFAULT_TOLERANCES))
    sources = ["built-in defaults"]
    for path in [reference_dir / "tolerances.yaml"] + ([reference_dir / slug / "tolerances.yaml"] if slug else []):
        if not path.exists():
            continue
        data = yaml.safe_load(path.read_text()) or {}
        errors = sorted(jsonschema.Draft202012Validator(TOLERANCE_SCHEMA).iter_errors(data),
                        key=lambda e: -len(list(e.absolute_path)))
        if errors:
            where = ".".join(str(p) for p in errors[0].absolute_path) or "(top level)"
            raise VerifyError(f"{path}: field {where}: {errors[0].message}.")
        merged["metrics"].update(data.get("metrics") or {})
        merged["overrides"] += data.get("overrides") or []
        sources.append(str(path))
    merged["metrics"] = {k: v for k, v in merged["metrics"].items() if v}
    merged["sources"] = sources
    return merged


def band_for(tolerances: dict, cell: dict) -> dict:
    bands = dict(tolerances["metrics"])
    for override in tolerances.get("overrides", []):
        match = override["match"]
        if all(cell.get(key) in values for key, values in match.items()):
            bands.update(override["metrics"])
    return {k: v for k, v in bands.items() if v}


def cell_specs(runs_dir: str | Path | None) -> dict:
    """'model/precision/seed' -> the cell's full settings, from its metrics.json."""
    specs = {}
    if runs_dir and Path(runs_dir).is_dir():
        for path in sorted(Path(runs_dir).glob("*/*/seed*/metrics.json")):
            try:
                metrics = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if metrics.get("spec"):
                specs[f"{metrics['model']}/{metrics['precision']}/{metrics['seed']}"] = metrics["spec"]
    return specs


def _spec_diff(here: dict, ref: dict, prefix: str = "") -> list[str]:
    diffs = []
    for key in sorted(set(here) | set(ref)):
        a, b = here.get(key), ref.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            diffs += _spec_diff(a, b, f"{prefix}{key}.")
        elif a != b:
            diffs.append(f"{prefix}{key} {b!r} in the reference, {a!r} here")
    return diffs


# ----------------------------------------------------------------------------------------------------------------------
# Comparison


def _fmt(metric: str, value) -> str:
    if value is None:
        return "n/a"
    if metric.endswith("_bytes"):
        return f"{value / 2**30:.2f} GiB"
    if metric == "throughput_per_s":
        return f"{value:,.1f}/s"
    if metric.endswith("_s"):
        return f"{value * 1000:.2f} ms"
    return f"{value:.4g}"


def check_metric(metric: str, band: dict, here, ref) -> dict:
    out = {"metric": metric, "here": here, "reference": ref, "ratio": None, "ok": True, "allowed": "", "note": ""}
    if here is None or ref is None:
        out["note"] = "not recorded " + ("here" if here is None else "in the reference")
        out["ok"] = None
        return out
    if "ratio" in band:
        low, high = band["ratio"]
        out["allowed"] = f"{low:g}–{high:g}× reference"
        if not ref:
            out.update(ok=here == ref, note="reference value is 0")
            return out
        ratio = here / ref
        out["ratio"] = ratio
        out["deviation_pct"] = (ratio - 1) * 100
        out["ok"] = low - 1e-12 <= ratio <= high + 1e-12
        if not out["ok"]:
            edge = low if ratio < low else high
            out["outside_pct"] = (ratio - edge) / edge * 100
    if "abs" in band and out["ok"] is not False:
        diff = here - ref
        out["allowed"] = (out["allowed"] + "; " if out["allowed"] else "") + f"±{band['abs']:g}"
        out["deviation_abs"] = diff
        out["ok"] = abs(diff) <= band["abs"] + 1e-12
        if out["ratio"] is None and ref:
            out["ratio"] = here / ref
            out["deviation_pct"] = (here / ref - 1) * 100
    return out


def describe_failure(key: str, check: dict) -> str:
    metric = check["metric"]
    label = METRIC_LABEL.get(metric, metric)
    text = f"{key}: {label} {_fmt(metric, check['here'])} vs reference {_fmt(metric, check['reference'])}"
    if check.get("ratio") is not None:
        text += f" = {check['ratio']:.3f}× ({check['deviation_pct']:+.1f} %"
        if check.get("outside_pct") is not None:
            text += f", {abs(check['outside_pct']):.1f} % {'below' if check['outside_pct'] < 0 else 'above'} the band"
        text += ")"
    elif check.get("deviation_abs") is not None:
        text += f" (difference {check['deviation_abs']:+.4g})"
    return text + f"; allowed {check['allowed']}"


def compare(summary: dict, reference_rows: list[dict], tolerances: dict, specs_here: dict | None = None,
            specs_ref: dict | None = None) -> dict:
    """Per-cell comparison. Returns cells, failures (the cells out of tolerance) and warnings."""
    specs_here, specs_ref = specs_here or {}, specs_ref or {}
    here = {(c["model"], c["precision"], int(c["seed"])): c for c in summary.get("cells", [])}
    ref = {(c["model"], c["precision"], int(c["seed"])): c for c in reference_rows}
    cells, failures, warnings = [], [], []
    for key in list(here) + [k for k in ref if k not in here]:
        name = f"{key[0]}/{key[1]}/seed{key[2]}"
        spec_key = f"{key[0]}/{key[1]}/{key[2]}"
        row_here, row_ref = here.get(key), ref.get(key)
        cell = {"model": key[0], "precision": key[1], "seed": key[2], "cell": name,
                "status_here": row_here and row_here["status"], "status_reference": row_ref and row_ref["status"],
                "checks": [], "verdict": "pass", "note": ""}
        cells.append(cell)
        if row_ref is None:
            cell.update(verdict="not_in_reference", note="the reference has no such cell")
            continue
        if row_here is None:
            cell.update(verdict="not_run_here", note="in the reference, not in this run's matrix")
            continue
        if specs_here.get(spec_key) and specs_ref.get(spec_key) and specs_here[spec_key] != specs_ref[spec_key]:
            diff = _spec_diff(specs_here[spec_key], specs_ref[spec_key])
            cell.update(verdict="not_comparable", note="settings differ: " + "; ".join(diff))
            continue
        if row_here["status"] != row_ref["status"]:
            why = row_here.get("reason") or row_ref.get("reason") or ""
            cell.update(verdict="fail", note=f"status {row_here['status']} here, {row_ref['status']} in the reference"
                        + (f" ({why})" if why else ""))
            failures.append(f"{name}: {cell['note']}")
            continue
        if row_here["status"] != "ok":
            cell["note"] = f"{row_here['status']} in both"
            continue
        for metric, band in band_for(tolerances, {"model": key[0], "precision": key[1], "seed": key[2]}).items():
            check = check_metric(metric, band, row_here.get(metric), row_ref.get(metric))
            cell["checks"].append(check)
            if check["ok"] is False:
                cell["verdict"] = "fail"
                failures.append(describe_failure(name, check))
    counts = {v: sum(c["verdict"] == v for c in cells)
              for v in ("pass", "fail", "not_comparable", "not_in_reference", "not_run_here")}
    if counts["not_comparable"]:
        warnings.append(f"{counts['not_comparable']} cell(s) not compared: their settings differ from the reference's")
    if counts["not_in_reference"]:
        warnings.append(f"{counts['not_in_reference']} cell(s) of this run are not in the reference")
    if counts["not_run_here"]:
        warnings.append(f"{counts['not_run_here']} reference cell(s) did not run here")
    return {"cells": cells, "failures": failures, "warnings": warnings, "counts": counts}


def provenance_differences(summary: dict, provenance: dict) -> list[str]:
    versions = summary.get("versions", {})
    notes = []
    for key in ("gpu", "driver", "cuda", "cudnn", "torch", "apex_commit", "gpu_count"):
        if provenance.get(key) != versions.get(key):
            notes.append(f"{key}: {provenance.get(key)} in the reference, {versions.get(key)} here")
    return notes


def verify(summary: dict, reference_dir: str | Path = "reference", runs_dir: str | Path | None = None) -> dict:
    """The whole check: which reference applies, the comparison, one status and one message."""
    reference_dir = Path(reference_dir)
    gpu = summary.get("versions", {}).get("gpu")
    preset = summary.get("preset", {}).get("preset", "?")
    result = {"gpu": gpu, "slug": gpu_slug(gpu) if gpu else None, "reference": None, "cells": [], "failures": [],
              "warnings": [], "counts": {}, "differences": []}
    result["tolerances"] = load_tolerances(reference_dir, result["slug"])
    if not gpu:
        result.update(status="no_reference", message=(
            f"this run has no GPU ({preset} preset on CPU); reference results are per GPU model, so nothing was "
            "compared"))
        return result
    folder = reference_dir / result["slug"]
    if not (folder / "summary.csv").exists():
        available = sorted(p.parent.name for p in reference_dir.glob("*/summary.csv"))
        result.update(status="no_reference", message=(
            f"no reference results for {gpu} ({folder}/summary.csv does not exist"
            + (f"; references exist for: {', '.join(available)}" if available else "; no reference is committed yet")
            + "); nothing was compared"))
        return result
    provenance = read_json(folder / "provenance.json") if (folder / "provenance.json").exists() else {}
    rows = read_reference_rows(folder / "summary.csv")
    outcome = compare(summary, rows, result["tolerances"], cell_specs(runs_dir), provenance.get("specs"))
    result.update(outcome)
    result["reference"] = {"path": str(folder), "provenance": {k: v for k, v in provenance.items() if k != "specs"}}
    result["differences"] = provenance_differences(summary, provenance) if provenance else [
        f"{folder}/provenance.json is missing: the reference's origin is unknown"]
    compared = outcome["counts"]["pass"] + outcome["counts"]["fail"]
    recorded = provenance.get("created_utc", "date unknown")
    if outcome["failures"]:
        result["status"] = "fail"
        result["message"] = (f"{outcome['counts']['fail']} of {compared} cells out of tolerance against {folder} "
                             f"({gpu}, recorded {recorded})")
    elif compared == 0:
        result["status"] = "not_comparable"
        result["message"] = f"a reference exists ({folder}) but no cell of this run is comparable with it"
    else:
        result["status"] = "pass"
        result["message"] = f"all {compared} compared cells within tolerance of {folder} ({gpu}, recorded {recorded})"
    return result


def run_verify(summary_path: str, reference_dir: str, runs_dir: str | None, claims_path: str | None = None,
               sanity_path: str | None = None) -> dict:
    summary = read_json(summary_path)
    result = verify(summary, reference_dir, runs_dir)
    if claims_path:
        from amprepro import claims as claims_mod

        sanity = read_json(sanity_path) if sanity_path and Path(sanity_path).exists() else None
        evaluated = claims_mod.evaluate(claims_mod.load_claims(claims_path), summary, sanity,
                                        claims_mod.model_archs(runs_dir), claims_mod.model_data(runs_dir))
        result["claims"] = evaluated
        result["claims_counts"] = claims_mod.counts(evaluated)
    return result


def csv_rows(result: dict) -> list[dict]:
    rows = []
    for cell in result.get("cells", []):
        base = {"model": cell["model"], "precision": cell["precision"], "seed": cell["seed"],
                "verdict": cell["verdict"], "status_here": cell["status_here"],
                "status_reference": cell["status_reference"], "note": cell["note"]}
        if not cell["checks"]:
            rows.append(base)
        for check in cell["checks"]:
            rows.append({**base, "metric": check["metric"], "here": check["here"], "reference": check["reference"],
                         "ratio": check.get("ratio"), "allowed": check["allowed"],
                         "deviation_pct": check.get("deviation_pct"),
                         "verdict": "pass" if check["ok"] else ("fail" if check["ok"] is False else "not_compared"),
                         "note": check["note"] or cell["note"]})
    return rows


def report_lines(result: dict) -> list[str]:
    status = result["status"]
    head = {"pass": "PASS", "fail": "FAIL", "no_reference": "WARNING", "not_comparable": "WARNING"}[status]
    lines = [f"verify: {head}: {result['message']}"]
    lines += [f"  out of tolerance: {line}" for line in result["failures"]]
    lines += [f"  warning: {line}" for line in result["warnings"]]
    if status == "no_reference" and result.get("slug"):
        lines.append(f"  to add one from a run on this GPU: PYTHONPATH=workflow python -m amprepro.verify promote "
                     f"(writes reference/{result['slug']}/)")
    lines += [f"  note: {line}" for line in result.get("differences", [])]
    if result.get("claims"):
        lines.append("claims (informational; they do not change the exit code):")
        for r in result["claims"]:
            detail = r["measured_text"] if r["verdict"] != "not_measurable" else r["reason"]
            detail = detail if len(detail) <= 140 else detail[:140].rsplit(" ", 1)[0] + " …"
            lines.append(f"  {r['id']}: {r['verdict_text']} — {detail}")
    return lines


# ----------------------------------------------------------------------------------------------------------------------
# Promote a real run to a reference


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except OSError:
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def promote(summary_path: str, table_path: str, runs_dir: str, reference_dir: str, note: str = "",
            force: bool = False) -> Path:
    summary = read_json(summary_path)
    versions = summary.get("versions", {})
    gpu = versions.get("gpu")
    if not gpu:
        raise VerifyError("this run has no GPU: references are per GPU model; promote a run made on the GPU.")
    if not any(c["status"] == "ok" for c in summary.get("cells", [])):
        raise VerifyError("no cell of this run is ok: nothing worth keeping as a reference.")
    folder = Path(reference_dir) / gpu_slug(gpu)
    if (folder / "summary.csv").exists() and not force:
        raise VerifyError(f"{folder} already holds a reference; pass --force to replace it.")
    folder.mkdir(parents=True, exist_ok=True)
    table = Path(table_path).read_text()
    (folder / "summary.csv").write_text(table)
    provenance = {
        "gpu": gpu, "gpu_count": versions.get("gpu_count"), "driver": versions.get("driver"),
        "cuda": versions.get("cuda"), "cudnn": versions.get("cudnn"), "torch": versions.get("torch"),
        "apex_commit": versions.get("apex_commit"), "python": versions.get("python"),
        "isolation": versions.get("isolation"), "packages": versions.get("packages", {}),
        "preset": summary.get("preset", {}), "pipeline_commit": _git_commit(),
        "created_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "summary_csv_sha256": hashlib.sha256(table.encode()).hexdigest(),
        "note": note, "specs": cell_specs(runs_dir),
    }
    write_json(folder / "provenance.json", provenance)
    return folder


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    cmp_ = sub.add_parser("compare", help="write verify.json (+csv); exit 1 only with --strict and a failure")
    cmp_.add_argument("--summary", default="results/summary/summary.json")
    cmp_.add_argument("--runs-dir", default="results/runs")
    cmp_.add_argument("--reference-dir", default="reference")
    cmp_.add_argument("--claims", help="also evaluate these claims (config/claims.yaml) into verify.json")
    cmp_.add_argument("--sanity", default=None)
    cmp_.add_argument("--json", help="write the result here")
    cmp_.add_argument("--csv", help="one row per cell and metric")
    cmp_.add_argument("--strict", action="store_true", help="exit 1 when a cell is out of tolerance")
    gate = sub.add_parser("gate", help="print verify.json's outcome; exit 1 when a cell is out of tolerance")
    gate.add_argument("--verify", default="results/verify/verify.json")
    pro = sub.add_parser("promote", help="make reference/<gpu-slug>/ from a real GPU run")
    pro.add_argument("--summary", default="results/summary/summary.json")
    pro.add_argument("--table", default="results/summary/summary.csv")
    pro.add_argument("--runs-dir", default="results/runs")
    pro.add_argument("--reference-dir", default="reference")
    pro.add_argument("--note", default="")
    pro.add_argument("--force", action="store_true")
    args = parser.parse_args(argv)
    try:
        if args.command == "promote":
            folder = promote(args.summary, args.table, args.runs_dir, args.reference_dir, args.note, args.force)
            print(f"reference written: {folder}/summary.csv and provenance.json; review and commit them")
            return 0
        if args.command == "compare":
            result = run_verify(args.summary, args.reference_dir, args.runs_dir, args.claims, args.sanity)
            if args.json:
                write_json(args.json, result)
            if args.csv:
                write_csv(args.csv, csv_rows(result), CSV_COLUMNS)
        else:
            result = read_json(args.verify)
    except (VerifyError, OSError, ValueError) as exc:
        print(f"verify: ERROR: {exc}", file=sys.stderr)
        return 2
    for line in report_lines(result):
        print(line)
    if args.command == "gate" or args.strict:
        return 1 if result["status"] == "fail" else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Compare this run, cell by cell, with the committed reference of the same GPU model; promote a run into it.

One cell's comparison is amprepro.verify.cellcompare's; this module runs the whole check, writes it and prints it.

The reference (reference/README.md, amprepro.verify.reference) is several independent runs of the paper preset under
``reference/<gpu-slug>/runs/`` and their aggregate, ``aggregate.json``: per cell the median of the runs, the observed
min/max, n runs and n machines. Each cell's band is centred on the median; its half-width is
max(floor, k x the observed range), with floor and k per metric from ``reference/tolerances.yaml`` (optionally
``reference/<gpu-slug>/tolerances.yaml``). With one run the range is 0 and the band is the floor (the output says so).

Subcommands:
  compare   write results/verify/verify.json (+ .csv); exit 0, or with --strict the gate's code
  gate      read verify.json, print the outcome, exit with the gate's code (the `verify` target): 0 pass or no
            reference, 1 a cell out of tolerance, 3 nothing compared (verify.GATE); 2 a usage, file or reference error
  promote   add a finished GPU run (a results directory) to reference/<gpu-slug>/runs/ and rebuild the aggregate
  rebuild   recompute reference/<gpu-slug>/aggregate.json from its runs

Statuses: pass, fail (a cell out of tolerance, or one that ran in one and not the other for a reason that is not the
machine), no_reference (no reference for this GPU model, or no GPU: exit 0 with a warning), not_comparable (a
reference exists but no cell could be compared). A cell this machine cannot run (more GPUs than it has, no bf16, no
apex: the cell's skip_cause is "machine") is "not comparable here": counted and shown, never a failure.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from amprepro.cellid import CellId
from amprepro.cellrecord import metrics_files
from amprepro.files import read_json, write_csv, write_json
from amprepro.verify import promote
from amprepro.verify import reference as ref_mod
from amprepro.verify.cellcompare import compare
from amprepro.verify.reference import ReferenceError, gpu_slug, load_tolerances

CSV_COLUMNS = ["model", "precision", "seed", "verdict", "status_here", "status_reference", "metric", "here",
               "reference", "ratio", "allowed", "deviation_pct", "reference_runs", "note"]
VerifyError = ReferenceError  # one error type for a wrong reference, tolerance or results file


# ----------------------------------------------------------------------------------------------------------------------
# This run's files


def reference_inputs(reference_dir: str | Path = "reference") -> list[str]:
    """Every reference and tolerance file, for a rule's input: changing one re-runs the comparison."""
    folder = Path(reference_dir)
    if not folder.is_dir():
        return []
    return sorted(str(p) for p in folder.rglob("*") if p.is_file() and p.suffix in (".csv", ".json", ".yaml"))


def cell_specs(runs_dir: str | Path | None, field: str = "spec") -> dict:
    """CellId.reference_key ('model/precision/N', as the reference's files key cells) -> the cell's full settings (or
    its memory plan: field "plan"), from its metrics.json."""
    specs = {}
    for _, metrics in metrics_files(runs_dir):
        if metrics.get(field):
            specs[CellId.of(metrics).reference_key] = metrics[field]
    return specs



# ----------------------------------------------------------------------------------------------------------------------
# This machine and its software against the reference's


def machine_here(summary: dict, runs_dir: str | Path | None, probe=None) -> dict:
    """This machine's GPU count: what nvidia-smi lists where verify runs, else what the cells saw."""
    from amprepro.gpuslots import visible_gpus

    names, how = (probe or visible_gpus)()
    metrics = [m for _, m in promote.cell_metrics(Path(runs_dir))] if runs_dir and Path(runs_dir).is_dir() else []
    seen = promote.machine_identity(metrics, {})["gpu_count"] if metrics else None
    limit = {"gpu_memory_limit_gib": summary.get("versions", {}).get("gpu_memory_limit_gib")}
    if names:
        return {"gpu_count": len(names), "source": how, "gpus_seen_by_cells": seen, **limit}
    if seen:
        return {"gpu_count": seen, "source": f"GPUs the cells saw; {how} where verify ran", "gpus_seen_by_cells": seen,
                **limit}
    return {"gpu_count": summary.get("versions", {}).get("gpu_count") or 0, "source": f"the summary's GPU count; {how}",
            "gpus_seen_by_cells": None, **limit}


def _same(key: str, here, reference) -> bool:
    if (key == "apex_commit" and isinstance(here, str) and isinstance(reference, str)
            and min(len(here), len(reference)) >= 7):
        return here.startswith(reference) or reference.startswith(here)  # a short and a full hash of one commit
    return here == reference


def stack_differences(summary: dict, machine: dict, aggregate: dict) -> list[dict]:
    """Where this run's software (torch, CUDA, cuDNN, apex) or machine (driver, GPU count) is not the reference's."""
    versions = summary.get("versions", {})
    here = {**{k: versions.get(k) for k in (*ref_mod.SOFTWARE_KEYS, "driver")}, "gpu_count": machine["gpu_count"]}
    differences = []
    for key, value in here.items():
        seen: dict = {}
        for run in aggregate.get("runs", {}).values():
            seen.setdefault(json.dumps(run["stack"].get(key)), []).append(run)
        if any(_same(key, value, json.loads(v)) for v in seen):
            continue
        reference = ", ".join(f"{json.loads(v)} ({len(runs)} run{'s' * (len(runs) > 1)})" for v, runs in seen.items())
        kind = "machine" if key in ref_mod.MACHINE_KEYS else "software"
        label = {"gpu_count": "GPU count", "apex_commit": "apex commit"}.get(key, key)
        differences.append({"key": key, "kind": kind, "here": value, "reference": [json.loads(v) for v in seen],
                            "text": f"{label}: {value} here; {reference} in the reference"})
    return differences


# ----------------------------------------------------------------------------------------------------------------------
# The whole check


# The gate's contract (docs/report.md): PASS 0; FAIL 1; a usage, file or reference error 2 (main); no reference for
# this GPU, or no GPU, a WARNING with 0 (nothing here to be judged against); a reference exists but not one cell of
# this run could be compared with it: NOTHING COMPARED, 3. Zero compared cells is never a PASS.
GATE = {"pass": ("PASS", 0), "fail": ("FAIL", 1), "no_reference": ("WARNING", 0),
        "not_comparable": ("NOTHING COMPARED", 3)}


def verify(summary: dict, reference_dir: str | Path = "reference", runs_dir: str | Path | None = None,
           probe=None) -> dict:
    """The whole check: which reference applies, the comparison, one status, one message and the gate's exit code."""
    reference_dir = Path(reference_dir)
    gpu = summary.get("versions", {}).get("gpu")
    preset = summary.get("preset", {}).get("preset", "?")
    result = {"gpu": gpu, "slug": gpu_slug(gpu) if gpu else None, "reference": None, "cells": [], "failures": [],
              "warnings": [], "counts": {}, "differences": [], "stack": {"same": None, "differences": []},
              "machine": machine_here(summary, runs_dir, probe)}
    result["tolerances"] = load_tolerances(reference_dir, result["slug"])
    folder = reference_dir / result["slug"] if gpu else None
    if not gpu:
        result.update(status="no_reference", message=(
            f"this run has no GPU ({preset} preset on CPU); reference results are per GPU model, so nothing was "
            "compared"))
    elif not folder.is_dir():
        available = sorted(p.name for p in reference_dir.glob("*") if p.is_dir())
        result.update(status="no_reference", message=(
            f"no reference results for {gpu} ({folder}/ does not exist"
            + (f"; references exist for: {', '.join(available)}" if available else "; no reference is committed yet")
            + "); nothing was compared"))
    else:
        judge(result, summary, folder, runs_dir)
    head, code = GATE[result["status"]]
    result["gate"] = {"result": head, "exit_code": code, "gpu_count": result["machine"]["gpu_count"]}
    return result


def judge(result: dict, summary: dict, folder: Path, runs_dir) -> None:
    aggregate = ref_mod.load_aggregate(folder)
    outcome = compare(summary, aggregate, result["tolerances"], cell_specs(runs_dir), cell_specs(runs_dir, "plan"))
    result.update(outcome)
    result["reference"] = {"path": str(folder), "n_runs": aggregate["n_runs"], "n_machines": aggregate["n_machines"],
                           "runs": aggregate["runs"]}
    stack = stack_differences(summary, result["machine"], aggregate)
    result["stack"] = {"same": not stack, "differences": stack}
    result["differences"] = [d["text"] for d in stack]
    counts = outcome["counts"]
    compared = counts["pass"] + counts["fail"]
    basis = (f"{folder}: median of {aggregate['n_runs']} run(s) on {aggregate['n_machines']} machine(s)"
             + (", bands at their floor (one run)" if aggregate["n_runs"] == 1 else ""))
    elsewhere = (f"; {counts['not_comparable_here']} not comparable here (this machine cannot run them)"
                 if counts["not_comparable_here"] else "")
    if outcome["failures"]:
        result["status"] = "fail"
        result["message"] = f"{counts['fail']} of {compared} cells out of tolerance against {basis}{elsewhere}"
    elif compared == 0:
        result["status"] = "not_comparable"
        result["message"] = (f"a reference exists ({folder}) but no cell of this run is comparable with it"
                             f"{elsewhere}: nothing was judged, which is not a pass")
    else:
        result["status"] = "pass"
        result["message"] = f"all {compared} compared cells within tolerance of {basis}{elsewhere}"


def run_verify(summary_path: str, reference_dir: str, runs_dir: str | None, claims_path: str | None = None,
               sanity_path: str | None = None) -> dict:
    summary = read_json(summary_path)
    result = verify(summary, reference_dir, runs_dir)
    if claims_path:
        from amprepro.analysis import claims as claims_mod

        sanity = read_json(sanity_path) if sanity_path and Path(sanity_path).exists() else None
        evaluated = claims_mod.evaluate_run(claims_path, summary, sanity, runs_dir)
        result["claims"] = evaluated
        result["claims_counts"] = claims_mod.counts(evaluated)
    return result


def csv_rows(result: dict) -> list[dict]:
    rows = []
    for cell in result.get("cells", []):
        base = {"model": cell["model"], "precision": cell["precision"], "seed": cell["seed"],
                "verdict": cell["verdict"], "status_here": cell["status_here"],
                "status_reference": cell["status_reference"], "reference_runs": cell.get("reference_runs"),
                "note": cell["note"]}
        if not cell["checks"]:
            rows.append(base)
        for check in cell["checks"]:
            rows.append({**base, "metric": check["metric"], "here": check["here"], "reference": check["reference"],
                         "ratio": check.get("ratio"), "allowed": check["allowed"],
                         "deviation_pct": check.get("deviation_pct"), "reference_runs": check["reference_runs"],
                         "verdict": "pass" if check["ok"] else ("fail" if check["ok"] is False else "not_compared"),
                         "note": check["note"] or cell["note"]})
    return rows


def report_lines(result: dict) -> list[str]:
    """What the gate prints: what differs from the reference first, then the verdict and the reasons."""
    lines = []
    machine = result.get("machine") or {}
    if result.get("stack", {}).get("differences"):
        lines.append("verify: NOTE: this run's software or machine differs from the reference's; the bands were "
                     "measured on the reference's:")
        lines += [f"  {d['text']}" for d in result["stack"]["differences"]]
    head = GATE[result["status"]][0]
    lines.append(f"verify: {head}: {result['message']}")
    capped = (f", memory capped at {machine['gpu_memory_limit_gib']:g} GiB (gpu_memory_limit_gib)"
              if machine.get("gpu_memory_limit_gib") else "")
    lines.append(f"  this machine: {machine.get('gpu_count')} GPU(s) ({machine.get('source')}){capped}; gate "
                 f"{result.get('gate', {}).get('result', head)}, exit code {GATE[result['status']][1]}")
    lines += [f"  out of tolerance: {line}" for line in result["failures"]]
    lines += [f"  warning: {line}" for line in result["warnings"]]
    if result["status"] == "no_reference" and result.get("slug"):
        lines.append(f"  to add one from a run on this GPU: .venv/bin/python -m amprepro.verify.verify promote "
                     f"results --note '...' (writes reference/{result['slug']}/runs/)")
    if result.get("claims"):
        lines.append("claims (informational; they do not change the exit code):")
        for r in result["claims"]:
            detail = r["measured_text"] if r["verdict"] != "not_measurable" else r["reason"]
            detail = detail if len(detail) <= 140 else detail[:140].rsplit(" ", 1)[0] + " …"
            lines.append(f"  {r['id']}: {r['verdict_text']} — {detail}")
            if r.get("regimes"):
                from amprepro.analysis.regimes import lines as regime_lines

                lines.append(f"    {r['id']} in other regimes (predicted unless measured; not a verdict):")
                lines += [f"      {line}" for line in regime_lines(r["regimes"]["rows"])]
    return lines


# ----------------------------------------------------------------------------------------------------------------------
# Command line


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    cmp_ = sub.add_parser("compare", help="write verify.json (+csv); exit 0, or with --strict the gate's code: 1 out "
                                          "of tolerance, 3 nothing compared")
    cmp_.add_argument("--summary", default="results/summary/summary.json")
    cmp_.add_argument("--runs-dir", default="results/runs")
    cmp_.add_argument("--reference-dir", default="reference")
    cmp_.add_argument("--claims", help="also evaluate these claims (config/claims.yaml) into verify.json")
    cmp_.add_argument("--sanity", default=None)
    cmp_.add_argument("--json", help="write the result here")
    cmp_.add_argument("--csv", help="one row per cell and metric")
    cmp_.add_argument("--strict", action="store_true",
                      help="exit with the gate's code: 1 when a cell is out of tolerance, 3 when nothing was compared")
    gate = sub.add_parser("gate", help="print verify.json's outcome; exit 1 when a cell is out of tolerance, 3 when "
                                       "nothing was compared")
    gate.add_argument("--verify", default="results/verify/verify.json")
    pro = sub.add_parser("promote",
                         help="add a finished GPU run to reference/<gpu-slug>/runs/ and rebuild the aggregate")
    pro.add_argument("results", nargs="?", default="results",
                     help="the run's results directory (summary/, runs/, environment/); default results")
    pro.add_argument("--note", required=True, help="who ran it, on which machine (kind, lease), anything unusual")
    pro.add_argument("--reference-dir", default="reference")
    reb = sub.add_parser("rebuild", help="recompute reference/<gpu-slug>/aggregate.json from its runs")
    reb.add_argument("--reference", required=True, help="the GPU model's folder, e.g. reference/nvidia-h200")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        if args.command == "promote":
            folder, built = promote.add_run(args.results, args.reference_dir, args.note)
            print(f"reference run added: {folder}; {folder.parent.parent}/aggregate.json now holds {built['n_runs']} "
                  f"run(s) on {built['n_machines']} machine(s). Review and commit {folder.parent.parent}/.")
            return 0
        if args.command == "rebuild":
            built = ref_mod.rebuild(Path(args.reference))
            print(f"{args.reference}/aggregate.json: {built['n_runs']} run(s) on {built['n_machines']} machine(s)")
            return 0
        if args.command == "compare":
            result = run_verify(args.summary, args.reference_dir, args.runs_dir, args.claims, args.sanity)
            if args.json:
                write_json(args.json, result)
            if args.csv:
                write_csv(args.csv, csv_rows(result), CSV_COLUMNS)
        else:
            result = read_json(args.verify)
    except (ReferenceError, OSError, ValueError) as exc:
        print(f"verify: ERROR: {exc}", file=sys.stderr)
        return 2
    for line in report_lines(result):
        print(line)
    if args.command == "gate" or args.strict:
        return GATE[result["status"]][1]
    return 0


if __name__ == "__main__":
    sys.exit(main())

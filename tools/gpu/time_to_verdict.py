"""Assemble results-reference/perf/<commit>/time-to-verdict.json from one fresh-box route
(tools/gpu/time_to_verdict.sh): the seconds from the first call's start to `make verify`'s verdict, the gate, the
apex build's own seconds, every job kind's wall seconds (from Snakemake's log) and the timm comparison's ratios of
the same lease.

    python tools/gpu/time_to_verdict.py --started EPOCH_FILE --verdict EPOCH_FILE --log make-run.log \
        --results results --timm timm_compare.json --commit HASH --out time-to-verdict.json
"""
import argparse
import collections
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workflow"))
import job_seconds
import steps_budget

from amprepro import precisions
from amprepro.cellrecord import metrics_files


def read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def job_kinds(jobs: list[tuple]) -> dict:
    """Per rule: how many jobs finished and their summed, longest and mean wall seconds (whole seconds, as Snakemake
    stamps them; jobs beside each other overlap, so the sums add up to more than the run's wall time). jobs:
    job_seconds.spans of the route's logs."""
    kinds = collections.defaultdict(list)
    for rule, _, start, end in jobs:
        kinds[rule].append((end - start).total_seconds())
    return {rule: {"jobs": len(s), "sum_s": sum(s), "max_s": max(s), "mean_s": round(sum(s) / len(s), 2)}
            for rule, s in sorted(kinds.items(), key=lambda kv: -sum(kv[1]))}


def cell_phases(cells: list[tuple[Path, dict]]) -> dict:
    """Per phase of a cell's process (metrics.json's phase_seconds, amprepro.train.measure.Phases): how many cells
    recorded it and their summed seconds, so the train jobs' time splits into start-up, build, data and loop."""
    sums = collections.defaultdict(lambda: [0, 0.0])
    for _, metrics in cells:
        for phase, seconds in (metrics.get("phase_seconds") or {}).items():
            if seconds is not None:
                sums[phase][0] += 1
                sums[phase][1] += seconds
    return {phase: {"cells": n, "sum_s": round(total, 1)} for phase, (n, total) in sums.items()}


def init_weights(cells: list[tuple[Path, dict]]) -> dict:
    """Where the cells' initial weights came from (metrics.json's init_weights, amprepro.train.initcache): per source,
    how many cells and the seconds their build or read took; cells that predate the record are not counted."""
    sums = collections.defaultdict(lambda: [0, 0.0])
    for _, metrics in cells:
        record = metrics.get("init_weights")
        if record:
            sums[record["source"]][0] += 1
            sums[record["source"]][1] += record.get("seconds") or 0.0
    return {source: {"cells": n, "sum_s": round(total, 1)} for source, (n, total) in sorted(sums.items())}


def step_seconds(cells: list[tuple[Path, dict]]) -> dict:
    """The GPU's own work the config asks for: every finished cell's step times (steps.csv, warm-up steps included),
    summed. No route can be faster than this plus the searches' trial budget without running fewer steps."""
    counted, total = 0, 0.0
    for path, _ in cells:
        times = steps_budget.step_times(path.parent / "steps.csv")
        if times:
            counted, total = counted + 1, total + sum(times)
    return {"cells": counted, "sum_s": round(total, 1)}


# The jobs that hold the whole GPU one after another once the cells start: the cells on a GPU of their own, the
# largest-batch searches and apex's check (the untimed cells that share a GPU run beside each other first).
SERIAL_GPU_RULES = ("train", "largest_batch", "apex")


def critical_path(jobs: list[tuple], cells: list[tuple[Path, dict]], seconds_to_verdict: float) -> dict:
    """Where the seconds to the verdict went, from Snakemake's job stamps (whole seconds) and the cells' records:
    before the first cell job, the cell jobs' stretch, after the last of them (summary, report), and what Snakemake's
    jobs do not cover (make and the launcher before the first job, Snakemake's own start and end, `make verify`).
    Within the stretch, the cells on a GPU of their own: their jobs' seconds, their loops' (warm-up and timed steps,
    compile, FLOP count, held-out losses) and the rest of each job (fork, CUDA start, build, data, Snakemake). A route
    resumed over several calls has each call's log: the time between the calls counts where it fell."""
    cell_jobs = [job for job in jobs if job[0] in SERIAL_GPU_RULES]
    if not cell_jobs:  # a route cut before its first cell, or no log: nothing to split
        return {}
    # each cell's record by (model, precision, seedN): its results/runs/<model>/<precision>/<seedN>/metrics.json
    records = {(path.parent.parent.parent.name, path.parent.parent.name, path.parent.name): metrics
               for path, metrics in cells}
    shared = {key for key, metrics in records.items() if metrics.get("gpu_shared")}
    loops = {key: (metrics.get("phase_seconds") or {}).get("loop") for key, metrics in records.items()}
    # a staged cell (amprepro.gpuslots --defer) started while the one before trained: its job's seconds hold its
    # model's build and its wait for the GPU, both beside that cell; outside_loop_s is the rest, after the lock
    waits = {key: (metrics.get("phase_seconds") or {}).get("gpu_wait") or 0.0 for key, metrics in records.items()}
    staged = {key: (metrics.get("phase_seconds") or {}).get("staged_build") or 0.0 for key, metrics in records.items()}

    def cell_of(wildcards: str) -> tuple[str, str, str]:
        found = dict(item.split("=", 1) for item in wildcards.split(", ") if "=" in item)
        return found.get("model", ""), found.get("precision", ""), f"seed{found.get('seed', '')}"

    first, last = min(job[2] for job in jobs), max(job[3] for job in jobs)
    serial = [job for job in cell_jobs if cell_of(job[1]) not in shared]
    cells_start, cells_end = min(job[2] for job in cell_jobs), max(job[3] for job in cell_jobs)
    own = [job for job in serial if job[0] == "train" and loops.get(cell_of(job[1])) is not None]
    job_s = sum((job[3] - job[2]).total_seconds() for job in own)
    loop_s = sum(loops[cell_of(job[1])] for job in own)
    wait_s = sum(waits.get(cell_of(job[1]), 0.0) for job in own)
    staged_s = sum(staged.get(cell_of(job[1]), 0.0) for job in own)
    return {
        "before_cells_s": (cells_start - first).total_seconds(),
        "cells_s": (cells_end - cells_start).total_seconds(),
        "after_cells_s": (last - cells_end).total_seconds(),
        "outside_snakemake_jobs_s": round(seconds_to_verdict - (last - first).total_seconds(), 1),
        "cells_on_their_own_gpu": {"jobs": len(own), "job_s": job_s, "loop_s": round(loop_s, 1),
                                   "waited_for_gpu_s": round(wait_s, 1),
                                   "staged_build_s": round(staged_s, 1),
                                   "outside_loop_s": round(job_s - loop_s - wait_s - staged_s, 1)},
        "serial_gpu_jobs": {rule: sum(1 for job in serial if job[0] == rule) for rule in SERIAL_GPU_RULES},
    }


def recipe_difference(precision: str, optimizer: str) -> str | None:
    """What our cell runs that timm's benchmark.py does not, where it costs time: torch.amp.GradScaler, whose step
    reads the inf flag on the host before a non-fused optimizer's step (timm's benchmark runs no scaler)."""
    if not precisions.get(precision).grad_scaler:
        return None
    if optimizer.endswith("_fused"):
        return "GradScaler (timm runs none); the fused optimizer takes its inf flag on the device: no host wait"
    return "GradScaler (timm runs none): its step reads the inf flag on the host before this non-fused optimizer's step"


def timm_ratio(row: dict) -> dict:
    """One compared cell: "ratio" is our harness against timm's on the same work ("compared_as": on timm's recipe where
    our cell's differs, tools/gpu/timm_compare.py's "same_recipe"), with its samples/s; "cell_ratio" and
    "cell_samples_per_s" are the cell as the pipeline runs it, and "recipe_differs" what that cell runs that timm does
    not. A same-recipe run that failed leaves "ratio" None, with its error."""
    same = row.get("same_recipe")
    compared = same if same and "ratio" in same else (None if same else row)
    optimizer = row["amprepro"]["spec"]["train"]["optimizer"]
    return {"model": row["model"], "precision": row["precision"], "optimizer": optimizer,
            "timm_samples_per_s": row["timm_samples_per_s"],
            "compared_as": (same or row)["precision"],
            "amprepro_samples_per_s": round(compared["amprepro_samples_per_s"], 2) if compared else None,
            "ratio": round(compared["ratio"], 4) if compared else None,
            **({"error": same["error"]} if same and "error" in same else {}),
            "cell_samples_per_s": round(row["amprepro_samples_per_s"], 2), "cell_ratio": round(row["ratio"], 4),
            "recipe_differs": recipe_difference(row["precision"], optimizer)}


def record(args) -> dict:
    started, verdict = (float(Path(p).read_text().split()[0]) for p in (args.started, args.verdict))
    results = Path(args.results)
    cells = metrics_files(results / "runs")  # read once, for the phases and the step times
    jobs = job_seconds.spans([p for p in args.log if Path(p).exists()])  # parsed once, for the kinds and the path
    verify = read_json(results / "verify" / "verify.json") or {}
    build = read_json(results / "apex" / "build.json") or {}
    timm = read_json(Path(args.timm)) if args.timm else None
    return {
        "what": "a fresh one-GPU box: apex built cold, `make run` then `make verify` (tools/gpu/time_to_verdict.sh)",
        "commit": args.commit,
        "seconds_to_verdict": round(verdict - started, 1),
        "gate": (verify.get("gate") or {}).get("result"),
        "gate_message": verify.get("message"),
        "apex_build_seconds": build.get("seconds"),
        "apex_build": {k: build.get(k) for k in ("cache", "jobs", "max_jobs", "parallel", "extensions_built",
                                                 "extensions_left_out")},
        "job_kinds": job_kinds(jobs),
        "cell_phases": cell_phases(cells),
        "init_weights": init_weights(cells),
        "step_seconds": step_seconds(cells),
        "critical_path": critical_path(jobs, cells, verdict - started),
        "timm_ratios": None if timm is None else [timm_ratio(r) for r in timm],
        "timm_note": args.timm_note or (None if timm else "no timm comparison in this lease "
                                                          "(vendor/timm/benchmark.py not carried)"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--started", required=True)
    parser.add_argument("--verdict", required=True)
    parser.add_argument("--log", action="append", required=True)
    parser.add_argument("--results", default="results")
    parser.add_argument("--timm")
    parser.add_argument("--timm-note", help="why there is no timm comparison, or only part of one, where timm was "
                                             "carried")
    parser.add_argument("--commit", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    out = record(args)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps({k: out[k] for k in ("seconds_to_verdict", "gate", "apex_build_seconds")}))


if __name__ == "__main__":
    main()

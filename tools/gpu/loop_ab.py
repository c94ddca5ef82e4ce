"""The first timed step with the train loop before and after measure.TimedWindow (issue 40), on one GPU, side by side.

Each given cell is run from the spec in its metrics.json, once with an older loop (--old: a folder holding that
commit's workflow/amprepro/train/loop.py and measure.py, whose loop waited for the GPU's queue to run out before the
first timed step) and once with this tree's, alternating which goes first, --rounds times. For each run it writes the
step times, the last warm-up step and the first timed step over the median of the later timed steps (the steady
step), p90 over the median, the throughput and the energy per item.

    python tools/gpu/loop_ab.py --old ab-old --apex results/apex/apex.json --rounds 2 --out ab/ \
        --model llama7b | --cell results/runs/llama7b/amp_bf16/seed0 [--cell ...]

--model takes the model's seed-0 cells in results/runs of the mixed precisions (MIXED) that ran.
"""

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import time
from pathlib import Path

from timm_compare import cell_command  # this folder's: the same train CLI call

REPO = Path(__file__).resolve().parents[2]
SWAPPED = ("loop.py", "measure.py")
MIXED = ("amp_bf16", "amp_fp16", "apex_o1", "apex_o2")


def old_tree(old: Path, into: Path) -> Path:
    """This tree's workflow/ with the older loop's files swapped in."""
    shutil.copytree(REPO / "workflow", into / "workflow", ignore=shutil.ignore_patterns("__pycache__"))
    for name in SWAPPED:
        shutil.copy(old / name, into / "workflow" / "amprepro" / "train" / name)
    return into / "workflow"


def run(spec: dict, workflow: Path, apex: Path, out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    try:
        done = subprocess.run(cell_command(spec, apex, out), capture_output=True, text=True, timeout=600,
                              env={**os.environ, "PYTHONPATH": str(workflow)})
    except subprocess.TimeoutExpired:
        return {"error": "ran past 600 s"}
    if done.returncode != 0:
        return {"error": done.stderr[-2000:]}
    metrics = json.loads((out / "metrics.json").read_text())
    if metrics["status"] != "ok":
        return {"error": f"{metrics['status']}: {metrics.get('reason')}"}
    with open(out / "steps.csv") as f:
        seconds = [float(r["step_time_s"]) for r in csv.DictReader(f)]
    warmup = spec["train"]["warmup_steps"]
    steady = statistics.median(seconds[warmup + 1:]) if len(seconds) > warmup + 1 else None
    return {"status": metrics["status"], "step_time_s": seconds, "warmup_steps": warmup,
            "last_warmup_over_steady": seconds[warmup - 1] / steady if steady and warmup else None,
            "first_timed_over_steady": seconds[warmup] / steady if steady else None,
            "p90_over_median": metrics["step_time_p90_s"] / metrics["step_time_median_s"],
            "throughput_per_s": metrics["throughput_per_s"], "energy_j_per_item": metrics.get("energy_j_per_item"),
            "gpu": metrics["hardware"].get("gpu_name"), "process_seconds": round(time.time() - started, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", type=Path, required=True, help="the older loop.py and measure.py")
    parser.add_argument("--cell", type=Path, action="append", default=[], help="a cell folder under results/runs")
    parser.add_argument("--model", help="its seed-0 cells of MIXED in --runs")
    parser.add_argument("--runs", type=Path, default=Path("results/runs"))
    parser.add_argument("--apex", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=400, help="stop starting runs after this long")
    args = parser.parse_args()
    if args.model:
        args.cell += [c for c in (args.runs / args.model / p / "seed0" for p in MIXED) if (c / "metrics.json").exists()]
    if not args.cell:
        raise SystemExit("no cell to run: give --cell, or --model with cells in --runs")
    args.out.mkdir(parents=True, exist_ok=True)
    loops = {"old": old_tree(args.old, args.out / "old-tree"), "new": REPO / "workflow"}
    deadline, rows = time.time() + args.seconds, []
    for round_ in range(args.rounds):
        for cell in args.cell:
            spec = json.loads((cell / "metrics.json").read_text())["spec"]
            for loop in (("old", "new") if round_ % 2 == 0 else ("new", "old")):
                if time.time() > deadline:
                    break
                result = run(spec, loops[loop], args.apex, args.out / f"r{round_}" / spec["model"] / spec["precision"]
                             / loop)
                rows.append({"model": spec["model"], "precision": spec["precision"], "loop": loop, "round": round_,
                             **result})
                first = result.get("first_timed_over_steady")
                print(f"round {round_} {spec['model']}/{spec['precision']} {loop}: "
                      + (f"first timed step {first:.3f}x steady, {result['throughput_per_s']:.1f}/s"
                         if first else result.get("error", "")[-300:]), flush=True)
                (args.out / "loop_ab.json").write_text(json.dumps(rows, indent=2))
    shutil.rmtree(args.out / "old-tree", ignore_errors=True)


if __name__ == "__main__":
    main()

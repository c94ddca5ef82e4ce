"""How many training steps a cell's speed needs (issue 40, item 1), read from a finished run's own step times: for every
cell, the median step time over fewer warm-up steps or fewer timed steps, against the median the cell reported, and the
GPU seconds the dropped steps took. Nothing runs: the shorter windows are slices of the steps.csv each cell wrote.

    python tools/gpu/steps_budget.py results/runs --band 0.08 --tolerances reference/tolerances.yaml --out FILE
    python tools/gpu/steps_budget.py reference/nvidia-h200 --reference --tolerances reference/tolerances.yaml --out FILE

With --reference, the same for every committed reference run's cells (their steps.csv in the run's steps.tar.gz, the
warm-up from its provenance, the median recomputed from the steps as tests/report/test_reference_steps.py checks it
is), keyed run/cell: independent runs on several machines, the compiled and FP8 cells among them. Cells that shared
their GPU with others (the run's summary.csv says so) are listed apart, as verify does not compare their speed.

A window "holds" when its median is within --band (relative) of the cell's own median, the throughput band of
reference/tolerances.yaml; the cells whose throughput that file does not compare (the digits and LoRA models:
host-bound, there for accuracy or memory) are listed apart and count in no window. The windows are slices of one run,
not independent runs. The final loss is not judged here: a run of fewer steps ends at another loss, which is why
cutting steps means recording the reference again.

Each cell also gets "around_warmup": its last warm-up step and its first two timed steps, each over the median of the
steps after them (the steady step). Until ebb54cc the loop emptied the GPU's queue before the first timed step, which
then ran slow (results-reference/perf/first-timed-step/); the totals count the cells where each was more than
AROUND_SLOW slower than steady.

A shorter window is a slice of a run that waited at its own warm-up's end, not what a run at those counts would
measure: such a run waits earlier, and the steps after its wait can run slow. The 7B cells' 2 + 4 held within 2.1 % on
the slices (68b578b) and failed on an H100 when run (results-reference/perf/9d8afa1-h100/, first-timed-step/).
"""

import argparse
import csv
import io
import json
import statistics
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workflow"))
from amprepro.cellrecord import metrics_files
from amprepro.train import measure
from amprepro.verify import reference

WINDOWS = [(3, 20), (5, 20), (10, 10), (5, 10), (3, 10), (5, 5)]  # (warm-up steps, timed steps)
AROUND = {"last_warmup": -1, "first_timed": 0, "second_timed": 1}  # steps around the warm-up's end, from it
AROUND_SLOW = 0.05


def read_times(handle) -> list[float]:
    """The step times of an open steps.csv, in step order (a row without one left out). The one reader of steps.csv's
    times for tools/gpu: a results folder's files (step_times, which time_to_verdict.py sums) and a reference run's
    steps.tar.gz."""
    return [float(row["step_time_s"]) for row in csv.DictReader(handle) if row.get("step_time_s")]


def step_times(path: Path) -> list[float] | None:
    """read_times of a cell's steps.csv; None without the file or the column."""
    try:
        with open(path, newline="") as handle:
            return read_times(handle)
    except (OSError, KeyError, ValueError):
        return None


def cell_budget(times: list[float], warmup: int, reported: float, band: float) -> dict:
    """The cell's windows: each one's median, its distance from the reported median and the seconds it saves."""
    spent = sum(times)
    windows = {}
    for w, k in WINDOWS:
        if w + k > len(times) or (w, k) == (warmup, len(times) - warmup):
            continue
        median = statistics.median(times[w:w + k])
        rel = median / reported - 1
        windows[f"{w}+{k}"] = {"median_s": round(median, 6), "rel": round(rel, 4), "holds": abs(rel) <= band,
                               "saves_s": round(spent - sum(times[:w + k]), 3)}
    return {"steps": len(times), "warmup": warmup, "median_s": reported, "spent_s": round(spent, 3),
            "windows": windows, "around_warmup": around_warmup(times, warmup)}


def around_warmup(times: list[float], warmup: int) -> dict:
    """The steps around the warm-up's end over the steady step (the median of the steps after them); {} where a cell
    has no warm-up or fewer than one steady step."""
    steady = times[warmup + 2:]
    if warmup < 1 or not steady:
        return {}
    median = statistics.median(steady)
    return {label: round(times[warmup + at] / median, 4) for label, at in AROUND.items()}


def read_tolerances(path: Path | None, slug: str | None = None) -> dict | None:
    """A reference folder's tolerances.yaml, with reference/<slug>/tolerances.yaml over it, checked and merged over the
    defaults as verify reads them (amprepro.verify.reference.load_tolerances)."""
    if path is None:
        return None
    if path.name != "tolerances.yaml":
        raise SystemExit(f"--tolerances {path}: give a reference folder's tolerances.yaml (reference/tolerances.yaml)")
    return reference.load_tolerances(path.parent, slug)


def speed_compared(tolerances: dict | None, model: str, precision: str, seed: str) -> bool:
    """Whether verify compares this cell's throughput: its band rule (reference.band_for) has one."""
    if tolerances is None:
        return True
    return "throughput_per_s" in reference.band_for(tolerances, {"model": model, "precision": precision,
                                                                 "seed": int(seed)})


def budget(runs: Path, band: float, tolerances: dict | None = None) -> dict:
    cells, apart = {}, []
    for path, metrics in metrics_files(runs):
        if metrics.get("status") != "ok" or not metrics.get("step_time_median_s"):
            continue
        model, precision, seed = path.parent.relative_to(runs).parts[:3]
        if not speed_compared(tolerances, model, precision, seed.removeprefix("seed")):
            apart.append("/".join(path.parent.relative_to(runs).parts))
            continue
        times = step_times(path.parent / "steps.csv")
        if not times:
            continue
        key = "/".join(path.parent.relative_to(runs).parts)
        cells[key] = cell_budget(times, int(metrics["warmup_steps"]), float(metrics["step_time_median_s"]), band)
    return totals_of(cells, band, apart)


def totals_of(cells: dict, band: float, apart: list) -> dict:
    totals = {}
    for name in {name for cell in cells.values() for name in cell["windows"]}:
        held = [c["windows"][name] for c in cells.values() if name in c["windows"]]
        totals[name] = {"cells": len(held), "hold": sum(w["holds"] for w in held),
                        "worst_rel": max((w["rel"] for w in held), key=abs),
                        "saves_s": round(sum(w["saves_s"] for w in held), 1)}
    spent = round(sum(c["spent_s"] for c in cells.values()), 1)
    around = {}
    for label in AROUND:
        ratios = [c["around_warmup"][label] for c in cells.values() if c.get("around_warmup")]
        if ratios:
            around[label] = {"cells": len(ratios), "median": round(statistics.median(ratios), 4),
                             "slow": sum(r > 1 + AROUND_SLOW for r in ratios)}
    return {"band": band, "throughput_not_compared": apart, "spent_s": spent,
            "windows": dict(sorted(totals.items())), "around_warmup": around, "cells": cells}


def reference_budget(reference_dir: Path, band: float, tolerances: dict | None = None) -> dict:
    """budget() over the committed runs of a reference folder, keyed '<run id>/<model>/<precision>/<seed>'."""
    cells, apart = {}, []
    for run in sorted(p for p in (reference_dir / "runs").iterdir() if (p / "steps.tar.gz").is_file()):
        specs = json.loads((run / "provenance.json").read_text()).get("specs") or {}
        with open(run / "summary.csv", newline="") as handle:  # cells that shared their GPU: speed not compared
            shared = {f"{r['model']}/{r['precision']}/{r['seed']}" for r in csv.DictReader(handle)
                      if r.get("gpu_shared_cells_per_gpu")}
        with tarfile.open(run / "steps.tar.gz") as archive:
            for member in archive.getmembers():
                parts = Path(member.name).parts  # runs/<model>/<precision>/seed<N>/steps.csv
                if not member.isfile() or len(parts) != 5:
                    continue
                model, precision, seed = parts[1], parts[2], parts[3].removeprefix("seed")
                key = f"{run.name}/{model}/{precision}/{seed}"
                if not speed_compared(tolerances, model, precision, seed) or f"{model}/{precision}/{seed}" in shared:
                    apart.append(key)
                    continue
                spec = specs.get(f"{model}/{precision}/{seed}")
                times = read_times(io.TextIOWrapper(archive.extractfile(member), encoding="utf-8"))
                if spec and len(times) > spec["train"]["warmup_steps"]:
                    warmup = spec["train"]["warmup_steps"]  # the median as the cell computed it
                    median = measure.step_stats(times, warmup, 1)["step_time_median_s"]
                    cells[key] = cell_budget(times, warmup, median, band)
    return totals_of(cells, band, apart)


def windows_arg(text: str) -> list[tuple[int, int]]:
    found = [part.strip().split("+") for part in text.split(",")]
    if not all(len(pair) == 2 and all(n.isdigit() for n in pair) and int(pair[1]) > 0 for pair in found):
        raise argparse.ArgumentTypeError(f"{text!r}: give windows as W+K, comma-separated (e.g. 2+4,3+4)")
    return [(int(w), int(k)) for w, k in found]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", type=Path, help="a results/runs folder (a reference/<gpu> folder with --reference)")
    parser.add_argument("--reference", action="store_true", help="read a reference folder's committed runs")
    parser.add_argument("--band", type=float, default=0.08, help="relative distance a window may have (0.08)")
    parser.add_argument("--tolerances", type=Path, help="reference/tolerances.yaml: leave out what it does not compare")
    parser.add_argument("--windows", type=windows_arg, help="W+K,...: these (warm-up, timed) windows instead of "
                        + ",".join(f"{w}+{k}" for w, k in WINDOWS))
    parser.add_argument("--model", help="only this model's cells (e.g. llama7b)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.windows:
        WINDOWS[:] = args.windows
    read = reference_budget if args.reference else budget
    # a reference folder is named by its GPU's slug: its own tolerances.yaml applies, as verify applies it
    out = read(args.runs, args.band, read_tolerances(args.tolerances, args.runs.name if args.reference else None))
    if args.model:  # keys: [<run id>/]<model>/<precision>/<seed>
        out = totals_of({key: cell for key, cell in out["cells"].items() if args.model in key.split("/")[-3:-2]},
                        args.band, out["throughput_not_compared"])
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    for name, total in out["windows"].items():
        print(f"warm-up+timed {name}: {total['hold']} of {total['cells']} cells within {args.band:.0%}, worst "
              f"{total['worst_rel']:+.1%}, saves {total['saves_s']} s of {out['spent_s']} s")
    for label, total in out["around_warmup"].items():
        print(f"{label.replace('_', ' ')} step: {total['slow']} of {total['cells']} cells more than "
              f"{AROUND_SLOW:.0%} slower than steady (median {total['median']:.3f}x)")


if __name__ == "__main__":
    main()

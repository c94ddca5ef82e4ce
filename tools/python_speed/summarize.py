"""Turns run.sh's JSON lines into the evidence file the python_speedup claim is judged from
(results-reference/python/cpu-<date>.json): both interpreters as they describe themselves, the torch build, the CPU,
every run, and per cell the step times and speedups amprepro.analysis.pythonclaim computes from those runs.

  PYTHONPATH=workflow python tools/python_speed/summarize.py runs.jsonl [more.jsonl] \
      results-reference/python/cpu-DATE.json \
      --build-note "both pyenv source builds: ./configure --enable-shared, -O3, no PGO, no LTO" \
      --torch-wheel torch-2.13.0-cp310-cp310-manylinux_2_28_x86_64.whl --torch-wheel torch-2.13.0-cp311-...
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from pathlib import Path

from amprepro.analysis import pythonclaim


def cpu_model() -> str:
    """'AMD EPYC (family 25 model 17), 2 CPUs': /proc/cpuinfo's name, with family and model where the name is bare."""
    fields = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        return platform.processor() or "unknown"
    return (f"{fields.get('model name', 'unknown')} (family {fields.get('cpu family', '?')} model "
            f"{fields.get('model', '?')}), {os.cpu_count()} CPUs")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", help="run.sh's outputs (JSON lines); a later file's rounds follow the "
                        "earlier ones'")
    parser.add_argument("out", help="the evidence file to write")
    parser.add_argument("--build-note", required=True, help="how the two interpreters were built, in words")
    parser.add_argument("--torch-wheel", action="append", default=[], help="the wheel files installed (repeat)")
    parser.add_argument("--note", default="", help="anything else a reader must know")
    args = parser.parse_args(argv)
    runs, offset = [], 0
    for path in args.runs:  # each run.sh output numbers its rounds from 1: renumber them to follow on
        batch = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
        for run in batch:
            runs.append({**run, "round": run["round"] + offset, "batch": path.rsplit("/", 1)[-1]})
        offset = max([run["round"] for run in runs], default=offset)
    if not runs:
        sys.exit(f"{', '.join(args.runs)}: no runs; run tools/python_speed/run.sh first")
    interpreters = {run["label"]: run["python"] for run in runs}
    trained = [run for run in runs if "torch" in run]  # the control imports no torch
    torch_builds = {(run["torch"], run["torch_cuda"]) for run in trained}
    threads = {run["torch_threads"] for run in trained}
    if len(torch_builds) != 1 or threads != {1}:
        sys.exit(f"{', '.join(args.runs)}: the runs used torch {sorted(torch_builds)} with threads "
                 f"{sorted(threads)}; the comparison needs one torch build and one thread in every training run")
    (version, cuda), = torch_builds
    loads = [run["loadavg_1m"] for run in runs]
    evidence = {
        "what": ("Python 3.10 against 3.11 on amprepro's FP32 training step, on this CPU: the CPU's answer to the "
                 "claim, not a GPU's (tools/python_speed/)"),
        "date": datetime.date.today().isoformat(),
        "cpu": cpu_model(), "loadavg_1m": {"min": min(loads), "max": max(loads)},
        "interpreters": interpreters, "build_note": args.build_note,
        "torch": {"version": version, "cuda": cuda, "threads": 1, "wheels": args.torch_wheel},
        "note": args.note,
        "cells": pythonclaim.cell_summary(runs),
        "runs": [{key: value for key, value in run.items() if key != "python"} for run in runs],
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(evidence, indent=1, ensure_ascii=False) + "\n")
    for cell in evidence["cells"]:
        print(f"{cell['kind']} ({cell['cell']}): 3.11 vs 3.10 {cell['speedup_text']} "
              f"(min-max {cell['speedup']['min']:.3f}x to {cell['speedup']['max']:.3f}x, {cell['rounds']} rounds)")


if __name__ == "__main__":
    main()

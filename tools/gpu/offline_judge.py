"""Judge a GPU run's cells here, on any machine: the summary, `make verify`'s comparison and gate, and the report,
from the cell records a device call packed (tools/gpu/full_run.sh's tgz), for a run whose device time ended before its
own summary did. The commands are the rules' own (workflow/rules/runs.smk, verify.smk, report.smk), with the run's
config resolved as the Snakefile resolves it for that box's GPUs. No cell runs here: a cell record that is missing or
set aside (--set-aside) is left out of the summary, and the caller says so beside the evidence.

    .venv/bin/python tools/gpu/offline_judge.py RESULTS_PARENT --gpus 2 [--cap 12] [--set-aside MODEL ...]

RESULTS_PARENT holds results/ (the tgz unpacked); the commands run there, with this checkout's code and reference/.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "workflow"))

from amprepro import config as cfg  # noqa: E402
from amprepro.cellid import CellId  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("parent", type=Path)
    parser.add_argument("--gpus", type=int, required=True, help="GPUs nvidia-smi listed on the run's box")
    parser.add_argument("--gpu-name", default="NVIDIA H200")
    parser.add_argument("--preset", default="full")
    parser.add_argument("--cap", default=None, help="gpu_memory_limit_gib of the run (GiB), if it had one")
    parser.add_argument("--set-aside", nargs="*", default=[], help="models whose records are left out")
    args = parser.parse_args()
    raw = yaml.safe_load((REPO / "config/config.yaml").read_text())
    raw["preset"] = args.preset
    if args.cap:
        raw["gpu_memory_limit_gib"] = float(args.cap)
    config = cfg.validate_config(raw)
    gpus = [args.gpu_name] * args.gpus
    probe = f"nvidia-smi lists {args.gpus} GPU(s)" if gpus else "no nvidia-smi on PATH"
    runs, preset = cfg.resolve_runs(config, REPO / "config/presets", gpus, probe)
    preset["config_sha256"] = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()
    os.chdir(args.parent)
    metrics = [str(CellId.of(c).path / "metrics.json") for c in cfg.cells(runs)]
    kept = [m for m in metrics if Path(m).exists() and m.split("/")[2] not in args.set_aside]
    missing = [m for m in metrics if not Path(m).exists()]
    print(f"offline_judge: {len(kept)} cell records of {len(metrics)}; missing {len(missing)}; set aside "
          f"{len([m for m in metrics if m.split('/')[2] in args.set_aside])} ({', '.join(args.set_aside) or 'none'})")
    searches = [f"results/largest_batch/{c['model']}/{c['precision']}.json" for c in cfg.largest_batch_searches(runs)]
    searches = [s for s in searches if Path(s).exists()]
    largest = (runs.get("largest_batch") or {}).get("models", [])
    env = {**os.environ, "PYTHONPATH": str(REPO / "workflow")}
    py = sys.executable
    steps = [
        [py, "-m", "amprepro.analysis.summary", "--metrics", *kept, "--env", "results/environment/environment.json",
         "--apex", "results/apex/apex.json", "--peak", "results/peak/peak.json", "--preset",
         json.dumps(preset, sort_keys=True), "--largest-batch-asked",
         json.dumps({"models": largest, "note": "" if gpus else "the search measures GPU memory; this run has no GPU"},
                    sort_keys=True), "--largest-batch", *searches,
         "--csv", "results/summary/summary.csv", "--json", "results/summary/summary.json"],
        [py, "-m", "amprepro.verify.verify", "compare", "--summary", "results/summary/summary.json", "--sanity",
         "results/sanity/sanity.json", "--runs-dir", "results/runs", "--reference-dir", str(REPO / "reference"),
         "--claims", str(REPO / "config/claims.yaml"), "--json", "results/verify/verify.json", "--csv",
         "results/verify/verify.csv"],
        [py, "-m", "amprepro.verify.verify", "gate", "--verify", "results/verify/verify.json"],
        [py, "-m", "amprepro.report.render", "--notebook", str(REPO / "notebooks/report.ipynb"), "--executed",
         "results/report/report.ipynb", "--html", "results/report/report.html", "--param",
         f"title={config['report']['title']}", "--param", "summary=results/summary/summary.json",
         "--param", "table=results/summary/summary.csv", "--param", "environment=results/environment/environment.json",
         "--param", "sanity=results/sanity/sanity.json", "--param", "apex=results/apex/apex.json", "--param",
         "runs_dir=results/runs", "--param", f"claims={REPO / 'config/claims.yaml'}", "--param",
         f"reference_dir={REPO / 'reference'}"],
    ]
    for d in ("results/summary", "results/verify", "results/report"):
        Path(d).mkdir(parents=True, exist_ok=True)
    for step in steps:
        print("offline_judge: " + " ".join(step[:4]), flush=True)
        done = subprocess.run(step, env=env)
        if done.returncode != 0:
            print(f"offline_judge: exit {done.returncode}", flush=True)
            if step[3] != "gate":
                sys.exit(done.returncode)


if __name__ == "__main__":
    main()

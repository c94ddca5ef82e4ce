"""Where a paper-preset cell's seconds go outside its timed steps: each cell run as the train rule runs it (plain, for
its wall time), then again under cProfile and -X importtime, and the biggest phases printed.

    python tools/gpu/cell_profile.py --out DIR resnet50/amp_bf16 vit_timm/amp_bf16 ...

Cells that use apex need --apex results/apex/runs.json (a built apex); the others run without it, as in the pipeline.
"""

import argparse
import json
import os
import pstats
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "workflow"))
from amprepro.config import cell_spec_json, gpus_for_jobs, read_config_file, resolve_runs, validate_config  # noqa: E402


def spec_for(cell: str) -> str:
    config = validate_config(read_config_file(REPO / "config" / "config.yaml") | {"preset": "paper"})
    gpus, why = gpus_for_jobs(config.get("gpu", "auto"))
    runs, _ = resolve_runs(config, REPO / "config" / "presets", gpus, why)
    model, precision = cell.split("/")
    return cell_spec_json(runs, model, precision, 0)


def train_command(cell: str, out: Path, apex: str | None, extra: list[str]) -> list[str]:
    folder = out / cell.replace("/", "-")
    folder.mkdir(parents=True, exist_ok=True)
    return [sys.executable, *extra, "-m", "amprepro.train.train", "--spec", spec_for(cell), "--threads", "8",
            "--metrics", str(folder / "metrics.json"), "--steps", str(folder / "steps.csv"),
            *(["--apex", apex] if apex else [])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--apex")
    parser.add_argument("cells", nargs="+")
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(REPO / "workflow"), "CUDA_VISIBLE_DEVICES": "0"}
    report = {}
    for cell in args.cells:
        began = time.monotonic()
        done = subprocess.run(train_command(cell, args.out, args.apex, []), env=env, capture_output=True, text=True)
        plain = time.monotonic() - began
        metrics = json.loads((args.out / cell.replace("/", "-") / "metrics.json").read_text())
        profile = args.out / f"{cell.replace('/', '-')}.prof"
        imports = subprocess.run(train_command(cell, args.out, args.apex, ["-X", "importtime", "-m", "cProfile",
                                                                            "-o", str(profile)]),
                                 env=env, capture_output=True, text=True).stderr
        tops = sorted((int(line.split("|")[1]), line.split("|")[2].strip()) for line in imports.splitlines()
                      if line.startswith("import time:") and line.split("|")[1].strip().isdigit()
                      and not line.split("|")[2].startswith("  "))[-6:]
        stats = pstats.Stats(str(profile))
        ours = {f"{Path(filename).name}:{line}({name})": round(entry[3], 2)
                for (filename, line, name), entry in stats.stats.items() if "/amprepro/" in filename}
        phases = dict(sorted(ours.items(), key=lambda kv: -kv[1])[:30])
        report[cell] = {"rc": done.returncode, "wall_plain_s": round(plain, 2),
                        "metrics_wall_seconds": round(metrics.get("wall_seconds") or 0, 2),
                        "timed_steps_s": round((metrics.get("step_time_mean_s") or 0) * (metrics.get("timed_steps")
                                                                                         or 0), 2),
                        "top_imports_us": tops, "phases_s": dict(sorted(phases.items(), key=lambda kv: -kv[1]))}
        print(json.dumps({cell: report[cell]}, indent=1), flush=True)
    (args.out / "cell_profile.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()

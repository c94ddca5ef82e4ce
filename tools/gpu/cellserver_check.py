"""A forked cell against a fresh one on the GPU: same cell, alternating fresh / forked, through the train rule's
launcher; wall time, throughput, peak memory and every step's loss.

    python tools/gpu/cellserver_check.py --out DIR --repeats 2 resnet50/amp_bf16 vit_timm/amp_bf16 ...
"""

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "workflow"))
sys.path.insert(0, str(REPO / "tools" / "gpu"))
from cell_profile import spec_for  # noqa: E402

from amprepro.plan import cellserver  # noqa: E402


def run(cell: str, out: Path, env: dict, device: str) -> dict:
    command = [sys.executable, "-m", "amprepro.plan.launcher", "--per-node", "1", "--device", device, "--",
               "--spec", spec_for(cell), "--threads", "8", "--metrics", str(out / "metrics.json"),
               "--steps", str(out / "steps.csv")]
    out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    wall = time.monotonic() - began
    if done.returncode != 0:
        return {"rc": done.returncode, "stderr": done.stderr[-2000:]}
    metrics = json.loads((out / "metrics.json").read_text())
    return {"rc": 0, "wall_s": round(wall, 2), "throughput_per_s": metrics["throughput_per_s"],
            "peak_allocated_bytes": metrics["peak_allocated_bytes"], "process": metrics["process"][:40],
            "losses": [row["loss"] for row in csv.DictReader((out / "steps.csv").open())]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("cells", nargs="+")
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(REPO / "workflow"), "CUDA_VISIBLE_DEVICES": "0"}
    process, path = cellserver.start(env, str(REPO))
    report = {}
    try:
        for cell in args.cells:
            runs = []
            for repeat in range(args.repeats):
                for mode, job_env in (("fresh", env), ("forked", {**env, cellserver.ENV: path})):
                    result = run(cell, args.out / cell.replace("/", "-") / f"{mode}{repeat}", job_env, args.device)
                    runs.append({"mode": mode, **result})
            losses = {tuple(r.get("losses", [])) for r in runs}
            report[cell] = {"same_losses_in_every_run": len(losses) == 1,
                            "runs": [{k: v for k, v in r.items() if k != "losses"} for r in runs]}
            print(json.dumps({cell: report[cell]}, indent=1), flush=True)
    finally:
        cellserver.stop(process, path)
    (args.out / "cellserver_check.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()

"""Our ViT cell against timm's benchmark.py in train mode: same model, batch and precision, same GPU, same call.

    python tools/gpu/timm_compare.py --benchmark vendor/timm/benchmark.py --cell results/runs/vit_timm/amp_bf16/seed0
        --apex results/apex/apex.json --out compare/

The cell is re-run from the spec in its metrics.json (so its settings are exactly the pipeline's), right after timm's
run, and both throughputs are written with the ratio. benchmark.py comes from a timm snapshot: never commit it.
timm times fwd + bwd + optimizer step with no loss scaler and reports the mean; we report samples over the median
step. timm's benchmark has no fused-AdamW switch: against our adamw_fused cells it still runs its own AdamW.

Where our cell runs a GradScaler (fp16), timm's benchmark does not: with a non-fused optimizer the scaler's step reads
the inf flag on the host before every optimizer step, a cost of the articles' recipe, not of the harness. So such a
cell is also re-run on timm's recipe (the same spec with the scaler dropped: amp_fp16_unscaled), and that ratio,
"same_recipe", is the harness comparison; the cell's own ratio says what the recipe costs on top.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workflow"))
from amprepro import precisions


def timm_throughput(benchmark: Path, spec: dict, iters: int, warmup: int) -> tuple[float, dict]:
    config, dtype = spec["model_config"], precisions.get(spec["precision"]).autocast_dtype
    if dtype is None:
        raise SystemExit(f"{spec['precision']} runs no torch.autocast: timm's benchmark has nothing to compare")
    command = [sys.executable, str(benchmark), "--bench", "train", "--model", config["arch"],
               "-b", str(config["batch_size"]), "--amp", "--amp-dtype", dtype,
               "--opt", spec["train"]["optimizer"].replace("_fused", ""),
               "--num-warm-iter", str(warmup), "--num-bench-iter", str(iters)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if done.returncode != 0 or "--result" not in done.stdout:
        raise SystemExit(f"timm benchmark failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.split("--result", 1)[1])
    return result["train_samples_per_sec"], {"command": command[1:], "result": result}


def timm_recipe(spec: dict) -> dict | None:
    """The cell's spec on timm's recipe where ours differs (a GradScaler: timm's benchmark runs none), else None."""
    ours = precisions.get(spec["precision"])
    if not ours.grad_scaler:
        return None
    twin = [p.name for p in precisions.REGISTRY.values()
            if p.autocast_dtype == ours.autocast_dtype and not (p.grad_scaler or p.needs_apex or p.compile
                                                                or p.float8_recipe)]
    if len(twin) != 1:
        raise SystemExit(f"no single unscaled twin of {spec['precision']} in amprepro.precisions: {twin}")
    train = {k: v for k, v in spec["train"].items() if k != "grad_scaler_init_scale"}
    return {**spec, "precision": twin[0], "train": train}


def cell_command(spec: dict, apex: Path, out: Path) -> list[str]:
    """The train CLI's command for one cell spec, writing metrics.json and steps.csv in out (loop_ab.py runs it too)."""
    return [sys.executable, "-m", "amprepro.train.train", "--spec", json.dumps(spec), "--apex", str(apex),
            "--threads", "8", "--metrics", str(out / "metrics.json"), "--steps", str(out / "steps.csv")]


def our_throughput(spec: dict, apex: Path, out: Path) -> tuple[float, dict]:
    env = {**os.environ, "PYTHONPATH": "workflow"}
    done = subprocess.run(cell_command(spec, apex, out), capture_output=True, text=True, timeout=600, env=env)
    if done.returncode != 0:
        raise SystemExit(f"amprepro cell failed ({done.returncode}):\n{done.stderr[-3000:]}")
    metrics = json.loads((out / "metrics.json").read_text())
    return metrics["throughput_per_s"], {"spec": spec, "step_time_median_s": metrics["step_time_median_s"],
                                         "hardware": metrics["hardware"], "software": metrics["software"]}


def save_partial(out: Path, rows: list[dict]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "timm_compare.partial.json").write_text(json.dumps(rows, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--benchmark", type=Path, required=True)
    parser.add_argument("--cell", type=Path, action="append", required=True, help="a cell folder under results/runs")
    parser.add_argument("--apex", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--bench-iters", type=int, default=50)
    parser.add_argument("--warm-iters", type=int, default=10)
    args = parser.parse_args()
    rows = []
    for cell in args.cell:
        spec = json.loads((cell / "metrics.json").read_text())["spec"]
        timm, timm_detail = timm_throughput(args.benchmark, spec, args.bench_iters, args.warm_iters)
        ours, our_detail = our_throughput(spec, args.apex, args.out / spec["model"] / spec["precision"])
        row = {"model": spec["model"], "precision": spec["precision"], "timm_samples_per_s": timm,
               "amprepro_samples_per_s": ours, "ratio": ours / timm, "timm": timm_detail, "amprepro": our_detail}
        print(f"{spec['model']}/{spec['precision']}: timm {timm:.1f}/s, amprepro {ours:.1f}/s, "
              f"ratio {ours / timm:.3f} ({(ours / timm - 1) * 100:+.1f} %)", flush=True)
        rows.append(row)
        save_partial(args.out, rows)  # what has finished, should the call's budget end before the rest
        same = timm_recipe(spec)
        if same is not None:
            try:
                plain, plain_detail = our_throughput(same, args.apex, args.out / spec["model"] / same["precision"])
            except SystemExit as failed:  # the cell's own comparison stands; the harness comparison says why not
                row["same_recipe"] = {"precision": same["precision"], "error": str(failed)[-1000:]}
            else:
                row["same_recipe"] = {"precision": same["precision"], "amprepro_samples_per_s": plain,
                                      "ratio": plain / timm, "amprepro": plain_detail}
                print(f"{spec['model']}/{same['precision']} (timm's recipe): amprepro {plain:.1f}/s, "
                      f"ratio {plain / timm:.3f} ({(plain / timm - 1) * 100:+.1f} %)", flush=True)
            save_partial(args.out, rows)
    (args.out / "timm_compare.json").write_text(json.dumps(rows, indent=2))
    (args.out / "timm_compare.partial.json").unlink()


if __name__ == "__main__":
    main()

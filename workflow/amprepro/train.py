"""One training run (one cell of the matrix) in its own process; writes a per-step CSV and a metrics JSON.

A cell this hardware or build cannot run writes status "skipped" with the reason. A run whose loss goes non-finite
is a finding (status "collapsed", first non-finite step recorded), not a crash.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time

STEP_FIELDS = ["step", "loss", "loss_scale", "skipped", "step_time_s"]


def seed_everything(seed: int, deterministic: bool) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False


def put_apex_on_path(apex: dict) -> None:
    """Apex lives in a verified target directory (see docs/apex.md), not in the env: this process adds it."""
    if apex.get("status") == "built" and apex.get("site_dir"):
        sys.path.insert(0, apex["site_dir"])


def make_data(model_config: dict, seed: int, device, model):
    from amprepro import data

    kind, batch = model_config["data"], model_config["batch_size"]
    if kind == "digits":
        return data.DigitsBatches(batch, seed, device)
    if kind == "synthetic_images":
        return data.SyntheticImages(batch, model_config.get("image_size", 224), seed, device)
    return data.SyntheticTokens(batch, model_config.get("seq_len", 1024), model.vocab_size, seed, device)


def make_optimizer(name: str, params, lr: float, weight_decay: float, device):
    import torch

    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=weight_decay)
    if name == "apex_fused_adam":
        from apex.optimizers import FusedAdam

        return FusedAdam(params, lr=lr, weight_decay=weight_decay, adam_w_mode=True)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=(name == "adamw_fused") or None)


def optimizer_unsupported(name: str, device, apex: dict) -> str | None:
    if name == "apex_fused_adam" and (device.type != "cuda" or apex.get("status") != "built"):
        return "apex FusedAdam needs a CUDA GPU and a built apex"
    return None


def cross_entropy(logits, target):
    import torch.nn.functional as F

    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), target.reshape(-1))


def items_per_step(model_config: dict) -> tuple[int, str]:
    if model_config["data"] == "synthetic_tokens":
        return model_config["batch_size"] * model_config.get("seq_len", 1024), "tokens"
    return model_config["batch_size"], "samples"


def evaluate(trainer, batches) -> float | None:
    test = batches.test_set()
    if test is None:
        return None
    x, y = test
    return float((trainer.logits(x).argmax(dim=-1) == y).float().mean())


def numerics(rows: list[dict]) -> dict:
    nonfinite = [r["step"] for r in rows if not math.isfinite(r["loss"])]
    scales = [r["loss_scale"] for r in rows if r["loss_scale"] is not None]
    return {
        "nonfinite_steps": len(nonfinite),
        "first_nonfinite_step": nonfinite[0] if nonfinite else None,
        "skipped_steps": sum(1 for r in rows if r["skipped"]),
        "loss_scale_initial": scales[0] if scales else None,
        "loss_scale_final": scales[-1] if scales else None,
        "loss_scale_min": min(scales) if scales else None,
    }


def run(spec: dict, apex: dict, threads: int) -> tuple[dict, list[dict]]:
    import torch

    from amprepro import measure, models, precision

    torch.set_num_threads(threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model_config, train = spec["model_config"], spec["train"]
    base = {"model": spec["model"], "precision": spec["precision"], "seed": spec["seed"], "spec": spec,
            "hardware": measure.hardware(device), "software": measure.software(apex)}
    reason = (precision.unsupported_reason(spec["precision"], device, apex)
              or models.unavailable_reason(model_config["arch"])
              or optimizer_unsupported(train["optimizer"], device, apex))
    if reason:
        return {**base, "status": "skipped", "reason": reason}, []

    if train.get("deterministic"):
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    seed_everything(spec["seed"], train.get("deterministic", False))
    tf32 = precision.configure_tf32(spec["precision"])
    model = models.build(model_config["arch"], model_config).to(device)
    if model_config.get("channels_last"):
        model = model.to(memory_format=torch.channels_last)
    batches = make_data(model_config, spec["seed"], device, model)
    optimizer = make_optimizer(train["optimizer"], model.parameters(), train["lr"], train.get("weight_decay", 0.0),
                               device)
    trainer = precision.Trainer(spec["precision"], model, optimizer, cross_entropy, device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    rows, started = [], time.time()
    for step in range(train["steps"]):
        x, y = batches.next()
        with measure.StepTimer(device) as timer:
            result = trainer.step(x, y)
            loss = float(result.loss)  # one host sync per step for every precision: fair and simple
        rows.append({"step": step, "loss": loss, "loss_scale": result.scale, "skipped": result.skipped,
                     "step_time_s": timer.seconds})
        if step % 20 == 0:
            print(f"step {step:5d} loss {loss:.4f} scale {result.scale} {timer.seconds * 1000:.1f} ms", flush=True)

    items, unit = items_per_step(model_config)
    stats = measure.step_stats([r["step_time_s"] for r in rows], train["warmup_steps"], items)
    checks = numerics(rows)
    collapsed = not math.isfinite(rows[-1]["loss"]) or (checks["loss_scale_min"] is not None
                                                       and checks["loss_scale_min"] < 1.0)
    metrics = {
        **base,
        "status": "collapsed" if collapsed else "ok",
        "reason": (f"non-finite loss from step {checks['first_nonfinite_step']}; loss scale min "
                   f"{checks['loss_scale_min']}" if collapsed else ""),
        "throughput_unit": f"{unit}/s",
        **stats,
        **measure.memory_stats(device),
        **checks,
        "final_loss": rows[-1]["loss"],
        "final_loss_mean10": sum(r["loss"] for r in rows[-10:]) / len(rows[-10:]),
        "eval_accuracy": evaluate(trainer, batches),
        "parameters": models.parameter_count(model),
        "tf32": tf32,
        "wall_seconds": time.time() - started,
    }
    return metrics, rows


def main(argv=None) -> None:
    from amprepro.files import read_json, write_csv, write_json

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spec", required=True, help="JSON of this cell's settings")
    parser.add_argument("--apex", required=True, help="results/apex/apex.json")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--metrics", required=True)
    parser.add_argument("--steps", required=True)
    args = parser.parse_args(argv)
    spec, apex = json.loads(args.spec), read_json(args.apex)
    put_apex_on_path(apex)
    metrics, rows = run(spec, apex, args.threads)
    # Steps first, metrics last: metrics.json only exists once the run is complete.
    write_csv(args.steps, rows, STEP_FIELDS)
    write_json(args.metrics, metrics)
    print(f"{spec['model']}/{spec['precision']}/seed{spec['seed']}: {metrics['status']} {metrics.get('reason', '')}")


if __name__ == "__main__":
    main()

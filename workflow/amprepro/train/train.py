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

from amprepro.train.cellsupport import cell_optimizer, skip_cause

STEP_FIELDS = ["step", "loss", "loss_scale", "skipped", "step_time_s"]
# The apex record of a cell that uses no apex (cellsupport.needs_apex): its job does not wait for the apex build.
NO_APEX = {"status": "not used", "reason": "this cell uses no apex", "commit": None}


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
    from amprepro.train import data

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


def cross_entropy(logits, target):
    import torch.nn.functional as F

    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), target.reshape(-1))


def items_per_step(x, model_config: dict, world: int) -> tuple[int, str]:
    """Items one step trained on, counted from x, the batch that reached this rank's model (every rank gets as many)."""
    if model_config["data"] == "synthetic_tokens":
        return x.numel() * world, "tokens"
    return x.shape[0] * world, "samples"


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


def swap_layer_norms(model):
    """Replace every nn.LayerNorm by apex's FusedLayerNorm with the same shape and weights."""
    from apex.normalization import FusedLayerNorm
    from torch import nn

    for name, child in model.named_children():
        if isinstance(child, nn.LayerNorm):
            fused = FusedLayerNorm(child.normalized_shape, eps=child.eps, elementwise_affine=child.elementwise_affine)
            fused.load_state_dict(child.state_dict())
            setattr(model, name, fused)
        else:
            swap_layer_norms(child)
    return model


def prepare_model(model_config: dict, device):
    import torch

    from amprepro.train import models

    model = models.build(model_config["arch"], model_config)
    if model_config.get("fused_layer_norm"):
        model = swap_layer_norms(model)
    model = models.place(model, device)
    if model_config.get("channels_last"):
        model = model.to(memory_format=torch.channels_last)
    return model


def step_flops(trainer, model, x, y, world: int) -> tuple[int | None, str]:
    """FLOPs of one global training step (forward + backward; the counted step is not applied), and how counted."""
    from amprepro.train import flops, models

    if isinstance(model, models.Llama):  # counting would cost another (7B) step and would count the recompute
        return model.model_flops_per_token(x.shape[1]) * x.numel() * world, "analytic"
    try:
        total = flops.count_training_flops(lambda: trainer.forward_loss(x, y).backward())
    except Exception as exc:  # counting is best effort: some custom kernels have no FLOP formula
        print(f"FLOP counting failed: {exc}", flush=True)
        total = None
    trainer.zero_grad()
    return (total * world if total else None), "FlopCounterMode"


def run(spec: dict, apex: dict, threads: int, dist=None) -> tuple[dict, list[dict]]:
    import torch

    from amprepro.train import distributed

    dist = dist or distributed.Dist()
    torch.set_num_threads(threads)
    device = dist.device()
    base = base_record(spec, apex, device, dist)
    skip = skip_cause(spec, device, apex)
    if skip:
        cause, needs, reason = skip
        return {**base, "status": "skipped", "reason": reason, "skip_cause": cause, "skip_needs": needs}, []
    try:
        return train_cell(spec, apex, dist, device, base)
    except Exception as exc:
        if dist.active:  # torchrun stops the other ranks; a half-written DDP record would be worse than none
            raise
        return failure_record(base, exc), []


def base_record(spec: dict, apex: dict, device, dist) -> dict:
    """What every record of a cell says: the cell, where it ran (nodes, GPUs, the node of each rank), the software."""
    from amprepro.train import measure

    return {"model": spec["model"], "precision": spec["precision"], "seed": spec["seed"], "spec": spec,
            "hardware": measure.hardware(device), "software": measure.software(apex), "world_size": dist.world,
            "nodes": dist.nodes, "gpus_used": dist.world if device.type == "cuda" else 0, "rank_nodes": dist.hosts,
            "process": os.environ.get("AMPREPRO_CELL_PROCESS", "a fresh interpreter")}


def not_run_record(spec: dict, apex: dict, cause: str, needs: str, reason: str) -> dict:
    """The record of a cell its launcher found it cannot start (too few GPUs or nodes): no worker ever ran."""
    import torch

    from amprepro.train import distributed

    base = base_record(spec, apex, torch.device("cpu"), distributed.Dist(hosts=[]))
    return {**base, "world_size": 0, "nodes": 0, "status": "skipped", "skip_cause": cause, "skip_needs": needs,
            "reason": reason}


def failure_record(base: dict, exc: Exception) -> dict:
    """A cell that broke is a result the report shows (with the reason), not a hole that stops the summary."""
    import traceback

    import torch

    traceback.print_exc()  # the whole traceback goes to the cell's log
    message = (str(exc).strip().splitlines() or [""])[0][:300]
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return {**base, "status": "skipped", "skip_cause": "machine",
                "reason": f"out of GPU memory at batch size {base['spec']['model_config']['batch_size']}: "
                          f"lower batch_size for this model. {message}{measured_need(base)}"}
    return {**base, "status": "failed",
            "reason": f"{type(exc).__name__}: {message} (traceback in the cell's log; after fixing, rerun with "
                      "snakemake --forcerun <this cell's metrics.json>)"}


def measured_need(base: dict) -> str:
    """What an out-of-memory cell had allocated at its peak, next to what it was estimated to need."""
    import torch

    from amprepro.train import memory

    parts = []
    if torch.cuda.is_available():
        parts.append(f"allocator peak before the failure {memory.gib(torch.cuda.max_memory_allocated())}")
    if base.get("memory_estimate"):
        estimate = base["memory_estimate"]
        parts.append(f"{memory.describe(estimate)}; free at start {memory.gib(estimate['free_bytes_at_start'])}")
    return f" ({'; '.join(parts)})" if parts else ""


def epoch_fields(model_config: dict, tokens_per_s: float) -> dict:
    """The derived epoch time for the preset's stated token count (token models only): tokens / (tokens/s)."""
    tokens = model_config.get("epoch_tokens")
    if not tokens or model_config["data"] != "synthetic_tokens":
        return {"epoch_tokens": tokens, "epoch_hours_derived": None}
    return {"epoch_tokens": tokens, "epoch_hours_derived": tokens / tokens_per_s / 3600}


def train_cell(spec: dict, apex: dict, dist, device, base: dict) -> tuple[dict, list[dict]]:
    from amprepro.train import memory, precision

    model_config, train = spec["model_config"], spec["train"]
    if train.get("deterministic"):
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    seed_everything(spec["seed"], train.get("deterministic", False))
    tf32 = precision.configure_tf32(spec["precision"])
    estimate = memory.estimate_for_cell(model_config, spec["precision"], device)
    base["memory_estimate"] = estimate  # in place: failure_record names it when the cell runs out of memory anyway
    if memory.does_not_fit(estimate):
        return memory.skip_record(base, estimate), []
    model = prepare_model(model_config, device)
    optimizer_name = cell_optimizer(train, spec["precision"])
    optimizer = make_optimizer(optimizer_name, model.parameters(), train["lr"], train.get("weight_decay", 0.0), device)
    wrap = lambda m: dist.wrap(m, device, model_config.get("sync_batchnorm", False))  # noqa: E731
    trainer = precision.Trainer(spec["precision"], model, optimizer, cross_entropy, device, wrap=wrap,
                                recomputes=getattr(model, "checkpointing", False))
    breakdown = memory.Breakdown(model, trainer.optimizer, enabled=device.type == "cuda")
    batches = make_data(model_config, spec["seed"], device, model)
    return train_loop(spec, dist, device, base, model, batches, trainer, breakdown,
                      {"tf32": tf32, "optimizer": optimizer_name, "apex_cast_cache": trainer.apex_cast_cache})


def train_loop(spec, dist, device, base, model, batches, trainer, breakdown, settings) -> tuple[dict, list[dict]]:
    import torch

    from amprepro.train import flops, measure, models

    model_config, train = spec["model_config"], spec["train"]
    if model_config.get("compile"):
        trainer.model = torch.compile(trainer.model)

    def next_batch():
        x, y = batches.next()
        x, y = dist.shard(x), dist.shard(y)
        if model_config.get("channels_last") and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        return x, y

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    energy = flops.EnergyMeter(device)
    rows, started, energy_start = [], time.time(), None
    for step in range(train["steps"]):
        if step == train["warmup_steps"]:
            energy_start = energy.read_joules()
        x, y = next_batch()
        with measure.StepTimer(device) as timer:
            result = trainer.step(x, y)
            loss = float(dist.mean(result.loss))  # one host sync per step for every precision: fair and simple
        scale, skipped = result.read_back()  # after the timed step: the queue is empty, reading back is free
        rows.append({"step": step, "loss": loss, "loss_scale": scale, "skipped": skipped,
                     "step_time_s": timer.seconds})
        if step % 20 == 0 and dist.is_main:
            print(f"step {step:5d} loss {loss:.4f} scale {scale} {timer.seconds * 1000:.1f} ms", flush=True)
    energy_end = energy.read_joules()
    load = measure.host_load()
    energy_j = dist.total(energy_end - energy_start if None not in (energy_start, energy_end) else None, device)
    # Counted after training, on the last batch, so counting changes neither the data order nor the timings. Every
    # rank counts its own share (under DDP the backward's all-reduce needs them all); the global step is world times.
    flops_per_step, flops_method = step_flops(trainer, model, x, y, dist.world)
    gpu_name = base["hardware"]["gpu_name"]

    items, unit = items_per_step(x, model_config, dist.world)
    stats = measure.step_stats([r["step_time_s"] for r in rows], train["warmup_steps"], items)
    checks = numerics(rows)
    collapsed = not math.isfinite(rows[-1]["loss"]) or (checks["loss_scale_min"] is not None
                                                       and checks["loss_scale_min"] < 1.0)
    achieved = flops_per_step / stats["step_time_median_s"] / 1e12 if flops_per_step else None
    timed_items = items * stats["timed_steps"]
    memory_stats = measure.memory_stats(device)
    metrics = {
        **base,
        "status": "collapsed" if collapsed else "ok",
        "reason": (f"non-finite loss from step {checks['first_nonfinite_step']}; loss scale min "
                   f"{checks['loss_scale_min']}" if collapsed else ""),
        "throughput_unit": f"{unit}/s",
        **stats,
        **memory_stats,
        "memory_breakdown_bytes": breakdown.result(memory_stats["peak_allocated_bytes"]),
        **checks,
        "final_loss": rows[-1]["loss"],
        "final_loss_mean10": sum(r["loss"] for r in rows[-10:]) / len(rows[-10:]),
        "eval_accuracy": evaluate(trainer, batches) if not dist.active else None,
        "parameters": models.parameter_count(model),
        "flops_per_step": flops_per_step,
        "flops_method": flops_method,
        "achieved_tflops": achieved,
        "items_per_step": items,
        "datasheet_peak_tflops": dist.total(flops.datasheet_peak(gpu_name, spec["precision"]), device),
        "datasheet_note": flops.datasheet_note(gpu_name),
        "energy_j_per_item": energy_j / timed_items if energy_j is not None else None,
        **epoch_fields(model_config, stats["throughput_per_s"]),
        **settings,
        "host_load": load,
        "host_threads": measure.thread_pools(),
        "wall_seconds": time.time() - started,
    }
    return metrics, rows


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spec", required=True, help="JSON of this cell's settings")
    parser.add_argument("--apex", help="results/apex/runs.json, for a cell that uses apex")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--metrics", required=True)
    parser.add_argument("--steps", required=True)
    return parser.parse_args(argv)


def write_results(args: argparse.Namespace, metrics: dict, rows: list[dict]) -> None:
    """Steps first, metrics last: metrics.json only exists once the run is complete."""
    from amprepro.files import write_csv, write_json

    write_csv(args.steps, rows, STEP_FIELDS)
    write_json(args.metrics, metrics)
    print(f"{metrics['model']}/{metrics['precision']}/seed{metrics['seed']}: {metrics['status']} "
          f"{metrics.get('reason', '')}")


def cell_apex(path: str | None) -> dict:
    from amprepro.files import read_json

    return read_json(path) if path else NO_APEX


def write_not_run(argv: list[str], cause: str, needs: str, reason: str) -> None:
    """For the launcher (amprepro.train.distributed): write the cell as skipped, with the reason, without running it."""
    args = parse_args(argv)
    write_results(args, not_run_record(json.loads(args.spec), cell_apex(args.apex), cause, needs, reason), [])


def main(argv=None) -> None:
    args = parse_args(argv)
    spec, apex = json.loads(args.spec), cell_apex(args.apex)
    put_apex_on_path(apex)
    from amprepro.train import distributed

    dist = distributed.setup()
    metrics, rows = run(spec, apex, args.threads, dist)
    dist.close()
    if dist.is_main:
        write_results(args, metrics, rows)


if __name__ == "__main__":
    main()

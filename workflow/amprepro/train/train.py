"""One training run (one cell of the matrix) in its own process; writes a per-step CSV and a metrics JSON.

A cell this hardware or build cannot run writes status "skipped" with the reason. A run whose loss goes non-finite
is a finding (status "collapsed", first non-finite step recorded), not a crash.
"""

from __future__ import annotations

import argparse
import collections
import math
import os
import random
import sys
import time

from amprepro import archs
from amprepro.cellspec import CellSpec
from amprepro.train.cellsupport import skip_cause
from amprepro.train.oom import (
    ALLOCATION_FAILURES,
    apply_memory_limit,
    available_memory_bytes,
    does_not_fit,
    measured_need,
    out_of_memory,
)
from amprepro.train.record import (
    NO_APEX,
    STEP_FIELDS,
    base_record,
    cell_apex,
    cell_plan,
    epoch_fields,
    failure_record,
    gpu_sharing,
    lora_fields,
    not_run_record,
    numerics,
    write_results,
)

__all__ = ["ALLOCATION_FAILURES", "COSINE_FLOOR", "NO_APEX", "PROGRESS_EVERY", "PROGRESS_LAG", "STEP_FIELDS",
           "apply_memory_limit", "available_memory_bytes", "base_record", "cell_apex", "cell_plan",
           "cross_entropy", "does_not_fit", "epoch_fields", "evaluate", "failure_record", "gpu_sharing",
           "items_per_step", "lora_fields", "lr_at", "main", "make_data", "make_optimizer", "measured_need",
           "not_run_record", "numerics", "out_of_memory", "parse_args", "prepare_model", "put_apex_on_path", "run",
           "seed_everything", "set_lr", "step_flops", "swap_layer_norms", "train_cell", "train_loop",
           "write_not_run", "write_results"]

PROGRESS_EVERY, PROGRESS_LAG = 20, 2  # a progress line every 20 steps, read 2 steps behind the queue (train_loop)


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


def make_data(model_config: dict, seed: int, device, model, on_device: bool = False):
    """The cell's batches. on_device: synthetic values drawn on the device (data.generator_on), for the search."""
    from amprepro.train import data, imagedata, textdata

    kind, batch = model_config["data"], model_config["batch_size"]
    if kind == "digits":
        return data.DigitsBatches(batch, seed, device)
    if kind == "synthetic_images":
        return data.SyntheticImages(batch, archs.image_size(model_config), seed, device, on_device)
    if kind == textdata.DATA_KIND:
        return textdata.StdlibTextBatches(batch, archs.data_seq_len(model_config), seed, device,
                                          model_config.get("eval_windows", textdata.DEFAULT_EVAL_WINDOWS))
    if kind in imagedata.KINDS:
        return imagedata.batches(model_config, seed, device)
    return data.SyntheticTokens(batch, archs.data_seq_len(model_config), model.vocab_size, seed, device, on_device)


def make_optimizer(name: str, params, lr: float, weight_decay: float, device):
    import torch

    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=weight_decay)
    if name == "apex_fused_adam":
        from apex.optimizers import FusedAdam

        return FusedAdam(params, lr=lr, weight_decay=weight_decay, adam_w_mode=True)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=(name == "adamw_fused") or None)


COSINE_FLOOR = 0.1  # lr_schedule cosine: from lr down to this fraction of it at the last step


def lr_at(train: dict, step: int) -> float:
    """The learning rate of a step. First train.lr_warmup_steps steps (0 by default): a linear ramp, lr x (step + 1) /
    (lr_warmup_steps + 1), as nanoGPT's. Then train.lr (lr_schedule constant, the default), or a cosine decay from
    train.lr at the first step after the ramp to COSINE_FLOOR x train.lr at the last step (lr_schedule cosine)."""
    ramp = train.get("lr_warmup_steps", 0)
    if step < ramp:
        return train["lr"] * (step + 1) / (ramp + 1)
    decay_steps = train["steps"] - 1 - ramp
    if train.get("lr_schedule", "constant") == "constant" or decay_steps < 1:
        return train["lr"]
    progress = (step - ramp) / decay_steps
    return train["lr"] * (COSINE_FLOOR + (1 - COSINE_FLOOR) * 0.5 * (1 + math.cos(math.pi * progress)))


def set_lr(optimizer, train: dict, step: int) -> None:
    if train.get("lr_schedule", "constant") != "constant" or train.get("lr_warmup_steps", 0):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(train, step)


def cross_entropy(logits, target):
    import torch.nn.functional as F

    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), target.reshape(-1))


def items_per_step(x, model_config: dict, world: int) -> tuple[int, str]:
    """Items one step trained on, counted from x, the batch that reached this rank's model (every rank gets as many)."""
    if model_config["data"] in ("synthetic_tokens", "python_stdlib"):
        return x.numel() * world, "tokens"
    return x.shape[0] * world, "samples"


def evaluate(trainer, batches) -> float | None:
    test = batches.test_set()
    if test is None:
        return None
    x, y = test
    return float((trainer.logits(x).argmax(dim=-1) == y).float().mean())


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

    from amprepro.train import lora, models

    model = models.build(model_config["arch"], model_config)
    if model_config.get("fused_layer_norm"):
        model = swap_layer_norms(model)
    adapters = lora.setting(model_config)  # LoRA: a frozen base with trainable adapters (amprepro.train.lora)
    if adapters and adapters["base"] == "bf16":  # still on the meta device: materialised in bf16, never in FP32 first
        model = model.to(torch.bfloat16)
    model = models.place(model, device)
    if adapters:
        model = lora.apply(model, adapters)
    if model_config.get("channels_last"):
        model = model.to(memory_format=torch.channels_last)
    return model


def step_flops(trainer, model, x, y, world: int) -> tuple[int | None, str]:
    """FLOPs of one global training step (forward + backward; the counted step is not applied), and how counted."""
    from amprepro.train import flops, models

    if isinstance(model, models.Llama):  # counting would cost another (7B) step and would count the recompute
        from amprepro.train import lora

        if lora.adapters(model):
            return lora.flops_per_token(model, x.shape[1]) * x.numel() * world, "analytic (LoRA: amprepro.train.lora)"
        return model.model_flops_per_token(x.shape[1]) * x.numel() * world, "analytic"
    try:
        total = flops.count_training_flops(lambda: trainer.forward_loss(x, y).backward())
    except Exception as exc:  # counting is best effort: some custom kernels have no FLOP formula
        print(f"FLOP counting failed: {exc}", flush=True)
        total = None
    trainer.zero_grad()
    return (total * world if total else None), "FlopCounterMode"


def run(spec: CellSpec | dict, apex: dict, threads: int, dist=None, plan: dict | None = None
        ) -> tuple[dict, list[dict]]:
    """One cell. plan: its model's view of the memory plan (amprepro.plan.memplan): the batch and shape it runs at,
    whether that fits, and the allocator limit of an emulated smaller card."""
    import torch

    from amprepro.train import distributed

    spec = CellSpec.of(spec).planned(plan)
    dist = dist or distributed.Dist()
    torch.set_num_threads(threads)
    device = dist.device()
    base = base_record(spec, apex, device, dist, plan)
    skip = skip_cause(spec, device, apex)
    if skip:
        cause, needs, reason = skip
        return {**base, "status": "skipped", "reason": reason, "skip_cause": cause, "skip_needs": needs}, []
    try:
        return train_cell(spec, apex, dist, device, base, plan)
    except Exception as exc:
        if dist.active:  # torchrun stops the other ranks; a half-written DDP record would be worse than none
            raise
        return failure_record(base, exc), []


def train_cell(spec: CellSpec, apex: dict, dist, device, base: dict, plan: dict | None = None
               ) -> tuple[dict, list[dict]]:
    from amprepro import memory
    from amprepro.train import float8, measure, precision

    model_config, train = spec.model_config, spec.train
    if train.get("deterministic"):
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    seed_everything(spec.seed, train.get("deterministic", False))
    tf32 = precision.configure_tf32(spec.precision)
    # in place: failure_record names them when the cell runs out of memory anyway
    base["memory_estimate"] = memory.estimate(model_config, spec.precision, spec.optimizer).as_record()
    base["memory_limit_bytes"] = apply_memory_limit(plan, device)
    skipped = does_not_fit(spec, base, plan, device)
    if skipped:
        return skipped, []
    model = prepare_model(model_config, device)
    fp8 = float8.convert(model, spec.precision)  # torchao Float8Linear on the qualifying layers; None: no FP8
    optimizer_name = spec.optimizer
    # only what trains: every parameter, or a LoRA model's adapters (its frozen base has no gradient and no state)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(optimizer_name, trainable, train["lr"], train.get("weight_decay", 0.0), device)
    wrap = lambda m: dist.wrap(m, device, model_config.get("sync_batchnorm", False))  # noqa: E731
    trainer = precision.Trainer(spec.precision, model, optimizer, cross_entropy, device, wrap=wrap,
                                recomputes=getattr(model, "checkpointing", False),
                                scaler_init_scale=train.get("grad_scaler_init_scale"))
    breakdown = measure.Breakdown(model, trainer.optimizer, enabled=device.type == "cuda")
    batches = make_data(model_config, spec.seed, device, model)
    return train_loop(spec, dist, device, base, model, batches, trainer, breakdown,
                      {"tf32": tf32, "optimizer": optimizer_name, "apex_cast_cache": trainer.apex_cast_cache,
                       "apex_build": spec.apex_build if spec.needs_apex else None,
                       "apex_fused_kernels": trainer.apex_fused_kernels, "float8": fp8})


def train_loop(spec, dist, device, base, model, batches, trainer, breakdown, settings) -> tuple[dict, list[dict]]:
    import torch

    from amprepro.train import float8, flops, heldout, measure, models, precisions

    model_config, train = spec.model_config, spec.train
    curve = heldout.Curve(train["steps"], model_config.get("eval_every") if not dist.active else None)
    curve.maybe(0, trainer, batches)
    settings["compiled"] = None
    if model_config.get("compile") or precisions.get(spec.precision).compile:
        trainer.model, settings["compiled"] = float8.compile_model(trainer.model)

    def next_batch():
        x, y = batches.next()
        x, y = dist.shard(x), dist.shard(y)
        if model_config.get("channels_last") and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        return x, y

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    energy = flops.EnergyMeter(device)
    # Every step's loss, loss scale and skip flag stay on the device until the GPU is past them: reading them as each
    # step is queued would make the host wait for that step before queueing the next (fp16 ViT-B/16 measured 3.6 %
    # slower than timm's benchmark.py, which reads nothing in its timed loop; issue 40). Every PROGRESS_EVERY steps the
    # rows up to PROGRESS_LAG steps back are read and the progress line printed, while the GPU still has the last
    # PROGRESS_LAG steps queued, so it never waits for the host; the rest are read after the last step.
    pending, rows, started, energy_start = collections.deque(), [], time.time(), None

    def settle(upto: float) -> None:
        while pending and pending[0][0] <= upto:
            step, loss, result, timer = pending.popleft()
            loss, (scale, skipped), seconds = float(loss), result.read_back(), timer.settle()
            rows.append({"step": step, "loss": loss, "loss_scale": scale, "skipped": skipped, "step_time_s": seconds})
            if step % PROGRESS_EVERY == 0 and dist.is_main:
                print(f"step {step:5d} loss {loss:.4f} scale {scale} {seconds * 1000:.1f} ms", flush=True)

    for step in range(train["steps"]):
        if step == train["warmup_steps"]:
            if device.type == "cuda":  # the host runs ahead of the GPU: the warm-up's energy ends when its work does
                torch.cuda.synchronize(device)
            energy_start = energy.read_joules()
        x, y = next_batch()
        set_lr(trainer.optimizer, train, step)
        with measure.StepTimer(device, sync=False) as timer:
            result = trainer.step(x, y)
            loss = dist.mean(result.loss)
        pending.append((step, loss, result, timer))
        if step % PROGRESS_EVERY == PROGRESS_LAG:
            settle(step - PROGRESS_LAG)
        curve.maybe(step + 1, trainer, batches)
    settle(math.inf)
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
        **curve.fields(),
        **({"data_record": batches.record} if getattr(batches, "record", None) else {}),
        "parameters": models.parameter_count(model),
        **lora_fields(model_config, model, rows, curve),
        "flops_per_step": flops_per_step,
        "flops_method": flops_method,
        "achieved_tflops": achieved,
        "items_per_step": items,
        "datasheet_peak_tflops": dist.total(flops.datasheet_peak(gpu_name, spec.precision), device),
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
    parser.add_argument("--plan", help="results/plan/models/<model>.json: the memory plan's view for this model")
    return parser.parse_args(argv)


def write_not_run(argv: list[str], cause: str, needs: str, reason: str) -> None:
    """For the launcher (amprepro.plan.launcher): write the cell as skipped, with the reason, without running it."""
    args = parse_args(argv)
    record = not_run_record(CellSpec.from_json(args.spec), cell_apex(args.apex), cause, needs, reason,
                            cell_plan(args.plan))
    write_results(args, record, [])


def main(argv=None) -> None:
    args = parse_args(argv)
    spec, apex, plan = CellSpec.from_json(args.spec), cell_apex(args.apex), cell_plan(args.plan)
    put_apex_on_path(apex)
    from amprepro.train import distributed

    dist = distributed.setup()
    metrics, rows = run(spec, apex, args.threads, dist, plan)
    dist.close()
    if dist.is_main:
        write_results(args, metrics, rows)


if __name__ == "__main__":
    main()

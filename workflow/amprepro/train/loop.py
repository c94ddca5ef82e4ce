"""A cell's training loop: the learning-rate schedule, the steps (read back behind the GPU queue), the held-out curve,
the FLOP count and energy, and the record of a cell that ran (status ok or collapsed) from what the loop measured."""

from __future__ import annotations

import collections
import math
import time

from amprepro.cellrecord import CellRecord
from amprepro.modelsettings import ModelSettings
from amprepro.train.record import epoch_fields, lora_fields, numerics

PROGRESS_EVERY, PROGRESS_LAG = 20, 2  # a progress line every 20 steps, read 2 steps behind the queue (train_loop)
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


def items_per_step(x, settings: ModelSettings, world: int) -> tuple[int, str]:
    """Items one step trained on, counted from x, the batch that reached this rank's model (every rank gets as many)."""
    if settings.data in ("synthetic_tokens", "python_stdlib"):
        return x.numel() * world, "tokens"
    return x.shape[0] * world, "samples"


def evaluate(trainer, batches) -> float | None:
    test = batches.test_set()
    if test is None:
        return None
    x, y = test
    return float((trainer.logits(x).argmax(dim=-1) == y).float().mean())


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


def train_loop(spec, dist, device, base, cell, batches, breakdown, settings) -> tuple[dict, list[dict]]:
    """The steps of a cell built by amprepro.train.cell.build_cell (its compile left to here: after the held-out loss
    before the first step), and its record (built as a CellRecord: a key it does not know is refused; returned as its
    dict, as train.run returns every record). settings: what the record says about the build (tf32, cell.settings())."""
    import torch

    from amprepro.train import flops, heldout, measure, models

    model_settings, train = spec.settings, spec.train
    model, trainer = cell.model, cell.trainer
    curve = heldout.Curve(train["steps"], model_settings.eval_every if not dist.active else None)
    curve.maybe(0, trainer, batches)
    cell.compile()
    settings["compiled"] = cell.compiled

    def next_batch():
        x, y = batches.next()
        return cell.inputs(dist.shard(x)), dist.shard(y)

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    energy = flops.EnergyMeter(device)
    # Every step's loss, loss scale and skip flag stay on the device until the GPU is past them: reading them as each
    # step is queued would make the host wait for that step before queueing the next (fp16 ViT-B/16 measured 3.6 %
    # slower than timm's benchmark.py, which reads nothing in its timed loop; issue 40). Every PROGRESS_EVERY steps the
    # rows up to PROGRESS_LAG steps back are read and the progress line printed: each waits for its step's end event
    # only, and is read on a side stream (measure.SideReads), so the GPU keeps the last PROGRESS_LAG steps queued; the
    # rest are read after the last step.
    pending, rows, started, reads = collections.deque(), [], time.time(), measure.SideReads(device)

    def counters():  # where the timed steps' energy and CPU windows start and end
        return energy.read_joules(), measure.cpu_snapshot()

    window = measure.TimedWindow(counters)

    def settle(upto: float) -> None:
        while pending and pending[0][0] <= upto:
            step, loss, result, timer = pending.popleft()
            seconds = timer.settle()
            with reads:
                loss, (scale, skipped) = float(loss), result.read_back()
            rows.append({"step": step, "loss": loss, "loss_scale": scale, "skipped": skipped, "step_time_s": seconds})
            if step % PROGRESS_EVERY == 0 and dist.is_main:
                print(f"step {step:5d} loss {loss:.4f} scale {scale} {seconds * 1000:.1f} ms", flush=True)

    for step in range(train["steps"]):
        if step == train["warmup_steps"]:  # the timed steps' energy and CPU windows start where the warm-up's work ends
            window.before_first(pending[-1][3] if pending else None, device)
        x, y = next_batch()
        set_lr(trainer.optimizer, train, step)
        with measure.StepTimer(device, sync=False) as timer:
            result = trainer.step(x, y)
            loss = dist.mean(result.loss)
        pending.append((step, loss, result, timer))
        if step == train["warmup_steps"]:
            window.after_first_queued()
        if step % PROGRESS_EVERY == PROGRESS_LAG:
            settle(step - PROGRESS_LAG)
        curve.maybe(step + 1, trainer, batches)
    settle(math.inf)
    energy_end, cpu_end = counters()
    energy_start, cpu_start = window.start or (None, None)
    load = {**measure.host_load(), **measure.busy_during(cpu_start, cpu_end, own_ranks=measure.local_ranks(dist))}
    energy_j = dist.total(energy_end - energy_start if None not in (energy_start, energy_end) else None, device)
    # Counted after training, on the last batch, so counting changes neither the data order nor the timings. Every
    # rank counts its own share (under DDP the backward's all-reduce needs them all); the global step is world times.
    flops_per_step, flops_method = step_flops(trainer, model, x, y, dist.world)
    gpu_name = base["hardware"]["gpu_name"]

    items, unit = items_per_step(x, model_settings, dist.world)
    stats = measure.step_stats([r["step_time_s"] for r in rows], train["warmup_steps"], items)
    checks = numerics(rows)
    collapsed = not math.isfinite(rows[-1]["loss"]) or (checks["loss_scale_min"] is not None
                                                       and checks["loss_scale_min"] < 1.0)
    achieved = flops_per_step / stats["step_time_median_s"] / 1e12 if flops_per_step else None
    timed_items = items * stats["timed_steps"]
    memory_stats = measure.memory_stats(device)
    record = CellRecord.from_dict({
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
        **lora_fields(model_settings, model, rows, curve),
        "flops_per_step": flops_per_step,
        "flops_method": flops_method,
        "achieved_tflops": achieved,
        "items_per_step": items,
        "datasheet_peak_tflops": dist.total(flops.datasheet_peak(gpu_name, spec.precision), device),
        "datasheet_note": flops.datasheet_note(gpu_name),
        "energy_j_per_item": energy_j / timed_items if energy_j is not None else None,
        **epoch_fields(model_settings, stats["throughput_per_s"]),
        **settings,
        "host_load": load,
        "host_threads": measure.thread_pools(),
        "wall_seconds": time.time() - started,
    }, source="the finished run's record")
    return record.as_dict(), rows

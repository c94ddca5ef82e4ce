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
from amprepro.cellid import CellId
from amprepro.cellspec import CellSpec
from amprepro.train.cellsupport import skip_cause

STEP_FIELDS = ["step", "loss", "loss_scale", "skipped", "step_time_s"]
PROGRESS_EVERY, PROGRESS_LAG = 20, 2  # a progress line every 20 steps, read 2 steps behind the queue (train_loop)
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


def base_record(spec: CellSpec, apex: dict, device, dist, plan: dict | None = None) -> dict:
    """What every record of a cell says: the cell, where it ran (nodes, GPUs, the node of each rank), the software,
    and the memory plan's decision for its model (the batch and shape it ran at, and why)."""
    from amprepro.train import measure

    return {"model": spec.model, "precision": spec.precision, "seed": spec.seed, "spec": spec.as_dict(),
            "plan": plan,
            "hardware": measure.hardware(device), "software": measure.software(apex), "world_size": dist.world,
            "nodes": dist.nodes, "gpus_used": dist.world if device.type == "cuda" else 0, "rank_nodes": dist.hosts,
            "process": os.environ.get("AMPREPRO_CELL_PROCESS", "a fresh interpreter"), **gpu_sharing(os.environ)}


def gpu_sharing(env) -> dict:
    """{"gpu_shared": {"cells_per_gpu": K}} for a cell that ran on a GPU shared with up to K-1 other untimed cells
    (amprepro.gpuslots --shared sets the variable): its throughput was measured while sharing, so the report marks
    it and verify does not compare it. {} for a cell that had its GPU to itself."""
    from amprepro.gpuslots import SHARED_ENV

    value = env.get(SHARED_ENV, "")
    return {"gpu_shared": {"cells_per_gpu": int(value)}} if value.isdigit() and int(value) > 0 else {}


def not_run_record(spec: CellSpec, apex: dict, cause: str, needs: str, reason: str, plan: dict | None = None) -> dict:
    """The record of a cell its launcher found it cannot start (too few GPUs or nodes): no worker ever ran."""
    import torch

    from amprepro.train import distributed

    base = base_record(spec.planned(plan), apex, torch.device("cpu"), distributed.Dist(hosts=[]), plan)
    return {**base, "world_size": 0, "nodes": 0, "status": "skipped", "skip_cause": cause, "skip_needs": needs,
            "reason": reason}


def failure_record(base: dict, exc: Exception) -> dict:
    """A cell that broke is a result the report shows (with the reason), not a hole that stops the summary."""
    import traceback

    traceback.print_exc()  # the whole traceback goes to the cell's log
    message = (str(exc).strip().splitlines() or [""])[0][:300]
    if out_of_memory(exc):
        return {**base, "status": "skipped", "skip_cause": "machine", "skip_needs": "more GPU memory",
                "reason": f"out of GPU memory at batch size {base['spec']['model_config']['batch_size']}: "
                          f"{message}{measured_need(base)}. The memory plan (results/plan/plan.json) sizes the "
                          "presets' batches; a batch written in your config is kept as written: lower it"}
    return {**base, "status": "failed",
            "reason": f"{type(exc).__name__}: {message} (traceback in the cell's log; after fixing, rerun with "
                      "snakemake --forcerun <this cell's metrics.json>)"}


# What CUDA, cuBLAS and cuDNN say when an allocation fails: memory, not a crash (issue 21: cublasCreate at 11.5 GiB).
ALLOCATION_FAILURES = ("CUDA out of memory", "CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED",
                       "CUSOLVER_STATUS_ALLOC_FAILED", "CUFFT_ALLOC_FAILED", "CUSPARSE_STATUS_ALLOC_FAILED",
                       "cudaErrorMemoryAllocation", "CUDA error: out of memory")


def out_of_memory(exc: BaseException) -> bool:
    import torch

    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    text = f"{exc}"
    return isinstance(exc, RuntimeError) and any(marker in text for marker in ALLOCATION_FAILURES)


def measured_need(base: dict) -> str:
    """What an out-of-memory cell had allocated at its peak, next to what it was estimated to need."""
    import torch

    from amprepro import memory

    parts = []
    if torch.cuda.is_available():
        parts.append(f"allocator peak before the failure {memory.gib(torch.cuda.max_memory_allocated())}")
    if base.get("memory_estimate"):
        parts.append(memory.describe_record(base["memory_estimate"]))
    if base.get("memory_limit_bytes"):
        parts.append(f"this cell's allocator limit {memory.gib(base['memory_limit_bytes'])}")
    return f" ({'; '.join(parts)})" if parts else ""


def apply_memory_limit(plan: dict | None, device) -> int | None:
    """An emulated smaller card (gpu_memory_limit_gib): cap this process's caching allocator before the model is
    built. Returns the limit in bytes, or None."""
    limit = (plan or {}).get("allocator_limit_bytes")
    if device.type != "cuda" or not limit:
        return None
    import torch

    index = torch.cuda.current_device() if device.index is None else device.index  # the call wants an index
    total = torch.cuda.get_device_properties(index).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, limit / total), index)
    return limit


def available_memory_bytes() -> int | None:
    """The memory this machine can still give a process (Linux's MemAvailable), or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def does_not_fit(spec: CellSpec, base: dict, plan: dict | None, device) -> dict | None:
    """The skip record of a cell that cannot fit: the plan said so (a batch written in the config), or, run without a
    plan, its estimate exceeds the GPU's free memory, or, on a CPU (where the plan fits nothing), its estimate exceeds
    the machine's available memory (the 7B shape of the fp8 presets on a laptop: killed by the kernel otherwise, with
    an empty log)."""
    from amprepro import memory

    estimate = base["memory_estimate"]
    if device.type == "cpu":
        available = available_memory_bytes()
        if available is not None and estimate["total_bytes"] > available:
            return {**base, "status": "skipped", "skip_cause": "machine", "skip_needs": "more memory (a GPU)",
                    "reason": f"does not fit: {memory.describe_record(estimate)} exceeds the {memory.gib(available)} "
                              "of memory available on this machine, which has no GPU for it; run it on a GPU"}
    if plan is not None and not plan.get("fits", True):
        return {**base, "status": "skipped", "skip_cause": "machine", "skip_needs": "more GPU memory",
                "reason": f"{plan['why']}; run it on a GPU with more memory or lower its batch_size"}
    if plan is None and device.type == "cuda":
        import torch

        free = torch.cuda.mem_get_info(device)[0]
        base["free_bytes_at_start"] = free
        if estimate["total_bytes"] > free:
            return {**base, "status": "skipped", "skip_cause": "machine", "skip_needs": "more GPU memory",
                    "reason": f"does not fit: {memory.describe_record(estimate)} exceeds the {memory.gib(free)} "
                              "free on this GPU at start; run it on a GPU with more memory"}
    return None


def epoch_fields(model_config: dict, tokens_per_s: float) -> dict:
    """The derived epoch time for the preset's stated token count (token models only): tokens / (tokens/s)."""
    tokens = model_config.get("epoch_tokens")
    if not tokens or model_config["data"] != "synthetic_tokens":
        return {"epoch_tokens": tokens, "epoch_hours_derived": None}
    return {"epoch_tokens": tokens, "epoch_hours_derived": tokens / tokens_per_s / 3600}


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

    from amprepro import precisions
    from amprepro.train import float8, flops, heldout, measure, models

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


def lora_fields(model_config: dict, model, rows: list[dict], curve) -> dict:
    """A LoRA cell's own record (amprepro.train.lora.record) and where its loss started: the first step's training
    loss and the held-out loss before the first step (with eval_every), beside final_loss and heldout_loss_final."""
    if model_config.get("lora") is None:
        return {}
    from amprepro.train import lora

    first = curve.rows[0]["loss"] if curve.rows and curve.rows[0]["step"] == 0 else None
    return {**lora.record(model, lora.setting(model_config)), "initial_loss": rows[0]["loss"],
            "heldout_loss_initial": first}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spec", required=True, help="JSON of this cell's settings")
    parser.add_argument("--apex", help="results/apex/runs.json, for a cell that uses apex")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--metrics", required=True)
    parser.add_argument("--steps", required=True)
    parser.add_argument("--plan", help="results/plan/models/<model>.json: the memory plan's view for this model")
    return parser.parse_args(argv)


def write_results(args: argparse.Namespace, metrics: dict, rows: list[dict]) -> None:
    """Steps first, metrics last: metrics.json only exists once the run is complete."""
    from amprepro.files import write_csv, write_json

    write_csv(args.steps, rows, STEP_FIELDS)
    write_json(args.metrics, metrics)
    print(f"{CellId.of(metrics)}: {metrics['status']} "
          f"{metrics.get('reason', '')}")


def cell_apex(path: str | None) -> dict:
    from amprepro.files import read_json

    return read_json(path) if path else NO_APEX


def cell_plan(path: str | None) -> dict | None:
    from amprepro.files import read_json

    return read_json(path) if path else None


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

"""One training run (one cell of the matrix) in its own process; writes a per-step CSV and a metrics JSON.

A cell this hardware or build cannot run writes status "skipped" with the reason. A run whose loss goes non-finite
is a finding (status "collapsed", first non-finite step recorded), not a crash.
"""

from __future__ import annotations

import argparse
import os
import random
import sys

from amprepro import archs
from amprepro.cellspec import CellSpec
from amprepro.train.cellsupport import skip_cause
from amprepro.train.loop import (
    COSINE_FLOOR,
    PROGRESS_EVERY,
    PROGRESS_LAG,
    evaluate,
    items_per_step,
    lr_at,
    set_lr,
    step_flops,
    train_loop,
)
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


def cross_entropy(logits, target):
    import torch.nn.functional as F

    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), target.reshape(-1))


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

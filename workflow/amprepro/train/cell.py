"""One factory for a cell: build_cell(spec, device, plan) makes what a cell trains with, for the training run
(amprepro.train.train, which the memory plan's probes run too) and the largest-batch search
(amprepro.train.batchsearch), so that the search measures what the cell runs.

What it builds, in this order (the order draws the seeded random numbers): the model (LoRA, a bf16 base, apex's
fused LayerNorm and channels_last where the model asks), torchao's FP8 conversion where the precision has a recipe, the
optimizer over what trains, the precision's Trainer (autocast, GradScaler, apex amp.initialize, then the DDP wrap), and
torch.compile where the precision or the model compiles. Its batches come from make_data, through Cell.inputs.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from amprepro.cellspec import CellSpec
from amprepro.modelsettings import ModelSettings


def seed_everything(seed: int, deterministic: bool) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False


def make_data(settings: ModelSettings | dict, seed: int, device, model, on_device: bool = False):
    """The cell's batches. on_device: synthetic values drawn on the device (data.generator_on), for the search."""
    from amprepro.train import data, imagedata, textdata

    settings = ModelSettings.of(settings)
    kind, batch = settings.data, settings.batch_size
    if kind == "digits":
        return data.DigitsBatches(batch, seed, device)
    if kind == "synthetic_images":
        return data.SyntheticImages(batch, settings.image_size, seed, device, on_device)
    if kind == textdata.DATA_KIND:
        return textdata.StdlibTextBatches(batch, settings.data_seq_len, seed, device, settings.eval_windows)
    if kind in imagedata.KINDS:
        return imagedata.batches(settings, seed, device)
    return data.SyntheticTokens(batch, settings.data_seq_len, model.vocab_size, seed, device, on_device)


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


def build_weights(settings: ModelSettings | dict, init_cache=None):
    """The model as its builder makes it, on the CPU (or the meta device, for a model its GPU initialises), and where
    its initial weights came from (amprepro.train.initcache: built, or read from init_cache, the directory of weights
    earlier cells built; None: always built). Needs no GPU: a cell whose GPU is still busy does it first
    (amprepro.train.train.stage)."""
    from amprepro.train import initcache, models

    settings = ModelSettings.of(settings)
    return initcache.build(settings.arch_entry, settings, lambda: models.build(settings.arch, settings), init_cache)


def prepare_model(settings: ModelSettings | dict, device, init_cache=None, built=None):
    """The model, on its device, and where its initial weights came from (build_weights; built: what it returned,
    when the cell called it before its GPU was free)."""
    import torch

    from amprepro.train import lora, models

    settings = ModelSettings.of(settings)
    model, init_weights = built if built is not None else build_weights(settings, init_cache)
    if settings.fused_layer_norm:
        model = swap_layer_norms(model)
    adapters = lora.setting(settings)  # LoRA: a frozen base with trainable adapters (amprepro.train.lora)
    if adapters and adapters["base"] == "bf16":  # still on the meta device: materialised in bf16, never in FP32 first
        model = model.to(torch.bfloat16)
    model = models.place(model, device)
    if adapters:
        model = lora.apply(model, adapters)
    if settings.channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model, init_weights


@dataclass
class Cell:
    """What a cell trains with. model: the model as built (converted to FP8, LoRA-wrapped, channels_last), before the
    DDP wrap and the compile: what the FLOP count, the parameter count and LoRA's record read. trainer: the precision's
    training step around it (trainer.model is what runs, trainer.optimizer what steps)."""

    spec: CellSpec
    model: Any
    trainer: Any
    float8: dict | None
    compiled: str | None = None
    init_weights: dict | None = None

    @property
    def compiles(self) -> bool:
        """Whether the model runs through torch.compile: the model's `compile` setting or the precision's."""
        from amprepro import precisions

        return self.spec.settings.compile or precisions.get(self.spec.precision).compile

    def compile(self) -> None:
        """torch.compile where the model or the precision asks (amprepro.train.float8.compile_model), once."""
        if self.compiles and self.compiled is None:
            from amprepro.train import float8

            blocks = self.spec.settings.arch_entry.compiled_blocks
            self.trainer.model, self.compiled = float8.compile_model(self.trainer.model, blocks)

    def inputs(self, x):
        """A batch as the model takes it: in channels_last where the model is (4-D image batches only)."""
        if self.spec.settings.channels_last and x.dim() == 4:
            import torch

            return x.contiguous(memory_format=torch.channels_last)
        return x

    def settings(self) -> dict:
        """What the cell's record says about how it was built (beside tf32, which the process sets)."""
        spec, trainer = self.spec, self.trainer
        return {"optimizer": spec.optimizer, "apex_cast_cache": trainer.apex_cast_cache,
                "apex_build": spec.apex_build if spec.needs_apex else None,
                "apex_fused_kernels": trainer.apex_fused_kernels, "float8": self.float8,
                "init_weights": self.init_weights}


def build_cell(spec: CellSpec | dict, device, plan: dict | None, dist=None, compile_now: bool = True,
               init_cache=None, built=None) -> Cell:
    """The cell of `spec` at the batch and shape of `plan` (its model's view of the memory plan; None: as written), on
    `device`. dist: the data-parallel group (amprepro.train.distributed.Dist) whose DDP wraps the model; None: one
    process. compile_now=False leaves the compile to the caller's cell.compile() (the training run: after its held-out
    loss before the first step, which runs eager). init_cache, built: the initial weights (prepare_model)."""
    from amprepro.train import float8, precision

    spec = CellSpec.of(spec).planned(plan)
    settings, train = spec.settings, spec.train
    model, init_weights = prepare_model(settings, device, init_cache, built)
    fp8 = float8.convert(model, spec.precision)  # torchao Float8Linear on the qualifying layers; None: no FP8
    # only what trains: every parameter, or a LoRA model's adapters (its frozen base has no gradient and no state)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(spec.optimizer, trainable, train["lr"], train.get("weight_decay", 0.0), device)
    wrap = None
    if dist is not None:
        wrap = lambda m: dist.wrap(m, device, settings.sync_batchnorm)  # noqa: E731
    trainer = precision.Trainer(spec.precision, model, optimizer, cross_entropy, device, wrap=wrap,
                                recomputes=getattr(model, "checkpointing", False),
                                scaler_init_scale=train.get("grad_scaler_init_scale"))
    cell = Cell(spec, model, trainer, fp8, init_weights=init_weights)
    if compile_now:
        cell.compile()
    return cell

"""FP8 training through torchao (issue 26, docs/fp8.md): which nn.Linear layers run their matmuls in FP8, the
conversion, why a cell cannot run it here, and how a precision with `compile` compiles the model.

The filter (FP8_FILTER, kept in amprepro.precisions: the report states it, and every FP8 cell's metrics.json
as `float8`): an nn.Linear runs in FP8 when
- both of its dimensions are multiples of 16 (torch._scaled_mm's requirement),
- both are at least MIN_DIM (small matmuls get slower: the casts and scales cost more than FP8 saves; torchao's own
  auto-filter uses stricter H100 thresholds that would leave every layer of GPT-124M and ViT-B/16 in bf16 under
  rowwise scaling, so amprepro uses this one threshold for both recipes and reports what it converted),
- it is not the model's output layer (OUTPUT_LAYERS: the LM head, the classifier; torchao's docs and torchtitan keep
  it in high precision), and
- its forward is its own: the out_proj of nn.MultiheadAttention is never called as a module (the attention reads
  its weight directly), so converting it would change nothing and be counted wrongly.
Everything else (embeddings, attention scores, norms, the skipped layers) runs under bf16 autocast.
"""

from __future__ import annotations

import importlib

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from amprepro import precisions
from amprepro.precisions import FP8_FILTER
from amprepro.precisions import FP8_MIN_DIM as MIN_DIM
from amprepro.precisions import FP8_OUTPUT_LAYERS as OUTPUT_LAYERS

TORCHAO_VERSION = "0.18.0"  # requirements.txt's pin; tests/backbone/test_fp8.py keeps them equal


def layer_decision(fqn: str, module, parent) -> str | None:
    """None when this nn.Linear runs in FP8; else why not."""
    if fqn in OUTPUT_LAYERS:
        return "the output layer stays in bf16"
    if isinstance(parent, nn.MultiheadAttention):
        return "nn.MultiheadAttention calls its weight directly, not this module"
    out_features, in_features = module.weight.shape
    if in_features % 16 or out_features % 16:
        return f"{in_features}x{out_features}: a dimension is not a multiple of 16"
    if min(in_features, out_features) < MIN_DIM:
        return f"{in_features}x{out_features}: smaller than {MIN_DIM}"
    return None


def plan(model) -> dict[str, str | None]:
    """Every nn.Linear of the model by its name: None (runs in FP8) or the reason it does not."""
    modules = dict(model.named_modules())
    decisions = {}
    for fqn, module in modules.items():
        if isinstance(module, nn.Linear) and fqn:
            parent = modules.get(fqn.rpartition(".")[0]) if "." in fqn else model
            decisions[fqn] = layer_decision(fqn, module, parent)
    return decisions


def convert(model, precision: str) -> dict | None:
    """Swap the qualifying nn.Linear layers for torchao's Float8Linear with the precision's recipe, in place (the
    parameters stay the same objects, so an optimizer built later or earlier sees them). Returns the record that goes
    into metrics.json (`float8`), or None for a precision without FP8."""
    recipe = precisions.get(precision).float8_recipe
    if recipe is None:
        return None
    import torchao
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    decisions = plan(model)
    converted = {fqn for fqn, why in decisions.items() if why is None}
    convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(recipe),
                               module_filter_fn=lambda module, fqn: fqn in converted)
    linear = {fqn: m for fqn, m in dict(model.named_modules()).items() if fqn in decisions}
    done = sorted(fqn for fqn, m in linear.items() if type(m).__name__ == "Float8Linear")
    if set(done) != converted:
        raise RuntimeError(f"torchao converted {sorted(set(done) ^ converted)} other than planned")
    fp8_params = sum(linear[fqn].weight.numel() for fqn in done)
    all_params = sum(m.weight.numel() for m in linear.values())
    return {"recipe": recipe, "torchao": torchao.__version__, "filter": FP8_FILTER,
            "linear_layers": len(decisions), "fp8_layers": len(done),
            "fp8_weight_fraction": fp8_params / all_params if all_params else None,
            "kept_in_bf16": {fqn: why for fqn, why in decisions.items() if why is not None}}


def unavailable_reason(precision: str) -> str | None:
    """Why a precision that needs torchao cannot run here (torchao missing or broken); None when it can."""
    if not precisions.get(precision).needs_torchao:
        return None
    try:
        importlib.import_module("torchao.float8")
    except Exception as exc:  # ImportError, or a torchao built for another torch
        return (f"{precision} needs torchao (float8 training), which is not importable here ({exc}); "
                f"install torchao=={TORCHAO_VERSION} (requirements.txt)")
    return None


def capability_reason(precision: str, device) -> str | None:
    """Why this device cannot run the precision's matmuls (FP8: compute capability >= 8.9); None when it can."""
    needed = precisions.get(precision).min_capability
    if needed is None:
        return None
    want = ".".join(map(str, needed))
    if device.type != "cuda":
        return (f"{precision}: FP8 matmuls (torch._scaled_mm) need an NVIDIA GPU of compute capability >= {want} "
                "(Ada, Hopper or newer); no CUDA GPU here")
    have = tuple(torch.cuda.get_device_capability(device))
    if have < tuple(needed):
        return (f"{precision}: FP8 matmuls (torch._scaled_mm) need compute capability >= {want} (Ada, Hopper or "
                f"newer); this GPU is {have[0]}.{have[1]}")
    return None


def compile_model(model, blocks: str = ""):
    """torch.compile for a cell whose model sets `compile: true` or whose precision compiles. A LLaMA-shaped model
    compiles each block (its blocks are identical: one graph serves all of them), with the block's activation
    checkpoint inside the compiled region, as torchtitan orders them (checkpoint, then compile). blocks: the arch's
    list of identical blocks (amprepro.archs.Arch.compiled_blocks, e.g. ViT-B/16's encoder layers): each is compiled
    in place and one graph serves them all (PyTorch's regional compilation), which halves the cold compile; "" (any
    other model): the whole model. Returns (the model to train, how it was compiled)."""
    from amprepro.train import models

    inner = getattr(model, "module", model)  # DDP wraps the model
    if isinstance(inner, models.Llama):
        inner.blocks = nn.ModuleList(CompiledBlock(block, inner.checkpointing) for block in inner.blocks)
        inner.checkpointing = False  # the blocks checkpoint themselves now, inside the compiled region
        return model, "torch.compile per block (activation checkpointing inside the compiled block)"
    if blocks:
        layers = inner.get_submodule(blocks)
        for layer in layers:
            layer.compile()  # in place: the model's modules and state_dict keys stay as they were
        return model, (f"torch.compile per block: the {len(layers)} blocks of {blocks} (one graph serves them all), "
                       "the rest eager")
    return torch.compile(model), "torch.compile of the whole model"


class CompiledBlock(nn.Module):
    """One LLaMA block, checkpointed when the model was, compiled with the checkpoint inside."""

    def __init__(self, block: nn.Module, checkpointing: bool):
        super().__init__()
        self.block, self.checkpointing = block, checkpointing
        self.compile()

    def forward(self, x, cos, sin):
        if self.checkpointing and self.training and torch.is_grad_enabled():
            return checkpoint(self.block, x, cos, sin, use_reentrant=False)
        return self.block(x, cos, sin)

"""LoRA fine-tuning of a LLaMA-shaped model (model_config `lora`, issue 39): a frozen base, trainable low-rank adapters.

Written here rather than taken from peft (not a requirement of this pipeline) so that the CPU tests and every machine
run it with torch alone. It does what peft 0.21's LoraConfig(r, lora_alpha, lora_dropout=0, target_modules) does to
an nn.Linear, in the same order, so that amprepro.memory's LoRA rules (measured through peft on the H200:
results-reference/regimes, the 7b-lora rows) hold for it:
- the base linear is kept as is and frozen (requires_grad False), as are every other weight of the model (embedding,
  norms, LM head);
- A (in x r, Kaiming-uniform with a = sqrt(5), as nn.Linear's default) and B (r x out, zeros: the adapted model starts
  as the base) are FP32 parameters on the base's device, whatever the base's dtype (peft's autocast_adapter_dtype);
- forward: base(x) + B(A(x cast to the adapters' dtype)) x alpha / r, cast back to the base output's dtype. Under
  autocast the adapters' matmuls run in the autocast dtype; the cast of a bf16 input to FP32 makes a copy that A
  keeps for its weight's gradient (memory counts it).
The frozen base is held in FP32 or in bf16 (`base`): a bf16 base needs autocast bf16 (amp_bf16), which
amprepro.config checks before anything runs. A cell builds a bf16 base in bf16 on the meta device and materialises it
so (amprepro.train.cell.prepare_model): an FP32 copy first would need twice the memory (OpenLLaMA-3B: 12.8 GiB, over
a 12 GiB card, for a base that trains in 6.4).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from amprepro.modelsettings import LORA_TARGETS, LoraSettings, ModelSettings

TARGETS = LORA_TARGETS  # LlamaBlock's linears, by module name
DEFAULTS = LoraSettings().resolved()  # the setting's defaults (amprepro.modelsettings.LoraSettings)


class LoraLinear(nn.Module):
    """A frozen nn.Linear plus a trainable rank-r update B A, scaled by alpha / r."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float):
        super().__init__()
        self.base = base
        base.weight.requires_grad_(False)
        if base.bias is not None:
            base.bias.requires_grad_(False)
        device = base.weight.device
        self.lora_A = nn.Linear(base.in_features, rank, bias=False, device=device, dtype=torch.float32)
        self.lora_B = nn.Linear(rank, base.out_features, bias=False, device=device, dtype=torch.float32)
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)
        self.rank, self.scaling = rank, alpha / rank

    def forward(self, x):
        result = self.base(x)
        update = self.lora_B(self.lora_A(x.to(self.lora_A.weight.dtype))) * self.scaling
        return (result + update).to(result.dtype)


def setting(settings: ModelSettings | dict) -> dict | None:
    """The model's `lora` setting with the defaults filled in, or None (no LoRA)."""
    given = ModelSettings.of(settings).lora
    return None if given is None else given.resolved()


def apply(model: nn.Module, lora: dict) -> nn.Module:
    """Freeze every parameter of the (materialised) model, cast it to bf16 for a bf16 base, and wrap each targeted
    linear of the blocks in a LoraLinear. Returns the model, changed in place."""
    if lora["base"] == "bf16":  # parameters and buffers (RoPE's tables), as the measured regimes did; a no-op where
        model.to(torch.bfloat16)  # the cell built the base in bf16 on the meta device (cell.prepare_model)
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    targets = set(lora["targets"])
    for block in model.blocks:
        for parent in (block.attn, block.ffn):
            for name, child in list(parent.named_children()):
                if name in targets and isinstance(child, nn.Linear):
                    setattr(parent, name, LoraLinear(child, lora["rank"], lora["alpha"]))
    return model


def trainable(model: nn.Module) -> list:
    return [p for p in model.parameters() if p.requires_grad]


def adapters(model: nn.Module) -> list[LoraLinear]:
    return [m for m in model.modules() if isinstance(m, LoraLinear)]


def flops_per_token(model: nn.Module, seq_len: int) -> int:
    """Training FLOPs per token of a LoRA step, counted as they are computed: each frozen matmul weight 4 (forward 2,
    the input's gradient 2; no weight gradient), each adapter weight 6 (forward, input and weight gradients), and
    the attention term of Llama.model_flops_per_token. The first block's input needs no gradient (the embedding is
    frozen), so its linears' input gradients are counted but not computed: an overcount under 1/layers of the
    frozen part. A checkpointed forward's recompute is not useful work and is not counted."""
    adapter = sum(m.lora_A.weight.numel() + m.lora_B.weight.numel() for m in adapters(model))
    frozen = model.matmul_parameters() - adapter  # matmul_parameters counts every nn.Linear, adapters included
    return 4 * frozen + 6 * adapter + 12 * model.layers * model.dim * seq_len


def record(model: nn.Module, lora: dict) -> dict:
    """What a LoRA cell's metrics.json says about its adapters (flat, so the summary table carries them)."""
    params = trainable(model)
    return {"lora_rank": lora["rank"], "lora_alpha": lora["alpha"], "lora_targets": "+".join(lora["targets"]),
            "lora_base": lora["base"], "trainable_parameters": sum(p.numel() for p in params),
            "frozen_parameter_dtypes": sorted({str(p.dtype) for p in model.parameters() if not p.requires_grad})}

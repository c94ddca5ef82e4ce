"""The regimes' types: the memory model's settings beyond one GPU with FP32 master weights (issue 25), for the LLaMA
shapes (llama_estimate; the report's regimes table, amprepro.analysis.regimes, reads it). All predictions: a regime is
measured only where a committed measurement file says so (tools/gpu/regimes_run.sh writes one).
- Sharding over N data-parallel ranks (Sharding): ZeRO-1 divides the optimizer state and the FP32 master weights by N,
  ZeRO-2 the gradients too, ZeRO-3 (= FSDP FULL_SHARD) the weights too (arXiv 1910.02054). What stays whole: ZeRO-2/3
  hold one FSDP unit's unsharded gradient before its reduce-scatter, ZeRO-3 two units' gathered weights (the one
  computing and the one prefetched) in the compute dtype; a unit is one decoder block, or the embedding or LM head
  where larger. ZeRO-3's AMP is FSDP's MixedPrecision (weights gathered in bf16, so no autocast cast cache).
  The optimizer's step runs on the rank's shard. Communication buffers beyond one unit are not counted.
- bf16 weights with no FP32 master copy (BF16_WEIGHTS, a memory-model precision, not in the registry: no cell trains
  it): bf16 weights and gradients, and torch's AdamW on bf16 parameters keeps its two moments in bf16: 2 + 2 + 4 = 8
  bytes per parameter; the residual stream and the matmul inputs are bf16.
- LoRA (Lora): the base frozen in FP32 or bf16, rank-r adapters (A: in x r, B: r x out, FP32 as peft casts them) on
  every linear of the blocks (qkv, out, gate_up, down; this model fuses q, k and v into one linear, so "q and v only"
  is not a module peft can target here); the LM head and embeddings frozen. Gradients and AdamW state exist for the
  adapters only. The frozen norms keep no normalised input and the frozen LM head no input; each adapter's A keeps
  its own copy of its linear's input: peft casts the input to the adapter's FP32 (a bf16 input is copied) and
  autocast casts that back to bf16, so under autocast even the out projection's and down's bf16 inputs are kept as
  new copies. A frozen FP32 base under autocast is cast again at every use (autocast caches only weights that require
  grad), and each cast is saved for the input gradient: without checkpointing, a 16-bit copy of every frozen matmul
  weight is alive at the end of the forward (counted as the cast cache); with checkpointing, the LM head's, and one
  block's while it is recomputed. Left out (at most 0.13 GiB for LLaMA-7B, an overestimate): the frozen embedding's
  output needs no gradient, so the first block keeps neither its input nor, over an FP32 base, qkv's weight cast.
"""

from __future__ import annotations

from dataclasses import dataclass

from amprepro import precisions
from amprepro.modelsettings import LORA_TARGETS as SETTING_TARGETS
from amprepro.modelsettings import ModelSettings

# A precision the memory model knows beyond the registry: bf16 weights trained by torch's AdamW on bf16 parameters
# (moments in bf16), no FP32 master copy. No cell trains it (the registry is the pipeline's); the regimes table and the
# GPU regime measurement (tools/gpu/regimes_run.py) do.
BF16_WEIGHTS = precisions.Precision("bf16_weights", "bf16 weights, bf16 AdamW (no FP32 master)", "#7a5195", "bf16",
                                    bytes_per_parameter=(2, 2, 4, 0, 0), compute_bytes=2, residual_bytes=2)
MODEL_ONLY_PRECISIONS = {BF16_WEIGHTS.name: BF16_WEIGHTS}


def precision_of(name: str) -> precisions.Precision:
    """The registry's entry, or one of the memory model's own (MODEL_ONLY_PRECISIONS)."""
    return MODEL_ONLY_PRECISIONS[name] if name in MODEL_ONLY_PRECISIONS else precisions.get(name)


@dataclass(frozen=True)
class Sharding:
    """Model states partitioned over `ranks` data-parallel ranks at ZeRO `stage` (0: each rank holds them all, as DDP;
    1: optimizer state and FP32 master weights; 2: + gradients; 3, FSDP FULL_SHARD: + weights)."""

    ranks: int = 1
    stage: int = 0

    def __post_init__(self):
        if self.ranks < 1 or self.stage not in (0, 1, 2, 3):
            raise ValueError(f"sharding over {self.ranks} ranks at ZeRO stage {self.stage}: ranks must be >= 1 and "
                             "the stage 0, 1, 2 or 3")

    def text(self) -> str:
        if self.stage == 0 or self.ranks == 1:
            return "one GPU" if self.ranks == 1 else f"DDP over {self.ranks} GPUs"
        return f"{'FSDP (ZeRO-3)' if self.stage == 3 else f'ZeRO-{self.stage}'} over {self.ranks} GPUs"


UNSHARDED = Sharding()


LORA_TARGETS = SETTING_TARGETS  # amprepro.train.models.LlamaBlock's linears, by module name (amprepro.modelsettings)


@dataclass(frozen=True)
class Lora:
    """LoRA adapters of `rank` on every linear of the blocks over a frozen base held in `base` ("fp32" or "bf16").
    The activations are counted as with every linear targeted (the default); with fewer targets the frozen linears
    keep a little less, and the estimate is an upper bound."""

    rank: int = 16
    base: str = "fp32"
    targets: tuple[str, ...] = LORA_TARGETS

    def __post_init__(self):
        if self.rank < 1 or self.base not in ("fp32", "bf16") or not set(self.targets) <= set(LORA_TARGETS):
            raise ValueError(f"LoRA rank {self.rank}, base {self.base!r}, targets {self.targets}: rank must be >= 1, "
                             f"the base fp32 or bf16, the targets among {', '.join(LORA_TARGETS)}")

    def text(self) -> str:
        return f"LoRA r={self.rank} on {'every linear' if len(self.targets) == 4 else '+'.join(self.targets)}, " \
               f"frozen {'FP32' if self.base == 'fp32' else 'bf16'} base"


def lora_of(settings: ModelSettings | dict) -> Lora | None:
    """The model config's `lora` setting (amprepro.train.lora: rank, alpha, targets, base) as the memory model's Lora,
    or None. Its defaults are the setting's (amprepro.modelsettings.LoraSettings: rank 16, every linear, FP32 base)."""
    given = ModelSettings.of(settings).lora
    if given is None:
        return None
    return Lora(rank=given.rank, base=given.base, targets=given.targets)


"""One cell's predicted peak: what each part of its memory holds at each moment of a training step, the largest of
those moments, and the headroom a measured peak must leave of a budget.

Parts (bytes), with an AdamW-type optimizer (two FP32 moments):
- model states, per parameter (amprepro.precisions.bytes_per_parameter): fp32/tf32 4 weights + 4 gradients + 8
  optimizer state; torch.amp and apex O1 the same plus a 2-byte cast of each matmul weight; apex O2 2-byte FP16 weights
  + 2-byte FP16 and 4-byte FP32 master gradients + 8 optimizer state + 4-byte FP32 master weights (ZeRO's 16 bytes per
  parameter of mixed-precision Adam, arXiv 1910.02054, plus O2's FP32 master gradients, read from apex 25.05).
- activations: the tensors autograd saves for the backward, counted from the architecture (amprepro.memory.activations,
  amprepro.memory.llama), plus the largest
  short-lived gradient at the start of the backward; the input batch (not for a LLaMA: its token ids are a few KiB).
- workspace: cuBLAS/cuDNN workspaces and allocator rounding. WORKSPACE_BYTES is what the digits models (whose own
  tensors are under 2 MiB) peaked at on the H200 reference (0.066-0.070 GiB): a measured constant, not derived.

The peak is the largest of these moments:
- A, the end of the forward: weights, master weights, optimizer state (from the second step on), the forward's cast
  cache, the saved activations and the first gradients of the backward; gradients are freed before the forward
  (zero_grad(set_to_none=True)), except apex O2's FP16 model gradients, which its patched zero_grad zeroes and keeps
  (and scale_loss frees before the backward; it frees the FP32 master gradients and allocates them after the
  backward, so the end of the backward holds the FP16 gradients only: apex 25.05's _process_optimizer).
  For a LLaMA it is two moments: the forward's last (the loss: the logits, their FP32 copy and log-softmax's output,
  with autocast's whole cast cache) and the backward's first ("backward start": log-softmax's output, its gradient and
  its input's gradient, 12 bytes x vocab per token, or the LM head's weight gradient where larger; autocast has exited
  and freed the casts no saved tensor holds: under checkpointing all but the LM head's).
- B, the end of a LLaMA's backward (llama_backward_end_bytes): every gradient, and the larger of the embedding's
  backward (the last: its output's gradient) and the first block's (recomputed under checkpointing, kept without it:
  its saved tensors, weight casts and working gradients, less its own and the embedding's gradients, not yet
  allocated then). At micro-batch 1 the embedding's is the larger: the H200 measured 32 MiB beyond the model states
  and the workspace for LLaMA-7B in TF32 and in bf16 AMP, with and without checkpointing (results-reference/regimes).
  Without checkpointing the backward between A and B frees each block's saved tensors and casts as it allocates the
  block's gradients, so the memory moves monotonically from A to B and the larger end is the peak.
- C, the optimizer step: every gradient, the optimizer state, the optimizer's temporaries (the default foreach AdamW
  allocates one FP32 tensor per parameter; fused AdamW and apex FusedAdam update in place), and apex O1's cast cache,
  which apex keeps until scale_loss exits after the backward (not when activation checkpointing recomputes blocks:
  amprepro.train.precision turns the cache off then).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from amprepro import archs
from amprepro.memory.activations import (
    _gpt_activations,
    _resnet_activations,
    _risk_activations,
    _small_activations,
    _vit_activations,
)
from amprepro.memory.llama import (
    _llama_activations,
    _llama_dtypes,
    llama_backward_end_bytes,
    llama_block_bytes,
    llama_head_bytes,
)
from amprepro.memory.regimes import UNSHARDED, Lora, Sharding, lora_of, precision_of
from amprepro.memory.shapes import (
    LLAMA_SHAPES,
    _gpt_parameters,
    _gumbel_parameters,
    _lstm_parameters,
    _resnet_parameters,
    _small_cnn_parameters,
    _tiny_transformer_parameters,
    _vit_parameters,
    is_llama,
    llama_parameters,
    llama_shape,
    llama_unit_parameters,
    lora_parameters,
)
from amprepro.modelsettings import ModelSettings

WORKSPACE_BYTES = 68 * 2**20
# A batch measured to fit (a plan's probe, a largest-batch try) fits for the cells only when its allocator peak is at
# most HEADROOM of the budget: the rest is for what a cell's later steps and its siblings meet and one short
# measurement does not (fragmentation, another memory layout). H200, 2026-12-01, 16 GiB cap: resnet50/fp32's probe
# at 184 peaked at 98.3 % of the budget and ran, then resnet50_channels_last/tf32 at 184 ran out of memory; at a 3 GiB
# cap a largest-batch try of vit_b_16/amp_bf16 finished and the same batch ran out of memory at a fresh cell's second
# step (0.22 GiB reserved but unallocated). Every probe peak of the 12, 16 and 24 GiB runs whose cells all ran was at
# most 94 % (results-reference/memory-caps).
HEADROOM = 0.95

# Optimizers that update in place; the others (torch's default foreach AdamW, SGD with momentum) allocate about one
# FP32 tensor per parameter in their step.
IN_PLACE_OPTIMIZERS = ("adamw_fused", "apex_fused_adam")


@dataclass(frozen=True)
class Estimate:
    """A cell's predicted peak, by part (bytes), and which moment is the peak ("forward end", "backward start" (a
    LLaMA's), "backward end" or "optimizer step")."""

    weights: int
    gradients: int
    optimizer_state: int
    master_weights: int
    cast_cache: int
    activations: int
    workspace: int
    optimizer_temporaries: int
    total: int
    peak_moment: str
    # The model states as a measured peak is split (measure.Breakdown counts them at the optimizer step: weights,
    # gradients, optimizer_state, master_weights); the rest of the peak is activations and workspace. The fields above
    # differ where sharded: they include one unit's unsharded gradient (gradients) and two units' gathered weights
    # (weights), transient buffers the optimizer step no longer holds, so a split by them can leave a negative rest.
    at_step: dict = field(default_factory=dict, compare=False)

    def as_record(self) -> dict:
        return {f"{k}_bytes": getattr(self, k) for k in ("weights", "gradients", "optimizer_state",
                                                         "master_weights", "cast_cache", "activations",
                                                         "workspace", "optimizer_temporaries", "total")} | {
            "peak_moment": self.peak_moment}


# Each family's formulas: (parameters(shape, settings), activation_bytes(shape, settings, precision, batch)), shape
# being the arch entry's (amprepro.archs), settings the model's (amprepro.modelsettings.ModelSettings). A family
# missing here has no memory model (a ValueError naming it).
FAMILIES = {
    "cnn": (_small_cnn_parameters, _small_activations),
    "image_transformer": (_tiny_transformer_parameters, _small_activations),
    "resnet": (_resnet_parameters, _resnet_activations),
    "vit": (_vit_parameters, _vit_activations),
    "gpt": (_gpt_parameters, _gpt_activations),
    "llama": (lambda shape, settings: llama_parameters(llama_shape(settings)), _llama_activations),
    "lstm": (_lstm_parameters, _risk_activations),
    "gumbel": (_gumbel_parameters, _risk_activations),
}


def _arch(settings: ModelSettings) -> archs.Arch:
    arch = settings.arch
    if arch not in archs.REGISTRY or archs.REGISTRY[arch].family not in FAMILIES:
        raise ValueError(f"no memory model for arch {arch!r}")
    return archs.REGISTRY[arch]


def parameters(settings: ModelSettings | dict) -> tuple[int, int]:
    """(parameters, matmul parameters: the weights a cast cache holds a 16-bit copy of) of a model config's arch."""
    settings = ModelSettings.of(settings)
    arch = _arch(settings)
    return FAMILIES[arch.family][0](arch.shape, settings)


def activation_bytes(settings: ModelSettings | dict, precision: str, batch: int) -> int:
    """Saved activations plus the first gradients of the backward, and the input batch, for `batch` items."""
    settings = ModelSettings.of(settings)
    arch = _arch(settings)
    return FAMILIES[arch.family][1](arch.shape, settings, precision, batch)


def cell_batch(settings: ModelSettings | dict) -> int:
    settings = ModelSettings.of(settings)
    return settings.batch_size // settings.gpus  # each data-parallel rank's share


def estimate(settings: ModelSettings | dict, precision: str, optimizer: str, batch: int | None = None,
             apex_cast_cache: bool | None = None, sharding: Sharding = UNSHARDED, lora: Lora | None = None) -> Estimate:
    """The predicted allocator peak of one cell (one GPU's share) at `batch` (default: the config's); for the LLaMA
    shapes also sharded (ZeRO-1/2/3) or with LoRA on a frozen base (amprepro.memory.regimes has the rules; `lora`, or
    the config's own `lora` setting). settings: the model's (a model_config is read as one)."""
    settings = ModelSettings.of(settings)
    batch = cell_batch(settings) if batch is None else batch
    lora = lora or lora_of(settings)
    p = precision_of(precision)
    total_params, matmul_params = parameters(settings)
    llama = is_llama(settings)
    if (sharding != UNSHARDED or lora) and not llama:
        raise ValueError(f"sharding and LoRA are modelled for the LLaMA shapes only, not {settings.arch!r}")
    if lora and p.needs_apex:
        raise ValueError(f"LoRA is modelled under torch.amp or none, not {precision} (amp_bf16 or fp32)")
    if sharding.stage == 3 and p.apex_opt_level == "O1":
        raise ValueError("ZeRO-3 is modelled with FSDP's MixedPrecision (amp_bf16), not apex O1's cast cache")
    recomputes = llama and settings.activation_checkpointing
    o1 = p.apex_opt_level == "O1"
    if apex_cast_cache is None:
        apex_cast_cache = o1 and not recomputes
    trainable = lora_parameters(llama_shape(settings), lora) if lora else total_params
    w, g, o, m = (b * trainable for b in p.bytes_per_parameter[:4])
    cast = p.bytes_per_parameter[4] * matmul_params
    if llama:
        shape = llama_shape(settings)
        casts = _llama_dtypes(precision, lora)[4] and sharding.stage < 3  # FP32 matmul weights cast at each use
        head_cast = 2 * shape["vocab_size"] * shape["dim"] if casts else 0  # outside the checkpoints: saved
    if lora:  # frozen base + FP32 adapters; only the adapters have gradients and AdamW state
        w, g, o, m = (4 if lora.base == "fp32" else 2) * total_params + 4 * trainable, 4 * trainable, 8 * trainable, 0
        cast = 2 * trainable if p.autocast_dtype else 0  # autocast's cache of the adapters' casts
        # a frozen FP32 weight is cast at every use, and the cast saved for the input gradient: every matmul weight's
        # without checkpointing, the LM head's with it (the recomputed block's: llama_backward_end_bytes)
        cast += (2 * matmul_params if not recomputes else head_cast) if casts else 0
    cast_kept = cast if (o1 and apex_cast_cache) else 0
    if o1 and not apex_cast_cache:
        cast = 0
    # apex O2 (25.05, _process_optimizer): its zero_grad zeroes and keeps the FP16 model gradients and frees the FP32
    # master gradients; scale_loss frees the FP16 ones before the backward and allocates the FP32 ones after it
    o2 = p.apex_opt_level == "O2"
    grads_kept = 2 * trainable if o2 else 0  # through the forward
    masters_later = 4 * trainable if o2 else 0  # not yet allocated during the backward
    temporaries = 0 if optimizer in IN_PLACE_OPTIMIZERS else p.bytes_per_parameter[2] // 2 * trainable
    ranks, stage = sharding.ranks, sharding.stage
    unit = llama_unit_parameters(llama_shape(settings)) if stage >= 2 else 0
    unit_grad, gathered = 0, 0
    if stage >= 1:
        o, m, temporaries = o // ranks, m // ranks, temporaries // ranks
    if stage >= 2:
        g, grads_kept, masters_later = g // ranks, grads_kept // ranks, masters_later // ranks
        unit_grad = unit * p.compute_bytes  # one unit's unsharded gradient, before its reduce-scatter
    if stage == 3:
        w, cast = w // ranks, 0  # FSDP MixedPrecision gathers 16-bit weights: no autocast cast cache
        gathered = 2 * unit * p.compute_bytes  # the unit computing and the one prefetched
    states = w + gathered + m + o + grads_kept
    if llama:
        seq_len = settings.seq_len
        block_inputs, saved, extra = llama_block_bytes(shape, batch, seq_len, precision, lora)
        kept, loss, first = llama_head_bytes(shape, batch, seq_len, precision, lora)
        kept += block_inputs if recomputes else shape["layers"] * (saved + extra)
        activations = kept + first
        # the casts a checkpointed forward made are freed when autocast exits (its cache is their only holder), but
        # the LM head's; without checkpointing every cast is saved by its matmul (apex O1's kept cache: all of them)
        cast_saved = cast if (not recomputes or cast_kept) else head_cast if o1 else min(cast, head_cast)
        moments = {"forward end": states + cast + kept + loss,
                   "backward start": states - grads_kept + cast_saved + activations}
        end = llama_backward_end_bytes(settings, precision, batch, lora, sharding, cast_kept=bool(cast_kept))
    else:
        activations = activation_bytes(settings, precision, batch)
        moments = {"forward end": states + cast + activations}
        end = 0
    moments["backward end"] = w + gathered + m + g - masters_later + unit_grad + o + cast_kept + end
    moments["optimizer step"] = w + m + g + o + cast_kept + temporaries
    peak_moment = max(moments, key=moments.get)
    return Estimate(weights=w + gathered, gradients=g + unit_grad, optimizer_state=o, master_weights=m,
                    cast_cache=cast, activations=activations, workspace=WORKSPACE_BYTES,
                    optimizer_temporaries=temporaries, total=moments[peak_moment] + WORKSPACE_BYTES,
                    peak_moment=peak_moment,
                    at_step={"weights": w, "gradients": g, "optimizer_state": o, "master_weights": m})


def llama_estimate(shape: str, precision: str, batch: int = 1, seq_len: int = archs.get("llama").seq_len,
                   checkpointing: bool = True,
                   optimizer: str = "adamw_fused", sharding: Sharding = UNSHARDED,
                   lora: Lora | None = None) -> Estimate:
    """One rank's predicted peak for a LLaMA ladder shape (a key of LLAMA_SHAPES) in a regime: micro-batch `batch` of
    `seq_len` tokens, checkpointing per block or none, sharded, LoRA. estimate() with the model config built here."""
    if shape not in LLAMA_SHAPES:
        raise ValueError(f"unknown LLaMA shape {shape!r}: one of {', '.join(LLAMA_SHAPES)}")
    model_config = {"arch": "llama", "shape": shape, "data": "synthetic_tokens", "batch_size": batch,
                    "seq_len": seq_len, "activation_checkpointing": checkpointing}
    return estimate(model_config, precision, optimizer, batch, sharding=sharding, lora=lora)


def within_headroom(peak: int | None, budget: int | None) -> bool:
    """A measured allocator peak leaves the headroom a cell needs (HEADROOM); without a budget, nothing to compare."""
    return budget is None or peak is None or peak <= HEADROOM * budget

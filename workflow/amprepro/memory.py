"""The memory model: the GPU memory a training cell will hold at its peak, from the model's shape, the batch and the
precision, before anything is allocated. One home for the formulas: the memory plan (amprepro.plan.memplan), the cell's
own does-it-fit check, the LLaMA shape ladder and the report read it. No torch import: it runs at plan time, in the
report and in CI, where torchvision may not even load.

Parts (bytes), with an AdamW-type optimizer (two FP32 moments):
- model states, per parameter (amprepro.precisions.bytes_per_parameter): fp32/tf32 4 weights + 4 gradients + 8
  optimizer state; torch.amp and apex O1 the same plus a 2-byte cast of each matmul weight; apex O2 2-byte FP16 weights
  + 2-byte FP16 and 4-byte FP32 master gradients + 8 optimizer state + 4-byte FP32 master weights (ZeRO's 16 bytes per
  parameter of mixed-precision Adam, arXiv 1910.02054, plus O2's FP32 master gradients, read from apex 25.05).
- activations: the tensors autograd saves for the backward, counted from the architecture (below), plus the largest
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

Saved activations per architecture (what each op keeps for its backward; c = bytes of the matmul inputs under the
precision, r = of the residual stream, g = of GELU's input: FP32 under apex O1, whose function lists run GELU in FP32):
- transformer block (ViT, GPT: pre-norm, fused qkv, SDPA, 4x GELU MLP), per token: LayerNorm inputs 2 x r x d, the
  linears' inputs and SDPA's q, k, v and output 11 x c x d, GELU's input 4 x g x d (Korthikanti et al. 2022's
  34 s b h for 16-bit without the s^2 attention term, which SDPA does not keep, recounted for this block).
- LM head: the FP32 log-softmax output kept by cross-entropy, and at the start of the backward two FP32 logit-sized
  gradients: 12 x vocab bytes per token.
- ResNet: each convolution's output (BatchNorm's input) and each ReLU's output (the next convolution's input), max
  pooling's output and int64 indices, a downsample convolution's output; the first convolution's gradient.
- LLaMA (llama_block_terms, by tensor, per token of one block; c the matmul bytes, r the residual stream's, the
  weights' dtype): each RMSNorm keeps its input (x.float() is the FP32 residual itself; of a 16-bit residual two FP32
  copies, one per x.float() call) and, for its weight's gradient, its normalised input (FP32, or r bytes); the qkv and
  gate_up linears keep their inputs (c); SDPA keeps q, k, v (v a view of qkv's output, which it keeps whole), the
  rotated q and k and its output, which the out projection reads as a view; SwiGLU keeps gate_up's output (SiLU and
  the product keep views of it), SiLU's output and the product (down's input). Flash attention pads a head size that
  is not a multiple of 8 (OpenLLaMA-3B's 100, under 16-bit compute): it keeps the padded q, k, v and output instead,
  and the out projection a copy of its input. Per sequence: autocast's bf16 casts of RoPE's FP32 cos and sin tables.
  With one checkpoint per block only every block's input is kept; the final norm and the LM head's input; at the
  loss and the backward's start the logits as in moment A. Checked against the H200 regime measurements
  (results-reference/regimes): every measured forward and backward moment within 0.3 %.
The committed H200 reference checks every cell against this (tests/backbone/test_memory_model.py): within 15 % of
the measured allocator peak.

Regimes beyond one GPU with FP32 master weights (issue 25), for the LLaMA shapes (llama_estimate; the report's regimes
table, amprepro.analysis.regimes, reads it). All predictions: a regime is measured only where a committed measurement
file says so (tools/gpu/regimes_run.sh writes one).
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
- Without checkpointing every block keeps its saved tensors. Korthikanti et al. 2022 (arXiv 2205.05198) count
  s b h (34 + 5 a s / h) bytes per layer of a 16-bit GPT block without recomputation; korthikanti_terms() maps that
  count onto this block term by term (no dropout masks, SDPA keeps no s^2 scores, SwiGLU instead of the 4h GELU MLP,
  RMSNorm's FP32 inputs and normalised inputs, RoPE's rotated q and k, flash attention's head padding).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from amprepro import archs, precisions

GIB = 2**30
WORKSPACE_BYTES = 68 * 2**20
# A batch measured to fit (a plan's probe, a largest-batch try) fits for the cells only when its allocator peak is at
# most HEADROOM of the budget: the rest is for what a cell's later steps and its siblings meet and one short
# measurement does not (fragmentation, another memory layout). H200, 2026-12-01, 16 GiB cap: resnet50/fp32's probe
# at 184 peaked at 98.3 % of the budget and ran, then resnet50_channels_last/tf32 at 184 ran out of memory; at a 3 GiB
# cap a largest-batch try of vit_b_16/amp_bf16 finished and the same batch ran out of memory at a fresh cell's second
# step (0.22 GiB reserved but unallocated). Every probe peak of the 12, 16 and 24 GiB runs whose cells all ran was at
# most 94 % (results-reference/memory-caps).
HEADROOM = 0.95

# The shape tables live in the arch registry (amprepro.archs); these names are the memory model's views of them.
RESNET50 = archs.RESNET50
VIT_B_16 = archs.VIT_B_16
LLAMA_LADDER = archs.LLAMA_LADDER
# Every LLaMA shape by key: the ladder's (a `shape` setting) and each llama-family arch's own.
LLAMA_SHAPES = {key: shape for a in archs.REGISTRY.values() for key, _, shape in a.ladder} | {
    a.name: a.shape for a in archs.REGISTRY.values() if a.family == "llama" and not a.ladder}
LLAMA_NAMES = {key: name for key, name, _ in LLAMA_LADDER}
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


LORA_TARGETS = ("qkv", "out", "gate_up", "down")  # amprepro.train.models.LlamaBlock's linears, by module name


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


def lora_of(model_config: dict) -> Lora | None:
    """The model config's `lora` setting (amprepro.train.lora: rank, alpha, targets, base) as the memory model's Lora,
    or None. Defaults as amprepro.train.lora.DEFAULTS (rank 16, every linear, FP32 base)."""
    given = model_config.get("lora")
    if given is None:
        return None
    return Lora(rank=given.get("rank", 16), base=given.get("base", "fp32"),
                targets=tuple(given.get("targets", LORA_TARGETS)))


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


# ----------------------------------------------------------------------------------------------------------------------
# Parameters


def _transformer_block_parameters(d: int, hidden: int) -> int:
    return 2 * 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * hidden + hidden) + (hidden * d + d)


def llama_parameters(shape: dict) -> tuple[int, int]:
    """(parameters, matmul parameters) of amprepro.train.models.Llama at this shape."""
    d, f, v, n = shape["dim"], shape["ffn_dim"], shape["vocab_size"], shape["layers"]
    matmul = n * (d * (d + 2 * kv_dim(shape)) + d * d + 2 * d * f + f * d) + v * d
    return matmul + v * d + n * 2 * d + d, matmul


def llama_linear_shapes(shape: dict) -> dict[str, tuple[int, int]]:
    """(in, out) features of each linear of one block, by module name (amprepro.train.models.LlamaBlock)."""
    d, f = shape["dim"], shape["ffn_dim"]
    return {"qkv": (d, d + 2 * kv_dim(shape)), "out": (d, d), "gate_up": (d, 2 * f), "down": (f, d)}


def lora_parameters(shape: dict, lora: Lora) -> int:
    """Trainable adapter parameters: r x (in + out) for each targeted linear of every block."""
    linears = llama_linear_shapes(shape)
    return shape["layers"] * lora.rank * sum(sum(linears[name]) for name in lora.targets)


def llama_unit_parameters(shape: dict) -> int:
    """The largest FSDP unit (one per block, the embedding, the LM head): what ZeRO-3 gathers whole."""
    block = sum(i * o for i, o in llama_linear_shapes(shape).values()) + 2 * shape["dim"]
    return max(block, shape["vocab_size"] * shape["dim"])


def kv_dim(shape: dict) -> int:
    """Width of the key (and of the value) projection: kv_heads x head size (the width itself without grouped KV)."""
    return shape.get("kv_heads", shape["heads"]) * (shape["dim"] // shape["heads"])


def _arch(model_config: dict) -> archs.Arch:
    arch = model_config["arch"]
    if arch not in archs.REGISTRY or archs.REGISTRY[arch].family not in FAMILIES:
        raise ValueError(f"no memory model for arch {arch!r}")
    return archs.REGISTRY[arch]


def parameters(model_config: dict) -> tuple[int, int]:
    """(parameters, matmul parameters: the weights a cast cache holds a 16-bit copy of) of a model config's arch."""
    arch = _arch(model_config)
    return FAMILIES[arch.family][0](arch.shape, model_config)


def _resnet_parameters(shape: dict, model_config: dict) -> tuple[int, int]:
    total = shape["parameters"]
    return total, total - 2 * shape["bn_channels"] - 1000


def _vit_parameters(shape: dict, model_config: dict) -> tuple[int, int]:
    d, tokens, patch, classes = shape["dim"], vit_tokens(model_config, shape), shape["patch"], shape["classes"]
    matmul = shape["layers"] * (4 * d * d + 8 * d * d) + 3 * patch**2 * d + d * classes
    blocks = shape["layers"] * _transformer_block_parameters(d, 4 * d)
    return blocks + 3 * patch**2 * d + d + tokens * d + d + 2 * d + d * classes + classes, matmul


def _gpt_parameters(shape: dict, model_config: dict) -> tuple[int, int]:
    d, seq = shape["dim"], archs.seq_len(model_config)
    blocks = shape["layers"] * _transformer_block_parameters(d, 4 * d)
    matmul = shape["layers"] * 12 * d * d + shape["vocab_size"] * d
    return shape["vocab_size"] * d + seq * d + blocks + 2 * d, matmul


def _small_cnn_parameters(shape: dict, model_config: dict) -> tuple[int, int]:
    return 1 * 32 * 9 + 32 + 2 * 32 + 32 * 64 * 9 + 64 + 2 * 64 + 64 * 10 + 10, 32 * 9 + 32 * 64 * 9 + 640


def _tiny_transformer_parameters(shape: dict, model_config: dict) -> tuple[int, int]:
    d = 64
    return 8 * d + d + 8 * d + 2 * _transformer_block_parameters(d, 4 * d) + 2 * d + d * 10 + 10, 2 * 12 * d * d


def _lstm_parameters(shape: dict, model_config: dict) -> tuple[int, int]:
    """amprepro.train.riskmodels.ByteLSTM: byte embedding, one LSTM layer, linear head (the risk preset)."""
    e, h, vocab = shape["embed"], shape["hidden"], 256
    recurrent = 4 * h * (e + h)  # weight_ih and weight_hh of the four gates
    return vocab * e + recurrent + 8 * h + h * vocab + vocab, recurrent + h * vocab


def _gumbel_parameters(shape: dict, model_config: dict) -> tuple[int, int]:
    """amprepro.train.riskmodels.GumbelBytes: embedding, causal convolution, code logits, code book, MLP, head."""
    d, k, codes, vocab = shape["dim"], shape["context"], shape["groups"] * shape["codes"], 256
    matmul = k * d * d + 2 * d * codes + 4 * d * d + d * vocab
    return vocab * d + matmul + d + codes + 2 * d + d + vocab, matmul  # + the biases


LSTM_STATES_PER_TOKEN = 10  # values of width `hidden` an LSTM step holds for its backward (_risk_activations)


def _risk_activations(shape: dict, model_config: dict, precision: str, batch: int) -> int:
    """Saved activations of a risk arch, an upper estimate per token: every intermediate of its layers in the compute
    dtype (the LSTM's gates, cell and hidden states; the Gumbel model's convolution, MLP and code book), the sampler's
    logits, noise and softmax in FP32, and the byte logits as the GPT's (12 bytes per logit)."""
    c = _bytes(precision)[0]
    if "hidden" in shape:
        # the remedy (risky_layer_fp32) runs the LSTM outside autocast on an FP32 input: its states are FP32 then;
        # cuDNN's training reserve keeps the four gates, the cell and hidden state and tanh(cell) per step, and the
        # backward's gate gradients take as much again (measured on the H200: 0.386 GiB at batch 32 x 512, FP32)
        lstm = 4 if model_config.get("risky_layer_fp32") else c
        per_token = shape["embed"] * c + LSTM_STATES_PER_TOKEN * shape["hidden"] * lstm
    else:
        codes = shape["groups"] * shape["codes"]
        per_token = 8 * shape["dim"] * c + codes * (c + 12)
    return batch * archs.data_seq_len(model_config) * (per_token + 12 * 256 + 8)


def llama_shape(model_config: dict) -> dict:
    """The config's `shape` (a key of LLAMA_SHAPES), else its arch's own shape."""
    key = model_config.get("shape") or model_config["arch"]
    return LLAMA_SHAPES[key] if key in LLAMA_SHAPES else archs.get(key).shape


def vit_tokens(model_config: dict, shape: dict = VIT_B_16) -> int:
    return (archs.image_size(model_config) // shape["patch"]) ** 2 + 1


# ----------------------------------------------------------------------------------------------------------------------
# Activations


def _bytes(precision: str) -> tuple[int, int, int]:
    """(c, r, g): bytes of the matmul inputs, of the residual stream and of GELU's input under this precision."""
    p = precision_of(precision)
    gelu = 4 if p.apex_opt_level == "O1" else p.compute_bytes
    return p.compute_bytes, p.residual_bytes, gelu


def transformer_block_bytes_per_token(d: int, precision: str) -> int:
    c, r, g = _bytes(precision)
    return 2 * r * d + 11 * c * d + 4 * g * d


def resnet50_bytes_per_item(image_size: int, precision: str) -> tuple[int, int]:
    """(saved, first gradient) per image."""
    c = _bytes(precision)[0]
    h = image_size // 4
    stem = 64 * (image_size // 2) ** 2
    elements = 2 * stem + 64 * h * h
    for width, count, stride in RESNET50["blocks"]:
        for i in range(count):
            out = h // (stride if i == 0 else 1)
            elements += 2 * width * h * h + 2 * width * out * out + 2 * 4 * width * out * out
            elements += 4 * width * out * out if i == 0 else 0
            h = out
    indices = 8 * 64 * (image_size // 4) ** 2
    cast_input = 3 * image_size**2 * c if c != 4 else 0  # the 16-bit copy of the image the first convolution keeps
    return elements * c + indices + cast_input, stem * c


def activation_bytes(model_config: dict, precision: str, batch: int) -> int:
    """Saved activations plus the first gradients of the backward, and the input batch, for `batch` items."""
    arch = _arch(model_config)
    return FAMILIES[arch.family][1](arch.shape, model_config, precision, batch)


def _resnet_activations(shape: dict, model_config: dict, precision: str, batch: int) -> int:
    size = archs.image_size(model_config)
    saved, first_grad = resnet50_bytes_per_item(size, precision)
    return batch * (saved + first_grad + 3 * size**2 * 4)


def _vit_activations(shape: dict, model_config: dict, precision: str, batch: int) -> int:
    c = _bytes(precision)[0]
    d, tokens, size = shape["dim"], vit_tokens(model_config, shape), archs.image_size(model_config)
    per_item = shape["layers"] * tokens * transformer_block_bytes_per_token(d, precision)
    return batch * (per_item + tokens * d * 4 * 2 + 3 * size**2 * (4 + (c if c != 4 else 0)))


def _gpt_activations(shape: dict, model_config: dict, precision: str, batch: int) -> int:
    tokens = batch * archs.seq_len(model_config)
    blocks = shape["layers"] * transformer_block_bytes_per_token(shape["dim"], precision)
    return tokens * (blocks + 12 * shape["vocab_size"] + 2 * shape["dim"] * 4 + 8)


def _llama_activations(shape: dict, model_config: dict, precision: str, batch: int) -> int:
    return llama_activation_bytes(llama_shape(model_config), batch, archs.seq_len(model_config), precision,
                                  model_config.get("activation_checkpointing", True))


def _small_activations(shape: dict, model_config: dict, precision: str, batch: int) -> int:
    return batch * 64 * 64 * 4 * 4  # under 1 MiB at batch 64: the workspace dominates


def _llama_dtypes(precision: str, lora: Lora | None = None) -> tuple[int, int, int, bool, bool]:
    """(c, r, a, autocast, casts) of a LLaMA cell: bytes of the matmul inputs and outputs, of the residual stream
    (RMSNorm's input: the weights' dtype) and of a LoRA adapter's saved input; whether torch.autocast (or apex O1's
    patched functions) runs the matmuls; whether FP32 matmul weights are cast to 16 bits at each use. A bf16 LoRA base
    makes the matmuls and the residual stream bf16 whatever the precision."""
    p = precision_of(precision)
    bf16_base = bool(lora) and lora.base == "bf16"
    c = 2 if bf16_base else p.compute_bytes
    r = 2 if bf16_base else p.residual_bytes
    autocast = p.autocast_dtype is not None or p.apex_opt_level == "O1"
    return c, r, 2 if autocast else 4, autocast, autocast and r == 4


def llama_block_terms(shape: dict, precision: str, lora: Lora | None = None) -> dict[str, int]:
    """Bytes per token one decoder block (amprepro.train.models.LlamaBlock) keeps for its backward, tensor by tensor,
    as autograd saves them (the module's docstring says why each is there). Counted once where two ops keep one
    tensor (the SiLU and the product keep views of gate_up's output; SDPA keeps v, a view of qkv's output)."""
    c, r, a, _, _ = _llama_dtypes(precision, lora)
    d, f, kv, heads = shape["dim"], shape["ffn_dim"], kv_dim(shape), shape["heads"]
    kv_heads, head_dim = shape.get("kv_heads", heads), d // heads
    trainable = lora is None  # LoRA freezes the norms and the linears' weights
    linear_input = a if lora else c  # under LoRA the adapter's A keeps its own copy of the linear's input
    # each norm's input: the FP32 residual itself, or two FP32 copies of a 16-bit one
    terms = {"RMSNorm inputs": 2 * (4 * d if r == 4 else 2 * 4 * d)}
    if trainable:
        terms["RMSNorm's normalised input"] = 2 * (4 if r == 4 else r) * d
    terms["qkv and gate_up inputs"] = 2 * linear_input * d
    padded = c == 2 and head_dim % 8 != 0  # flash attention pads the head size to a multiple of 8
    if padded:
        terms["flash attention's padded q, k, v and output"] = c * (-(-head_dim // 8) * 8) * 2 * (heads + kv_heads)
    else:
        terms["q, k and v"] = c * (d + 2 * kv)
        terms["rotated q and k"] = c * (d + kv)
        terms["attention output"] = c * d
    if padded or (lora and c == 2):
        terms["out projection's input copy"] = linear_input * d
    terms["gate_up output"] = 2 * f * c
    terms["SiLU output"] = f * c
    terms["product (down's input)"] = f * linear_input
    if lora:
        terms["adapters' rank-r outputs"] = len(lora.targets) * lora.rank * a
    return terms


def llama_block_bytes(shape: dict, batch: int, seq_len: int, precision: str,
                      lora: Lora | None = None) -> tuple[int, int, int]:
    """(every block's input, kept by the checkpoints; one block's saved tensors; one block's per-sequence extras) in
    bytes. The extras: the 16-bit casts of RoPE's FP32 cos and sin tables (q and k each, under autocast over FP32
    weights) and, in FP32 with grouped KV heads, the attention scores the math path keeps."""
    c, r, _, autocast, _ = _llama_dtypes(precision, lora)
    tokens, dim, heads = batch * seq_len, shape["dim"], shape["heads"]
    block_inputs = shape["layers"] * tokens * dim * r
    saved = tokens * sum(llama_block_terms(shape, precision, lora).values())
    rope = 4 * seq_len * (dim // heads) * c if autocast and r == 4 else 0
    # Grouped KV heads in FP32: no fused SDPA kernel takes them, so the math path keeps one block's attention scores,
    # probabilities and their gradient, s^2 per head (measured on the H200: TinyLlama-1.1B strict FP32 +1.8 GiB).
    scores = 3 * 4 * batch * heads * seq_len**2 if c == 4 and kv_dim(shape) < dim else 0
    return block_inputs, saved, rope + scores


def llama_head_bytes(shape: dict, batch: int, seq_len: int, precision: str,
                     lora: Lora | None = None) -> tuple[int, int, int]:
    """(kept, loss, first gradients) in bytes, for the final RMSNorm, the LM head and the loss:
    - kept from the forward: the final norm's saved tensors and the LM head's input (a frozen head keeps none);
    - loss, the forward's last moment: the logits (when 16-bit), their FP32 copy and log-softmax's output;
    - first gradients, the backward's first moment: log-softmax's output, its gradient and its input's gradient (12
      bytes x vocab per token), or, where larger, the LM head's weight gradient with its 16-bit original (autocast)
      or with the logits' gradient it is computed from."""
    c, r, _, autocast, _ = _llama_dtypes(precision, lora)
    tokens, d, v = batch * seq_len, shape["dim"], shape["vocab_size"]
    trainable = lora is None
    kept = tokens * ((4 * d if r == 4 else 2 * 4 * d) + ((4 if r == 4 else r) * d + c * d if trainable else 0))
    loss = tokens * v * (4 + 4 + (c if c < 4 else 0))
    first = 12 * tokens * v
    if trainable:
        first = max(first, tokens * v * c + v * d * c + tokens * d * c, v * d * (c + 4) if autocast else 0)
    return kept, loss, first


def llama_activation_bytes(shape: dict, batch: int, seq_len: int, precision: str, checkpointing: bool = True,
                           lora: Lora | None = None) -> int:
    """Activations at the start of the backward: with one checkpoint per block every block's input, without
    checkpointing every block's saved tensors; the final norm's and the LM head's; the first gradients."""
    block_inputs, saved, extra = llama_block_bytes(shape, batch, seq_len, precision, lora)
    kept, _, first = llama_head_bytes(shape, batch, seq_len, precision, lora)
    blocks = block_inputs if checkpointing else shape["layers"] * (saved + extra)
    return blocks + kept + first


def korthikanti_layer_bytes(shape: dict, batch: int, seq_len: int) -> int:
    """Korthikanti et al. 2022 (arXiv 2205.05198), eq. 1: activations one 16-bit GPT layer keeps without recomputation,
    s b h (34 + 5 a s / h) bytes."""
    s, b, h, a = seq_len, batch, shape["dim"], shape["heads"]
    return s * b * h * 34 + 5 * a * s * s * b


def korthikanti_terms(shape: dict, seq_len: int) -> dict[str, int]:
    """Korthikanti's per-layer count, per token, turned into this model's block under bf16 AMP (FP32 weights and
    residual stream, bf16 matmuls) term by term (bytes). The terms sum to llama_block_terms() under amp_bf16; each
    difference is named:
    - no dropout in LLaMA: their attention and MLP dropout masks (1 byte x h each) go;
    - SDPA (flash / memory-efficient) keeps no s^2 scores: their 5 a s (scores, softmax, its dropout mask) go;
    - SwiGLU instead of a 4h GELU MLP: their GELU input and output (2 x 2 x 4h) become gate_up's output, SiLU's output
      and the product (4 x 2 x ffn);
    - grouped KV heads keep narrower k and v than their 3 x 2h (zero for LLaMA-7B);
    - RoPE keeps the rotated q and k as well (2 x (h + kv));
    - RMSNorm over an FP32 residual stream keeps its input and its normalised input in FP32 (2 x 2 x 4h), where their
      LayerNorm inputs are 16-bit (2 x 2h);
    - flash attention pads a head size that is not a multiple of 8 (OpenLLaMA-3B's 100): the padded q, k, v and
      output replace q, k, v, the rotated q and k and the output, and the out projection keeps a copy of its input."""
    h, f, kv, a = shape["dim"], shape["ffn_dim"], kv_dim(shape), shape["heads"]
    block = llama_block_terms(shape, "amp_bf16")
    padded = block.get("flash attention's padded q, k, v and output", 0) + block.get("out projection's input copy", 0)
    unpadded = 2 * (h + 2 * kv) + 2 * (h + kv) + 2 * h  # q, k, v, the rotated q and k, the output
    return {"korthikanti (34 h + 5 a s)": 34 * h + 5 * a * seq_len, "no dropout masks": -2 * h,
            "no s^2 scores (SDPA)": -5 * a * seq_len, "SwiGLU for the 4h GELU MLP": 2 * 4 * f - 2 * 2 * 4 * h,
            "grouped KV heads": 2 * (h + 2 * kv) - 2 * 3 * h, "RoPE's rotated q and k": 2 * (h + kv),
            "RMSNorm's FP32 inputs and normalised inputs": 2 * 2 * 4 * h - 2 * 2 * h,
            "flash attention's head padding": padded - unpadded if padded else 0}


def llama_backward_end_bytes(model_config: dict, precision: str, batch: int, lora: Lora | None = None,
                             sharding: Sharding | None = None, cast_kept: bool = False) -> int:
    """What the end of a LLaMA's backward holds beyond the model states (every gradient counted): the larger of
    - the embedding's backward, the last (the embedding's gradient is the last allocated): the gradient of its output,
      tokens x dim in the residual's dtype (none under LoRA: the embedding is frozen, the backward ends in block 0);
    - the first block's backward (recomputed under checkpointing, kept without it): its saved tensors and extras,
      its 16-bit weight casts (autocast over FP32 weights, unless apex O1's kept cache holds them: cast_kept), the
      incoming gradient (tokens x dim x r) and the widest gradient of its MLP (tokens x 2 ffn x c), less the gradients
      not yet allocated then: its own and the embedding's (divided over the ranks from ZeRO-2 on; apex O2's FP32
      master gradients, allocated after the backward, estimate() leaves out of the moment).
    0 for other models."""
    if not is_llama(model_config):
        return 0
    sharding = sharding or Sharding()
    shape, seq_len = llama_shape(model_config), archs.seq_len(model_config)
    c, r, _, _, casts = _llama_dtypes(precision, lora)
    _, saved, extra = llama_block_bytes(shape, batch, seq_len, precision, lora)
    tokens, d, f = batch * seq_len, shape["dim"], shape["ffn_dim"]
    block_matmul = sum(i * o for i, o in llama_linear_shapes(shape).values())
    weight_casts = 2 * block_matmul if casts and not cast_kept and sharding.stage < 3 else 0
    working = saved + extra + weight_casts + tokens * (d * r + 2 * f * c)
    if lora:
        pending = 4 * lora_parameters(shape, lora) // shape["layers"]
    else:
        p = precision_of(precision)  # apex O2: its FP16 gradients (the FP32 master ones come after the backward)
        grad_bytes = p.bytes_per_parameter[1] - (4 if p.apex_opt_level == "O2" else 0)
        pending = grad_bytes * (block_matmul + 2 * d + shape["vocab_size"] * d)
    pending //= sharding.ranks if sharding.stage >= 2 else 1
    embedding = 0 if lora else tokens * d * r
    return max(embedding, working - pending)


# ----------------------------------------------------------------------------------------------------------------------
# The estimate


# Each family's formulas: (parameters(shape, model_config), activation_bytes(shape, model_config, precision, batch)),
# shape being the arch entry's (amprepro.archs). A family missing here has no memory model (a ValueError naming it).
FAMILIES = {
    "cnn": (_small_cnn_parameters, _small_activations),
    "image_transformer": (_tiny_transformer_parameters, _small_activations),
    "resnet": (_resnet_parameters, _resnet_activations),
    "vit": (_vit_parameters, _vit_activations),
    "gpt": (_gpt_parameters, _gpt_activations),
    "llama": (lambda shape, model_config: llama_parameters(llama_shape(model_config)), _llama_activations),
    "lstm": (_lstm_parameters, _risk_activations),
    "gumbel": (_gumbel_parameters, _risk_activations),
}


def is_llama(model_config: dict) -> bool:
    """A LLaMA-family arch: the memory model's LLaMA moments, sharding and LoRA apply."""
    arch = archs.REGISTRY.get(model_config["arch"])
    return arch is not None and arch.family == "llama"


def cell_batch(model_config: dict) -> int:
    return model_config["batch_size"] // model_config.get("gpus", 1)  # each data-parallel rank's share


def estimate(model_config: dict, precision: str, optimizer: str, batch: int | None = None,
             apex_cast_cache: bool | None = None, sharding: Sharding = UNSHARDED, lora: Lora | None = None) -> Estimate:
    """The predicted allocator peak of one cell (one GPU's share) at `batch` (default: the config's); for the LLaMA
    shapes also sharded (ZeRO-1/2/3) or with LoRA on a frozen base (the module's docstring has the rules; `lora`, or
    the config's own `lora` setting)."""
    batch = cell_batch(model_config) if batch is None else batch
    lora = lora or lora_of(model_config)
    p = precision_of(precision)
    total_params, matmul_params = parameters(model_config)
    llama = is_llama(model_config)
    if (sharding != UNSHARDED or lora) and not llama:
        raise ValueError(f"sharding and LoRA are modelled for the LLaMA shapes only, not {model_config['arch']!r}")
    if lora and p.needs_apex:
        raise ValueError(f"LoRA is modelled under torch.amp or none, not {precision} (amp_bf16 or fp32)")
    if sharding.stage == 3 and p.apex_opt_level == "O1":
        raise ValueError("ZeRO-3 is modelled with FSDP's MixedPrecision (amp_bf16), not apex O1's cast cache")
    recomputes = llama and model_config.get("activation_checkpointing", True)
    o1 = p.apex_opt_level == "O1"
    if apex_cast_cache is None:
        apex_cast_cache = o1 and not recomputes
    trainable = lora_parameters(llama_shape(model_config), lora) if lora else total_params
    w, g, o, m = (b * trainable for b in p.bytes_per_parameter[:4])
    cast = p.bytes_per_parameter[4] * matmul_params
    if llama:
        shape = llama_shape(model_config)
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
    unit = llama_unit_parameters(llama_shape(model_config)) if stage >= 2 else 0
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
        seq_len = archs.seq_len(model_config)
        block_inputs, saved, extra = llama_block_bytes(shape, batch, seq_len, precision, lora)
        kept, loss, first = llama_head_bytes(shape, batch, seq_len, precision, lora)
        kept += block_inputs if recomputes else shape["layers"] * (saved + extra)
        activations = kept + first
        # the casts a checkpointed forward made are freed when autocast exits (its cache is their only holder), but
        # the LM head's; without checkpointing every cast is saved by its matmul (apex O1's kept cache: all of them)
        cast_saved = cast if (not recomputes or cast_kept) else head_cast if o1 else min(cast, head_cast)
        moments = {"forward end": states + cast + kept + loss,
                   "backward start": states - grads_kept + cast_saved + activations}
        end = llama_backward_end_bytes(model_config, precision, batch, lora, sharding, cast_kept=bool(cast_kept))
    else:
        activations = activation_bytes(model_config, precision, batch)
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


def gib(n: int | float | None) -> str:
    return "unknown" if n is None else f"{n / GIB:.1f} GiB"


def describe(e: Estimate) -> str:
    return describe_record(e.as_record())


def describe_record(r: dict) -> str:
    """An estimate (Estimate.as_record(), as metrics.json and plan.json carry it) in words."""
    return (f"estimated peak {gib(r['total_bytes'])} at the {r['peak_moment']} (weights {gib(r['weights_bytes'])}, "
            f"gradients {gib(r['gradients_bytes'])}, optimizer state {gib(r['optimizer_state_bytes'])}, master "
            f"weights {gib(r['master_weights_bytes'])}, cast cache {gib(r['cast_cache_bytes'])}, activations "
            f"{gib(r['activations_bytes'])}, workspace {gib(r['workspace_bytes'])})")

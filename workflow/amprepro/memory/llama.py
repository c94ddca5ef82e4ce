"""A LLaMA cell's activations, tensor by tensor, and what its moments hold beyond the model states (the forward's end,
the backward's start and end: amprepro.memory.cellpeak names the moments), in every regime (amprepro.memory.regimes).

Saved activations (llama_block_terms, by tensor, per token of one block; c the matmul bytes, r the residual stream's,
the weights' dtype): each RMSNorm keeps its input (x.float() is the FP32 residual itself; of a 16-bit residual two
FP32 copies, one per x.float() call) and, for its weight's gradient, its normalised input (FP32, or r bytes); the qkv
and gate_up linears keep their inputs (c); SDPA keeps q, k, v (v a view of qkv's output, which it keeps whole), the
rotated q and k and its output, which the out projection reads as a view; SwiGLU keeps gate_up's output (SiLU and
the product keep views of it), SiLU's output and the product (down's input). Flash attention pads a head size that
is not a multiple of 8 (OpenLLaMA-3B's 100, under 16-bit compute): it keeps the padded q, k, v and output instead,
and the out projection a copy of its input. Per sequence: autocast's bf16 casts of RoPE's FP32 cos and sin tables.
With one checkpoint per block only every block's input is kept; the final norm and the LM head's input; at the
loss and the backward's start the logits as in moment A. Checked against the H200 regime measurements
(results-reference/regimes): every measured forward and backward moment within 0.3 %.

Without checkpointing every block keeps its saved tensors. Korthikanti et al. 2022 (arXiv 2205.05198) count
s b h (34 + 5 a s / h) bytes per layer of a 16-bit GPT block without recomputation; korthikanti_terms() maps that
count onto this block term by term (no dropout masks, SDPA keeps no s^2 scores, SwiGLU instead of the 4h GELU MLP,
RMSNorm's FP32 inputs and normalised inputs, RoPE's rotated q and k, flash attention's head padding).
"""

from __future__ import annotations

from amprepro.memory.regimes import Lora, Sharding, precision_of
from amprepro.memory.shapes import is_llama, kv_dim, llama_linear_shapes, llama_shape, lora_parameters
from amprepro.modelsettings import ModelSettings


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
    as autograd saves them (this module's docstring says why each is there). Counted once where two ops keep one
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


def _llama_activations(shape: dict, settings: ModelSettings, precision: str, batch: int) -> int:
    return llama_activation_bytes(llama_shape(settings), batch, settings.seq_len, precision,
                                  settings.activation_checkpointing)


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


def llama_backward_end_bytes(settings: ModelSettings | dict, precision: str, batch: int, lora: Lora | None = None,
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
    settings = ModelSettings.of(settings)
    if not is_llama(settings):
        return 0
    sharding = sharding or Sharding()
    shape, seq_len = llama_shape(settings), settings.seq_len
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

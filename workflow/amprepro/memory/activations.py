"""The activations a cell holds at the start of its backward, for every family but the LLaMA's (amprepro.memory.llama):
the tensors autograd saves, plus the largest short-lived gradient at the start of the backward and the input batch.

Saved activations per architecture (what each op keeps for its backward; c = bytes of the matmul inputs under the
precision, r = of the residual stream, g = of GELU's input: FP32 under apex O1, whose function lists run GELU in FP32):
- transformer block (ViT, GPT: pre-norm, fused qkv, SDPA, 4x GELU MLP), per token: LayerNorm inputs 2 x r x d, the
  linears' inputs and SDPA's q, k, v and output 11 x c x d, GELU's input 4 x g x d (Korthikanti et al. 2022's
  34 s b h for 16-bit without the s^2 attention term, which SDPA does not keep, recounted for this block).
- LM head: the FP32 log-softmax output kept by cross-entropy, and at the start of the backward two FP32 logit-sized
  gradients: 12 x vocab bytes per token.
- ResNet: each convolution's output (BatchNorm's input) and each ReLU's output (the next convolution's input), max
  pooling's output and int64 indices, a downsample convolution's output; the first convolution's gradient.
"""

from __future__ import annotations

from amprepro.memory.regimes import precision_of
from amprepro.memory.shapes import RESNET50, vit_tokens
from amprepro.modelsettings import ModelSettings


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
    h, stem_width = image_size // 4, RESNET50["stem"]
    stem = stem_width * (image_size // 2) ** 2
    elements = 2 * stem + stem_width * h * h
    for width, count, stride in RESNET50["blocks"]:
        for i in range(count):
            out = h // (stride if i == 0 else 1)
            elements += 2 * width * h * h + 2 * width * out * out + 2 * 4 * width * out * out
            elements += 4 * width * out * out if i == 0 else 0
            h = out
    indices = 8 * stem_width * (image_size // 4) ** 2
    cast_input = 3 * image_size**2 * c if c != 4 else 0  # the 16-bit copy of the image the first convolution keeps
    return elements * c + indices + cast_input, stem * c


def _resnet_activations(shape: dict, settings: ModelSettings, precision: str, batch: int) -> int:
    size = settings.image_size
    saved, first_grad = resnet50_bytes_per_item(size, precision)
    return batch * (saved + first_grad + 3 * size**2 * 4)


def _vit_activations(shape: dict, settings: ModelSettings, precision: str, batch: int) -> int:
    c = _bytes(precision)[0]
    d, tokens, size = shape["dim"], vit_tokens(settings, shape), settings.image_size
    per_item = shape["layers"] * tokens * transformer_block_bytes_per_token(d, precision)
    return batch * (per_item + tokens * d * 4 * 2 + 3 * size**2 * (4 + (c if c != 4 else 0)))


def _gpt_activations(shape: dict, settings: ModelSettings, precision: str, batch: int) -> int:
    tokens = batch * settings.seq_len
    blocks = shape["layers"] * transformer_block_bytes_per_token(shape["dim"], precision)
    return tokens * (blocks + 12 * shape["vocab_size"] + 2 * shape["dim"] * 4 + 8)


def _small_activations(shape: dict, settings: ModelSettings, precision: str, batch: int) -> int:
    return batch * 64 * 64 * 4 * 4  # under 1 MiB at batch 64: the workspace dominates


LSTM_STATES_PER_TOKEN = 10  # values of width `hidden` an LSTM step holds for its backward (_risk_activations)


def _risk_activations(shape: dict, settings: ModelSettings, precision: str, batch: int) -> int:
    """Saved activations of a risk arch, an upper estimate per token: every intermediate of its layers in the compute
    dtype (the LSTM's gates, cell and hidden states; the Gumbel model's convolution, MLP and code book), the sampler's
    logits, noise and softmax in FP32, and the byte logits as the GPT's (12 bytes per logit)."""
    c = _bytes(precision)[0]
    if "hidden" in shape:
        # the remedy (risky_layer_fp32) runs the LSTM outside autocast on an FP32 input: its states are FP32 then;
        # cuDNN's training reserve keeps the four gates, the cell and hidden state and tanh(cell) per step, and the
        # backward's gate gradients take as much again (measured on the H200: 0.386 GiB at batch 32 x 512, FP32)
        lstm = 4 if settings.risky_layer_fp32 else c
        per_token = shape["embed"] * c + LSTM_STATES_PER_TOKEN * shape["hidden"] * lstm
    else:
        codes = shape["groups"] * shape["codes"]
        per_token = 8 * shape["dim"] * c + codes * (c + 12)
    return batch * settings.data_seq_len * (per_token + 12 * shape["vocab_size"] + 8)

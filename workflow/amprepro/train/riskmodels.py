"""Small models for the second article's AMP risk points, trained on real text (the stdlib bytes, python_stdlib):

    "并非所有模型都能安全启用AMP。典型风险点包括：RNN类模型（梯度随时间步累积易溢出）；使用极高温度的Gumbel-Softmax采样；
     自定义归一化层中含有极小分母"

- ByteLSTM (arch lstm_bytes): an LSTM language model over long byte windows. Backpropagation through time sums each
  recurrent weight's gradient over every time step (512 by the risk preset), so the fp16 gradient of the recurrent
  weights is the largest in the model; under fp16 AMP the loss scale multiplies it too.
- GumbelBytes (arch gumbel_bytes): a byte language model whose hidden layer is a discrete bottleneck sampled with
  F.gumbel_softmax at temperature gumbel_tau. See its docstring for which extreme of the temperature overflows fp16.
- The third risk (a hand-written norm with a tiny epsilon) is models.HalfEpsNorm inside the GPT (naive_norm_eps).

The articles' first remedy, "对特定层禁用autocast：with autocast(enabled=False)", is model setting risky_layer_fp32: the
model's risky layer (the LSTM, the Gumbel sampler, the hand-written norm) runs with autocast disabled on an input cast
to float32 (in_fp32 below); the rest of the model keeps the cell's precision. The second remedy,
"GradScaler(init_scale=2.**14)", is train setting grad_scaler_init_scale (amprepro.train.precision.Trainer).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from amprepro.modelsettings import GUMBEL_TAU

# Their archs (sizes, the byte vocabulary included) are amprepro.archs entries: lstm_bytes (0.81 M parameters) and
# gumbel_bytes (0.64 M).
DEFAULT_GUMBEL_TAU = GUMBEL_TAU  # the setting's default (amprepro.modelsettings)


def in_fp32(fn, *inputs):
    """fn(*inputs) with autocast disabled and every floating input cast to float32: the remedy "with
    autocast(enabled=False)" as the PyTorch AMP docs write it (an op under a disabled region runs in its inputs' dtype,
    so the inputs, which the enclosing autocast region may have made fp16, are cast back first)."""
    kind = next(t.device.type for t in inputs if isinstance(t, torch.Tensor))
    with torch.autocast(kind, enabled=False):
        return fn(*(t.float() if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in inputs))


class ByteLSTM(nn.Module):
    """Byte embedding -> one nn.LSTM layer -> linear head over the bytes; next-byte prediction at every position.

    Why it is an AMP risk: the gradient of the recurrent weights W_hh is a sum over every time step of the window
    (sum_t delta_t h_{t-1}^T), computed by the fused RNN kernel in the autocast dtype; over 512 steps, and multiplied
    by fp16 AMP's loss scale (2^16 at the start), it is the model's most likely fp16 overflow (max 65504). An overflow
    makes GradScaler skip the step and halve the scale; one inside the recurrence can also make the loss non-finite.
    No gradient clipping, as the article's risk is about the unprotected recipe.

    risky_layer_fp32: the LSTM runs in float32 outside autocast (in_fp32); the embedding and head keep the precision.
    """

    def __init__(self, *, vocab_size: int, embed: int, hidden: int, risky_layer_fp32: bool = False):
        super().__init__()
        self.vocab_size, self.risky_layer_fp32 = vocab_size, risky_layer_fp32
        self.embed = nn.Embedding(vocab_size, embed)
        self.lstm = nn.LSTM(embed, hidden, batch_first=True)
        self.head = nn.Linear(hidden, vocab_size)

    def _recur(self, x):
        return self.lstm(x)[0]

    def forward(self, idx):
        x = self.embed(idx)
        h = in_fp32(self._recur, x) if self.risky_layer_fp32 else self._recur(x)
        return self.head(h)


class GumbelBytes(nn.Module):
    """A byte language model through a discrete bottleneck: the previous `context` bytes (a causal convolution over
    their embeddings) -> `groups` categorical codes of `codes` choices each, sampled with F.gumbel_softmax(logits,
    tau) in training (soft, straight through the softmax; the argmax one-hot in evaluation) -> code embeddings -> the
    next byte. The quantiser of wav2vec 2.0 has this shape.

    Which temperature is the fp16 risk. F.gumbel_softmax computes y = softmax((logits + g) / tau), g Gumbel noise
    (about -2 to 12 in practice). The division runs in the logits' dtype: under fp16 autocast the code logits come out
    of a Linear in fp16, and autocast lifts only the softmax to float32, after the division. So:
    - a tiny tau (1e-3) multiplies by 1/tau = 1000: any |logits + g| above 65.5 becomes inf in fp16 (max 65504), and
      softmax of a row with inf is NaN; in the backward the softmax's gradient is multiplied by 1/tau in fp16 again,
      so the gradient of the code logits is 1000x larger, times the loss scale. This is where fp16 overflows.
    - a huge tau (1e4) divides everything down to about 1e-3 or less: no overflow; the samples are near uniform (the
      bottleneck carries little) in every precision, and the gradient of the logits is scaled by 1/tau, an underflow
      that fp16 AMP's loss scale exists to cover and bf16's range does not have.
    The article says "极高温度" (extremely high temperature). Written as temperature, as PyTorch's tau is, only the
    tiny-tau extreme overflows fp16 (a sharp, near-argmax sampler is sometimes called "hot" when the parameter is an
    inverse temperature, beta = 1/tau); the risk preset therefore sets gumbel_tau to a tiny value and says so.
    bf16 has float32's exponent range: neither extreme overflows it, it only rounds (8 significant bits).

    risky_layer_fp32: the sampler (noise, division, softmax) runs in float32 outside autocast (in_fp32).
    """

    def __init__(self, *, vocab_size: int, dim: int, context: int, groups: int, codes: int,
                 tau: float = DEFAULT_GUMBEL_TAU, risky_layer_fp32: bool = False):
        super().__init__()
        self.vocab_size, self.context, self.groups, self.codes = vocab_size, context, groups, codes
        self.tau, self.risky_layer_fp32 = tau, risky_layer_fp32
        self.embed = nn.Embedding(vocab_size, dim)
        self.mix = nn.Conv1d(dim, dim, context)  # left-padded below: position t sees bytes t-context+1 .. t
        self.to_codes = nn.Linear(dim, groups * codes)
        self.code_book = nn.Linear(groups * codes, dim, bias=False)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.head = nn.Linear(dim, vocab_size)

    def _sample(self, logits):
        grouped = logits.view(*logits.shape[:-1], self.groups, self.codes)
        if self.training:
            y = F.gumbel_softmax(grouped, tau=self.tau, hard=False, dim=-1)
        else:  # evaluation: the most likely code, no noise (the held-out loss does not depend on the sampler's luck)
            y = F.one_hot(grouped.argmax(dim=-1), self.codes).to(grouped.dtype)
        return y.flatten(-2)

    def forward(self, idx):
        x = self.embed(idx).transpose(1, 2)  # (batch, dim, seq)
        x = F.gelu(self.mix(F.pad(x, (self.context - 1, 0)))).transpose(1, 2)
        logits = self.to_codes(x)
        codes = in_fp32(self._sample, logits) if self.risky_layer_fp32 else self._sample(logits)
        h = self.code_book(codes)
        h = h + self.mlp(h)
        return self.head(h)


def build_lstm(arch, settings) -> ByteLSTM:
    """The builder of an lstm-family arch entry (amprepro.archs: shape vocab_size, embed, hidden)."""
    return ByteLSTM(**arch.shape, risky_layer_fp32=settings.risky_layer_fp32)


def build_gumbel(arch, settings) -> GumbelBytes:
    """The builder of a gumbel-family arch entry (amprepro.archs: shape vocab_size, dim, context, groups, codes;
    gumbel_tau)."""
    return GumbelBytes(**arch.shape, tau=settings.gumbel_tau, risky_layer_fp32=settings.risky_layer_fp32)

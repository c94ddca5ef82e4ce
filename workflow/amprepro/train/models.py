"""Models: a small CNN and a small transformer for smoke; ResNet-50, ViT-B/16 (torchvision), a GPT and a
LLaMA-7B-shaped decoder for paper."""

from __future__ import annotations

import importlib

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from amprepro import archs
from amprepro.memory import llama_shape
from amprepro.modelsettings import ModelSettings
from amprepro.train import riskmodels
from amprepro.train.riskmodels import in_fp32

_GPT2, _LLAMA7B = archs.get("gpt"), archs.get("llama")  # the classes' default sizes


class SmallCNN(nn.Module):
    """Two convolutions (each with BatchNorm and ReLU), global average pooling, a linear head; sizes: the small_cnn
    entry's shape (amprepro.archs.SMALL_CNN)."""

    def __init__(self, *, channels: tuple[int, int], kernel: int, in_channels: int, num_classes: int):
        super().__init__()
        first, second = channels
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, first, kernel, padding=kernel // 2), nn.BatchNorm2d(first), nn.ReLU(),
            nn.Conv2d(first, second, kernel, padding=kernel // 2), nn.BatchNorm2d(second), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(second, num_classes)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


class TinyTransformer(nn.Module):
    """Reads an (N, 1, H, W) image as H tokens of W features: attention, LayerNorm and GELU on a real task. Sizes: the
    tiny_transformer entry's shape (amprepro.archs.TINY_TRANSFORMER)."""

    def __init__(self, *, width: int, tokens: int, dim: int, depth: int, heads: int, num_classes: int):
        super().__init__()
        self.embed = nn.Linear(width, dim)
        self.position = nn.Parameter(torch.zeros(1, tokens, dim))
        layer = nn.TransformerEncoderLayer(dim, heads, dim * 4, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x):
        tokens = self.embed(x.flatten(1, 2)) + self.position
        return self.head(self.norm(self.encoder(tokens)).mean(dim=1))


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        batch, seq, dim = x.shape
        q, k, v = self.qkv(x).split(dim, dim=2)
        q, k, v = (t.view(batch, seq, self.heads, dim // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(batch, seq, dim))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(dim), CausalSelfAttention(dim, heads)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """nanoGPT-shaped decoder; the default size is GPT-2 small (about 124M parameters: the registry's gpt)."""

    def __init__(self, vocab_size: int = _GPT2.shape["vocab_size"], seq_len: int = _GPT2.seq_len,
                 layers: int = _GPT2.shape["layers"], heads: int = _GPT2.shape["heads"], dim: int = _GPT2.shape["dim"]):
        super().__init__()
        self.vocab_size, self.seq_len, self.layers, self.dim = vocab_size, seq_len, layers, dim
        self.tok = nn.Embedding(vocab_size, dim)
        self.pos = nn.Embedding(seq_len, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab_size, bias=False)
        self.lm_head.weight = self.tok.weight
        self.apply(self._init)

    @staticmethod
    def _init(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx):
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))




class HalfEpsNorm(nn.Module):
    """A hand-written LayerNorm that does its arithmetic in the compute dtype (the autocast dtype where autocast is
    on) and adds its epsilon there: the "custom norm with a tiny denominator" the second article warns about. With
    eps 1e-8 in fp16 the epsilon rounds to 0 (fp16's smallest subnormal is 6e-8), and a variance below about 6e-8
    rounds to 0 too; nn.LayerNorm, which autocast runs in FP32, has neither problem."""

    def __init__(self, dim: int, eps: float, fp32: bool = False):
        super().__init__()
        self.eps, self.fp32 = eps, fp32
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        if self.fp32:  # model setting risky_layer_fp32: the article's remedy, autocast disabled on this layer
            return in_fp32(self._normalize, x)
        return self._normalize(x)

    def _normalize(self, x):
        kind = x.device.type
        dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else x.dtype
        h = x.to(dtype)
        centered = h - h.mean(-1, keepdim=True)
        variance = (centered * centered).mean(-1, keepdim=True)
        return centered / (variance + self.eps).sqrt() * self.weight.to(dtype) + self.bias.to(dtype)


def swap_in_half_eps_norms(model: nn.Module, eps: float, fp32: bool = False) -> nn.Module:
    """Every nn.LayerNorm of model replaced by a HalfEpsNorm of the same width (model_config naive_norm_eps; fp32:
    risky_layer_fp32, each norm outside autocast on a float32 input)."""
    for name, child in model.named_children():
        if isinstance(child, nn.LayerNorm):
            setattr(model, name, HalfEpsNorm(child.normalized_shape[-1], eps, fp32))
        else:
            swap_in_half_eps_norms(child, eps, fp32)
    return model


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def rotary_tables(seq_len: int, head_dim: int, device=None, base: float = 10000.0):
    """cos and sin of rotary positions (LLaMA/GPT-NeoX half-split layout), (seq_len, head_dim), float32."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


class LlamaAttention(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int | None = None):
        super().__init__()
        self.heads, self.kv_heads = heads, kv_heads or heads
        self.kv_dim = self.kv_heads * (dim // heads)
        # q, k and v projections as one matmul; grouped KV heads (TinyLlama, SmolLM) project k and v narrower
        self.qkv = nn.Linear(dim, dim + 2 * self.kv_dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)

    def forward(self, x, cos, sin):
        batch, seq, dim = x.shape
        if self.kv_heads == self.heads:
            q, k, v = self.qkv(x).view(batch, seq, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        else:
            q, k, v = self.qkv(x).split([dim, self.kv_dim, self.kv_dim], dim=-1)
            q, k, v = (t.view(batch, seq, -1, dim // self.heads).transpose(1, 2) for t in (q, k, v))
        q, k = rotate(q, cos[:seq], sin[:seq]), rotate(k, cos[:seq], sin[:seq])
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv_heads != self.heads)
        return self.out(y.transpose(1, 2).reshape(batch, seq, dim))


class SwiGLU(nn.Module):
    def __init__(self, dim: int, ffn_dim: int):
        super().__init__()
        self.gate_up = nn.Linear(dim, 2 * ffn_dim, bias=False)  # gate and up projections as one matmul
        self.down = nn.Linear(ffn_dim, dim, bias=False)

    def forward(self, x):
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class LlamaBlock(nn.Module):
    def __init__(self, dim: int, heads: int, ffn_dim: int, kv_heads: int | None = None):
        super().__init__()
        self.attn_norm, self.attn = RMSNorm(dim), LlamaAttention(dim, heads, kv_heads)
        self.ffn_norm, self.ffn = RMSNorm(dim), SwiGLU(dim, ffn_dim)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.ffn(self.ffn_norm(x))


class Llama(nn.Module):
    """LLaMA-shaped decoder (RMSNorm, rotary positions, SwiGLU, untied embeddings); the default size is LLaMA-7B.

    Build it on the meta device and call materialize(device): the weights are then allocated and initialised where
    they will train, with no CPU copy (a 7B model is 27 GB in FP32). Each block is recomputed in the backward
    (activation checkpointing) unless checkpointing is False.
    """

    def __init__(self, vocab_size: int = _LLAMA7B.shape["vocab_size"], seq_len: int = _LLAMA7B.seq_len,
                 layers: int = _LLAMA7B.shape["layers"], heads: int = _LLAMA7B.shape["heads"],
                 dim: int = _LLAMA7B.shape["dim"], ffn_dim: int = _LLAMA7B.shape["ffn_dim"], checkpointing: bool = True,
                 kv_heads: int | None = None):
        super().__init__()
        self.vocab_size, self.seq_len, self.layers, self.dim = vocab_size, seq_len, layers, dim
        self.heads, self.ffn_dim, self.checkpointing = heads, ffn_dim, checkpointing
        self.tok = nn.Embedding(vocab_size, dim)
        self.blocks = nn.ModuleList(LlamaBlock(dim, heads, ffn_dim, kv_heads) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.lm_head = nn.Linear(dim, vocab_size, bias=False)
        cos, sin = rotary_tables(seq_len, dim // heads)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def materialize(self, device) -> Llama:
        """Allocate the (meta) parameters on `device` and initialise them there; rotary tables are recomputed."""
        self.to_empty(device=device)
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(module.weight, std=0.02)
                elif isinstance(module, RMSNorm):
                    nn.init.ones_(module.weight)
            cos, sin = rotary_tables(self.seq_len, self.dim // self.heads, device=device)
            self.rope_cos.copy_(cos)
            self.rope_sin.copy_(sin)
        return self

    def forward(self, idx):
        x = self.tok(idx)
        recompute = self.checkpointing and self.training and torch.is_grad_enabled()
        for block in self.blocks:
            if recompute:
                x = checkpoint(block, x, self.rope_cos, self.rope_sin, use_reentrant=False)
            else:
                x = block(x, self.rope_cos, self.rope_sin)
        return self.lm_head(self.norm(x))

    def matmul_parameters(self) -> int:
        """Parameters that are matmul weights (every Linear, the LM head included; not the embedding lookup)."""
        return sum(m.weight.numel() for m in self.modules() if isinstance(m, nn.Linear))

    def model_flops_per_token(self, seq_len: int) -> int:
        """Training FLOPs per token of useful work, nanoGPT/PaLM style: 6 x matmul parameters (forward 2, backward 4)
        + 12 x layers x width x seq_len (attention scores and weighted values, full square as the kernels count it).
        The forward that activation checkpointing recomputes in the backward is not useful work and is not counted."""
        return 6 * self.matmul_parameters() + 12 * self.layers * self.dim * seq_len


LLAMA_SIZES = {name: archs.get(name).shape for name in archs.where(family="llama")}  # a view of the registry's
# The package each arch needs besides torch (the registry's `package`); an arch not listed is plain torch.
# requirements.txt and envs/ must provide every package named here (tests/backbone/test_routes.py).
ARCH_PACKAGES = {a.name: a.package for a in archs.REGISTRY.values() if a.package}


def unavailable_reason(arch: str) -> str | None:
    package = archs.get(arch).package if arch in archs.REGISTRY else None
    if package is None:
        return None
    try:
        importlib.import_module(package)
    except Exception as exc:  # ImportError, or a torchvision built for another torch
        return f"{arch} comes from {package}, which is not importable here ({exc}); install {package}"
    return None


def build_small_cnn(arch: archs.Arch, settings: ModelSettings) -> nn.Module:
    if settings.data in archs.IMAGE_DATA:
        from amprepro.train import imagedata

        return SmallCNN(**{**arch.shape, "in_channels": 3, "num_classes": imagedata.num_classes(settings)})
    return SmallCNN(**arch.shape)


def build_gpt(arch: archs.Arch, settings: ModelSettings) -> nn.Module:
    model = GPT(seq_len=settings.seq_len, **arch.shape)
    if settings.naive_norm_eps is not None:
        model = swap_in_half_eps_norms(model, settings.naive_norm_eps, settings.risky_layer_fp32)
    return model


def build_llama(arch: archs.Arch, settings: ModelSettings) -> nn.Module:
    with torch.device("meta"):  # on the meta device: place() materialises it where it trains
        return Llama(seq_len=settings.seq_len, checkpointing=settings.activation_checkpointing,
                     **llama_shape(settings))


def build_timm(arch: archs.Arch, settings: ModelSettings) -> nn.Module:
    import timm

    return timm.create_model(arch.name, pretrained=False)


def build_torchvision(arch: archs.Arch, settings: ModelSettings) -> nn.Module:
    import torchvision

    kwargs = {"image_size": settings.image_size} if arch.family == "vit" else {}
    return getattr(torchvision.models, arch.name)(weights=None, **kwargs)


# The builders by name (an arch entry's `builder`): (arch entry, the model's settings: amprepro.modelsettings) -> the
# model, on the CPU or the meta device. A new arch of a new kind adds its builder here (amprepro.archs says how to add
# an arch).
BUILDERS = {
    "small_cnn": build_small_cnn,
    "tiny_transformer": lambda arch, settings: TinyTransformer(**arch.shape),
    "gpt": build_gpt,
    "llama": build_llama,
    "timm": build_timm,
    "torchvision": build_torchvision,
    "lstm_bytes": riskmodels.build_lstm,  # the AMP risk points' byte models
    "gumbel_bytes": riskmodels.build_gumbel,
}


def build(arch: str, settings: ModelSettings | dict) -> nn.Module:
    """The model of `arch` at these settings (a model_config dict, or a run matrix's model entry whose precisions,
    seeds and train are not the model's, is read as the settings of that arch)."""
    if arch not in archs.REGISTRY:
        raise ValueError(f"unknown arch {arch!r}")
    entry = archs.get(arch)
    if entry.builder not in BUILDERS:
        raise ValueError(f"arch {arch!r} names builder {entry.builder!r}, which amprepro.train.models.BUILDERS does "
                         f"not have ({', '.join(BUILDERS)}). Fix: add its builder there.")
    if not isinstance(settings, ModelSettings):
        settings = ModelSettings.of_entry({**settings, "arch": arch})
    return BUILDERS[entry.builder](entry, settings)


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())



def place(model: nn.Module, device) -> nn.Module:
    """Move a built model to its device; a model built on the meta device is materialised there instead."""
    if isinstance(model, Llama):
        return model.materialize(device)
    return model.to(device)

"""Models: a small CNN and a small transformer for smoke; ResNet-50, ViT-B/16 (torchvision) and a GPT for paper."""

from __future__ import annotations

import importlib

import torch
from torch import nn
from torch.nn import functional as F


class SmallCNN(nn.Module):
    def __init__(self, num_classes: int = 10, in_channels: int = 1):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(64, num_classes)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


class TinyTransformer(nn.Module):
    """Reads an (N, 1, H, W) image as H tokens of W features: attention, LayerNorm and GELU on a real task."""

    def __init__(self, width: int = 8, tokens: int = 8, dim: int = 64, depth: int = 2, heads: int = 4,
                 num_classes: int = 10):
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
    """nanoGPT-shaped decoder; the default size is GPT-2 small (about 124M parameters)."""

    def __init__(self, vocab_size: int = 50304, seq_len: int = 1024, layers: int = 12, heads: int = 12,
                 dim: int = 768):
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

    def flops_per_token(self) -> float:
        """Training FLOPs per token, nanoGPT/PaLM estimate: 6N + 12 L D T."""
        params = sum(p.numel() for p in self.parameters()) - self.pos.weight.numel()
        return 6 * params + 12 * self.layers * self.dim * self.seq_len


GPT_SIZES = {"gpt": {}, "gpt_tiny": {"vocab_size": 512, "layers": 2, "heads": 4, "dim": 128}}


# The package each arch needs besides torch; an arch not listed is plain torch. requirements.txt and envs/ must provide
# every package named here (tests/backbone/test_routes.py).
ARCH_PACKAGES = {"resnet50": "torchvision", "vit_b_16": "torchvision", "vit_base_patch16_224": "timm"}


def unavailable_reason(arch: str) -> str | None:
    package = ARCH_PACKAGES.get(arch)
    if package is None:
        return None
    try:
        importlib.import_module(package)
    except Exception as exc:  # ImportError, or a torchvision built for another torch
        return f"{arch} comes from {package}, which is not importable here ({exc}); install {package}"
    return None


def build(arch: str, model_config: dict) -> nn.Module:
    if arch == "small_cnn":
        return SmallCNN()
    if arch == "tiny_transformer":
        return TinyTransformer()
    if arch in GPT_SIZES:
        return GPT(seq_len=model_config.get("seq_len", 1024), **GPT_SIZES[arch])
    if arch == "vit_base_patch16_224":
        import timm

        return timm.create_model(arch, pretrained=False)
    if arch in ("resnet50", "vit_b_16"):
        import torchvision

        kwargs = {"image_size": model_config.get("image_size", 224)} if arch == "vit_b_16" else {}
        return getattr(torchvision.models, arch)(weights=None, **kwargs)
    raise ValueError(f"unknown arch {arch!r}")


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


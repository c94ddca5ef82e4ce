"""The shapes the memory model reads (views of the arch registry, amprepro.archs) and what they count: each family's
parameters and matmul parameters (the weights a cast cache holds a 16-bit copy of), without building the model."""

from __future__ import annotations

from amprepro import archs
from amprepro.memory.regimes import Lora
from amprepro.modelsettings import ModelSettings

# The shape tables live in the arch registry (amprepro.archs); these names are the memory model's views of them.
RESNET50 = archs.RESNET50
VIT_B_16 = archs.VIT_B_16
LLAMA_LADDER = archs.LLAMA_LADDER
# Every LLaMA shape by key: the ladder's (a `shape` setting) and each llama-family arch's own.
LLAMA_SHAPES = {key: shape for a in archs.REGISTRY.values() for key, _, shape in a.ladder} | {
    a.name: a.shape for a in archs.REGISTRY.values() if a.family == "llama" and not a.ladder}
LLAMA_NAMES = {key: name for key, name, _ in LLAMA_LADDER}


def llama_shape(settings: ModelSettings | dict) -> dict:
    """The config's `shape` (a key of LLAMA_SHAPES), else its arch's own shape."""
    settings = ModelSettings.of(settings)
    key = settings.shape or settings.arch
    return LLAMA_SHAPES[key] if key in LLAMA_SHAPES else archs.get(key).shape


def vit_tokens(settings: ModelSettings | dict, shape: dict = VIT_B_16) -> int:
    return (ModelSettings.of(settings).image_size // shape["patch"]) ** 2 + 1


def kv_dim(shape: dict) -> int:
    """Width of the key (and of the value) projection: kv_heads x head size (the width itself without grouped KV)."""
    return shape.get("kv_heads", shape["heads"]) * (shape["dim"] // shape["heads"])


def is_llama(settings: ModelSettings | dict) -> bool:
    """A LLaMA-family arch: the memory model's LLaMA moments, sharding and LoRA apply."""
    arch = archs.REGISTRY.get(ModelSettings.of(settings).arch)
    return arch is not None and arch.family == "llama"


def llama_linear_shapes(shape: dict) -> dict[str, tuple[int, int]]:
    """(in, out) features of each linear of one block, by module name (amprepro.train.models.LlamaBlock)."""
    d, f = shape["dim"], shape["ffn_dim"]
    return {"qkv": (d, d + 2 * kv_dim(shape)), "out": (d, d), "gate_up": (d, 2 * f), "down": (f, d)}


def _transformer_block_parameters(d: int, hidden: int) -> int:
    return 2 * 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * hidden + hidden) + (hidden * d + d)


def llama_parameters(shape: dict) -> tuple[int, int]:
    """(parameters, matmul parameters) of amprepro.train.models.Llama at this shape."""
    d, f, v, n = shape["dim"], shape["ffn_dim"], shape["vocab_size"], shape["layers"]
    matmul = n * (d * (d + 2 * kv_dim(shape)) + d * d + 2 * d * f + f * d) + v * d
    return matmul + v * d + n * 2 * d + d, matmul


def lora_parameters(shape: dict, lora: Lora) -> int:
    """Trainable adapter parameters: r x (in + out) for each targeted linear of every block."""
    linears = llama_linear_shapes(shape)
    return shape["layers"] * lora.rank * sum(sum(linears[name]) for name in lora.targets)


def llama_unit_parameters(shape: dict) -> int:
    """The largest FSDP unit (one per block, the embedding, the LM head): what ZeRO-3 gathers whole."""
    block = sum(i * o for i, o in llama_linear_shapes(shape).values()) + 2 * shape["dim"]
    return max(block, shape["vocab_size"] * shape["dim"])


def _resnet_parameters(shape: dict, settings: ModelSettings) -> tuple[int, int]:
    total = shape["parameters"]
    return total, total - 2 * shape["bn_channels"] - shape["classes"]  # less BatchNorm's and the head's bias


def _vit_parameters(shape: dict, settings: ModelSettings) -> tuple[int, int]:
    d, tokens, patch, classes = shape["dim"], vit_tokens(settings, shape), shape["patch"], shape["classes"]
    matmul = shape["layers"] * (4 * d * d + 8 * d * d) + 3 * patch**2 * d + d * classes
    blocks = shape["layers"] * _transformer_block_parameters(d, 4 * d)
    return blocks + 3 * patch**2 * d + d + tokens * d + d + 2 * d + d * classes + classes, matmul


def _gpt_parameters(shape: dict, settings: ModelSettings) -> tuple[int, int]:
    d, seq = shape["dim"], settings.seq_len
    blocks = shape["layers"] * _transformer_block_parameters(d, 4 * d)
    matmul = shape["layers"] * 12 * d * d + shape["vocab_size"] * d
    return shape["vocab_size"] * d + seq * d + blocks + 2 * d, matmul


def _small_cnn_parameters(shape: dict, settings: ModelSettings) -> tuple[int, int]:
    """amprepro.train.models.SmallCNN at its entry's shape (the digits' channels and classes): each convolution with
    its bias and its BatchNorm's weight and bias, the linear head."""
    (c1, c2), k2, c0, classes = shape["channels"], shape["kernel"] ** 2, shape["in_channels"], shape["num_classes"]
    matmul = c0 * c1 * k2 + c1 * c2 * k2 + c2 * classes
    return matmul + c1 + 2 * c1 + c2 + 2 * c2 + classes, matmul


def _tiny_transformer_parameters(shape: dict, settings: ModelSettings) -> tuple[int, int]:
    """amprepro.train.models.TinyTransformer: the row embedding, the position table, the pre-norm encoder layers, the
    final norm, the head (matmul parameters: the encoder layers' linears only)."""
    d, width, tokens, depth, classes = (shape[k] for k in ("dim", "width", "tokens", "depth", "num_classes"))
    blocks = depth * _transformer_block_parameters(d, 4 * d)
    return width * d + d + tokens * d + blocks + 2 * d + d * classes + classes, depth * 12 * d * d


def _lstm_parameters(shape: dict, settings: ModelSettings) -> tuple[int, int]:
    """amprepro.train.riskmodels.ByteLSTM: byte embedding, one LSTM layer, linear head (the risk preset)."""
    e, h, vocab = shape["embed"], shape["hidden"], shape["vocab_size"]
    recurrent = 4 * h * (e + h)  # weight_ih and weight_hh of the four gates
    return vocab * e + recurrent + 8 * h + h * vocab + vocab, recurrent + h * vocab


def _gumbel_parameters(shape: dict, settings: ModelSettings) -> tuple[int, int]:
    """amprepro.train.riskmodels.GumbelBytes: embedding, causal convolution, code logits, code book, MLP, head."""
    d, k, codes, vocab = shape["dim"], shape["context"], shape["groups"] * shape["codes"], shape["vocab_size"]
    matmul = k * d * d + 2 * d * codes + 4 * d * d + d * vocab
    return vocab * d + matmul + d + codes + 2 * d + d + vocab, matmul  # + the biases

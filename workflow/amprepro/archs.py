"""The architectures, one entry each: every fact about an arch any stage needs, written once.

The config schema's arch enum (and its LLaMA `shape` enum), the config checks (which data an arch reads, which settings
it takes), the model builder (amprepro.train.models.BUILDERS, by the entry's `builder`), the memory model (the shape
tables, amprepro.memory's formulas by `family`), the memory plan and the job resources (host-built weights, seconds per
item) all read this table. No torch import: the DAG build and the report read it too.

Adding an arch (tests/backbone/test_archs.py does it at test time):
1. an Arch entry in REGISTRY below (its shape, the data it reads, its defaults, its resources);
2. its builder: a function (arch: Arch, settings: amprepro.modelsettings.ModelSettings) -> nn.Module in
   amprepro.train.models.BUILDERS under the entry's `builder` name, unless an existing builder fits (a GPT of a new
   size: builder "gpt", a new `shape`);
3. for a new `family` only: its formulas (parameters, activations) in amprepro.memory.FAMILIES (written in
   amprepro.memory.cellpeak), which every cell's memory estimate and the memory plan need.
Nothing else names an arch: the schema's enum, the config checks and the resources follow the entry.

Defaults for a setting a model's config leaves out (the one place each is written; amprepro.modelsettings applies them
once, when a cell's record is built, and every stage reads the record's fields):
- seq_len: the model's context length (GPT's position table, LLaMA's RoPE tables, the memory model) is the entry's
  `seq_len` (GPT 1024, LLaMA 2048). The data's windows are not always as long: synthetic_tokens draws
  SYNTHETIC_TOKENS_SEQ_LEN (1024) tokens per sample for every arch, a LLaMA too, and python_stdlib reads
  TEXT_SEQ_LEN (128)-byte windows (data_seq_len()). The job's time limit (amprepro.plan.resources) counts
  SYNTHETIC_TOKENS_SEQ_LEN tokens for both token kinds. These are the behaviours the pipeline had before the registry
  (each default then written where it was used); every preset sets seq_len where it matters, so they only apply to
  configs that leave it out.
- image_size: IMAGE_SIZE (224), for the synthetic images and the image models alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field

TEXT_DATA = "python_stdlib"  # byte-level text (amprepro.train.textdata.DATA_KIND)
IMAGE_DATA = ("cifar10", "imagefolder")  # labelled 3-channel images of any size (amprepro.train.imagedata.KINDS)
IMAGE_SIZE = 224
SYNTHETIC_TOKENS_SEQ_LEN = 1024
TEXT_SEQ_LEN = 128

# Shapes: what the memory model needs to know without building the model (torchvision and timm need not be importable
# here). Parameter counts are the built models' (reference/nvidia-h200: weights bytes / 4).
RESNET50 = {"parameters": 25_557_032, "bn_channels": 26_560, "stem": 64, "classes": 1000,
            "blocks": ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2))}
VIT_B_16 = {"layers": 12, "dim": 768, "patch": 16, "classes": 1000}
# The smoke models, built for the digits (8x8 grey images, 10 classes; small_cnn on 3-channel images takes the data's
# channels and classes instead): the keyword arguments of amprepro.train.models.SmallCNN and TinyTransformer.
SMALL_CNN = {"channels": (32, 64), "kernel": 3, "in_channels": 1, "num_classes": 10}
TINY_TRANSFORMER = {"width": 8, "tokens": 8, "dim": 64, "depth": 2, "heads": 4, "num_classes": 10}
# The AMP risk models over bytes (amprepro.train.riskmodels.ByteLSTM and GumbelBytes: their keyword arguments).
LSTM_BYTES = {"vocab_size": 256, "embed": 64, "hidden": 384}
GUMBEL_BYTES = {"vocab_size": 256, "dim": 192, "context": 8, "groups": 8, "codes": 32}
# Published LLaMA-family shapes, largest first: the ladder a card too small for the 7B shape steps down (issue 21).
# Built as published (grouped KV heads where the original has them: kv_heads), with untied embeddings as the 7B shape
# has: SmolLM ties its input and output embeddings, so its parameter count here is higher (memory.parameters()).
LLAMA_LADDER = (
    ("llama", "LLaMA-7B", {"vocab_size": 32000, "layers": 32, "heads": 32, "dim": 4096, "ffn_dim": 11008}),
    ("openllama_3b", "OpenLLaMA-3B", {"vocab_size": 32000, "layers": 26, "heads": 32, "dim": 3200, "ffn_dim": 8640}),
    ("tinyllama_1b", "TinyLlama-1.1B", {"vocab_size": 32000, "layers": 22, "heads": 32, "kv_heads": 4, "dim": 2048,
                                        "ffn_dim": 5632}),
    ("smollm_360m", "SmolLM-360M", {"vocab_size": 49152, "layers": 32, "heads": 15, "kv_heads": 5, "dim": 960,
                                    "ffn_dim": 2560}),
    ("smollm_135m", "SmolLM-135M", {"vocab_size": 49152, "layers": 30, "heads": 9, "kv_heads": 3, "dim": 576,
                                    "ffn_dim": 1536}),
)


@dataclass(frozen=True)
class Arch:
    name: str
    family: str  # its memory formulas (amprepro.memory.FAMILIES): cnn, image_transformer, resnet, vit, gpt, llama
    builder: str  # the key of its builder in amprepro.train.models.BUILDERS
    seconds_per_item: float  # job time limit: seconds per sample or token of a step (amprepro.plan.resources)
    shape: dict = field(default_factory=dict, compare=False)  # what its builder and the memory model read
    reads: tuple[str, ...] = ()  # the real-data kinds it reads (TEXT_DATA, IMAGE_DATA); digits and synthetic_* are
    # not checked per arch
    package: str | None = None  # the package it needs besides torch (requirements.txt and envs/ provide each)
    seq_len: int | None = None  # its context length when the config sets none (a language model)
    image_size: int | None = None  # the image side it is built for when the config sets none (an image model)
    host_built_parameters: int = 0  # parameters built on the host before .to(device): host memory (resources)
    activation_checkpointing: bool = False  # takes the activation_checkpointing setting (default on)
    ladder: tuple = ()  # (key, name, shape) of the LLaMA-family shapes its `shape` setting picks (first: its own)
    naive_norm_eps: bool = False  # takes naive_norm_eps (its LayerNorms swapped for models.HalfEpsNorm)
    gumbel_tau: bool = False  # takes gumbel_tau (its Gumbel-softmax bottleneck's temperature)
    # The layer risky_layer_fp32 runs outside autocast ("" = none; an arch with naive_norm_eps: its norms, where set)
    risky_layer: str = ""
    lora: bool = False  # takes lora (LoRA fine-tuning of a frozen base: amprepro.train.lora wraps its blocks' linears)
    # Where torch.compile compiles it (amprepro.train.float8.compile_model): "" the whole model; else the dotted path
    # of its list of identical blocks, each compiled in place (one graph serves them all; the rest runs eager)
    compiled_blocks: str = ""
    description: str = ""


REGISTRY: dict[str, Arch] = {
    a.name: a
    for a in (
        Arch("small_cnn", "cnn", "small_cnn", 4.3e-4, shape=SMALL_CNN, reads=IMAGE_DATA,
             description="two convolutions and a linear head, for the digits (smoke) or 3-channel images"),
        Arch("tiny_transformer", "image_transformer", "tiny_transformer", 1.0e-3, shape=TINY_TRANSFORMER,
             description="two pre-norm encoder layers reading a digit's rows as tokens (smoke)"),
        Arch("resnet50", "resnet", "torchvision", 1.1e-2, shape=RESNET50, reads=IMAGE_DATA, package="torchvision",
             image_size=IMAGE_SIZE, host_built_parameters=25_600_000, description="torchvision's ResNet-50"),
        Arch("vit_b_16", "vit", "torchvision", 2.7e-2, shape=VIT_B_16, package="torchvision", image_size=IMAGE_SIZE,
             host_built_parameters=86_600_000, compiled_blocks="encoder.layers", description="torchvision's ViT-B/16"),
        Arch("vit_base_patch16_224", "vit", "timm", 2.7e-2, shape=VIT_B_16, package="timm", image_size=IMAGE_SIZE,
             host_built_parameters=86_600_000, description="timm's ViT-B/16"),
        Arch("gpt", "gpt", "gpt", 1.9e-4, shape={"vocab_size": 50304, "layers": 12, "heads": 12, "dim": 768},
             reads=(TEXT_DATA,), seq_len=1024, host_built_parameters=124_000_000, naive_norm_eps=True,
             description="a nanoGPT-style GPT-2 small (124M)"),
        Arch("gpt_tiny", "gpt", "gpt", 1.9e-4, shape={"vocab_size": 512, "layers": 2, "heads": 4, "dim": 128},
             reads=(TEXT_DATA,), seq_len=1024, naive_norm_eps=True, description="the GPT at smoke size"),
        Arch("gpt_bytes", "gpt", "gpt", 1.9e-4, shape={"vocab_size": 256, "layers": 4, "heads": 4, "dim": 128},
             reads=(TEXT_DATA,), seq_len=1024, naive_norm_eps=True,
             description="a small GPT over byte values (python_stdlib)"),
        # Built on the meta device and materialised on the GPU (models.place): no host-built weights.
        Arch("llama", "llama", "llama", 1.2e-2, shape=LLAMA_LADDER[0][2], reads=(TEXT_DATA,), seq_len=2048,
             activation_checkpointing=True, ladder=LLAMA_LADDER, lora=True,
             description="a LLaMA-7B-shaped decoder (6.74 B parameters), or a smaller published shape (`shape`)"),
        Arch("llama_tiny", "llama", "llama", 1.0e-4,
             shape={"vocab_size": 256, "layers": 2, "heads": 4, "dim": 64, "ffn_dim": 172}, reads=(TEXT_DATA,),
             seq_len=2048, activation_checkpointing=True, lora=True,
             description="the LLaMA class at smoke size, for CPU tests"),
        # The second article's AMP risk points (amprepro.train.riskmodels; config/presets/risk.yaml). Time budget:
        # gpt_bytes's per token, not measured for these.
        Arch("lstm_bytes", "lstm", "lstm_bytes", 1.9e-4, shape=LSTM_BYTES, reads=(TEXT_DATA,),
             seq_len=TEXT_SEQ_LEN, risky_layer="the LSTM",
             description="an LSTM language model over bytes (0.81 M parameters): gradients summed over time steps"),
        Arch("gumbel_bytes", "gumbel", "gumbel_bytes", 1.9e-4, shape=GUMBEL_BYTES, reads=(TEXT_DATA,),
             seq_len=TEXT_SEQ_LEN,
             gumbel_tau=True, risky_layer="the Gumbel-softmax sampler",
             description="a byte model through a Gumbel-softmax bottleneck (0.64 M parameters) at gumbel_tau"),
    )
}
"""In the schema's order: the smoke models, the image models, the GPTs, the LLaMAs, the AMP risk models."""


def names() -> list[str]:
    """Every arch name, in the registry's order (the schema's enum)."""
    return list(REGISTRY)


def get(name: str) -> Arch:
    return REGISTRY[name]


def where(**wanted) -> list[str]:
    """The arch names whose entry has each given field equal to the given value (activation_checkpointing=True)."""
    return [a.name for a in REGISTRY.values() if all(getattr(a, k) == v for k, v in wanted.items())]


def reading(data: str) -> list[str]:
    """The archs that read a real-data kind, in the registry's order."""
    return [a.name for a in REGISTRY.values() if data in a.reads]


def with_ladder() -> list[str]:
    """The archs that take a `shape` setting (LLaMA-family shapes)."""
    return [a.name for a in REGISTRY.values() if a.ladder]


def ladder_keys() -> list[str]:
    """Every `shape` a config may set (the schema's shape enum), in ladder order."""
    return list(dict.fromkeys(key for a in REGISTRY.values() for key, _, _ in a.ladder))


def seq_len(model_config: dict) -> int | None:
    """The model's context length: the config's seq_len, else its arch's default (None: not a sequence model)."""
    return model_config.get("seq_len", REGISTRY[model_config["arch"]].seq_len)


def data_seq_len(model_config: dict) -> int:
    """Tokens (bytes) per sample of a token data kind: the config's seq_len, else the data kind's default."""
    default = TEXT_SEQ_LEN if model_config.get("data") == TEXT_DATA else SYNTHETIC_TOKENS_SEQ_LEN
    return model_config.get("seq_len", default)


def image_size(model_config: dict) -> int:
    """The image side: the config's image_size, else its arch's default, else IMAGE_SIZE."""
    arch = REGISTRY.get(model_config.get("arch"))
    return model_config.get("image_size", (arch and arch.image_size) or IMAGE_SIZE)

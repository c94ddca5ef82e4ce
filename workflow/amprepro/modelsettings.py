"""A model's settings (a cell's `model_config`) as one typed record, built once from the validated config and the arch
registry's defaults: every reader takes an attribute, none repeats a default.

One field per setting of the schema's model entry (workflow/schemas/config.schema.yaml, $defs.model) but precisions,
seeds and train, which the run matrix takes apart (amprepro.config.matrix). A field the config leaves out holds its
default: an arch's (seq_len, image_size: amprepro.archs, the one place those are written) or the setting's own
(written below, the one place each is). `written` names the keys the config wrote, in its order: as_dict() gives back
exactly those, as written, so the JSON form of a cell (the train job's --spec, metrics.json's "spec", the reference's
aggregate and the code digests over them) is the one it was before the record existed.

No torch import: the DAG build, the memory plan and the report read it too.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from amprepro import archs

# The settings of the schema's model entry that are the run matrix's, not the model's (amprepro.config.matrix).
MATRIX_KEYS = ("precisions", "seeds", "train")
LORA_TARGETS = ("qkv", "out", "gate_up", "down")  # amprepro.train.models.LlamaBlock's linears, by module name
EVAL_WINDOWS = 64  # python_stdlib's held-out windows when the config sets none (amprepro.train.textdata)
GUMBEL_TAU = 1.0  # gumbel_bytes' temperature when the config sets none (amprepro.train.riskmodels)
FOLDER_IMAGE_SIZE = 32  # the side imagefolder images are resized to when the config sets no image_size


@dataclass(frozen=True)
class LoraSettings:
    """The `lora` setting (amprepro.train.lora: LoRA fine-tuning of a frozen base) with its defaults filled in."""

    rank: int = 16
    """Rank r of the adapters A (in x r) and B (r x out)."""
    alpha: float = 32
    """Their scaling is alpha / r."""
    targets: tuple[str, ...] = LORA_TARGETS
    """The linears of each block that get adapters (qkv is q, k and v fused); default every one."""
    base: str = "fp32"
    """The frozen base's dtype: fp32, or bf16 (under amp_bf16 only)."""
    written: tuple[str, ...] = ()
    """The keys the config wrote, in its order: as_dict() gives back these only."""

    @classmethod
    def of(cls, given: dict) -> LoraSettings:
        unknown = [key for key in given if key not in ("rank", "alpha", "targets", "base")]
        if unknown:
            raise TypeError(f"lora: no setting {', '.join(map(repr, unknown))} (rank, alpha, targets, base)")
        values = {key: tuple(value) if key == "targets" else value for key, value in given.items()}
        return cls(**values, written=tuple(given))

    def as_dict(self) -> dict:
        """The setting as the config wrote it."""
        return {key: list(self.targets) if key == "targets" else getattr(self, key) for key in self.written}

    def resolved(self) -> dict:
        """Every key, defaults filled in (amprepro.train.lora reads this)."""
        return {"rank": self.rank, "alpha": self.alpha, "targets": list(self.targets), "base": self.base}


@dataclass(frozen=True)
class ModelSettings:
    """A model's settings, defaults applied once (amprepro.cellspec.CellSpec.settings)."""

    arch: str | None = None
    """The architecture: a name of the arch registry (amprepro.archs.REGISTRY). None only in a partial record (a
    test's, a tool's): then no arch default applies."""
    data: str | None = None
    """digits, python_stdlib, cifar10, imagefolder, synthetic_images or synthetic_tokens (amprepro.datakinds)."""
    data_path: str | None = None
    """cifar10 / imagefolder only: the dataset's directory."""
    download: bool = False
    """cifar10 only: fetch missing files with torchvision's checksummed download."""
    eval_every: int | None = None
    """Evaluate the held-out loss every this many steps (amprepro.train.heldout); None: no curve."""
    eval_windows: int = EVAL_WINDOWS
    """python_stdlib only: held-out windows of seq_len bytes, evenly spaced."""
    naive_norm_eps: float | None = None
    """GPT archs only: every LayerNorm replaced by a hand-written norm with this epsilon (models.HalfEpsNorm); None:
    the model's own LayerNorms."""
    gumbel_tau: float = GUMBEL_TAU
    """gumbel_bytes only: its Gumbel-softmax bottleneck's temperature."""
    risky_layer_fp32: bool = False
    """Run the model's risky layer (amprepro.archs.Arch.risky_layer) outside autocast on a float32 input."""
    batch_size: int | None = None
    """The batch of one step, over every data-parallel process (the plan may lower a preset's: CellSpec.planned)."""
    image_size: int = archs.IMAGE_SIZE
    """The image side: the config's, else the arch's default (amprepro.archs.image_size: IMAGE_SIZE for every arch
    without one). The imagefolder data's own default is folder_image_size."""
    seq_len: int | None = None
    """The model's context length: the config's, else the arch's default (amprepro.archs.Arch.seq_len); None for a
    model that is not a sequence model. The data's windows may differ when the config sets none: data_seq_len."""
    channels_last: bool = False
    """Model and 4-D inputs in torch.channels_last memory format."""
    compile: bool = False
    """torch.compile the model."""
    fused_layer_norm: bool = False
    """Swap nn.LayerNorm for apex FusedLayerNorm (needs apex)."""
    apex_build: str = "full"
    """Which apex build its apex cells use: full or shell (amprepro.cellspec.APEX_VIEWS)."""
    gpus: int = 1
    """Data-parallel processes through torchrun on each node."""
    nodes: int = 1
    """Nodes of a Slurm allocation, one torchrun of `gpus` processes on each."""
    sync_batchnorm: bool = False
    """SyncBatchNorm across the data-parallel processes."""
    shape: str | None = None
    """llama archs only: a LLaMA-family shape of the arch's ladder (amprepro.archs.LLAMA_LADDER); None: the arch's
    own (the memory plan may step a preset's 7B model down the ladder)."""
    activation_checkpointing: bool = True
    """llama archs only: recompute each block in the backward."""
    lora: LoraSettings | None = None
    """llama archs only: LoRA fine-tuning (amprepro.train.lora); None: every weight trains."""
    epoch_tokens: int | None = None
    """synthetic_tokens only: the token count of one epoch, for the derived epoch time."""
    written: tuple[str, ...] = ()
    """The keys the config wrote, in its order: as_dict() gives back these only, as written."""

    @classmethod
    def of(cls, value: ModelSettings | dict) -> ModelSettings:
        """The record of a model_config (the validated config's, or the JSON form's): each field the config's value,
        else its default. A key that is no setting is an error (the schema allows none)."""
        if isinstance(value, ModelSettings):
            return value
        names = [f.name for f in dataclasses.fields(cls) if f.name != "written"]
        unknown = [key for key in value if key not in names]
        if unknown:
            raise TypeError(f"model_config: no setting {', '.join(map(repr, unknown))} (the schema's model entry "
                            f"has {', '.join(names)})")
        values = dict(value)
        if value.get("lora") is not None:
            values["lora"] = LoraSettings.of(value["lora"])
        known = value.get("arch") in archs.REGISTRY
        values["seq_len"] = archs.seq_len(value) if known else value.get("seq_len")  # the arch's default
        values["image_size"] = archs.image_size(value)  # the arch's default, else archs.IMAGE_SIZE
        return cls(**values, written=tuple(value))

    @classmethod
    def of_entry(cls, entry: ModelSettings | dict) -> ModelSettings:
        """The record of a model entry of the run matrix (runs.models.<name>): its precisions, seeds and train are the
        matrix's (MATRIX_KEYS), the rest is the model's."""
        if isinstance(entry, ModelSettings):
            return entry
        return cls.of({key: value for key, value in entry.items() if key not in MATRIX_KEYS})

    def as_dict(self) -> dict:
        """The model_config the record was built from: the keys the config wrote, their values as written."""
        return {key: self.lora.as_dict() if key == "lora" and self.lora is not None else getattr(self, key)
                for key in self.written}

    def resolved(self) -> dict:
        """Every setting with its value, defaults filled in (lora as LoraSettings.resolved(), or None)."""
        return {f.name: (self.lora.resolved() if f.name == "lora" and self.lora is not None else getattr(self, f.name))
                for f in dataclasses.fields(self) if f.name != "written"}

    def is_set(self, key: str) -> bool:
        """Whether the config wrote this setting (rather than left it to its default)."""
        return key in self.written

    @property
    def data_seq_len(self) -> int:
        """Tokens (bytes) per sample of a token data kind: the config's seq_len, else the data kind's default
        (amprepro.archs.data_seq_len)."""
        return archs.data_seq_len(self.as_dict())

    @property
    def budget_seq_len(self) -> int:
        """Tokens per sample the job's time limit counts for a token data kind (amprepro.plan.resources): the config's
        seq_len, else SYNTHETIC_TOKENS_SEQ_LEN for both kinds (a bound over python_stdlib's shorter windows)."""
        return self.seq_len if self.is_set("seq_len") else archs.SYNTHETIC_TOKENS_SEQ_LEN

    @property
    def folder_image_size(self) -> int:
        """The side imagefolder images are resized to: the config's image_size, else FOLDER_IMAGE_SIZE."""
        return self.image_size if self.is_set("image_size") else FOLDER_IMAGE_SIZE

    @property
    def arch_entry(self) -> archs.Arch:
        """The arch's registry entry."""
        return archs.get(self.arch)

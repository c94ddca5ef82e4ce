"""The checks across fields of the resolved run matrix, per model: settings only where they mean something, a batch the
data can supply, LoRA's precisions, the AMP remedies where they act, an apex source where apex is required."""

from __future__ import annotations

from amprepro import archs, precisions
from amprepro.config.errors import ConfigError
from amprepro.datakinds import largest_batch
from amprepro.modelsettings import ModelSettings

LLAMA_ARCHS = tuple(archs.where(family="llama"))  # a view of the arch registry (amprepro.archs)


def check_model_settings(model: str, settings: dict) -> None:
    """Settings that only mean something for some models: refuse them elsewhere rather than ignore them."""
    if "activation_checkpointing" in settings and not archs.get(settings["arch"]).activation_checkpointing:
        raise ConfigError(
            f"Config error at runs.models.{model}.activation_checkpointing: arch {settings['arch']} has no "
            f"checkpointed blocks (only {', '.join(archs.where(activation_checkpointing=True))}). Fix: remove the key "
            "or use a llama arch."
        )
    if "shape" in settings and not archs.get(settings["arch"]).ladder:
        laddered = archs.with_ladder()
        raise ConfigError(
            f"Config error at runs.models.{model}.shape: arch {settings['arch']} has no LLaMA shapes (only "
            f"{', '.join(laddered)}). Fix: remove the key or use arch: {laddered[0]}."
        )
    check_data_settings(model, settings)
    if "epoch_tokens" in settings and settings["data"] != "synthetic_tokens":
        raise ConfigError(
            f"Config error at runs.models.{model}.epoch_tokens: data {settings['data']} is not counted in tokens. "
            "Fix: remove the key, or use it on a synthetic_tokens model."
        )


# The precisions a LoRA cell trains under, by the frozen base's dtype (amprepro.train.lora): a bf16 base needs bf16
# autocast (its matmuls and the FP32 adapters meet in one dtype); compiled, FP8 and apex cells are not LoRA's. Which
# archs take `lora` at all is the registry's (archs.Arch.lora; ONLY_FOR below).
LORA_PRECISIONS = {"fp32": ("fp32", "tf32", "amp_fp16", "amp_bf16"), "bf16": ("amp_bf16",)}


def check_lora(model: str, settings: dict, runs_precisions: list[str] | None = None) -> None:
    """A `lora` setting only under the precisions its frozen base trains in."""
    if "lora" not in settings:
        return
    base = ModelSettings.of_entry(settings).lora.base
    precisions_here = settings.get("precisions") or runs_precisions or []
    wrong = [p for p in precisions_here if p not in LORA_PRECISIONS[base]]
    if wrong:
        raise ConfigError(f"Config error at runs.models.{model}.precisions: a LoRA model with a frozen {base} base "
                          f"trains under {', '.join(LORA_PRECISIONS[base])} only, not {', '.join(wrong)}. Fix: set "
                          f"the model's precisions to [{', '.join(LORA_PRECISIONS[base])}] or fewer"
                          + (", or use lora.base fp32" if base == "bf16" else "") + ".")


# A model setting -> (the data kinds it means something for, or the arch registry's field that says which archs take
# it), and the config field it depends on.
ONLY_FOR = {
    "data_path": (archs.IMAGE_DATA, "data"),
    "download": (("cifar10",), "data"),
    "eval_windows": ((archs.TEXT_DATA,), "data"),
    "naive_norm_eps": ("naive_norm_eps", "arch"),
    "gumbel_tau": ("gumbel_tau", "arch"),
    "lora": ("lora", "arch"),
}


def check_data_settings(model: str, settings: dict) -> None:
    """The real-data kinds (python_stdlib, cifar10, imagefolder) with an arch that reads them, and their settings
    only where they mean something."""
    data, arch = settings["data"], settings["arch"]
    for key, (allowed, field) in ONLY_FOR.items():
        if field == "arch":  # the arch registry's field says which archs take it
            allowed = archs.where(**{allowed: True})
        if key in settings and settings[field] not in allowed:
            raise ConfigError(f"Config error at runs.models.{model}.{key}: {field} {settings[field]} does not use it "
                              f"(only {field} {', '.join(allowed)}). Fix: remove the key.")
    # The language models that read byte-level text (python_stdlib): byte values are token ids below every vocabulary
    # (256 and up), so a LLaMA shape reads them unchanged (the fp8 preset's 7B shape on real text).
    if data == archs.TEXT_DATA and arch not in archs.reading(data):
        raise ConfigError(f"Config error at runs.models.{model}.arch: data python_stdlib is byte-level text for a "
                          f"language model; arch {arch} is not one. Fix: use arch gpt_bytes (or "
                          f"{', '.join(archs.reading(data))}).")
    if data in archs.IMAGE_DATA:
        if arch not in archs.reading(data):
            raise ConfigError(f"Config error at runs.models.{model}.arch: data {data} needs an arch that reads "
                              f"3-channel images of any size ({', '.join(archs.reading(data))}). Fix: use one of "
                              "them.")
        if not ModelSettings.of_entry(settings).data_path:
            raise ConfigError(f"Config error at runs.models.{model}.data_path: data {data} needs the dataset's "
                              "directory. Fix: set data_path (docs: amprepro.train.imagedata).")


def check_batch(model: str, settings: dict) -> None:
    """A batch the data can supply, split evenly over the model's GPUs: throughput counts exactly this batch."""
    given = ModelSettings.of_entry(settings)
    batch, gpus, most = given.batch_size, given.gpus, largest_batch(given.data)
    if most is not None and batch > most:
        raise ConfigError(
            f"Config error at runs.models.{model}.batch_size: {batch} is more than the {most} samples of the "
            f"{settings['data']} training split. Fix: set batch_size to at most {most}."
        )
    if batch % gpus:
        raise ConfigError(
            f"Config error at runs.models.{model}.batch_size: {batch} does not split evenly over gpus: {gpus}. "
            f"Fix: use a multiple of {gpus} (e.g. {batch - batch % gpus or gpus})."
        )


def check_apex_source(apex: dict, required: bool) -> None:
    """A required apex needs a source and its commit; found now, not by the apex job after it cleared apex.json."""
    source = apex.get("source") or {}
    if required and not (source.get("url") or source.get("path") or source.get("tarball")):
        raise ConfigError(
            "Config error at config.apex.source: apex is required here but no source is set (url, path and tarball "
            "are all null). Fix: set apex.source.url with ref and commit (as config/config.yaml does), "
            "apex.source.path, or apex.source.tarball with sha256; or apex.required: false."
        )
    if (source.get("url") or source.get("path")) and not source.get("tarball") and not source.get("commit"):
        raise ConfigError(
            "Config error at config.apex.source.commit: a url or path source needs the commit it must be. "
            "Fix: set apex.source.commit (apex 25.05 is 379937e1719b8190f38f3e666e2a8d32c97e221f)."
        )


def check_remedies(model: str, settings: dict, train: dict, model_precisions: list[str]) -> None:
    """The second article's AMP remedies only where they act: risky_layer_fp32 on a model with a risky layer under a
    torch.autocast precision, grad_scaler_init_scale where every precision of the model has a GradScaler."""
    if ModelSettings.of_entry(settings).risky_layer_fp32:
        arch = archs.get(settings["arch"])
        if not arch.risky_layer and not (arch.naive_norm_eps and "naive_norm_eps" in settings):
            risky = [name for name in archs.names() if archs.get(name).risky_layer]
            raise ConfigError(
                f"Config error at runs.models.{model}.risky_layer_fp32: arch {arch.name} has no risky layer to take "
                f"out of autocast (only {', '.join(risky)}, or an arch with naive_norm_eps set: "
                f"{', '.join(archs.where(naive_norm_eps=True))}). Fix: remove the key.")
        apex = [p for p in model_precisions if precisions.get(p).needs_apex]
        if apex:
            raise ConfigError(
                f"Config error at runs.models.{model}.risky_layer_fp32: precision {apex[0]} casts through apex, which "
                "a disabled torch.autocast region does not stop, so the setting would do nothing there. Fix: give "
                "this model precisions without apex (e.g. precisions: [amp_fp16]).")
    if train.get("grad_scaler_init_scale") is not None:
        unscaled = [p for p in model_precisions if not precisions.get(p).grad_scaler]
        if unscaled:
            raise ConfigError(
                f"Config error at runs.models.{model}.train.grad_scaler_init_scale: precision {unscaled[0]} has no "
                "GradScaler, so the setting would be ignored there. Fix: set it only on a model whose precisions "
                "all use one (precisions: [amp_fp16]), in that model's train: section.")

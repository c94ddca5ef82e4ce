"""Resolve the run matrix: the GPUs the jobs will see, the preset chosen for them, the user's runs merged into it and
every model checked; what the config says about apex and the GPU memory here."""

from __future__ import annotations

from pathlib import Path

from amprepro import presets
from amprepro.config.checks import check_batch, check_lora, check_model_settings, check_remedies
from amprepro.config.errors import ConfigError
from amprepro.config.largestbatch import check_largest_batch
from amprepro.config.matrix import cells
from amprepro.config.schema import validate
from amprepro.gpuslots import visible_gpus
from amprepro.presets import deep_merge


def gpus_for_jobs(setting, probe=visible_gpus) -> tuple[list[str], str]:
    """The GPUs the jobs will see: nvidia-smi here (auto), or what the config says (a login node submitting to GPUs)."""
    setting = {"true": True, "false": False}.get(setting, setting)  # `--config gpu=true` arrives as a string
    if setting is True:
        return ["configured GPU"], "the config says the jobs run on GPU nodes (gpu: true)"
    if setting is False:
        return [], "the config says the jobs run without a GPU (gpu: false)"
    return probe()


def choose_preset(requested: str, gpus: list[str], probe: str) -> dict:
    if requested != "auto":
        return {"preset": requested, "reason": f"preset: {requested} set in the config"}
    if gpus:
        return {"preset": "paper", "reason": f"preset: auto chose paper because {probe}"}
    return {"preset": "smoke", "reason": f"preset: auto chose smoke because {probe}"}


def resolve_runs(config: dict, presets_dir: Path, gpus: list[str], probe: str) -> tuple[dict, dict]:
    """Return (runs, choice): the validated run matrix and which preset was used, with the reason. config is what
    validate_config returned."""
    choice = choose_preset(config.get("preset", "auto"), gpus, probe)
    try:
        preset = presets.read(presets_dir, choice["preset"])
    except presets.PresetError as exc:
        raise ConfigError(str(exc)) from None
    runs = deep_merge(preset, config.get("runs") or {})
    validate(runs, "runs_resolved", "runs")
    # A user's runs.precisions narrows the preset: a preset model left with no cell (e.g. the apex shell's O1/O2
    # models under `precisions: [amp_bf16]`) is left out; a model the user wrote with no cell is an error below.
    written = set((config.get("runs") or {}).get("models") or {})
    for model in [m for m, s in runs["models"].items() if m not in written and "precisions" in s
                  and not set(s["precisions"]) & set(runs["precisions"])]:
        del runs["models"][model]
    for model, settings in runs["models"].items():
        check_model_settings(model, settings)
        check_lora(model, settings, runs["precisions"])
        check_batch(model, settings)
        train = deep_merge(runs["train"], settings.get("train", {}))
        if train["warmup_steps"] >= train["steps"]:
            raise ConfigError(
                f"Config error at runs.train.warmup_steps (model {model}): {train['warmup_steps']} warm-up steps "
                f"leave no timed step out of {train['steps']}. Fix: make warmup_steps smaller than steps."
            )
        if train.get("lr_warmup_steps", 0) >= train["steps"]:
            raise ConfigError(
                f"Config error at runs.train.lr_warmup_steps (model {model}): a {train['lr_warmup_steps']}-step "
                f"learning-rate ramp does not end within the {train['steps']} steps. Fix: make lr_warmup_steps "
                "smaller than steps."
            )
        check_remedies(model, settings, train, [c["precision"] for c in cells(runs) if c["model"] == model])
        if not any(cell["model"] == model for cell in cells(runs)):
            raise ConfigError(
                f"Config error at runs.models.{model}.precisions: none of {settings.get('precisions')} is in "
                f"runs.precisions {runs['precisions']}, so the model has no cell. Fix: add one of them to "
                "runs.precisions or change the model's precisions."
            )
    check_largest_batch(runs)
    return runs, choice


def gpu_memory_limit(config: dict) -> float | None:
    """gpu_memory_limit_gib as a number (a `--config` value arrives as text), or None."""
    value = config.get("gpu_memory_limit_gib")
    return None if value in (None, "null", "") else float(value)


def apex_required(setting, gpus: list[str]) -> bool:
    if setting == "auto":
        return bool(gpus)
    return bool(setting)

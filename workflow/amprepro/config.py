"""Resolve the run matrix: preset choice, preset + overrides merge, validation with field-naming messages."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from pathlib import Path

import jsonschema
import yaml

SCHEMA_PATH = Path(__file__).resolve().parent.parent / "schemas" / "config.schema.yaml"
LLAMA_ARCHS = ("llama", "llama_tiny")  # models.LLAMA_SIZES (not imported: no torch at DAG build time)


class ConfigError(ValueError):
    """A config value is wrong; the message names the field and the fix."""


def visible_gpus() -> tuple[list[str], str]:
    """GPU names nvidia-smi lists, and how we found out. No torch import: this runs at DAG build time."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return [], "no nvidia-smi on PATH"
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [], f"nvidia-smi failed: {exc}"
    names = [line.split(":", 1)[1].split("(UUID")[0].strip() for line in out.stdout.splitlines() if line.startswith("GPU ")]
    if out.returncode != 0 or not names:
        return [], f"nvidia-smi lists no GPU (exit {out.returncode})"
    return names, f"nvidia-smi lists {len(names)} GPU(s): {', '.join(sorted(set(names)))}"


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


def deep_merge(base: dict, override: dict) -> dict:
    merged = copy.deepcopy(base)
    for key, value in (override or {}).items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def load_schema() -> dict:
    return yaml.safe_load(SCHEMA_PATH.read_text())


def _field(error: jsonschema.ValidationError, prefix: str) -> str:
    parts = [prefix]
    for part in error.absolute_path:
        parts.append(f"[{part}]" if isinstance(part, int) else f".{part}")
    return "".join(parts)


def validate(instance: dict, definition: str | None, prefix: str) -> None:
    """Validate against the schema (or one of its $defs); raise ConfigError naming the first bad field."""
    schema = load_schema()
    if definition:
        schema = {"$schema": schema["$schema"], "$defs": schema["$defs"], "$ref": f"#/$defs/{definition}"}
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(instance), key=lambda e: (len(list(e.absolute_path)), str(e.absolute_path)))
    if errors:
        error = errors[0]
        leaf = min(error.context, key=lambda e: len(list(e.absolute_path)), default=None) if error.context else None
        if leaf is not None and len(list(leaf.absolute_path)) >= len(list(error.absolute_path)):
            error = leaf
        raise ConfigError(
            f"Config error at {_field(error, prefix)}: {error.message}. "
            f"Fix that value in your config (allowed values are in {SCHEMA_PATH.name})."
        )


def validate_config(config: dict) -> None:
    validate(config, None, "config")


def resolve_runs(config: dict, presets_dir: Path, gpus: list[str], probe: str) -> tuple[dict, dict]:
    """Return (runs, choice): the validated run matrix and which preset was used, with the reason."""
    validate_config(config)
    choice = choose_preset(config.get("preset", "auto"), gpus, probe)
    preset_file = Path(presets_dir) / f"{choice['preset']}.yaml"
    if not preset_file.exists():
        raise ConfigError(f"Preset file {preset_file} is missing. Fix: restore it from the repository.")
    preset = yaml.safe_load(preset_file.read_text()) or {}
    runs = deep_merge(preset, config.get("runs") or {})
    validate(runs, "runs_resolved", "runs")
    for model, settings in runs["models"].items():
        check_model_settings(model, settings)
        train = deep_merge(runs["train"], settings.get("train", {}))
        if train["warmup_steps"] >= train["steps"]:
            raise ConfigError(
                f"Config error at runs.train.warmup_steps (model {model}): {train['warmup_steps']} warm-up steps "
                f"leave no timed step out of {train['steps']}. Fix: make warmup_steps smaller than steps."
            )
    return runs, choice


def check_model_settings(model: str, settings: dict) -> None:
    """Settings that only mean something for some models: refuse them elsewhere rather than ignore them."""
    if "activation_checkpointing" in settings and settings["arch"] not in LLAMA_ARCHS:
        raise ConfigError(
            f"Config error at runs.models.{model}.activation_checkpointing: arch {settings['arch']} has no "
            f"checkpointed blocks (only {', '.join(LLAMA_ARCHS)}). Fix: remove the key or use a llama arch."
        )
    if "epoch_tokens" in settings and settings["data"] != "synthetic_tokens":
        raise ConfigError(
            f"Config error at runs.models.{model}.epoch_tokens: data {settings['data']} is not counted in tokens. "
            "Fix: remove the key, or use it on a synthetic_tokens model."
        )


def cells(runs: dict) -> list[dict]:
    """Every cell of models x precisions x seeds, in a stable order."""
    return [
        {"model": model, "precision": precision, "seed": seed}
        for model, settings in runs["models"].items()
        for precision in runs["precisions"]
        if precision in settings.get("precisions", runs["precisions"])
        for seed in settings.get("seeds", runs["seeds"])
    ]


def cell_spec(runs: dict, model: str, precision: str, seed: int) -> dict:
    """Everything a single run needs: the settings of this cell only, so other cells' edits don't rerun it."""
    settings = runs["models"][model]
    return {
        "model": model,
        "precision": precision,
        "seed": int(seed),
        "model_config": {k: v for k, v in settings.items() if k not in ("precisions", "seeds", "train")},
        "train": deep_merge(runs["train"], settings.get("train", {})),
    }


def cell_spec_json(runs: dict, model: str, precision: str, seed: int) -> str:
    return json.dumps(cell_spec(runs, model, precision, seed), sort_keys=True)


def apex_required(setting, gpus: list[str]) -> bool:
    if setting == "auto":
        return bool(gpus)
    return bool(setting)

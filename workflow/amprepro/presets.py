"""Read a preset file, composing one that includes others (the `full` preset: every verdict from one command).

A preset is a run matrix (config/presets/<name>.yaml). One that says `include: [paper, accuracy, ...]` is the union
of those presets' models, each model carrying its own preset's seeds, precisions and training settings, so a cell of
the composed preset has exactly the spec (and therefore the results path, digest and reference entry) it has in its
own preset: `full` re-uses what `paper` or `accuracy` already ran, and `make verify` compares it with the same
reference cells. The composed matrix's own `precisions`, `seeds` are the union (in registry and numeric order); its
`train` and `largest_batch` are the first included preset's; each model keeps, under its own `train`, whatever of its
preset's training settings differs from that shared one (tests/backbone/test_presets.py checks every cell of the
composed preset against its own preset's, field for field).
"""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from amprepro import precisions

NAME_PATTERN = r"^[a-z0-9_]{1,32}\Z"


class PresetError(ValueError):
    """A preset file is missing or its include list is wrong; the message names the file and the fix."""


def _load(presets_dir: Path, name: str, included_from: str | None) -> dict:
    path = Path(presets_dir) / f"{name}.yaml"
    if not path.exists():
        where = f" (included by {included_from})" if included_from else ""
        raise PresetError(f"Preset file {path} is missing{where}. Fix: restore it from the repository.")
    return yaml.safe_load(path.read_text()) or {}


def deep_merge(base: dict, override: dict) -> dict:
    """base with override merged in key by key (nested dicts merged, everything else replaced), both copied; the
    config's overrides of a preset use it too (amprepro.config, which imports this module)."""
    merged = copy.deepcopy(base)
    for key, value in (override or {}).items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def read(presets_dir: Path, name: str) -> dict:
    """The preset's run matrix; an `include` list is composed (one level: an included preset may not include)."""
    preset = _load(presets_dir, name, None)
    included = preset.get("include")
    if included is None:
        return preset
    if not isinstance(included, list) or not included or not all(isinstance(n, str) for n in included):
        raise PresetError(f"Preset {name}: include must be a non-empty list of preset names, not {included!r}. "
                          "Fix: e.g. include: [paper, accuracy].")
    models: dict = {}
    owner: dict[str, str] = {}
    seeds: set[int] = set()
    used: set[str] = set()
    first: dict | None = None
    for part_name in included:
        part = _load(presets_dir, part_name, name)
        if "include" in part:
            raise PresetError(f"Preset {name} includes {part_name}, which itself has an include list. Fix: include "
                              "the presets it includes directly.")
        first = first or part
        for model, settings in (part.get("models") or {}).items():
            if model in models:
                raise PresetError(f"Preset {name}: model {model} is in both {owner[model]} and {part_name}. Fix: "
                                  f"rename it in one of them.")
            cell_settings = copy.deepcopy(settings)
            cell_settings["train"] = deep_merge(part.get("train") or {}, settings.get("train") or {})
            cell_settings.setdefault("seeds", list(part.get("seeds") or []))
            wanted = settings.get("precisions", part.get("precisions") or [])
            cell_settings["precisions"] = [p for p in wanted if p in (part.get("precisions") or [])]
            models[model] = cell_settings
            owner[model] = part_name
            seeds.update(cell_settings["seeds"])
            used.update(cell_settings["precisions"])
    composed = {"models": models, "precisions": [p for p in precisions.names() if p in used],
                "seeds": sorted(seeds), "train": copy.deepcopy(first.get("train") or {})}
    for part_name in included:
        part = _load(presets_dir, part_name, name)
        if part.get("largest_batch"):
            composed["largest_batch"] = copy.deepcopy(part["largest_batch"])
            break
    base = composed["train"]
    for settings in models.values():  # only what differs from the shared train: a `runs.train` override still
        # reaches every model that did not set that key itself, as it does in the model's own preset
        settings["train"] = {k: v for k, v in settings["train"].items() if k not in base or base[k] != v}
        if not settings["train"]:
            del settings["train"]
    return composed

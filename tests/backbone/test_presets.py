"""amprepro.presets: the `full` preset composes the others, and each of its cells is the very cell its own preset
runs (same spec, so the same results path, digest and reference entry); a bad include list is refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from amprepro import config as cfg
from amprepro import presets

REPO = Path(__file__).resolve().parents[2]
PRESETS = REPO / "config" / "presets"
BASE = yaml.safe_load((REPO / "config" / "config.yaml").read_text())


def runs_of(preset: str, runs: dict | None = None) -> dict:
    config = cfg.validate_config(cfg.deep_merge(BASE, {"preset": preset, "runs": runs or {}}))
    return cfg.resolve_runs(config, PRESETS, ["NVIDIA H200"], "nvidia-smi lists 1 GPU(s)")[0]


def specs(runs: dict) -> dict:
    return {(c["model"], c["precision"], c["seed"]): cfg.cell_spec(runs, c["model"], c["precision"], c["seed"])
            for c in cfg.cells(runs)}


def test_every_cell_of_the_full_preset_is_its_own_presets_cell():
    full = specs(runs_of("full"))
    included = yaml.safe_load((PRESETS / "full.yaml").read_text())["include"]
    own: dict = {}
    for name in included:
        part = specs(runs_of(name))
        assert not set(part) & set(own), f"{name} repeats a cell of an earlier preset"
        own.update(part)
    assert set(full) == set(own)
    for key, spec in full.items():
        assert spec == own[key], key
    assert runs_of("full")["largest_batch"] == runs_of("paper")["largest_batch"]


def test_a_runs_train_override_reaches_the_composed_cells_as_it_reaches_their_own():
    override = {"train": {"deterministic": True}}
    full = specs(runs_of("full", override))
    for name in yaml.safe_load((PRESETS / "full.yaml").read_text())["include"]:
        for key, spec in specs(runs_of(name, override)).items():
            assert full[key] == spec, key


def write(tmp_path: Path, name: str, data: dict) -> None:
    (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(data))


def test_bad_include_lists_are_refused_with_the_fix(tmp_path):
    part = {"models": {"m": {"arch": "small_cnn", "data": "digits", "batch_size": 8}}, "precisions": ["fp32"],
            "seeds": [0], "train": {"steps": 3, "warmup_steps": 1, "lr": 0.1, "optimizer": "adamw"}}
    write(tmp_path, "a", part)
    write(tmp_path, "b", part)
    write(tmp_path, "nested", {"include": ["a"]})
    cases = {
        "missing": ({"include": ["a", "nope"]},
                    f"Preset file {tmp_path / 'nope.yaml'} is missing (included by missing). Fix: restore it from "
                    "the repository."),
        "twice": ({"include": ["a", "b"]}, "Preset twice: model m is in both a and b. Fix: rename it in one of them."),
        "deep": ({"include": ["nested"]}, "Preset deep includes nested, which itself has an include list. Fix: "
                 "include the presets it includes directly."),
        "empty": ({"include": []}, "Preset empty: include must be a non-empty list of preset names, not []. Fix: "
                  "e.g. include: [paper, accuracy]."),
    }
    for name, (data, message) in cases.items():
        write(tmp_path, name, data)
        with pytest.raises(presets.PresetError) as error:
            presets.read(tmp_path, name)
        assert str(error.value) == message
    write(tmp_path, "b", {**part, "models": {"n": part["models"]["m"]}, "seeds": [3, 1], "precisions": ["tf32"]})
    write(tmp_path, "ok", {"include": ["a", "b"]})
    composed = presets.read(tmp_path, "ok")
    assert composed["precisions"] == ["fp32", "tf32"] and composed["seeds"] == [0, 1, 3]
    assert composed["models"]["n"]["seeds"] == [3, 1] and "train" not in composed["models"]["n"]

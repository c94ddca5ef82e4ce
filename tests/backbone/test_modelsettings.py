"""amprepro.modelsettings: a model's settings as one typed record. It gives back, key for key and byte for byte, the
model_config it was built from (every preset's every cell, every committed metrics.json), and the defaults it fills in
are the arch registry's."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
import yaml

from amprepro import archs
from amprepro import config as cfg
from amprepro.cellspec import CellSpec
from amprepro.modelsettings import MATRIX_KEYS, LoraSettings, ModelSettings

REPO = Path(__file__).resolve().parents[2]
PRESETS = REPO / "config" / "presets"
BASE = yaml.safe_load((REPO / "config" / "config.yaml").read_text())


def preset_runs(preset: str) -> dict:
    config = cfg.validate_config(cfg.deep_merge(BASE, {"preset": preset}))
    return cfg.resolve_runs(config, PRESETS, ["NVIDIA H200"], "nvidia-smi lists 1 GPU(s)")[0]


@pytest.mark.parametrize("preset", sorted(p.stem for p in PRESETS.glob("*.yaml")))
def test_every_cell_of_every_preset_round_trips_to_the_identical_dict(preset):
    runs = preset_runs(preset)
    cells = cfg.cells(runs)
    assert cells
    for cell in cells:
        written = {k: v for k, v in runs["models"][cell["model"]].items() if k not in MATRIX_KEYS}
        spec = cfg.cell_spec(runs, cell["model"], cell["precision"], cell["seed"])
        assert spec.settings.as_dict() == written
        # same keys in the same order, same values of the same types: the same JSON, sorted or not
        assert json.dumps(spec.settings.as_dict()) == json.dumps(written)
        assert json.dumps(spec.as_dict()["model_config"]) == json.dumps(written)
        again = CellSpec.from_json(cfg.cell_spec_json(runs, cell["model"], cell["precision"], cell["seed"]))
        assert again.settings.as_dict() == written and again.to_json() == spec.to_json()
        assert json.loads(spec.to_json())["model_config"] == written


def committed_specs() -> list[tuple[str, dict]]:
    found = []
    for path in sorted([*REPO.glob("reference/**/*.json"), *REPO.glob("results-reference/**/metrics.json")]):
        try:
            data = json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError):
            continue
        stack = [data]
        while stack:
            item = stack.pop()
            if isinstance(item, dict):
                if isinstance(item.get("model_config"), dict) and "precision" in item:
                    found.append((str(path.relative_to(REPO)), item))
                stack.extend(item.values())
            elif isinstance(item, list):
                stack.extend(item)
    return found


def test_every_committed_spec_round_trips_to_the_identical_json():
    found = committed_specs()
    assert len(found) > 100  # the reference's specs and the runs' metrics.json
    for where, spec in found:
        assert json.dumps(CellSpec.of(spec).as_dict()["model_config"]) == json.dumps(spec["model_config"]), where


def test_the_defaults_are_the_arch_registrys():
    for name, arch in archs.REGISTRY.items():
        settings = ModelSettings.of({"arch": name, "data": "synthetic_tokens", "batch_size": 2})
        assert settings.seq_len == arch.seq_len
        assert settings.image_size == (arch.image_size or archs.IMAGE_SIZE)
        assert settings.written == ("arch", "data", "batch_size")
    assert ModelSettings.of({"arch": "gpt", "seq_len": 64}).seq_len == 64
    assert ModelSettings.of({"arch": "vit_b_16", "image_size": 96}).image_size == 96


def test_a_changed_registry_default_reaches_the_record(monkeypatch):
    monkeypatch.setitem(archs.REGISTRY, "gpt", dataclasses.replace(archs.REGISTRY["gpt"], seq_len=77))
    monkeypatch.setitem(archs.REGISTRY, "vit_b_16", dataclasses.replace(archs.REGISTRY["vit_b_16"], image_size=96))
    assert ModelSettings.of({"arch": "gpt"}).seq_len == 77
    assert ModelSettings.of({"arch": "vit_b_16"}).image_size == 96
    assert ModelSettings.of({"arch": "gpt"}).as_dict() == {"arch": "gpt"}  # a default is not written back


def test_the_data_windows_and_the_settings_own_defaults():
    tokens = ModelSettings.of({"arch": "llama", "data": "synthetic_tokens"})
    assert tokens.data_seq_len == archs.SYNTHETIC_TOKENS_SEQ_LEN
    assert ModelSettings.of({"arch": "gpt_bytes", "data": "python_stdlib"}).data_seq_len == archs.TEXT_SEQ_LEN
    assert ModelSettings.of({"arch": "gpt_bytes", "data": "python_stdlib", "seq_len": 32}).data_seq_len == 32
    assert ModelSettings.of({"arch": "small_cnn", "data": "imagefolder"}).folder_image_size == 32
    assert ModelSettings.of({"arch": "small_cnn", "data": "imagefolder", "image_size": 64}).folder_image_size == 64
    plain = ModelSettings.of({"arch": "llama"})
    assert (plain.activation_checkpointing, plain.gpus, plain.nodes, plain.apex_build, plain.lora) == (
        True, 1, 1, "full", None)


def test_lora_fills_its_defaults_and_writes_back_only_what_was_written():
    settings = ModelSettings.of({"arch": "llama", "lora": {"rank": 4, "targets": ["qkv"]}})
    assert settings.lora == LoraSettings(4, 32, ("qkv",), "fp32", ("rank", "targets"))
    assert settings.lora.resolved() == {"rank": 4, "alpha": 32, "targets": ["qkv"], "base": "fp32"}
    assert settings.as_dict() == {"arch": "llama", "lora": {"rank": 4, "targets": ["qkv"]}}
    assert ModelSettings.of({"arch": "llama", "lora": {}}).as_dict() == {"arch": "llama", "lora": {}}


def test_a_key_that_is_no_setting_is_refused_by_name():
    with pytest.raises(TypeError, match="'batch'"):
        ModelSettings.of({"arch": "gpt", "batch": 2})
    with pytest.raises(TypeError, match="'ranks'"):
        ModelSettings.of({"arch": "llama", "lora": {"ranks": 2}})


def test_every_setting_of_the_schema_is_a_field():
    schema = yaml.safe_load((REPO / "workflow" / "schemas" / "config.schema.yaml").read_text())
    settings = [key for key in schema["$defs"]["model"]["properties"] if key not in MATRIX_KEYS]
    fields = [f.name for f in dataclasses.fields(ModelSettings) if f.name != "written"]
    assert fields == settings
    lora = schema["$defs"]["model"]["properties"]["lora"]["properties"]
    assert [f.name for f in dataclasses.fields(LoraSettings) if f.name != "written"] == list(lora)


# Where a model_config is still read as a dict, and why: the registry's default functions (the record applies them),
# verify's comparison of two cells' JSON forms key by key, and the claims' reader of one raw metrics.json field.
DICT_READERS = {"archs.py", "verify/cellcompare.py", "analysis/claims.py"}
DICT_READ = re.compile(r"""model_config\b["']?\]?\s*(\.get\(|\[)|\.get\(["']model_config["'][^)]*\)\s*(\.get\(|\[)""")


def test_no_other_module_reads_a_model_config_dict():
    package = REPO / "workflow" / "amprepro"
    readers = {str(path.relative_to(package)) for path in package.rglob("*.py") if DICT_READ.search(path.read_text())}
    assert readers == DICT_READERS


def test_the_dict_read_pattern_sees_each_spelling():
    for line in ('x = model_config.get("seq_len", 2048)', "x = model_config['arch']", "spec['model_config'].get('a')",
                 'spec.get("model_config", {}).get("arch")', 'cell["spec"]["model_config"]["batch_size"]'):
        assert DICT_READ.search(line), line
    assert not DICT_READ.search("settings = ModelSettings.of(spec.model_config)")

"""The arch registry (amprepro.archs) is the one home of the archs: a new entry (plus its builder) is accepted by the
config, built, estimated, given job resources and trained, with no other edit."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from torch import nn

from amprepro import archs, memory
from amprepro import config as cfg
from amprepro.modelsettings import ModelSettings
from amprepro.plan import resources
from amprepro.train import models, train

REPO = Path(__file__).resolve().parents[2]
NO_APEX = {"status": "skipped", "reason": "no apex source configured"}
TOY_GPT = archs.Arch("toy_gpt", "gpt", "toy_gpt", 2.0e-4, shape={"vocab_size": 256, "layers": 1, "heads": 2, "dim": 32},
                     reads=(archs.TEXT_DATA,), seq_len=48, naive_norm_eps=True, description="a test entry")
TOY_MLP = archs.Arch("toy_mlp", "toy_mlp_family", "toy_mlp", 1.0e-4, shape={"hidden": 24},
                     description="a test entry of a family of its own")


def build_toy_gpt(arch: archs.Arch, settings: ModelSettings | dict) -> nn.Module:
    return models.GPT(seq_len=ModelSettings.of(settings).seq_len, **arch.shape)  # the entry's unless the config's


def build_toy_mlp(arch: archs.Arch, settings: ModelSettings) -> nn.Module:
    """An 8x8 digit through one hidden layer."""
    return nn.Sequential(nn.Flatten(), nn.Linear(64, arch.shape["hidden"]), nn.ReLU(),
                         nn.Linear(arch.shape["hidden"], 10))


def toy_mlp_parameters(shape: dict, settings: ModelSettings) -> tuple[int, int]:
    h = shape["hidden"]
    return 64 * h + h + h * 10 + 10, 64 * h + h * 10


def toy_mlp_activations(shape: dict, settings: ModelSettings, precision: str, batch: int) -> int:
    return batch * 4 * (64 + 2 * shape["hidden"] + 10)  # the input, the hidden layer before and after ReLU, logits


@pytest.fixture
def toy_archs(monkeypatch):
    monkeypatch.setitem(archs.REGISTRY, TOY_GPT.name, TOY_GPT)
    monkeypatch.setitem(models.BUILDERS, "toy_gpt", build_toy_gpt)
    monkeypatch.setitem(archs.REGISTRY, TOY_MLP.name, TOY_MLP)
    monkeypatch.setitem(models.BUILDERS, "toy_mlp", build_toy_mlp)
    monkeypatch.setitem(memory.FAMILIES, "toy_mlp_family", (toy_mlp_parameters, toy_mlp_activations))


def resolved(models_settings: dict) -> dict:
    base = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config = cfg.validate_config(cfg.deep_merge(base, {"preset": "smoke", "runs": {"models": models_settings}}))
    return cfg.resolve_runs(config, REPO / "config" / "presets", [], "test probe")[0]


def test_the_schema_yaml_lists_no_arch_and_the_loader_fills_in_the_registry():
    raw = yaml.safe_load((REPO / "workflow" / "schemas" / "config.schema.yaml").read_text())
    properties = raw["$defs"]["model"]["properties"]
    assert "enum" not in properties["arch"] and "enum" not in properties["shape"]
    loaded = cfg.load_schema()["$defs"]["model"]["properties"]
    assert loaded["arch"]["enum"] == archs.names()
    assert loaded["shape"]["enum"] == archs.ladder_keys() == [key for key, _, _ in archs.LLAMA_LADDER]


def test_the_registry_has_every_arch_the_pipeline_had():
    assert archs.names() == ["small_cnn", "tiny_transformer", "resnet50", "vit_b_16", "vit_base_patch16_224", "gpt",
                             "gpt_tiny", "gpt_bytes", "llama", "llama_tiny", "lstm_bytes", "gumbel_bytes"]
    for arch in archs.REGISTRY.values():
        assert arch.builder in models.BUILDERS and arch.family in memory.FAMILIES, arch.name


def test_the_defaults_a_config_leaves_out():
    assert archs.seq_len({"arch": "gpt"}) == 1024 and archs.seq_len({"arch": "llama"}) == 2048
    assert archs.seq_len({"arch": "llama", "seq_len": 64}) == 64 and archs.seq_len({"arch": "resnet50"}) is None
    # the data's windows: synthetic_tokens' for every arch (a LLaMA too), python_stdlib's own
    assert archs.data_seq_len({"arch": "llama", "data": "synthetic_tokens"}) == 1024
    assert archs.data_seq_len({"arch": "gpt_bytes", "data": "python_stdlib"}) == 128
    assert archs.image_size({"arch": "vit_b_16"}) == 224 == archs.image_size({})
    assert archs.image_size({"arch": "vit_b_16", "image_size": 384}) == 384


def test_a_new_arch_is_one_entry_and_its_builder(toy_archs):
    assert cfg.load_schema()["$defs"]["model"]["properties"]["arch"]["enum"][-2:] == ["toy_gpt", "toy_mlp"]
    runs = resolved({"toy": {"arch": "toy_gpt", "data": "python_stdlib", "batch_size": 4, "seq_len": 32,
                             "naive_norm_eps": 1e-5, "precisions": ["fp32"]}})
    spec = cfg.cell_spec(runs, "toy", "fp32", 0)
    spec = dataclasses.replace(spec, train={**spec.train, "steps": 4, "warmup_steps": 1})
    metrics, rows = train.run(spec, NO_APEX, threads=1)
    assert metrics["status"] == "ok", metrics.get("reason")
    assert len(rows) == 4 and metrics["throughput_unit"] == "tokens/s"
    # the entry's shape reached the builder and the memory model alike
    assert metrics["parameters"] == memory.parameters(spec.model_config)[0] == sum(
        p.numel() for p in build_toy_gpt(TOY_GPT, spec.model_config).parameters())
    assert metrics["memory_estimate"]["total_bytes"] == memory.estimate(spec.model_config, "fp32",
                                                                      spec.optimizer).total
    # the job's resources: its seconds per token, no host-built weights
    minutes = resources.runtime_minutes(spec.model_config, spec.train, 1.0)
    assert minutes == resources.STARTUP_MINUTES + 1  # 4 steps x 128 tokens x 2e-4 s: under a minute
    assert resources.host_mb(spec.model_config, True) == resources.HOST_MB_PER_PROCESS


def test_a_new_family_is_one_entry_its_builder_and_its_memory_formulas(toy_archs):
    runs = resolved({"toy": {"arch": "toy_mlp", "data": "digits", "batch_size": 16, "precisions": ["fp32"]}})
    spec = cfg.cell_spec(runs, "toy", "fp32", 0)
    spec = dataclasses.replace(spec, train={**spec.train, "steps": 6, "warmup_steps": 1})
    metrics, rows = train.run(spec, NO_APEX, threads=1)
    assert metrics["status"] == "ok", metrics.get("reason")
    assert len(rows) == 6 and metrics["throughput_unit"] == "samples/s"
    assert metrics["parameters"] == memory.parameters(spec.model_config)[0] == 64 * 24 + 24 + 24 * 10 + 10
    assert 0.0 <= metrics["eval_accuracy"] <= 1.0


@pytest.mark.parametrize("setting, value, words", [
    ("activation_checkpointing", False, "has no checkpointed blocks (only llama, llama_tiny)"),
    ("shape", "smollm_135m", "has no LLaMA shapes (only llama)"),
    ("naive_norm_eps", 1e-8, "(only arch gpt, gpt_tiny, gpt_bytes, toy_gpt)"),
])
def test_the_entry_says_which_settings_an_arch_takes(toy_archs, setting, value, words):
    with pytest.raises(cfg.ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        resolved({"toy": {"arch": "toy_mlp", "data": "digits", "batch_size": 16, setting: value}})


def test_the_entry_says_which_data_an_arch_reads(toy_archs):
    with pytest.raises(cfg.ConfigError, match="arch toy_mlp is not one. Fix: use arch gpt_bytes "
                                              r"\(or gpt, gpt_tiny, gpt_bytes, llama, llama_tiny, lstm_bytes, "
                                              r"gumbel_bytes, toy_gpt\)"):
        resolved({"toy": {"arch": "toy_mlp", "data": "python_stdlib", "batch_size": 16}})

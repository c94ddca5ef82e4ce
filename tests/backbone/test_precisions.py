"""The precision registry is the one home of the precisions: a new entry appears everywhere with no other edit."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from amprepro import config as cfg
from amprepro import precisions
from amprepro.analysis import claimfile
from amprepro.memory.activations import _bytes
from amprepro.report import reportlib
from amprepro.train import flops

REPO = Path(__file__).resolve().parents[2]
FP8 = precisions.Precision("fp8_test", "fp8 (test entry)", "#123456", "bf16", autocast_dtype="bfloat16",
                           bytes_per_parameter=(4, 4, 8, 0, 1), compute_bytes=1)


@pytest.fixture
def fp8(monkeypatch):
    monkeypatch.setitem(precisions.REGISTRY, FP8.name, FP8)
    return FP8.name


def test_the_schema_yaml_lists_no_precision_and_the_loader_fills_in_the_registry():
    raw = yaml.safe_load((REPO / "workflow" / "schemas" / "config.schema.yaml").read_text())
    assert "enum" not in raw["$defs"]["precision"]
    assert cfg.load_schema()["$defs"]["precision"]["enum"] == precisions.names()
    assert claimfile.schema()["$defs"]["precision"]["enum"] == precisions.names()


def test_a_new_entry_needs_no_other_edit(fp8):
    assert cfg.load_schema()["$defs"]["precision"]["enum"][-1] == fp8
    base = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config = cfg.validate_config(cfg.deep_merge(base, {"preset": "smoke", "runs": {"precisions": ["fp32", fp8]}}))
    runs, _ = cfg.resolve_runs(config, REPO / "config" / "presets", [], "test probe")
    assert {c["precision"] for c in cfg.cells(runs)} == {"fp32", fp8}

    assert claimfile.schema()["$defs"]["precision"]["enum"][-1] == fp8
    claim = dict(yaml.safe_load((REPO / "config" / "claims.yaml").read_text())["claims"][0], variant=fp8)
    assert claimfile.validate({"claims": [claim]})[0]["variant"] == fp8

    frame = reportlib.cells_frame({"cells": [{"model": "m", "precision": fp8, "seed": 0},
                                             {"model": "m", "precision": "fp32", "seed": 0}]})
    assert list(frame["precision"].astype(str)) == ["fp32", fp8]
    assert precisions.color(fp8) == "#123456" and precisions.label(fp8) == "fp8 (test entry)"
    assert flops.datasheet_peak("NVIDIA H200", fp8) == flops.DATASHEET_TFLOPS["H200 SXM"]["bf16"]
    assert _bytes(fp8)[0] == 1  # the memory model reads the entry too


def test_apex_precisions_are_the_ones_with_an_opt_level():
    assert [p.name for p in precisions.REGISTRY.values() if p.needs_apex] == ["apex_o1", "apex_o2", "apex_o3"]
    assert {p.apex_opt_level for p in precisions.REGISTRY.values() if p.needs_apex} == {"O1", "O2", "O3"}


def test_apex_o3_is_pure_fp16():
    """apex 25.05's O3: model.half(), no FP32 master weights, FP16 AdamW moments: 8 bytes per parameter against O2's
    20 (FP16 + FP32 weights and gradients, FP32 moments), no autocast, no GradScaler (apex's loss_scale 1.0)."""
    o3 = precisions.get("apex_o3")
    assert (o3.bytes_per_parameter, sum(o3.bytes_per_parameter)) == ((2, 2, 4, 0, 0), 8)
    assert sum(precisions.get("apex_o2").bytes_per_parameter) == 20
    assert (o3.compute_bytes, o3.residual_bytes, o3.autocast_dtype, o3.grad_scaler) == (2, 2, None, False)


def test_the_registry_imports_no_torch():
    source = (REPO / "workflow" / "amprepro" / "precisions.py").read_text()
    assert "import torch" not in source

"""Which cells share a GPU (amprepro.plan.resources.shares_gpu): the untimed ones, and never one whose speed a claim
judges; and how the record, the summary, verify and the claims treat a cell that shared."""

from pathlib import Path

import pytest
import yaml

from amprepro import config as cfg
from amprepro import presets
from amprepro.analysis import claimmodels, claims
from amprepro.cellid import CellId
from amprepro.plan import resources
from amprepro.report import reportlib
from amprepro.train.train import gpu_sharing
from amprepro.verify import cellcompare

REPO = Path(__file__).resolve().parents[2]
PRESETS = REPO / "config" / "presets"


def decisions(preset: str) -> dict[str, set[bool]]:
    runs = presets.read(PRESETS, preset)
    found: dict[str, set[bool]] = {}
    for c in cfg.cells(runs):
        spec = cfg.cell_spec(runs, c["model"], c["precision"], c["seed"])
        found.setdefault(c["model"], set()).add(resources.shares_gpu(spec))
    return found


def test_every_accuracy_and_risk_cell_shares_and_no_benchmark_cell_does():
    full = decisions("full")
    for preset in ("accuracy", "risk"):
        for model in presets.read(PRESETS, preset)["models"]:
            assert full[model] == {True}, model
    paper = presets.read(PRESETS, "paper")["models"]
    for model, settings in paper.items():
        synthetic = settings["data"].startswith("synthetic_")
        one_gpu = settings.get("gpus", 1) == 1
        assert full[model] == {not synthetic and one_gpu}, model  # the digits models share, transformer_ddp not
    assert full["llama7b"] == {False} and full["transformer_ddp"] == {False}


def test_no_judged_speed_reads_a_cell_that_shares():
    """Every speedup claim's models (its proxies too) resolve, over the full preset, to cells that do not share."""
    full = presets.read(PRESETS, "full")
    present = list(full["models"])
    archs = {m: s["arch"] for m, s in full["models"].items()}
    data = {m: s["data"] for m, s in full["models"].items()}
    sharing = {m for m, shares in decisions("full").items() if True in shares}
    claim_file = yaml.safe_load((REPO / "config" / "claims.yaml").read_text())
    speed = [c for group in claim_file.values() if isinstance(group, list) for c in group
             if isinstance(c, dict) and c.get("metric") == "speedup"]
    assert speed, "claims.yaml has speed claims"
    for claim in speed:
        for models in [claim.get("models") or [], (claim.get("proxy") or {}).get("models") or []]:
            judged = claims.matching_models(models, present, archs, data)
            assert not set(judged) & sharing, (claim["id"], set(judged) & sharing)


def small_real(**extra) -> dict:
    return {"model": "m", "precision": "amp_bf16", "seed": 0,
            "model_config": {"arch": "gpt_bytes", "data": "python_stdlib", "batch_size": 32, "seq_len": 128, **extra},
            "train": {"steps": 10, "warmup_steps": 1, "lr": 1e-3, "optimizer": "adamw"}}


@pytest.mark.parametrize("spec, shares", [
    (small_real(), True),
    (small_real(data="synthetic_tokens"), False),  # measured for speed
    (small_real(gpus=2), False),  # data parallel: a GPU each
    (small_real(arch="llama_tiny"), False),  # the LLaMA family (LoRA fine-tuning on real text) never shares
    (small_real(arch="gpt", batch_size=64, seq_len=1024), False),  # GPT-2 small at 1024 tokens: over the 4 GiB bound
])
def test_shares_gpu_needs_a_small_single_gpu_model_on_real_data(spec, shares):
    assert resources.shares_gpu(spec) is shares


def test_shares_gpu_is_not_part_of_the_spec():
    runs = presets.read(PRESETS, "full")
    spec = cfg.cell_spec(runs, "risk_lstm", "amp_fp16", 0)
    assert "shar" not in cfg.cell_spec_json(runs, "risk_lstm", "amp_fp16", 0)
    assert resources.shares_gpu(spec) and resources.shared_threads() == 1


def test_the_record_says_the_cell_shared():
    assert gpu_sharing({"AMPREPRO_GPU_SHARED": "8"}) == {"gpu_shared": {"cells_per_gpu": 8}}
    assert gpu_sharing({}) == {} and gpu_sharing({"AMPREPRO_GPU_SHARED": "x"}) == {}


def row(**extra) -> dict:
    return {"model": "risk_lstm", "precision": "amp_fp16", "seed": 0, "status": "ok", "throughput_per_s": 10.0,
            "final_loss": 2.0, "peak_allocated_bytes": 100, **extra}


def test_verify_compares_the_loss_and_memory_of_a_shared_cell_but_not_its_throughput():
    ref = {"model": "risk_lstm", "precision": "amp_fp16", "seed": 0, "status": "ok", "n_runs": 1,
           "metrics": {m: {"median": v, "min": v, "max": v, "n": 1}
                       for m, v in (("throughput_per_s", 20.0), ("final_loss", 2.0), ("peak_allocated_bytes", 100))}}
    rules = {"throughput_per_s": {"rel_floor": 0.08, "k": 2}, "final_loss": {"rel_floor": 0.05, "k": 2},
             "peak_allocated_bytes": {"rel_floor": 0.05, "k": 2}}
    timed = cellcompare.compare_cell("c", row(), ref, rules, None, None)
    assert timed["verdict"] == "fail", "half the reference's throughput fails when the GPU was its own"
    shared = cellcompare.compare_cell("c", row(gpu_shared_cells_per_gpu=8), ref, rules, None, None)
    assert shared["verdict"] == "pass"
    checks = {c["metric"]: c for c in shared["checks"]}
    assert checks["throughput_per_s"]["ok"] is None and "shared" in checks["throughput_per_s"]["note"]
    assert checks["final_loss"]["ok"] is True and checks["peak_allocated_bytes"]["ok"] is True
    bad = cellcompare.compare_cell("c", row(gpu_shared_cells_per_gpu=8, final_loss=3.0), ref, rules, None, None)
    assert bad["verdict"] == "fail", "the loss of a shared cell is still compared"


def test_the_results_table_marks_a_throughput_measured_while_sharing():
    summary = {"cells": [row(gpu_shared_cells_per_gpu=8), row(seed=1)]}
    reasons = reportlib.results_table(summary).set_index("seed")["reason"]
    assert "shared with up to 7 other untimed cells" in reasons[0] and reasons[1] == ""


def test_a_speed_claim_refuses_a_cell_that_shared():
    claim = {"variant": "amp_fp16", "metric": "speedup", "claimed": {"at_least": 1.0}}
    cells = {CellId("risk_lstm", "fp32", 0): row(precision="fp32"),
             CellId("risk_lstm", "amp_fp16", 0): row(gpu_shared_cells_per_gpu=8)}
    out = claimmodels.evaluate_model(claim, cells, "risk_lstm", "fp32")
    assert out["verdict"] == "not_measurable" and "shared" in out["reason"]

"""The memory model's regimes (amprepro.memory: ZeRO sharding, checkpointing on/off, bf16 weights, LoRA, the
Korthikanti cross-check) and the regimes table (amprepro.analysis.regimes): fast, torch-free except where a test builds
the model on the meta device."""

import dataclasses
import json

import pytest

from amprepro import memory, precisions
from amprepro.analysis import claims as claims_mod
from amprepro.analysis import regimes
from amprepro.memory import Lora, Sharding

SHAPE = memory.LLAMA_SHAPES["llama"]
PARAMS, MATMUL = memory.llama_parameters(SHAPE)


def est(precision="fp32", **kw):
    return memory.llama_estimate("llama", precision, **kw)


@pytest.mark.parametrize("precision", ["fp32", "amp_bf16", "apex_o2", "bf16_weights"])
def test_zero_stages_divide_exactly_their_parts_by_n(precision):
    n = 8
    whole = est(precision)
    unit = memory.llama_unit_parameters(SHAPE)
    c = memory.precision_of(precision).compute_bytes
    z1, z2, z3 = (est(precision, sharding=Sharding(n, stage)) for stage in (1, 2, 3))
    # ZeRO-1: optimizer state and FP32 masters; weights and gradients whole
    assert (z1.optimizer_state, z1.master_weights) == (whole.optimizer_state // n, whole.master_weights // n)
    assert (z1.weights, z1.gradients, z1.cast_cache) == (whole.weights, whole.gradients, whole.cast_cache)
    # ZeRO-2: + gradients (and one unit's unsharded gradient before its reduce-scatter)
    assert z2.gradients == whole.gradients // n + unit * c and z2.weights == whole.weights
    assert z2.optimizer_state == z1.optimizer_state
    # ZeRO-3: + weights (and two units gathered in the compute dtype); no autocast cast cache under FSDP
    assert z3.weights == whole.weights // n + 2 * unit * c and z3.cast_cache == 0
    assert z3.gradients == z2.gradients and z3.optimizer_state == z1.optimizer_state
    # activations are each rank's own micro-batch: sharding leaves them alone
    assert z1.activations == z2.activations == z3.activations == whole.activations
    # ranks=1 changes nothing whatever the stage (up to the unit buffers ZeRO-2/3 add)
    assert est(precision, sharding=Sharding(1, 1)).total == whole.total


def test_fsdp_model_states_approach_16_bytes_over_n():
    for n in (8, 64, 512):
        e = est("fp32", sharding=Sharding(n, 3))
        states = e.weights + e.gradients + e.optimizer_state + e.master_weights
        gathered = 3 * memory.llama_unit_parameters(SHAPE) * 4
        assert states == pytest.approx(16 * PARAMS / n + gathered, rel=1e-6)


def test_bad_sharding_and_lora_are_named():
    with pytest.raises(ValueError, match="stage"):
        Sharding(8, 4)
    with pytest.raises(ValueError, match="base"):
        Lora(base="fp16")
    with pytest.raises(ValueError, match="LLaMA shapes only"):
        memory.estimate({"arch": "resnet50", "batch_size": 8}, "fp32", "adamw", sharding=Sharding(8, 3))
    with pytest.raises(ValueError, match="FSDP's MixedPrecision"):
        est("apex_o1", sharding=Sharding(8, 3))
    with pytest.raises(ValueError, match="unknown LLaMA shape"):
        memory.llama_estimate("llama13b", "fp32")


def test_checkpointing_off_keeps_every_block_and_scales_with_the_micro_batch():
    _, saved, extra = memory.llama_block_bytes(SHAPE, 1, 2048, "amp_bf16")
    kept, loss, first = memory.llama_head_bytes(SHAPE, 1, 2048, "amp_bf16")
    on, off = (memory.llama_activation_bytes(SHAPE, 1, 2048, "amp_bf16", ckpt) for ckpt in (True, False))
    assert off == SHAPE["layers"] * (saved + extra) + kept + first
    assert on == SHAPE["layers"] * 2048 * SHAPE["dim"] * 4 + kept + first  # every block's FP32 input
    assert on < off / 4
    assert first == 12 * 2048 * SHAPE["vocab_size"] > loss  # log-softmax's output, its gradient, its input's
    # the RoPE tables' casts are per sequence, not per token
    assert extra == 4 * 2048 * 128 * 2
    assert memory.llama_activation_bytes(SHAPE, 4, 2048, "amp_bf16", False) == 4 * off - 3 * SHAPE["layers"] * extra
    # micro-batch 1: the backward ends in the embedding's, holding its output's FP32 gradient beside every gradient,
    # with or without checkpointing (H200: 32 MiB beyond the states and the workspace, results-reference/regimes)
    for ckpt in (True, False):
        config = {"arch": "llama", "seq_len": 2048, "activation_checkpointing": ckpt}
        assert memory.llama_backward_end_bytes(config, "amp_bf16", 1) == 2048 * SHAPE["dim"] * 4
    # a larger micro-batch: the first block's backward, less the gradients it has yet to allocate, is larger
    config = {"arch": "llama", "seq_len": 2048, "activation_checkpointing": True}
    _, saved8, extra8 = memory.llama_block_bytes(SHAPE, 8, 2048, "amp_bf16")
    block = sum(i * o for i, o in memory.llama_linear_shapes(SHAPE).values())
    pending = 4 * (block + 2 * SHAPE["dim"] + SHAPE["vocab_size"] * SHAPE["dim"])
    working = saved8 + extra8 + 2 * block + 8 * 2048 * (4 * SHAPE["dim"] + 2 * 2 * SHAPE["ffn_dim"])
    assert memory.llama_backward_end_bytes(config, "amp_bf16", 8) == working - pending > 8 * 2048 * SHAPE["dim"] * 4
    big = est("fp32", batch=4, checkpointing=False)
    assert big.peak_moment == "backward start" and big.total > est("fp32", batch=4).total


def test_the_block_count_per_precision_is_the_saved_tensors_of_the_built_block():
    """Bytes per token of LLaMA-7B's block, counted by hand from what autograd keeps (amprepro.memory.llama):
    FP32/TF32 48 h + 16 ffn; bf16 AMP 32 h + 8 ffn; bf16 weights 36 h + 8 ffn; LoRA (frozen norms and weights) over
    FP32 40 h + 16 ffn, AMP over FP32 26 h + 8 ffn, AMP over bf16 34 h + 8 ffn (each within 0.3 % of the H200's
    measured peak, results-reference/regimes); OpenLLaMA-3B's head size 100 is padded to 104 under flash attention."""
    h, f = SHAPE["dim"], SHAPE["ffn_dim"]
    per_token = {("tf32", None): 48 * h + 16 * f, ("amp_bf16", None): 32 * h + 8 * f,
                 ("bf16_weights", None): 36 * h + 8 * f, ("tf32", "fp32"): 40 * h + 16 * f,
                 ("amp_bf16", "fp32"): 26 * h + 8 * f, ("amp_bf16", "bf16"): 34 * h + 8 * f}
    for (precision, base), want in per_token.items():
        lora = Lora(16, base) if base else None
        adapters = 4 * 16 * (4 if precision == "tf32" else 2) if lora else 0
        assert sum(memory.llama_block_terms(SHAPE, precision, lora).values()) == want + adapters, (precision, base)
    shape3b = memory.LLAMA_SHAPES["openllama_3b"]
    terms = memory.llama_block_terms(shape3b, "amp_bf16")
    assert terms["flash attention's padded q, k, v and output"] == 2 * 104 * 4 * 32 and "q, k and v" not in terms
    assert "q, k and v" in memory.llama_block_terms(shape3b, "tf32")  # memory-efficient attention: no padding


def test_korthikanti_count_maps_term_by_term_onto_this_block():
    """Every LLaMA shape: Korthikanti's per-layer 16-bit count, less what this block does not keep and plus what it
    keeps besides, is exactly the block's saved tensors under bf16 AMP (0 % tolerance). For LLaMA-7B this block keeps
    57 % more per token than Korthikanti's s^2-free count (SwiGLU +5.5h, RoPE +4h, RMSNorm's FP32 inputs and
    normalised inputs +12h, less the dropout masks -2h): the stated band for the raw comparison is 55-58 %."""
    for name, shape in memory.LLAMA_SHAPES.items():
        terms = memory.korthikanti_terms(shape, 2048)
        assert sum(terms.values()) == memory.llama_block_bytes(shape, 1, 1, "amp_bf16")[1], name
    h, a, s = SHAPE["dim"], SHAPE["heads"], 2048
    assert memory.korthikanti_layer_bytes(SHAPE, 1, s) == s * h * (34 + 5 * a * s / h)
    ours = memory.llama_block_bytes(SHAPE, 1, s, "amp_bf16")[1]
    without_scores = memory.korthikanti_layer_bytes(SHAPE, 1, s) - 5 * a * s * s
    assert 1.55 < ours / without_scores < 1.58
    # with the s^2 term (what a kernel that stores the scores would keep) Korthikanti's count is 2.1x this block's
    assert memory.korthikanti_layer_bytes(SHAPE, 1, s) / ours == pytest.approx(2.13, abs=0.01)


def test_bf16_weights_hold_8_bytes_per_parameter_and_no_master_copy():
    e = est("bf16_weights")
    assert (e.weights, e.gradients, e.optimizer_state, e.master_weights, e.cast_cache) == (
        2 * PARAMS, 2 * PARAMS, 4 * PARAMS, 0, 0)
    assert e.total / est("fp32").total == pytest.approx(0.5, abs=0.01)
    assert memory.BF16_WEIGHTS.name not in precisions.REGISTRY  # a memory-model precision, no cell trains it


def test_lora_states_exist_for_the_adapters_only():
    lora = Lora(rank=16)
    trainable = memory.lora_parameters(SHAPE, lora)
    assert trainable == 32 * 16 * (4096 + 12288 + 4096 + 4096 + 4096 + 22016 + 11008 + 4096) == 33_685_504
    fp32, bf16 = (est("fp32" if base == "fp32" else "amp_bf16", checkpointing=False, lora=Lora(16, base))
                  for base in ("fp32", "bf16"))
    assert fp32.weights == 4 * PARAMS + 4 * trainable and bf16.weights == 2 * PARAMS + 4 * trainable
    for e in (fp32, bf16):
        assert (e.gradients, e.optimizer_state, e.master_weights) == (4 * trainable, 8 * trainable, 0)
    assert fp32.cast_cache == 0 and bf16.cast_cache == 2 * trainable  # autocast caches the adapters' casts only
    # AMP over a frozen FP32 base: every frozen matmul weight's bf16 cast is saved for the input gradient
    amp_fp32_base = est("amp_bf16", checkpointing=False, lora=Lora(16, "fp32"))
    assert amp_fp32_base.cast_cache == 2 * MATMUL + 2 * trainable
    # checkpointed: the LM head's cast (outside the checkpoints), and one block's while it is recomputed
    assert est("amp_bf16", lora=Lora(16, "fp32")).cast_cache == 2 * trainable + 2 * SHAPE["vocab_size"] * SHAPE["dim"]
    assert bf16.total < 0.6 * fp32.total


def test_lora_targets_are_the_built_blocks_linears():
    import torch

    from amprepro.train import models

    with torch.device("meta"):
        block = models.LlamaBlock(SHAPE["dim"], SHAPE["heads"], SHAPE["ffn_dim"])
    built = {"qkv": block.attn.qkv, "out": block.attn.out, "gate_up": block.ffn.gate_up, "down": block.ffn.down}
    assert {k: (m.in_features, m.out_features) for k, m in built.items()} == memory.llama_linear_shapes(SHAPE)
    assert memory.llama_unit_parameters(SHAPE) == sum(p.numel() for p in block.parameters())


def test_the_existing_cells_estimate_is_unchanged_by_the_regime_arguments():
    config = {"arch": "llama", "data": "synthetic_tokens", "batch_size": 1, "seq_len": 2048}
    for precision in ("fp32", "amp_bf16", "apex_o1", "apex_o2"):
        assert memory.estimate(config, precision, "adamw_fused") == memory.llama_estimate("llama", precision)


# ----------------------------------------------------------------------------------------------------------------------
# The regimes table


def test_every_row_is_labelled_a_prediction_and_measured_only_from_a_file(tmp_path):
    rows = regimes.table(measured={})
    assert len(rows) == len(regimes.REGIMES) >= 12
    for r in rows:
        assert r["label"] == "predicted" and r["measured"] is None and r["predicted_text"].endswith("predicted")
        p = r["predicted"]
        assert p["saving"] == pytest.approx(1 - p["variant_peak_bytes"] / p["baseline_peak_bytes"])
    assert any(r["predicted"]["saving"] > 0.33 for r in rows)  # somewhere the claim's band is reachable
    assert all(r["predicted"]["saving"] < 0.02 for r in rows if r["key"] == "7b-1gpu-mb1-ckpt-apex_o1")


def test_every_rows_predicted_split_counts_the_states_as_the_step_holds_them():
    # measure.Breakdown counts the states at the optimizer step: a sharded rank's shards, not the unit it gathered or
    # the unsharded gradient it reduced, which are transient; with them counted ZeRO-2 O2's rest was -0.31 GiB
    for r in regimes.table(measured={}):
        for side in ("baseline", "variant"):
            parts = r["predicted"][f"{side}_parts"]
            assert parts["activations_and_workspace"] > 0, (r["key"], side, parts)
            assert sum(parts.values()) == r["predicted"][f"{side}_peak_bytes"]
    z2 = memory.llama_estimate("llama", "apex_o2", sharding=memory.Sharding(ranks=8, stage=2))
    assert z2.at_step["gradients"] < z2.gradients and z2.at_step["weights"] == z2.weights
    z3 = memory.llama_estimate("llama", "amp_bf16", sharding=memory.Sharding(ranks=8, stage=3))
    assert z3.at_step["weights"] < z3.weights


def measurement_file(tmp_path, regime, setting_override=None, peaks=(100, 60), prov=True):
    cells = []
    for side, peak in zip(("baseline", "variant"), peaks):
        setting = regime.setting(getattr(regime, side))
        if setting_override and side == "variant":
            setting = {**setting, **setting_override}
        cells.append({"regime": regime.key, "side": side, "setting": setting, "status": "ok",
                      "peak_allocated_bytes": peak * 2**30})
    path = tmp_path / "nvidia-h200.json"
    path.write_text(json.dumps({"kind": regimes.MEASUREMENT_KIND, "cells": cells, "provenance": {
        "torch": "2.11.0+cu130", "gpu": "NVIDIA H200", "date": "2026-12-01", "command": "test"} if prov else {}}))
    return path


def test_a_committed_measurement_fills_its_row_only_at_the_rows_setting(tmp_path):
    regime = regimes.BY_KEY["3b-1gpu-mb4-nockpt"]
    rows = {r["key"]: r for r in regimes.table(measured=regimes.load_measurements(measurement_file(tmp_path, regime)))}
    got = rows[regime.key]
    assert got["label"] == "predicted; measured" and got["measured"]["saving"] == pytest.approx(0.4)
    assert "measured" in got["measured_text"] and got["predicted_text"].endswith("predicted")
    assert sum(r["measured"] is not None for r in rows.values()) == 1
    other = regimes.load_measurements(measurement_file(tmp_path, regime, {"batch": 8}))
    row = regimes.row(regime, other)
    assert row["measured"] is None and "another setting" in row["measured_note"]


def test_a_bad_measurement_file_is_named_with_the_fix(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text("{")
    with pytest.raises(regimes.MeasurementError, match="regimes_run"):
        regimes.load_measurements(bad)
    with pytest.raises(regimes.MeasurementError, match="provenance lacks"):
        regimes.load_measurements(measurement_file(tmp_path, regimes.REGIMES[1], prov=False))


def test_the_reference_row_reads_the_committed_7b_cells():
    cells = regimes.reference_cells()
    row = regimes.row(regimes.BY_KEY["7b-1gpu-mb1-ckpt-apex_o1"], cells)
    assert row["measured"] and abs(row["measured"]["saving"]) < 0.01  # the −0.0 % the claim's verdict reports
    assert row["measured"]["source"] == "reference/nvidia-h200/aggregate.json"


def test_the_7b_memory_claim_carries_the_table_and_keeps_its_verdict():
    claim = {"id": "llm7b-peak-memory", "statement": "s", "model": "7B", "models": ["llama7b"],
             "metric": "memory_reduction", "baseline": ["fp32"], "variant": "apex_o1", "claimed": {"about": 0.38},
             "tolerance": 0.05, "source": {"file": "f", "title": "t"}}
    cells = [{"model": "llama7b", "precision": p, "seed": 0, "status": "ok", "peak_allocated_bytes": 100}
             for p in ("fp32", "apex_o1")]
    result = claims_mod.evaluate_claim(claim, {"cells": cells})
    assert result["verdict"] == "falls_short"  # the setup measured: −0.0 %
    rows = result["regimes"]["rows"]
    assert {r["predicted_verdict"] for r in rows} >= {"falls_short", "holds"}
    other = dict(claim, id="x", models=["resnet50"])
    assert "regimes" not in claims_mod.evaluate_claim(other, {"cells": cells})
    assert "regimes" not in claims_mod.evaluate_claim(dict(claim, metric="speedup"), {"cells": cells})


def test_the_gpu_rows_fit_one_h200_by_the_models_own_prediction():
    h200 = 139 * memory.GIB
    for r in regimes.REGIMES:
        peak = max(r.estimate(r.baseline).total, r.estimate(r.variant).total)
        if r.gpu:
            assert r.sharding.ranks == 1 and peak < 0.8 * h200, r.key
    assert {r.key for r in regimes.REGIMES if r.gpu} >= {"7b-1gpu-mb1-ckpt", "3b-1gpu-mb4-nockpt",
                                                         "7b-1gpu-mb1-ckpt-bf16w", "7b-lora-mb1-nockpt-bf16base"}


def test_the_gpu_script_runs_every_gpu_cell_on_a_tiny_shape_on_the_cpu():
    """tools/gpu/regimes_run.py's cell, at the tiny LLaMA shape on the CPU (no memory recorded there); the LoRA cells
    need peft, which CI does not install."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "regimes_run", Path(__file__).resolve().parents[2] / "tools" / "gpu" / "regimes_run.py")
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)
    has_peft = importlib.util.find_spec("peft") is not None
    for regime in regimes.REGIMES:
        if not regime.gpu or (regime.lora_rank and not has_peft):
            continue
        tiny = dataclasses.replace(regime, shape="llama_tiny", seq_len=16, batch=2,
                                   lora_rank=4 if regime.lora_rank else None)
        for side in ("baseline", "variant"):
            cell = run.run_cell(tiny, side, 3, "cpu")
            assert cell["status"] == "ok" and len(cell["losses"]) == 3 and cell["peak_allocated_bytes"] is None
            if side == "variant" and regime.variant.precision == "bf16_weights":
                assert cell["optimizer_state_dtypes"] == ["torch.bfloat16"]

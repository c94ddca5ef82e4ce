"""The LoRA claim (amprepro.analysis.loraclaim): the 12 GiB prediction, the preset's shapes held to it, and the verdict
from the LoRA cells (summary rows) by exact output: an uncapped larger card, a 12 GiB cap, a shape that runs out of
memory, a loss that does not fall, and nothing to judge. Torch-free."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from amprepro import memory
from amprepro.analysis import claimfile, claims, loraclaim

REPO = Path(__file__).resolve().parents[2]
G = memory.GIB
CLAIM = next(c for c in claimfile.load_claims(REPO / "config" / "claims.yaml") if c["id"] == "lora-12gb-card")
PREDICTED = ("predicted for 12.0 GiB (micro-batch 1 x 512 tokens, checkpointing per block, LoRA r=16 on every linear; "
             "fits at most 85% of it): with AMP (bf16 base, bf16 autocast) up to OpenLLaMA-3B (3.43 B), estimate 7.0 "
             "GiB (next, LLaMA-7B: 13.4 GiB); in FP32 (FP32 base, no autocast) up to TinyLlama-1.1B (1.10 B), "
             "estimate 4.6 GiB (next, OpenLLaMA-3B: 13.4 GiB)")
LIMIT = int(11.5 * G)  # a 12 GiB cap less the CUDA context


def row(model, precision, base, shape, status="ok", peak=None, start=10.9, end=8.5, limit=None, reason="",
        needs=None):
    return {"model": model, "precision": precision, "seed": 0, "status": status, "lora_base": base, "lora_shape": shape,
            "peak_allocated_bytes": peak, "heldout_loss_initial": start if status == "ok" else None,
            "heldout_loss_final": end if status == "ok" else None, "memory_limit_bytes": limit, "reason": reason,
            "skip_needs": needs}


def summary(cells, card_gib=None, cap_gib=None):
    return {"versions": {"gpu_memory_bytes": card_gib and int(card_gib * G), "gpu_memory_limit_gib": cap_gib},
            "cells": cells}


def refused(model, precision, base, shape):
    return row(model, precision, base, shape, status="skipped", limit=LIMIT, needs="more GPU memory",
               reason="does not fit: estimate 116% of the budget (> 102%)")


def judged(s):
    r = claims.evaluate_claim(CLAIM, s)
    return r["verdict"], r["verdict_text"], r["measured_text"], r["reason"]


def test_the_prediction_for_12_gib_names_a_shape_per_side():
    setting = CLAIM["lora"]
    assert loraclaim.prediction_text(12 * G, setting) == PREDICTED
    p = loraclaim.predict(12 * G, setting)
    assert {side: p[side]["largest"] for side in p} == {"amp": "openllama_3b", "fp32": "tinyllama_1b"}
    assert [(r["shape"], r["fits"]) for r in p["amp"]["shapes"]] == [
        ("llama", "no"), ("openllama_3b", "yes"), ("tinyllama_1b", "yes"), ("smollm_360m", "yes"),
        ("smollm_135m", "yes")]
    assert [r["fits"] for r in p["fp32"]["shapes"]] == ["no", "no", "yes", "yes", "yes"]
    # the 7B base alone is 12.55 GiB in bf16: no 7B LoRA on a 12 GiB card without a 4- or 8-bit base
    assert memory.llama_parameters(memory.LLAMA_SHAPES["llama"])[0] * 2 / G == pytest.approx(12.55, abs=0.01)
    # on one H200 both sides reach the ladder's top
    assert {s: v["largest"] for s, v in loraclaim.predict(int(139.8 * G), setting).items()} == {
        "amp": "llama", "fp32": "llama"}


def test_the_preset_runs_the_predicted_shapes_and_the_next_up_at_the_claim_s_setting():
    preset = yaml.safe_load((REPO / "config" / "presets" / "lora.yaml").read_text())
    p = loraclaim.predict(int(CLAIM["lora"]["memory_gib"] * G), CLAIM["lora"])
    keys = [key for key, _, _ in memory.LLAMA_LADDER]
    by_side = {"amp": set(), "fp32": set()}
    for settings in preset["models"].values():
        side = "amp" if settings["lora"]["base"] == "bf16" else "fp32"
        assert settings["precisions"] == ["amp_bf16" if side == "amp" else "fp32"]
        assert (settings["batch_size"], settings["seq_len"], settings["activation_checkpointing"],
                settings["lora"]["rank"]) == (CLAIM["lora"]["batch"], CLAIM["lora"]["seq_len"],
                                              CLAIM["lora"]["checkpointing"], CLAIM["lora"]["rank"])
        by_side[side].add(settings["shape"])
    for side, shapes in by_side.items():
        largest = keys.index(p[side]["largest"])
        assert {keys[largest], keys[largest - 1]} <= shapes  # the predicted largest and the next shape up
    assert "llama" in by_side["fp32"]  # a larger card answers for itself on both sides
    assert set(CLAIM["models"]) == set(preset["models"])


def test_an_uncapped_h200_answers_for_12_gib_from_the_peaks_and_for_itself():
    s = summary([row("lora_amp_7b", "amp_bf16", "bf16", "llama", peak=int(13.3 * G)),
                 row("lora_amp_3b", "amp_bf16", "bf16", "openllama_3b", peak=int(6.9 * G)),
                 row("lora_fp32_7b", "fp32", "fp32", "llama", peak=int(25.9 * G)),
                 row("lora_fp32_3b", "fp32", "fp32", "openllama_3b", peak=int(13.4 * G)),
                 row("lora_fp32_1b", "fp32", "fp32", "tinyllama_1b", peak=int(4.5 * G))], card_gib=139.8)
    assert judged(s) == (
        "holds", "holds",
        "with AMP a 12 GiB card LoRA-fine-tunes up to OpenLLaMA-3B (3.43 B); in FP32 up to TinyLlama-1.1B (1.10 B) "
        "(this card, 139.8 GiB: with AMP up to LLaMA-7B (6.74 B); in FP32 up to LLaMA-7B (6.74 B))",
        "12.0 GiB: with AMP (bf16 base, bf16 autocast) up to OpenLLaMA-3B (3.43 B) (peak 6.9 GiB, held-out loss "
        "10.90 → 8.50); LLaMA-7B does not fit (peak 13.3 GiB over 95% of 12.0 GiB); in FP32 (FP32 base, no autocast) "
        "up to TinyLlama-1.1B (1.10 B) (peak 4.5 GiB, held-out loss 10.90 → 8.50); OpenLLaMA-3B does not fit (peak "
        "13.4 GiB over 95% of 12.0 GiB) | 139.8 GiB: with AMP (bf16 base, bf16 autocast) up to LLaMA-7B (6.74 B) "
        "(peak 13.3 GiB, held-out loss 10.90 → 8.50); the ladder's largest shape; in FP32 (FP32 base, no autocast) "
        "up to LLaMA-7B (6.74 B) (peak 25.9 GiB, held-out loss 10.90 → 8.50); the ladder's largest shape; "
        + PREDICTED)


def test_at_a_12_gib_cap_the_refused_shapes_bound_the_answer():
    s = summary([refused("lora_amp_7b", "amp_bf16", "bf16", "llama"),
                 row("lora_amp_3b", "amp_bf16", "bf16", "openllama_3b", peak=int(6.9 * G), limit=LIMIT),
                 refused("lora_fp32_7b", "fp32", "fp32", "llama"),
                 refused("lora_fp32_3b", "fp32", "fp32", "openllama_3b"),
                 row("lora_fp32_1b", "fp32", "fp32", "tinyllama_1b", peak=int(4.5 * G), limit=LIMIT, end=10.5)],
                card_gib=139.8, cap_gib=12)
    verdict, _, measured, reason = judged(s)
    assert (verdict, measured) == ("holds", "with AMP a 12 GiB card LoRA-fine-tunes up to OpenLLaMA-3B (3.43 B); in "
                                            "FP32 no ladder shape")
    assert reason == (
        "12.0 GiB: with AMP (bf16 base, bf16 autocast) up to OpenLLaMA-3B (3.43 B) (peak 6.9 GiB under a 11.5 GiB "
        "allocator limit, held-out loss 10.90 → 8.50); LLaMA-7B does not fit (refused by the memory plan (its "
        "estimate) under 11.5 GiB); in FP32 (FP32 base, no autocast) no shape shown to fine-tune: LLaMA-7B (6.74 B) "
        "refused by the memory plan (its estimate) under 11.5 GiB; OpenLLaMA-3B (3.43 B) refused by the memory plan "
        "(its estimate) under 11.5 GiB; TinyLlama-1.1B (1.10 B) peak 4.5 GiB under a 11.5 GiB allocator limit, but "
        "its loss did not fall (held-out loss 10.90 → 10.50); " + PREDICTED)


def test_amp_falls_short_where_its_only_shapes_run_out_of_memory():
    s = summary([row("lora_amp_3b", "amp_bf16", "bf16", "openllama_3b", status="skipped", limit=LIMIT,
                     needs="more GPU memory", reason="out of GPU memory at batch size 1: CUDA out of memory"),
                 row("lora_fp32_1b", "fp32", "fp32", "tinyllama_1b", peak=int(4.5 * G), limit=LIMIT)], cap_gib=12)
    verdict, _, measured, reason = judged(s)
    assert (verdict, measured) == ("falls_short", "with AMP a 12 GiB card LoRA-fine-tunes no ladder shape; in FP32 up "
                                                  "to at least TinyLlama-1.1B (1.10 B)")
    assert reason.startswith("12.0 GiB: with AMP (bf16 base, bf16 autocast) no shape shown to fine-tune: "
                             "OpenLLaMA-3B (3.43 B) out of memory under 11.5 GiB; in FP32 ")


def test_nothing_to_judge_is_not_measurable_with_the_prediction():
    assert judged(summary([])) == (
        "not_measurable", "not measurable here", "",
        "no LoRA cell with a bf16 base under AMP tells what fits in 12.0 GiB: none ran (config/presets/lora.yaml); "
        + PREDICTED)
    assert claims.evaluate_claim(CLAIM, summary([]))["needs"] == (
        "LoRA cells (lora_amp_7b/lora_amp_3b/lora_fp32_7b/lora_fp32_3b/lora_fp32_1b), on a GPU (lora preset)")
    cpu = summary([row("lora_amp_3b", "amp_bf16", "bf16", "openllama_3b", status="skipped",
                       reason="does not fit: ... exceeds the 7.5 GiB of memory available on this machine",
                       needs="more memory (a GPU)")])
    assert judged(cpu)[3].startswith("no LoRA cell with a bf16 base under AMP tells what fits in 12.0 GiB: "
                                     "lora_amp_3b (skipped: does not fit: ... exceeds the 7.5 GiB")
    # llama_tiny (the CPU tests' shape) is not on the ladder: not the claim's
    tiny = summary([row("lora_tiny", "amp_bf16", "bf16", "llama_tiny", peak=G)], cap_gib=12)
    assert judged(tiny)[3].startswith("no LoRA cell with a bf16 base under AMP tells what fits in 12.0 GiB: none ran")
    # a skip under a limit above the question says nothing about it
    bigger = summary([refused("lora_amp_7b", "amp_bf16", "bf16", "llama") | {"memory_limit_bytes": 40 * G}])
    assert judged(bigger)[0] == "not_measurable"


def test_the_training_loss_stands_in_where_a_cell_has_no_held_out_curve():
    fell = {"initial_loss": 10.8, "final_loss": 9.0, "heldout_loss_initial": None, "heldout_loss_final": None}
    assert loraclaim.loss_fell(fell) == (True, "training loss 10.80 → 9.00")
    assert loraclaim.loss_fell({**fell, "final_loss": 10.4}) == (False, "training loss 10.80 → 10.40")
    assert loraclaim.loss_fell({}) == (None, "no loss recorded")


def test_the_lora_field_and_its_metric_go_together():
    bad = {k: v for k, v in CLAIM.items() if k != "lora"}
    bad["baseline"] = bad["baseline"][0]
    with pytest.raises(claimfile.ClaimsError) as error:
        claimfile.validate({"claims": [bad]})
    assert str(error.value) == (
        "config/claims.yaml: claim field claims[0] (id 'lora-12gb-card').lora: the metric lora_parameters and the "
        "lora field go together, with claimed {at_least: parameters} and variant amp_bf16 (the bf16 base under AMP; "
        "amprepro.analysis.loraclaim). Fix: write both, or neither.")


def test_the_summary_names_each_lora_cell_s_base_and_shape_from_its_spec_even_when_skipped():
    from amprepro.analysis import summary as summary_mod

    def metrics(**model_config):
        return {"spec": {"model_config": {"arch": "llama", "batch_size": 1, **model_config}}, "plan": {}}

    given = [metrics(shape="openllama_3b", lora={"rank": 16, "base": "bf16"}), metrics(lora={}), metrics(),
             metrics(arch="llama_tiny", lora={"base": "fp32"})]
    rows = summary_mod.add_plan([{"status": "skipped"} for _ in given], given)
    assert [(r["lora_base"], r["lora_shape"]) for r in rows] == [("bf16", "openllama_3b"), ("fp32", "llama"),
                                                                  (None, None), ("fp32", "llama_tiny")]
    assert {"lora_base", "lora_shape", "trainable_parameters", "initial_loss", "heldout_loss_initial",
            "memory_limit_bytes"} <= set(summary_mod.COLUMNS)

"""The opt-level claims (issue 38: "O2 may be unstable", "O3 is for inference, not training") judged on synthetic
summaries of the accuracy preset's cells, by exact output."""

import math

import pytest

from amprepro.analysis import claims, optlevels
from amprepro.analysis.claimfile import ClaimsError, load_claims, validate

FP32 = [1.50, 1.52, 1.48, 1.51, 1.49, 1.53, 1.47, 1.50]
SAME = [0.004, -0.002, 0.001, 0.006, -0.001, 0.003, 0.002, 0.0]  # mean +0.16 %, upper bound +0.34 %
WORSE = [g + 0.03 for g in SAME]  # mean +3.16 %, lower bound +2.98 %
CLAIMS = {c["id"]: c for c in load_claims(claims.__file__.rsplit("/workflow/", 1)[0] + "/config/claims.yaml")}
O2, O3 = CLAIMS["apex-o2-may-be-unstable"], CLAIMS["apex-o3-not-for-training"]
SAME_TEXT = ("final held-out loss 1.5024 against FP32's 1.5000 (means over the 8 paired seeds); paired gap +0.16 % "
             "over 8 seeds (sd 0.27 %, 95 % interval -0.06 % to +0.39 %, one-sided 95 % bounds -0.02 % and +0.34 %): "
             "not worse than FP32 by 1 % (upper bound below the margin); lower than FP32: no difference shown (the "
             "interval includes 0)")


def cell(precision, seed, gap, status="ok", model="stdlib_gpt", **extra):
    return {"model": model, "precision": precision, "seed": seed, "status": status, "reason": "",
            "heldout_loss_final": None if gap is None else FP32[seed] * (1 + gap), "first_nonfinite_step": None,
            "skipped_steps": 0, **extra}


def summary(precision, gaps, o1=SAME, model="stdlib_gpt", **extra):
    cells = [cell("fp32", s, 0.0, model=model) for s in range(8)]
    cells += [cell("apex_o1", s, g, model=model, skipped_steps=3) for s, g in enumerate(o1)]
    cells += [cell(precision, s, g, model=model, **extra) for s, g in enumerate(gaps)]
    return {"preset": {"preset": "accuracy"}, "versions": {"gpu": "NVIDIA H200"}, "cells": cells}


def test_o2_as_stable_as_fp32_falls_short_with_the_numbers_and_o1_beside_it():
    result = claims.evaluate_claim(O2, summary("apex_o2", SAME, skipped_steps=5, loss_scale_final=8192.0))
    assert result["verdict"] == "falls_short"
    assert result["verdict_text"] == (
        "falls short (apex O2 trained as stably as FP32 here, no collapse or non-finite step and its final held-out "
        "loss not worse by the margin): stdlib_gpt: no collapse or non-finite step in 8 seeds, final held-out loss "
        "+0.16 % against FP32's (one-sided 95 % upper bound +0.34 % < 1 %)")
    assert result["measured_text"] == (
        f"apex O2 over 8 seeds: no collapse, no non-finite step, 40 skipped steps in all, lowest final loss scale "
        f"8192; {SAME_TEXT} | beside it apex "
        f"O1 over 8 seeds: no collapse, no non-finite step, 24 skipped steps in all; {SAME_TEXT}")
    assert result["by_baseline"]["fp32"]["models"]["stdlib_gpt"]["verdict"] == "falls_short"
    assert result["stability_models"] == ["stdlib_gpt"]
    assert result["claimed_text"] == ("apex O2 unstable or unfit for training: a collapse, a non-finite loss or a "
                                      "final held-out loss above FP32's by more than 1 %")


def test_o2_worse_than_fp32_beyond_the_margin_holds():
    result = claims.evaluate_claim(O2, summary("apex_o2", WORSE))
    assert (result["verdict"], result["verdict_text"]) == ("holds", (
        "holds (apex O2 was unstable here or ended worse than FP32 beyond the margin): stdlib_gpt: final held-out "
        "loss +3.16 % against FP32's (one-sided 95 % lower bound +2.98 % > 1 %)"))


def test_collapses_and_non_finite_steps_are_signs_even_where_the_gap_is_small():
    gaps = [*SAME[:6], None, None]
    s = summary("apex_o3", gaps)
    s["cells"][-2:] = [cell("apex_o3", 6, None, "collapsed", heldout_loss_final=math.nan, first_nonfinite_step=40),
                       cell("apex_o3", 7, None, "collapsed", heldout_loss_final=math.nan, first_nonfinite_step=900)]
    s["cells"][-3]["first_nonfinite_step"] = 12  # seed 5 recovered from a non-finite step
    result = claims.evaluate_claim(O3, s)
    assert (result["verdict"], result["verdict_text"]) == ("holds", (
        "holds (apex O3 did not train as FP32 does here, by a collapse, a non-finite loss or a worse final held-out "
        "loss): stdlib_gpt: collapsed in seed(s) 6, 7; a non-finite loss in seed(s) 5, 6, 7"))
    assert result["measured_text"].startswith(
        "apex O3 over 8 seeds: collapsed in seed(s) 6, 7, a non-finite loss in seed(s) 5, 6, 7, 0 skipped steps in "
        "all; final held-out loss 1.5078 against FP32's 1.5050 (means over the 6 paired seeds)")


def test_every_seed_collapsed_holds_without_a_gap():
    s = summary("apex_o3", [None] * 8, status="collapsed", first_nonfinite_step=3)
    result = claims.evaluate_claim(O3, s)
    assert result["verdict"] == "holds" and result["verdict_text"].endswith(
        "stdlib_gpt: collapsed in seed(s) 0, 1, 2, 3, 4, 5, 6, 7; a non-finite loss in seed(s) 0, 1, 2, 3, 4, 5, 6, 7")
    assert "no paired gap: 0 seed(s) where both this precision and FP32 have a final held-out loss" in \
        result["measured_text"]


def test_a_gap_these_seeds_do_not_settle_is_not_settled_with_the_numbers():
    result = claims.evaluate_claim(O2, summary("apex_o2", [g * 6 + 0.004 for g in SAME]))
    assert result["verdict"] == "not_settled" and result["verdict_text"] == "not settled by these seeds"
    assert result["measured_text"] == result["reason"]
    assert result["reason"].startswith(
        "stdlib_gpt: not settled by these seeds: apex O2 over 8 seeds: no collapse, no non-finite step, 0 skipped "
        "steps in all; final held-out loss 1.5207 against FP32's 1.5000 (means over the 8 paired seeds); paired gap "
        "+1.38 % over 8 seeds (sd 1.60 %, 95 % interval +0.04 % to +2.71 %, one-sided 95 % bounds +0.30 % and "
        "+2.45 %): not settled against 1 %")


def test_without_the_accuracy_cells_or_with_failed_cells_it_says_why():
    paper = {"preset": {"preset": "paper"}, "versions": {}, "cells": [cell("fp32", 0, 0.0, model="vit_b_16")]}
    assert claims.evaluate_claim(O3, paper)["reason"] == (
        "no stdlib_gpt cell ran (--config preset=accuracy): paper preset on CPU (models here: vit_b_16)")
    failed = summary("apex_o3", [None] * 8, status="failed", reason="RuntimeError: x")
    for c in failed["cells"][-8:]:
        c["reason"] = "RuntimeError: x"
    result = claims.evaluate_claim(O3, failed)
    assert (result["verdict"], result["reason"]) == ("not_measurable", "stdlib_gpt/apex_o3: failed: RuntimeError: x")
    no_fp32 = {**failed, "cells": [c for c in summary("apex_o3", SAME)["cells"] if c["precision"] != "fp32"]}
    assert claims.evaluate_claim(O3, no_fp32)["reason"] == "stdlib_gpt: no FP32 cell to pair with"


def test_a_verdict_that_differs_between_models_says_so():
    claim = {**O2, "stability": {**O2["stability"], "models": ["stdlib_gpt", "other"]}}
    both = summary("apex_o2", SAME)
    both["cells"] += summary("apex_o2", WORSE, model="other")["cells"]
    result = claims.evaluate_claim(claim, both)
    assert result["verdict"] == "holds"
    assert result["verdict_text"] == (
        "holds for some models (apex O2 was unstable here or ended worse than FP32 beyond the margin for other; apex "
        "O2 trained as stably as FP32 here, no collapse or non-finite step and its final held-out loss not worse by "
        "the margin for stdlib_gpt): the verdict depends on the model: stdlib_gpt: no collapse or non-finite step in "
        "8 seeds, final held-out loss +0.16 % against FP32's (one-sided 95 % upper bound +0.34 % < 1 %); other: final "
        "held-out loss +3.16 % against FP32's (one-sided 95 % lower bound +2.98 % > 1 %)")


def test_the_eval_accuracy_of_the_cells_does_not_decide_a_stability_claim():
    s = summary("apex_o2", WORSE)
    for c in s["cells"]:
        c["eval_accuracy"] = 0.9  # the accuracy_delta of _judge would hold at_most 0; the stability verdict wins
    assert claims.evaluate_claim(O2, s)["verdict"] == "holds"


@pytest.mark.parametrize(("change", "message"), [
    ({"variant": "amp_fp16"}, "stability judges only an apex opt level"),
    ({"baseline": ["tf32"]}, "stability judges only an apex opt level"),
    ({"stability": {"models": ["stdlib_gpt"], "margin": 0.01}}, "'verdict_words' is a required property"),
    ({"stability": {**O3["stability"], "margin": 0}}, "margin"),
])
def test_a_stability_claim_the_judge_cannot_read_is_refused(change, message):
    with pytest.raises(ClaimsError, match=message):
        validate({"claims": [{**O3, **change}]})


def test_o3_claim_is_the_articles_sentence_and_o3_is_pure_fp16():
    from amprepro import precisions

    assert O3["source"]["quote"] == "O3：仅用于推理，不适合训练"
    assert O2["source"]["quote"] == "O2：更多操作转为FP16，速度快但可能不稳定"
    spec = precisions.get("apex_o3")
    assert (spec.apex_opt_level, spec.autocast_dtype, spec.bytes_per_parameter) == ("O3", None, (2, 2, 4, 0, 0))
    assert optlevels.CONTEXT == "apex_o1"

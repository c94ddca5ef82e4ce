"""The convergence verdict (paired final held-out loss gaps against FP32) on constructed numbers, and the accuracy
claim wired to it, by exact output."""

import math

import pytest

from amprepro.analysis import claims, convergence, paired
from amprepro.analysis.claimfile import ClaimsError, load_claims, validate

FP32 = [1.50, 1.52, 1.48, 1.51, 1.49, 1.53, 1.47, 1.50]  # 8 seeds, spread ±0.03: the seed noise pairing removes
SAME = [0.004, -0.002, 0.001, 0.006, -0.001, 0.003, 0.002, 0.0]  # relative gaps: mean +0.16 %, sd 0.27 %


def shifted(gaps: list[float]) -> dict:
    return {seed: FP32[seed] * (1 + gap) for seed, gap in enumerate(gaps)}


def test_the_gaps_are_paired_by_seed_and_judged_with_the_paired_module():
    result = convergence.compare(dict(enumerate(FP32)), shifted(SAME))
    assert result["gaps"] == pytest.approx(dict(enumerate(SAME)))
    assert result["stats"] == paired.interval(list(result["gaps"].values()), 0.01)
    assert (result["verdict"], result["zero"], result["margin"]) == ("under", "includes 0", 0.01)
    assert result["reason"] == (
        "final held-out loss 1.5024 against FP32's 1.5000 (means over the 8 paired seeds); paired gap +0.16 % over 8 "
        "seeds (sd 0.27 %, 95 % interval -0.06 % to +0.39 %, one-sided 95 % bounds -0.02 % and +0.34 %): not worse "
        "than FP32 by 1 % (upper bound below the margin); lower than FP32: no difference shown (the interval includes "
        "0)")


def test_pairing_sees_a_gap_that_fp32s_seed_spread_would_hide():
    """Every seed 0.5 % higher: FP32's seeds spread by 4 %, the old ±2·sd band (±0.04 nats) held it within noise."""
    result = convergence.compare(dict(enumerate(FP32)), shifted([0.005] * 8))
    assert result["verdict"] == "under" and result["zero"] == "higher"
    assert result["stats"]["lower"] == pytest.approx(0.005)


@pytest.mark.parametrize(("gaps", "verdict", "zero"), [
    ([g + 0.03 for g in SAME], "over", "higher"),
    ([g - 0.01 for g in SAME], "under", "lower"),
    ([g * 6 + 0.004 for g in SAME], "not settled", "higher"),
])
def test_each_verdict_against_the_margin_and_zero(gaps, verdict, zero):
    result = convergence.compare(dict(enumerate(FP32)), shifted(gaps))
    assert (result["verdict"], result["zero"]) == (verdict, zero)


def test_too_few_pairs_and_a_collapse():
    one = convergence.compare({0: 1.5, 1: 1.5}, {0: 1.4, 2: 1.4})
    assert one["verdict"] is None and one["reason"] == (
        "1 seed(s) where both this precision and FP32 have a final held-out loss: a paired interval needs at least 2")
    collapsed = convergence.compare(dict(enumerate(FP32)), shifted(SAME[:6]), collapsed=[7, 6])
    assert collapsed["verdict"] == "collapsed" and collapsed["collapsed_seeds"] == [6, 7]
    assert collapsed["reason"].startswith("collapsed (non-finite loss or loss scale below 1) in seed(s) 6, 7; the "
                                          "other seeds' gap +0.18 % over 6 seeds")


def cell(model, precision, seed, loss, status="ok", **extra):
    return {"model": model, "precision": precision, "seed": seed, "status": status, "reason": "",
            "heldout_loss_final": loss, **extra}


def summary(gaps, apex_status="ok", precision="apex_o1"):
    cells = [cell("stdlib_gpt", "fp32", s, v) for s, v in enumerate(FP32)]
    cells += [cell("stdlib_gpt", precision, s, None if g is None else FP32[s] * (1 + g), apex_status)
              for s, g in enumerate(gaps)]
    return {"preset": {"preset": "accuracy"}, "versions": {"gpu": "NVIDIA H200"}, "cells": cells}


CLAIMS = load_claims(convergence.__file__.rsplit("/workflow/", 1)[0] + "/config/claims.yaml")
ACCURACY = next(c for c in CLAIMS if c["id"] == "vit-apex-o1-accuracy")
NUMBERS = ("gap +0.16 % over 8 seeds (sd 0.27 %, 95 % interval -0.06 % to +0.39 %, one-sided 95 % bounds -0.02 % and "
           "+0.34 %)")


def test_the_claims_state_the_sections_margin():
    assert ACCURACY["convergence"]["margin"] == convergence.MARGIN == 0.01
    assert {c["stability"]["margin"] for c in CLAIMS if c.get("stability")} == {convergence.MARGIN}


@pytest.mark.parametrize(("gaps", "verdict", "text"), [
    (SAME, "holds", "holds: apex O1's final held-out loss is not worse than FP32's by 1 % (stdlib_gpt: " + NUMBERS
     + "); 'slightly higher': not shown (the 95 % interval -0.06 % to +0.39 % includes 0)"),
    ([g - 0.01 for g in SAME], "holds", "holds: apex O1's final held-out loss is not worse than FP32's by 1 % "
     "(stdlib_gpt: gap -0.84 % over 8 seeds (sd 0.27 %, 95 % interval -1.06 % to -0.61 %, one-sided 95 % bounds "
     "-1.02 % and -0.66 %)); 'slightly higher': holds (the held-out loss is lower than FP32's, upper bound -0.66 % "
     "< 0)"),
    ([g + 0.004 for g in SAME], "holds", "holds: apex O1's final held-out loss is not worse than FP32's by 1 % "
     "(stdlib_gpt: gap +0.56 % over 8 seeds (sd 0.27 %, 95 % interval +0.34 % to +0.79 %, one-sided 95 % bounds "
     "+0.38 % and +0.74 %)); 'slightly higher': falls short (the held-out loss is higher than FP32's, lower bound "
     "+0.38 % > 0)"),
    ([g + 0.03 for g in SAME], "falls_short", "falls short: apex O1's final held-out loss is worse than FP32's by "
     "more than 1 %, or it collapsed (stdlib_gpt: gap +3.16 % over 8 seeds (sd 0.27 %, 95 % interval +2.94 % to "
     "+3.39 %, one-sided 95 % bounds +2.98 % and +3.34 %)); 'slightly higher': falls short (the held-out loss is "
     "higher than FP32's, lower bound +2.98 % > 0)"),
])
def test_the_accuracy_claim_takes_its_verdict_from_the_paired_gaps(gaps, verdict, text):
    result = claims.evaluate_claim(ACCURACY, summary(gaps))
    assert (result["verdict"], result["verdict_text"]) == (verdict, text)
    assert "not ImageNet" in result["measured_text"]
    model = result["by_baseline"]["fp32"]["models"]["stdlib_gpt"]
    assert model["numbers"]["stats"]["n"] == 8 and "median" not in model  # not drawn as accuracy points


def test_a_gap_the_seeds_do_not_settle_is_not_settled_with_its_numbers():
    result = claims.evaluate_claim(ACCURACY, summary([g * 6 + 0.004 for g in SAME]))
    assert result["verdict"] == "not_settled" and result["verdict_text"] == "not settled by these seeds"
    assert result["measured_text"] == result["reason"]  # the numbers are shown, not a reason it could not run
    assert result["reason"].endswith(
        "held-out loss cells: stdlib_gpt/apex_o1: not settled by 8 seeds: final held-out loss 1.5207 against FP32's "
        "1.5000 (means over the 8 paired seeds); paired gap +1.38 % over 8 seeds (sd 1.60 %, 95 % interval +0.04 % "
        "to +2.71 %, one-sided 95 % bounds +0.30 % and +2.45 %): not settled against 1 %; lower than FP32: higher")


def test_a_collapsed_seed_falls_short():
    cells = summary(SAME)["cells"]
    cells[-1] = {**cells[-1], "status": "collapsed", "heldout_loss_final": math.nan}
    result = claims.evaluate_claim(ACCURACY, {**summary(SAME), "cells": cells})
    assert result["verdict"] == "falls_short"
    assert result["verdict_text"].endswith("'slightly higher': falls short (a seed collapsed)")
    assert "collapsed (non-finite loss or loss scale below 1) in seed(s) 7" in result["verdict_text"]


def test_without_the_text_cells_the_claim_stays_not_measurable_and_says_why():
    skipped = summary([None] * 8, apex_status="skipped")
    result = claims.evaluate_claim(ACCURACY, skipped)
    assert result["verdict"] == "not_measurable" and "stdlib_gpt/apex_o1" in result["reason"]
    other = {"preset": {"preset": "paper"}, "versions": {}, "cells": [cell("cnn", "fp32", 0, None)]}
    assert claims.evaluate_claim(ACCURACY, other)["verdict"] == "not_measurable"


def test_the_data_record_names_the_corpus_in_the_claim():
    records = {"stdlib_gpt": {"kind": "python_stdlib", "python": "3.11.7", "files": 734, "heldout_files": 71,
                              "corpus_sha256": "0c86f7c14a5a97ca" + "0" * 48}}
    result = claims.evaluate_claim(ACCURACY, summary(SAME), records=records)
    assert "Python 3.11.7 standard library" in result["measured_text"] and "0c86f7c14a5a" in result["measured_text"]


def test_convergence_is_refused_on_a_claim_it_cannot_judge_or_without_a_margin():
    bad = {**ACCURACY, "baseline": ["fp32"], "claimed": {"about": 0.01}}
    with pytest.raises(ClaimsError, match="convergence"):
        validate({"claims": [bad]})
    no_margin = {**ACCURACY, "convergence": {"models": ["stdlib_gpt"]}}
    with pytest.raises(ClaimsError, match=r"vit-apex-o1-accuracy.*convergence.*'margin' is a required property"):
        validate({"claims": [no_margin]})


def test_non_finite_final_losses_do_not_count_as_values():
    losses = convergence.final_losses(summary([math.nan, 0.0, 0.0]), "stdlib_gpt")
    assert list(losses["apex_o1"]["values"]) == [1, 2] and losses["apex_o1"]["other"][0][0] == 0


def test_the_report_lines_give_mean_sd_and_the_paired_verdict_per_precision():
    lines = convergence.report_lines(summary([g + 0.03 for g in SAME]))
    assert lines[0].endswith("margin 1 %")
    assert lines[1] == "  fp32: 1.5000 ± 0.0200 (min–max 1.4700–1.5300, 8 seeds); baseline"
    assert lines[2].startswith("  apex_o1: 1.5474 ± 0.0214 (min–max 1.5170–1.5805, 8 seeds); over: final held-out "
                               "loss 1.5474 against FP32's 1.5000")


def test_a_seed_without_an_fp32_pair_is_named_as_left_out():
    fp32 = dict(enumerate(FP32))
    del fp32[3]
    result = convergence.compare(fp32, shifted(SAME))
    assert result["stats"]["n"] == 7 and result["reason"].endswith(
        "; seed(s) 3 left out: no finite FP32 loss of the same seed")

"""The convergence verdict on constructed numbers, and the accuracy claim wired to it."""

import math

import pytest

from amprepro.report import claims, convergence
from amprepro.report.claimfile import ClaimsError, load_claims, validate

FP32 = [1.50, 1.52, 1.48]  # mean 1.50, sd 0.02: noise band ±0.04


def test_the_band_is_two_sample_sds_of_fp32():
    result = convergence.compare(FP32, [1.51, 1.53, 1.52])
    assert result["baseline"]["sd"] == pytest.approx(0.02)
    assert result["noise"] == pytest.approx(0.04) and result["band"] == pytest.approx([1.46, 1.54])
    assert result["delta"] == pytest.approx(0.02) and result["verdict"] == "within noise"


@pytest.mark.parametrize(("variant", "verdict"), [([1.55, 1.56, 1.57], "worse"), ([1.40, 1.41, 1.42], "better"),
                                                   ([1.46, 1.47, 1.45], "within noise")])
def test_verdicts_on_either_side_of_the_band(variant, verdict):
    assert convergence.compare(FP32, variant)["verdict"] == verdict


def test_just_inside_and_just_outside_the_edge():
    assert convergence.compare(FP32, [1.539] * 3)["verdict"] == "within noise"
    assert convergence.compare(FP32, [1.541] * 3)["verdict"] == "worse"
    assert convergence.compare(FP32, [1.541] * 3)["near_edge"]


def test_one_fp32_seed_has_no_spread_and_a_collapse_is_worse():
    assert convergence.compare([1.5], [1.4])["verdict"] is None
    assert "at least 2" in convergence.compare([1.5], [1.4])["reason"]
    collapsed = convergence.compare(FP32, [1.3], collapsed=2)
    assert collapsed["verdict"] == "worse" and "2 seed" in collapsed["reason"]


def cell(model, precision, seed, loss, status="ok"):
    return {"model": model, "precision": precision, "seed": seed, "status": status, "reason": "",
            "heldout_loss_final": loss}


def summary(apex_losses, apex_status="ok"):
    cells = [cell("stdlib_gpt", "fp32", s, v) for s, v in enumerate(FP32)]
    cells += [cell("stdlib_gpt", "apex_o1", s, v, apex_status) for s, v in enumerate(apex_losses)]
    return {"preset": {"preset": "accuracy"}, "versions": {"gpu": "NVIDIA H200"}, "cells": cells}


CLAIMS = load_claims(convergence.__file__.rsplit("/workflow/", 1)[0] + "/config/claims.yaml")
ACCURACY = next(c for c in CLAIMS if c["id"] == "vit-apex-o1-accuracy")


@pytest.mark.parametrize(("losses", "verdict", "words"), [
    ([1.49, 1.50, 1.51], "holds", "within FP32's seed noise"),
    ([1.40, 1.41, 1.42], "holds", "beyond its seed noise"),
    ([1.60, 1.61, 1.62], "falls_short", "higher held-out loss"),
])
def test_the_accuracy_claim_takes_its_verdict_from_the_heldout_losses(losses, verdict, words):
    result = claims.evaluate_claim(ACCURACY, summary(losses))
    assert result["verdict"] == verdict and words in result["verdict_text"]
    assert "not ImageNet" in result["measured_text"]
    model = result["by_baseline"]["fp32"]["models"]["stdlib_gpt"]
    assert model["numbers"]["baseline"]["n"] == 3 and "median" not in model  # not drawn as accuracy points


def test_without_the_text_cells_the_claim_stays_not_measurable_and_says_why():
    skipped = summary([None, None, None], apex_status="skipped")
    result = claims.evaluate_claim(ACCURACY, skipped)
    assert result["verdict"] == "not_measurable" and "stdlib_gpt/apex_o1" in result["reason"]
    other = {"preset": {"preset": "paper"}, "versions": {}, "cells": [cell("cnn", "fp32", 0, None)]}
    assert claims.evaluate_claim(ACCURACY, other)["verdict"] == "not_measurable"


def test_the_data_record_names_the_corpus_in_the_claim():
    records = {"stdlib_gpt": {"kind": "python_stdlib", "python": "3.11.7", "files": 734, "heldout_files": 71,
                              "corpus_sha256": "0c86f7c14a5a97ca" + "0" * 48}}
    result = claims.evaluate_claim(ACCURACY, summary([1.5, 1.5, 1.5]), records=records)
    assert "Python 3.11.7 standard library" in result["measured_text"] and "0c86f7c14a5a" in result["measured_text"]


def test_convergence_is_refused_on_a_claim_it_cannot_judge():
    bad = {**ACCURACY, "baseline": ["fp32"], "claimed": {"about": 0.01}}
    with pytest.raises(ClaimsError, match="convergence"):
        validate({"claims": [bad]})


def test_non_finite_final_losses_do_not_count_as_values():
    losses = convergence.final_losses(summary([math.nan, 1.5, 1.5]), "stdlib_gpt")
    assert list(losses["apex_o1"]["values"]) == [1, 2] and losses["apex_o1"]["other"][0][0] == 0


def test_the_report_lines_give_mean_sd_and_verdict_per_precision():
    lines = convergence.report_lines(summary([1.60, 1.61, 1.62]))
    assert lines[1].startswith("  fp32: 1.5000 ± 0.0200 (min–max 1.4800–1.5200, 3 seeds); baseline")
    assert lines[2].startswith("  apex_o1: 1.6100 ± 0.0100") and "worse: Δ +0.1100 vs noise ±0.0400" in lines[2]

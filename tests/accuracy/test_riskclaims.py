"""The AMP risk and remedy verdicts (amprepro.analysis.riskclaims) on synthetic summary cells, by exact output; the
claim form they need (amprepro.analysis.claimfile) and the dispatch from amprepro.analysis.claims."""

import copy

import pytest
import yaml

from amprepro.analysis import claimfile, claims, riskclaims
from workflow_testing import REPO

FP32 = {0: 1.50, 1: 1.60, 2: 1.55, 3: 1.45}


def cell(model, precision, seed, heldout, status="ok", nonfinite=0, skipped=0, scale=None):
    return {"model": model, "precision": precision, "seed": seed, "status": status, "heldout_loss_final": heldout,
            "nonfinite_steps": nonfinite, "first_nonfinite_step": 120 if nonfinite else None,
            "skipped_steps": skipped, "loss_scale_final": scale, "reason": "" if status == "ok" else "non-finite"}


def summary_of(*groups):
    return {"cells": [c for group in groups for c in group]}


def fp32(model):
    return [cell(model, "fp32", s, v) for s, v in FP32.items()]


def shifted(model, precision, by, **kwargs):
    """FP32's held-out losses plus per-seed gaps `by` (a list of four)."""
    return [cell(model, precision, s, FP32[s] + d, **kwargs) for s, d in zip(FP32, by)]


def collapsed(model, precision):
    return [cell(model, precision, s, None, status="collapsed", nonfinite=180, skipped=181, scale=2.0 ** -100)
            for s in FP32]


RISK_CLAIM = {"id": "amp-risk-x", "statement": "s", "model": "m", "models": ["risky"], "metric": "heldout_loss_gap",
              "baseline": ["fp32"], "variant": "amp_fp16", "claimed": {"at_least": 0.05}, "tolerance": 0.0,
              "source": {"file": "f", "title": "t"}, "risk": {"models": ["risky"]}}
REMEDY_CLAIM = {**RISK_CLAIM, "id": "amp-risk-remedies", "models": ["risky", "fix_a", "fix_b"],
                "claimed": {"at_most": 0.05},
                "risk": {"remedies": [{"risky": "risky", "remedy": "fix_a", "setting": "autocast off"},
                                      {"risky": "risky", "remedy": "fix_b", "setting": "init_scale 2^14"}]}}


def test_paired_interval_is_the_fp8_student_t_interval_with_both_one_sided_bounds():
    got = riskclaims.paired_interval([0.1, 0.2, 0.3, 0.4])
    # mean 0.25, sd 0.1291, se 0.06455; t(3) 3.182 two-sided, 2.353 one-sided (fp8's tables: 3.183, 2.354)
    assert got["n"] == 4 and got["mean"] == pytest.approx(0.25) and got["sd"] == pytest.approx(0.129099, abs=1e-6)
    assert got["low"] == pytest.approx(0.25 - 3.183 * 0.0645497, abs=1e-6)
    assert got["high"] == pytest.approx(0.25 + 3.183 * 0.0645497, abs=1e-6)
    assert got["upper"] == pytest.approx(0.25 + 2.354 * 0.0645497, abs=1e-6)
    assert got["lower"] == pytest.approx(0.25 - 2.354 * 0.0645497, abs=1e-6)
    assert riskclaims.paired_interval([0.1]) is None


def test_a_collapse_is_harm_and_the_claim_holds_naming_it():
    summary = summary_of(fp32("risky"), collapsed("risky", "amp_fp16"), shifted("risky", "amp_bf16", [0, 0, 0, 0]))
    got = riskclaims.judge_risk(RISK_CLAIM, summary)
    assert got["verdict"] == "holds"
    assert got["verdict_text"] == "holds: AMP harmed risky/amp_fp16"
    assert got["reason"] == (
        "risky/amp_fp16: harmed: collapsed in 4 of 4 seeds; 720 non-finite steps in 4 of 4 seeds, 724 skipped steps; "
        "lowest final loss scale 2^-100; held-out loss vs FP32: 0 paired seed(s) with a finite held-out loss, fewer "
        "than the 2 an interval needs; "
        "risky/amp_bf16: clean: 0 non-finite steps in 0 of 4 seeds, 0 skipped steps; held-out loss vs FP32 +0.0000 "
        "nats (95 % +0.0000 to +0.0000, 4 paired seeds): not worse than FP32 beyond the margin 0.05")


def test_a_held_out_loss_worse_beyond_the_margin_at_95_percent_is_harm():
    summary = summary_of(fp32("risky"), shifted("risky", "amp_fp16", [0.30, 0.32, 0.28, 0.31]))
    got = riskclaims.judge_risk(RISK_CLAIM, summary)
    assert got["verdict"] == "holds" and got["verdict_text"] == "holds: AMP harmed risky/amp_fp16"
    assert got["reason"] == ("risky/amp_fp16: harmed: 0 non-finite steps in 0 of 4 seeds, 0 skipped steps; held-out "
                             "loss vs FP32 +0.3025 nats (95 % +0.2753 to +0.3297, 4 paired seeds): worse than FP32 "
                             "beyond the margin 0.05")


def test_overflows_the_loss_scale_absorbed_are_not_harm_and_the_claim_falls_short():
    summary = summary_of(fp32("risky"), shifted("risky", "amp_fp16", [0.01, -0.02, 0.0, 0.01], skipped=6,
                                                scale=1024.0))
    got = riskclaims.judge_risk(RISK_CLAIM, summary)
    assert got["verdict"] == "falls_short"
    assert got["verdict_text"] == ("falls short: no AMP cell harmed here (overflows absorbed by the loss scale in "
                                   "risky/amp_fp16)")
    assert got["reason"] == ("risky/amp_fp16: overflow absorbed: 0 non-finite steps in 0 of 4 seeds, 24 skipped "
                             "steps; lowest final loss scale 2^10; held-out loss vs FP32 +0.0000 nats (95 % -0.0225 "
                             "to +0.0225, 4 paired seeds): not worse than FP32 beyond the margin 0.05")


def test_an_interval_that_straddles_the_margin_is_not_settled_and_said_so():
    summary = summary_of(fp32("risky"), shifted("risky", "amp_fp16", [0.0, 0.1, -0.05, 0.15]))
    got = riskclaims.judge_risk(RISK_CLAIM, summary)
    assert got["verdict"] == "falls_short"
    assert got["verdict_text"] == ("falls short: no AMP cell harmed here (no overflow either); not worse than FP32 "
                                   "shown at 95 % only where settled (not settled: risky/amp_fp16)")
    assert ("+0.0500 nats (95 % -0.0953 to +0.1953, 4 paired seeds): not settled against the margin 0.05"
            in got["reason"])


def test_without_fp32_or_amp_cells_a_risk_is_not_measurable():
    assert riskclaims.judge_risk(RISK_CLAIM, summary_of(collapsed("risky", "amp_fp16"))) == {
        "verdict": "not_measurable", "verdict_text": "not measurable here",
        "reason": "no risky/fp32 cell that ran ok in this run", "measured_text": "", "by_baseline": {}}
    skipped = [dict(c, status="skipped", reason="no CUDA GPU here") for c in collapsed("risky", "amp_fp16")]
    got = riskclaims.judge_risk(RISK_CLAIM, summary_of(fp32("risky"), skipped))
    assert got["verdict"] == "not_measurable" and got["reason"] == "no AMP cell of risky ran"


def test_a_remedy_rescues_where_the_unremedied_cells_were_harmed_and_the_remedied_are_not():
    summary = summary_of(fp32("risky"), collapsed("risky", "amp_fp16"),
                         shifted("fix_a", "amp_fp16", [0.01, 0.0, -0.01, 0.0]), collapsed("fix_b", "amp_fp16"))
    got = riskclaims.judge_remedies(REMEDY_CLAIM, summary)
    assert got["verdict"] == "holds"
    assert got["verdict_text"] == ("holds: rescued risky (autocast off on risky: rescues; init_scale 2^14 on risky: "
                                   "does not rescue)")
    assert [e["outcome"] for e in got["remedies"]] == ["rescues", "does not rescue"]
    assert {m: r["verdict"] for m, r in got["by_baseline"]["fp32"]["models"].items()} == {
        "fix_a": "holds", "fix_b": "falls_short"}


def test_a_harmed_risk_no_remedy_rescues_falls_short_and_an_unharmed_one_has_nothing_to_rescue():
    summary = summary_of(fp32("risky"), collapsed("risky", "amp_fp16"), collapsed("fix_a", "amp_fp16"),
                         collapsed("fix_b", "amp_fp16"))
    got = riskclaims.judge_remedies(REMEDY_CLAIM, summary)
    assert got["verdict"] == "falls_short"
    assert got["verdict_text"] == ("falls short: no remedy rescued risky (autocast off on risky: does not rescue; "
                                   "init_scale 2^14 on risky: does not rescue)")
    calm = summary_of(fp32("risky"), shifted("risky", "amp_fp16", [0, 0, 0, 0], skipped=5, scale=2048.0),
                      shifted("fix_a", "amp_fp16", [0, 0, 0, 0]), shifted("fix_b", "amp_fp16", [0, 0, 0, 0],
                                                                            skipped=3, scale=2048.0))
    got = riskclaims.judge_remedies(REMEDY_CLAIM, calm)
    assert got["verdict"] == "nothing_to_rescue" and got["verdict_text"] == "nothing to rescue here"
    assert got["measured_text"] == got["reason"]
    assert got["reason"].startswith("nothing to rescue: no risk model's amp_fp16 cells were harmed here; risky + "
                                    "autocast off: nothing to rescue (without: amp_fp16: overflow absorbed: 0 "
                                    "non-finite steps in 0 of 4 seeds, 20 skipped steps; lowest final loss scale 2^11")
    assert "risky + init_scale 2^14: nothing to rescue (without: amp_fp16: overflow absorbed" in got["reason"]
    assert "with: amp_fp16: overflow absorbed: 0 non-finite steps in 0 of 4 seeds, 12 skipped steps" in got["reason"]


def test_claims_dispatches_a_risk_claim_and_the_result_has_every_field_the_report_reads():
    summary = summary_of(fp32("risky"), collapsed("risky", "amp_fp16"))
    got = claims.evaluate_claim(copy.deepcopy(RISK_CLAIM), summary)
    assert got["verdict"] == "holds" and got["id"] == "amp-risk-x" and got["matched_models"] == ["risky"]
    shown = got["by_baseline"]["fp32"]["models"]["risky"]  # what the report's claim table reads per model
    assert shown["verdict"] == "holds" and shown["measured_text"] == got["reason"]
    assert got["claimed_text"] == ("harm: a collapse, or a final held-out loss above FP32's by more than 0.05 nats "
                                   "(one-sided 95 % over paired seeds)")
    assert claims.summary_lines([got])[0].startswith("amp-risk-x: HOLDS: AMP HARMED RISKY/AMP_FP16 — risky/amp_fp16:")


def test_the_claim_form_a_risk_claim_needs_is_checked_with_a_message_naming_the_fix():
    claimfile.validate({"claims": [copy.deepcopy(RISK_CLAIM), copy.deepcopy(REMEDY_CLAIM)]})
    wrong = dict(copy.deepcopy(RISK_CLAIM), metric="speedup")
    with pytest.raises(claimfile.ClaimsError, match=r"risk: a risk claim is judged on the final held-out loss "
                                                    r"against FP32. Fix: write metric: heldout_loss_gap"):
        claimfile.validate({"claims": [wrong]})
    both = dict(copy.deepcopy(RISK_CLAIM), risk={"models": ["a"], "remedies": [REMEDY_CLAIM["risk"]["remedies"][0]]})
    with pytest.raises(claimfile.ClaimsError, match=r"risk"):
        claimfile.validate({"claims": [both]})


def test_the_repository_claims_name_the_risk_presets_models():
    loaded = claimfile.load_claims(REPO / "config" / "claims.yaml")
    preset = yaml.safe_load((REPO / "config" / "presets" / "risk.yaml").read_text())
    risky = [c for c in loaded if c.get("risk")]
    assert len(risky) == 4
    for claim in risky:
        for model in claim["risk"].get("models", []):
            assert model in preset["models"]
        for item in claim["risk"].get("remedies", []):
            assert item["risky"] in preset["models"] and item["remedy"] in preset["models"]
            assert preset["models"][item["remedy"]]["precisions"] == [claim["variant"]]


def test_a_remedy_claim_without_the_cells_says_they_did_not_run():
    got = riskclaims.judge_remedies(REMEDY_CLAIM, summary_of(fp32("other")))
    assert got["verdict"] == "not_measurable"
    assert got["reason"] == ("no risk model ran amp_fp16 both with and without a remedy here: fix_a: no risky/fp32 "
                             "cell that ran ok; fix_b: no risky/fp32 cell that ran ok")
    skipped = [dict(c, status="skipped", reason="no CUDA GPU here") for c in collapsed("risky", "amp_fp16")]
    got = riskclaims.judge_remedies(REMEDY_CLAIM, summary_of(fp32("risky"), skipped))
    assert got["verdict"] == "not_measurable"
    assert got["reason"].startswith("no risk model ran amp_fp16 both with and without a remedy here: risky + autocast "
                                    "off: not measured (without: amp_fp16: did not run (skipped: no CUDA GPU here) | "
                                    "with: amp_fp16: did not run (no cell in this run))")

"""Claims as data: schema messages that name the field, and verdicts checked against hand-computed values."""

from __future__ import annotations

import copy
import json

import pytest
import yaml
from report_helpers import CLAIMS, GPU, LLM7B, SMOKE

from amprepro.analysis import claimfile, claimmetrics, claimmodels, claims

GIB = 2**30


def cell(model, precision, seed=0, status="ok", throughput=None, memory=None, accuracy=None, reason="", step=None):
    return {"model": model, "precision": precision, "seed": seed, "status": status, "reason": reason,
            "throughput_per_s": throughput, "peak_allocated_bytes": memory, "eval_accuracy": accuracy,
            "first_nonfinite_step": step}


def summary(cells, gpu="NVIDIA TEST GPU", preset="paper"):
    return {"cells": cells, "preset": {"preset": preset, "reason": "test"}, "versions": {"gpu": gpu}}


TENSOR_CORES = {"checks": [{"name": "Tensor Cores", "status": "pass", "detail": "compute capability 9.0"}]}


def claim(**overrides):
    base = {"id": "c", "source": {"file": "000.txt", "title": "t"}, "statement": "s", "model": "Model",
            "models": ["m"], "metric": "speedup", "baseline": ["fp32", "tf32"], "variant": "amp_fp16",
            "claimed": {"about": 2.0}, "tolerance": 0.2}
    base.update(overrides)
    return claimfile.validate({"claims": [base]})[0]


# ---------------------------------------------------------------------------------------------------------------------
# the claims file and its schema


def test_repository_claims_file_is_valid_and_covers_the_seed_claims():
    loaded = claimfile.load_claims(CLAIMS)
    ids = {c["id"] for c in loaded}
    assert {"vit-apex-o1-memory", "vit-apex-o1-speed", "resnet50-apex-memory", "resnet50-apex-speed",
            "fp16-tensor-core-throughput", "amp-memory-40-60", "llm7b-epoch-time", "llm7b-peak-memory"} <= ids
    for c in loaded:
        assert c["source"]["file"].endswith(".txt") and c["source"]["title"]
    by_id = {c["id"]: c for c in loaded}
    assert by_id["vit-apex-o1-speed"]["claimed"] == {"about": 1.75}
    assert by_id["resnet50-apex-speed"]["claimed"] == {"at_least": 1.30}
    assert by_id["fp16-tensor-core-throughput"]["claimed"] == {"between": [2.0, 3.0]}
    assert by_id["amp-memory-40-60"]["claimed"] == {"between": [0.40, 0.60]}
    for claim_id in ("llm7b-epoch-time", "llm7b-peak-memory"):  # measured on the paper preset's 7B cells now
        seven_b = by_id[claim_id]
        assert "not_measurable" not in seven_b and seven_b["models"] == ["llama7b"]
        assert seven_b["variant"] == "apex_o1" and seven_b["baseline"] == ["fp32", "tf32"]
        assert "O1" in seven_b["note"] and len(seven_b["caveats"]) >= 4
    assert any("derived from the measured tokens/s" in c for c in by_id["llm7b-epoch-time"]["caveats"])


@pytest.mark.parametrize("mutate, message", [
    (lambda c: c.update(tolerance=-0.1), "claims[0] (id 'c').tolerance: -0.1 is less than the minimum of 0"),
    (lambda c: c.update(metric="latency"), "claims[0] (id 'c').metric: 'latency' is not one of"),
    (lambda c: c.update(variant="fp8"), "claims[0] (id 'c').variant: 'fp8' is not one of"),
    (lambda c: c.pop("source"), "claims[0] (id 'c'): 'source' is a required property"),
    (lambda c: c["source"].pop("title"), "claims[0] (id 'c').source: 'title' is a required property"),
    (lambda c: c.update(claimed={"roughly": 2}), "claims[0] (id 'c').claimed: Additional properties are not allowed"),
    (lambda c: c.update(claimed={"between": [3, 2]}), "claims[0] (id 'c').claimed.between: [3, 2] is not [low, high]"),
    (lambda c: c.update(baseline=["fp32", "amp_fp16"]), "claims[0] (id 'c').variant: 'amp_fp16' is also a baseline"),
    (lambda c: c.update(colour="red"), "claims[0] (id 'c'): Additional properties are not allowed ('colour'"),
])
def test_a_bad_claim_names_the_field(mutate, message):
    data = {"id": "c", "source": {"file": "000.txt", "title": "t"}, "statement": "s", "model": "M", "models": ["m"],
            "metric": "speedup", "baseline": ["fp32"], "variant": "amp_fp16", "claimed": {"about": 2.0},
            "tolerance": 0.2}
    mutate(data)
    with pytest.raises(claimfile.ClaimsError) as info:
        claimfile.validate({"claims": [data]}, "my-claims.yaml")
    assert str(info.value).startswith("my-claims.yaml: claim field ")
    assert message in str(info.value)


def test_duplicate_ids_and_bad_yaml_are_refused(tmp_path):
    good = yaml.safe_load(CLAIMS.read_text())
    good["claims"].append(copy.deepcopy(good["claims"][0]))
    with pytest.raises(claimfile.ClaimsError, match="duplicate id"):
        claimfile.validate(good)
    path = tmp_path / "claims.yaml"
    path.write_text("claims: [\n")
    with pytest.raises(claimfile.ClaimsError, match="not valid YAML"):
        claimfile.load_claims(path)


def test_a_user_claim_in_the_same_form_is_evaluated(tmp_path):
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump({"claims": [{
        "id": "my-bf16", "source": {"file": "my-notes.md", "title": "Our lab"}, "statement": "bf16 is 1.5x",
        "model": "ResNet-50", "models": ["resnet50"], "metric": "speedup", "baseline": "tf32", "variant": "amp_bf16",
        "claimed": {"at_least": 1.5}, "tolerance": 0}]}))
    (result,) = claims.evaluate(claimfile.load_claims(path), json.loads((GPU / "summary/summary.json").read_text()))
    # fixture: resnet50 bf16 2407 / tf32 2198 = 1.095 < 1.5
    assert result["verdict"] == "falls_short"
    assert result["by_baseline"]["tf32"]["models"]["resnet50"]["median"] == pytest.approx(2407 / 2198, rel=0.01)


# ---------------------------------------------------------------------------------------------------------------------
# hand-computed verdicts


def test_holds_against_one_baseline_and_not_the_other_is_reported_as_such():
    cells = [cell("m", "fp32", throughput=100), cell("m", "tf32", throughput=200),
             cell("m", "amp_fp16", throughput=250)]
    result = claims.evaluate_claim(claim(claimed={"between": [2.0, 3.0]}, tolerance=0), summary(cells), TENSOR_CORES)
    # 250/100 = 2.5 in [2, 3]; 250/200 = 1.25 not
    assert result["verdict"] == "depends_on_baseline"
    assert result["verdict_text"] == "holds vs strict FP32; falls short vs TF32"
    assert result["by_baseline"]["fp32"]["models"]["m"]["median"] == pytest.approx(2.5)
    assert result["by_baseline"]["tf32"]["models"]["m"]["median"] == pytest.approx(1.25)


def test_median_and_min_max_spread_over_seeds():
    cells = []
    for seed, (base, amp) in enumerate([(100, 180), (100, 200), (100, 230)]):
        cells += [cell("m", "fp32", seed, throughput=base), cell("m", "amp_fp16", seed, throughput=amp)]
    result = claims.evaluate_claim(claim(baseline=["fp32"], claimed={"about": 2.0}, tolerance=0.15), summary(cells),
                                   TENSOR_CORES)
    m = result["by_baseline"]["fp32"]["models"]["m"]
    assert (m["median"], m["min"], m["max"], m["n_seeds"]) == (pytest.approx(2.0), pytest.approx(1.8),
                                                                pytest.approx(2.3), 3)
    assert result["verdict"] == "holds"  # median 2.0 in 1.85-2.15
    assert m["borderline"]  # 1.8 and 2.3 are both outside the band while the median is in it
    assert "min–max 1.80× to 2.30×, 3 seeds" in result["measured_text"]


def test_memory_reduction_about_forty_percent():
    cells = [cell("m", "fp32", memory=10 * GIB), cell("m", "tf32", memory=10 * GIB),
             cell("m", "apex_o1", memory=int(6.2 * GIB))]
    result = claims.evaluate_claim(claim(metric="memory_reduction", variant="apex_o1", claimed={"about": 0.40},
                                         tolerance=0.05), summary(cells))
    assert result["by_baseline"]["fp32"]["models"]["m"]["median"] == pytest.approx(0.38)
    assert result["verdict"] == "holds"
    assert result["verdict_text"] == "holds vs strict FP32 and TF32"
    assert "−38.0 %" in result["measured_text"]


def test_at_least_with_tolerance_edges():
    base = [cell("m", "fp32", throughput=100)]
    just = claims.evaluate_claim(claim(baseline=["fp32"], claimed={"at_least": 1.30}, tolerance=0.02),
                                 summary([*base, cell("m", "amp_fp16", throughput=128)]), TENSOR_CORES)
    under = claims.evaluate_claim(claim(baseline=["fp32"], claimed={"at_least": 1.30}, tolerance=0.02),
                                  summary([*base, cell("m", "amp_fp16", throughput=127.9)]), TENSOR_CORES)
    assert just["verdict"] == "holds" and under["verdict"] == "falls_short"
    assert "below the claimed band" in under["reason"]


def test_generic_claim_evaluates_every_model_that_ran_both_cells():
    cells = [cell("a", "fp32", throughput=100), cell("a", "amp_fp16", throughput=250),
             cell("b", "fp32", throughput=100), cell("b", "amp_fp16", throughput=400),
             cell("c", "fp32", throughput=100), cell("c", "amp_fp16", status="skipped", reason="no apex")]
    result = claims.evaluate_claim(claim(models=["any"], baseline=["fp32"], claimed={"between": [2.0, 3.0]},
                                         tolerance=0), summary(cells), TENSOR_CORES)
    assert result["matched_models"] == ["a", "b", "c"]
    per = result["by_baseline"]["fp32"]["models"]
    assert per["a"]["verdict"] == "holds" and per["b"]["verdict"] == "exceeds"  # 4.0x where 2-3x was claimed
    assert per["c"]["verdict"] == "not_measurable" and "no apex" in per["c"]["reason"]
    assert result["verdict"] == "exceeds"  # no model falls short, one does better than claimed
    assert "holds for a; exceeds the claim for b (of 2 models)" in result["reason"]


def test_generic_fp16_claim_on_cpu_needs_a_tensor_core_gpu():
    smoke = json.loads((SMOKE / "summary/summary.json").read_text())
    sanity = json.loads((SMOKE / "sanity/sanity.json").read_text())
    by_id = {c["id"]: c for c in claimfile.load_claims(CLAIMS)}
    data = {"cnn": "digits", "transformer": "digits"}  # what the smoke run's cells train on
    result = claims.evaluate_claim(by_id["fp16-tensor-core-throughput"], smoke, sanity, data=data)
    assert result["verdict"] == "not_measurable"
    assert result["reason"].startswith("needs a Tensor Core GPU")
    assert "smoke preset on CPU" in result["reason"]


def test_named_model_missing_says_which_cell_and_why():
    smoke = json.loads((SMOKE / "summary/summary.json").read_text())
    by_id = {c["id"]: c for c in claimfile.load_claims(CLAIMS)}
    result = claims.evaluate_claim(by_id["vit-apex-o1-speed"], smoke)
    assert result["verdict"] == "not_measurable"
    assert result["reason"].startswith("no ViT-Base cell ran (vit_b_16): smoke preset on CPU")


def test_models_match_by_arch_too():
    cells = [cell("my_vit", "fp32", throughput=100), cell("my_vit", "amp_fp16", throughput=200)]
    result = claims.evaluate_claim(claim(models=["vit_b_16"], baseline=["fp32"]), summary(cells), TENSOR_CORES,
                                   archs={"my_vit": "vit_b_16"})
    assert result["matched_models"] == ["my_vit"] and result["verdict"] == "holds"


def test_collapsed_variant_does_not_hold_and_skipped_variant_is_not_measurable():
    collapsed = [cell("m", "fp32", throughput=100), cell("m", "amp_fp16", status="collapsed", throughput=300, step=17)]
    result = claims.evaluate_claim(claim(baseline=["fp32"]), summary(collapsed), TENSOR_CORES)
    assert result["verdict"] == "falls_short" and "collapsed" in result["reason"] and "step 17" in result["reason"]
    skipped = [cell("m", "fp32", throughput=100), cell("m", "amp_fp16", status="skipped", reason="apex is not built")]
    result = claims.evaluate_claim(claim(baseline=["fp32"]), summary(skipped), TENSOR_CORES)
    assert result["verdict"] == "not_measurable" and "m/amp_fp16 skipped: apex is not built" in result["reason"]


def test_memory_claim_on_cpu_rss_is_not_measurable():
    cells = [dict(cell("m", "fp32"), peak_rss_bytes=GIB), dict(cell("m", "amp_bf16"), peak_rss_bytes=GIB)]
    result = claims.evaluate_claim(claim(metric="memory_reduction", variant="amp_bf16", baseline=["fp32"],
                                         claimed={"about": 0.4}), summary(cells, gpu=None, preset="smoke"))
    assert result["verdict"] == "not_measurable"
    assert "CPU process RSS" in result["reason"]


def test_a_claim_this_run_cannot_judge_keeps_its_proxy_as_context_only():
    gpu = json.loads((GPU / "summary/summary.json").read_text())  # no llama7b cell in this fixture
    sanity = json.loads((GPU / "sanity/sanity.json").read_text())
    by_id = {c["id"]: c for c in claimfile.load_claims(CLAIMS)}
    result = claims.evaluate_claim(by_id["llm7b-epoch-time"], gpu, sanity)
    assert result["verdict"] == "not_measurable"
    assert result["reason"].startswith("no 7B language model (pre-training) cell ran (llama7b)")
    proxy = result["proxy"]
    # fixture gpt124m: apex_o1 140000 / fp32 38000 = 3.68, / tf32 95000 = 1.47
    assert proxy["by_baseline"]["fp32"]["models"]["gpt124m"]["median"] == pytest.approx(140000 / 38000, rel=0.01)
    assert proxy["by_baseline"]["tf32"]["models"]["gpt124m"]["median"] == pytest.approx(140000 / 95000, rel=0.01)


def test_gpu_fixture_verdicts_match_hand_computed_values():
    gpu = json.loads((GPU / "summary/summary.json").read_text())
    sanity = json.loads((GPU / "sanity/sanity.json").read_text())
    results = {r["id"]: r for r in claims.evaluate(claimfile.load_claims(CLAIMS), gpu, sanity)}
    # ViT apex O1: memory 1 - 9.40/15.18 = 0.381 (in 0.35-0.45); speed 2330/402 = 5.80 (no), 2330/1248 = 1.87 (yes)
    assert results["vit-apex-o1-memory"]["verdict"] == "holds"
    assert results["vit-apex-o1-speed"]["verdict"] == "depends_on_baseline"
    assert results["vit-apex-o1-speed"]["verdict_text"] == "exceeds the claim vs strict FP32; holds vs TF32"
    # ResNet-50 apex O1: 2740/908 = 3.02 >= 1.28; 2740/2198 = 1.25 < 1.28
    assert results["resnet50-apex-speed"]["verdict_text"] == "holds vs strict FP32; falls short vs TF32"
    # fp16 2-3x: vs fp32 3.27, 6.29, 4.21 (all above 1.9-3.1); vs tf32 1.35, 2.03, 1.68 (ViT only in the band)
    assert (results["fp16-tensor-core-throughput"]["verdict_text"]
            == "exceeds the claim vs strict FP32; falls short vs TF32")
    # ResNet-50 apex O1 memory: 1 - 12.60/21.38 = 0.41, 1 - 12.60/20.94 = 0.40 (in 0.35-0.45)
    assert results["resnet50-apex-memory"]["verdict_text"] == "holds vs strict FP32 and TF32"
    # no eval accuracy on synthetic data
    assert results["vit-apex-o1-accuracy"]["verdict"] == "not_measurable"
    assert "synthetic" in results["vit-apex-o1-accuracy"]["reason"]
    assert all(r["verdict_text"] for r in results.values())


def test_benchmark_claims_leave_out_the_models_trained_on_real_data():
    cells = [cell("resnet", "fp32", throughput=100), cell("resnet", "amp_fp16", throughput=250),
             cell("cnn", "fp32", throughput=100), cell("cnn", "amp_fp16", throughput=70)]
    data = {"resnet": "synthetic_images", "cnn": "digits"}
    result = claims.evaluate_claim(claim(models=["benchmark"], baseline=["fp32"], claimed={"between": [2.0, 3.0]},
                                         tolerance=0), summary(cells), TENSOR_CORES, data=data)
    assert result["matched_models"] == ["resnet"] and result["verdict"] == "holds"
    anything = claims.evaluate_claim(claim(models=["any"], baseline=["fp32"], claimed={"between": [2.0, 3.0]},
                                           tolerance=0), summary(cells), TENSOR_CORES, data=data)
    assert anything["matched_models"] == ["resnet", "cnn"] and anything["verdict"] == "falls_short"


def test_variants_of_an_arch_count_only_where_they_ran_the_claims_precision():
    cells = [cell("vit", "fp32", throughput=100), cell("vit", "apex_o1", throughput=175),
             cell("vit_compile", "amp_bf16", throughput=300), cell("vit_fused", "fp32", throughput=100),
             cell("vit_fused", "apex_o1", throughput=180)]
    archs = {"vit": "vit_b_16", "vit_compile": "vit_b_16", "vit_fused": "vit_b_16"}
    result = claims.evaluate_claim(claim(models=["vit_b_16"], variant="apex_o1", baseline=["fp32"],
                                         claimed={"about": 1.75}, tolerance=0.1), summary(cells), archs=archs)
    assert result["matched_models"] == ["vit", "vit_fused"]
    named = claims.evaluate_claim(claim(models=["vit_compile"], variant="apex_o1", baseline=["fp32"],
                                        claimed={"about": 1.75}, tolerance=0.1), summary(cells), archs=archs)
    assert named["verdict"] == "not_measurable" and "no vit_compile/apex_o1 cell" in named["reason"]


# ---------------------------------------------------------------------------------------------------------------------
# which way a claim misses: holds / exceeds the claim / falls short


@pytest.mark.parametrize("metric, claimed, tolerance, value, verdict", [
    # about: either side
    ("memory_reduction", {"about": 0.40}, 0.05, 0.48, "exceeds"),  # −48 % where −40 % was claimed
    ("memory_reduction", {"about": 0.40}, 0.05, 0.30, "falls_short"),
    ("memory_reduction", {"about": 0.40}, 0.05, 0.44, "holds"),
    ("speedup", {"about": 1.75}, 0.175, 3.2, "exceeds"),  # 3.2x where 1.75x was claimed
    ("speedup", {"about": 1.75}, 0.175, 1.2, "falls_short"),
    ("accuracy_delta", {"about": 0.0}, 0.005, 0.02, "exceeds"),
    ("accuracy_delta", {"about": 0.0}, 0.005, -0.02, "falls_short"),
    # between: either side
    ("speedup", {"between": [2.0, 3.0]}, 0.1, 5.4, "exceeds"),
    ("speedup", {"between": [2.0, 3.0]}, 0.1, 1.3, "falls_short"),
    ("speedup", {"between": [2.0, 3.0]}, 0.1, 3.05, "holds"),
    # at_least: a lower bound, so anything above it holds; it can only fall short
    ("speedup", {"at_least": 1.30}, 0.02, 9.0, "holds"),
    ("speedup", {"at_least": 1.30}, 0.02, 1.27, "falls_short"),
    ("accuracy_delta", {"at_least": 0.0}, 0.0, -0.001, "falls_short"),
    # at_most: an upper bound on the benefit, so anything below it holds; above it is better than claimed
    ("speedup", {"at_most": 1.2}, 0.0, 0.5, "holds"),
    ("speedup", {"at_most": 1.2}, 0.0, 1.5, "exceeds"),
    ("memory_reduction", {"at_most": 0.10}, 0.0, 0.25, "exceeds"),
])
def test_a_miss_says_which_way(metric, claimed, tolerance, value, verdict):
    assert claimmetrics.verdict_for(claim(metric=metric, claimed=claimed, tolerance=tolerance), value) == verdict


def test_verdict_direction_follows_the_metric():
    """A metric where lower were better would turn the sides round (all three metrics here are higher-is-better)."""
    c = claim(metric="speedup", claimed={"about": 2.0}, tolerance=0.1)
    assert claimmetrics.verdict_for(c, 3.0) == "exceeds"
    original = claimmetrics.HIGHER_IS_BETTER["speedup"]
    try:
        claimmetrics.HIGHER_IS_BETTER["speedup"] = False
        assert claimmetrics.verdict_for(c, 3.0) == "falls_short" and claimmetrics.verdict_for(c, 1.0) == "exceeds"
    finally:
        claimmetrics.HIGHER_IS_BETTER["speedup"] = original


def test_a_bigger_saving_than_claimed_exceeds_the_claim_and_is_counted_so():
    cells = [cell("m", "fp32", memory=10 * GIB), cell("m", "tf32", memory=10 * GIB),
             cell("m", "apex_o1", memory=int(5.2 * GIB))]
    result = claims.evaluate_claim(claim(metric="memory_reduction", variant="apex_o1", claimed={"about": 0.40},
                                         tolerance=0.05), summary(cells))
    assert result["verdict"] == "exceeds" and result["verdict_text"] == "exceeds the claim vs strict FP32 and TF32"
    assert "−48.0 %" in result["measured_text"] and "above the claimed band" in result["reason"]
    assert claims.counts([result]) == {"holds": 0, "exceeds": 1, "falls_short": 0, "depends_on_baseline": 0,
                                       "not_settled": 0, "nothing_to_rescue": 0, "not_measurable": 0}


def test_depends_on_the_baseline_names_both_verdicts():
    cells = [cell("m", "fp32", throughput=100), cell("m", "tf32", throughput=250),
             cell("m", "amp_fp16", throughput=400)]
    result = claims.evaluate_claim(claim(claimed={"about": 1.75}, tolerance=0.175), summary(cells), TENSOR_CORES)
    # 400/100 = 4.0 above 1.575-1.925; 400/250 = 1.6 in it
    assert result["verdict"] == "depends_on_baseline"
    assert result["verdict_text"] == "exceeds the claim vs strict FP32; holds vs TF32"


def test_a_generic_claim_takes_the_worst_model_verdict():
    cells = [cell("a", "fp32", throughput=100), cell("a", "amp_fp16", throughput=250),
             cell("b", "fp32", throughput=100), cell("b", "amp_fp16", throughput=400),
             cell("c", "fp32", throughput=100), cell("c", "amp_fp16", throughput=150)]
    result = claims.evaluate_claim(claim(models=["any"], baseline=["fp32"], claimed={"between": [2.0, 3.0]},
                                         tolerance=0), summary(cells), TENSOR_CORES)
    assert result["verdict"] == "falls_short"
    assert "holds for a; exceeds the claim for b; falls short for c (of 3 models)" in result["reason"]


# ---------------------------------------------------------------------------------------------------------------------
# the 7B claims on the 7B cells


def llm7b_summary():
    return json.loads((LLM7B / "summary/summary.json").read_text())


def test_7b_claims_get_verdicts_on_the_7b_cells():
    sanity = json.loads((LLM7B / "sanity/sanity.json").read_text())
    by_id = {c["id"]: c for c in claimfile.load_claims(CLAIMS)}
    speed = claims.evaluate_claim(by_id["llm7b-epoch-time"], llm7b_summary(), sanity)
    # fixture llama7b tokens/s: apex_o1 3050 / fp32 720 = 4.24 (above 1.36-1.66), / tf32 2050 = 1.49 (in it)
    assert speed["by_baseline"]["fp32"]["models"]["llama7b"]["median"] == pytest.approx(3050 / 720)
    assert speed["by_baseline"]["tf32"]["models"]["llama7b"]["median"] == pytest.approx(3050 / 2050)
    assert speed["verdict_text"] == "exceeds the claim vs strict FP32; holds vs TF32"
    assert "proxy" not in speed and len(speed["caveats"]) >= 4
    memory = claims.evaluate_claim(by_id["llm7b-peak-memory"], llm7b_summary(), sanity)
    # 16 bytes/parameter + activations: fp32 100.4 + 6.0 GiB, apex O1 100.4 + 5.0 GiB -> −0.94 %, far from −38 %
    fp32 = 16 * 6_738_415_616 + 6 * GIB
    apex = 16 * 6_738_415_616 + 5 * GIB
    assert memory["by_baseline"]["fp32"]["models"]["llama7b"]["median"] == pytest.approx(1 - apex / fp32)
    assert memory["verdict_text"] == "falls short vs strict FP32 and TF32"


@pytest.mark.parametrize("skipped", [["apex_o1"], ["fp32", "tf32", "apex_o1"]])
def test_7b_claims_read_not_measurable_with_the_skip_reason_when_the_cells_do_not_fit(skipped):
    why = "needs about 118.0 GiB (estimate: 16 bytes/parameter + activations), 80.0 GiB free on this GPU"
    data = llm7b_summary()
    for row in data["cells"]:
        if row["precision"] in skipped:
            row.update(status="skipped", reason=why, throughput_per_s=None, peak_allocated_bytes=None)
    sanity = json.loads((LLM7B / "sanity/sanity.json").read_text())
    for claim_id in ("llm7b-epoch-time", "llm7b-peak-memory"):
        by_id = {c["id"]: c for c in claimfile.load_claims(CLAIMS)}
        result = claims.evaluate_claim(by_id[claim_id], data, sanity)
        assert result["verdict"] == "not_measurable" and result["verdict_text"] == "not measurable here"
        assert f"llama7b/apex_o1 skipped: {why}" in result["reason"]
        assert "proxy" in result  # the gpt124m shape check is context where the 7B cells could not run



@pytest.mark.parametrize("root", [SMOKE, GPU, LLM7B], ids=["smoke", "gpu", "llm7b"])
def test_the_cli_verify_and_the_report_give_every_claim_the_same_verdict_and_reason(tmp_path, root):
    """One evaluation (claims.evaluate_run) behind all three: e.g. the model's data decides which claims apply."""
    from amprepro.report import reportlib
    from amprepro.verify import verify

    summary, sanity = root / "summary" / "summary.json", root / "sanity" / "sanity.json"
    claims.main(["--claims", str(CLAIMS), "--summary", str(summary), "--sanity", str(sanity),
                 "--runs-dir", str(root / "runs"), "--json", str(tmp_path / "cli.json")])
    cli = json.loads((tmp_path / "cli.json").read_text())["claims"]
    verified = verify.run_verify(str(summary), str(tmp_path), str(root / "runs"), str(CLAIMS), str(sanity))["claims"]
    report = reportlib.load(str(summary), str(root / "environment" / "environment.json"), str(sanity),
                            str(root / "apex" / "apex.json"), str(CLAIMS), None, str(root / "runs"))["claims"]
    assert cli and [(c["id"], c["verdict"], c["reason"]) for c in cli] == [
        (c["id"], c["verdict"], c["reason"]) for c in report]
    assert cli == json.loads(json.dumps(report)) == json.loads(json.dumps(verified))


def test_a_claim_names_the_batch_or_shape_the_memory_plan_ran_it_at():
    planned = {"batch_size": 64, "preset_batch_size": 256, "plan_note": "64 of the preset's 256: the largest at which "
               "m/strict FP32 fits in 11.5 GiB"}
    cells = [{**cell("m", p, memory=m), **planned} for p, m in (("fp32", 10 * GIB), ("tf32", 10 * GIB),
                                                                 ("apex_o1", int(6.2 * GIB)))]
    result = claims.evaluate_claim(claim(metric="memory_reduction", variant="apex_o1", claimed={"about": 0.40},
                                         tolerance=0.05), summary(cells))
    assert "[at batch 64: 64 of the preset's 256: the largest at which m/strict FP32 fits in 11.5 GiB]" in result[
        "measured_text"]
    shaped = {"batch_size": 1, "preset_batch_size": 1, "shape_name": "TinyLlama-1.1B",
              "plan_note": "TinyLlama-1.1B shape (1.10 B parameters), the largest LLaMA-family shape of the ladder "
                           "whose every precision fits in 23.5 GiB"}
    cells = [{**c, **shaped} for c in cells]
    result = claims.evaluate_claim(claim(metric="memory_reduction", variant="apex_o1", claimed={"about": 0.40},
                                         tolerance=0.05), summary(cells))
    assert "[at the TinyLlama-1.1B shape (1.10 B parameters), the largest" in result["measured_text"]
    unplanned = [
        cell("m", p, memory=m) for p, m in (("fp32", 10 * GIB), ("apex_o1", int(6.2 * GIB)))]
    result = claims.evaluate_claim(claim(metric="memory_reduction", variant="apex_o1", claimed={"about": 0.40},
                                         tolerance=0.05, baseline=["fp32"]), summary(unplanned))
    assert "[" not in result["measured_text"]


# ---------------------------------------------------------------------------------------------------------------------
# verdict rules a wrong edit of claims.py would change (issue 28: each was a bug that no test caught)
NO_TENSOR_CORES = {"checks": [{"name": "Tensor Cores", "status": "fail", "detail": "compute capability 6.1"}]}


@pytest.mark.parametrize("models", [["m"], ["any"], ["benchmark"]], ids=["named", "any", "benchmark"])
def test_the_tensor_core_requirement_holds_for_named_and_generic_claims(models):
    cells = [cell("m", "fp32", throughput=100), cell("m", "amp_fp16", throughput=200)]
    needs = claim(models=models, baseline=["fp32"], requires=["tensor_cores"])
    without = claims.evaluate_claim(needs, summary(cells), NO_TENSOR_CORES)
    assert without["verdict"] == "not_measurable", without["reason"]
    assert without["reason"] == ("needs a Tensor Core GPU (compute capability ≥ 7.0); compute capability 6.1: "
                                 "paper preset on NVIDIA TEST GPU")
    assert claims.evaluate_claim(needs, summary(cells), TENSOR_CORES)["verdict"] == "holds"
    # a claim that does not name the requirement is judged on the same machine
    assert claims.evaluate_claim(claim(models=models, baseline=["fp32"]), summary(cells),
                                 NO_TENSOR_CORES)["verdict"] == "holds"


def test_without_a_sanity_record_a_gpu_counts_as_unchecked_tensor_cores_and_the_cpu_as_none():
    cells = [cell("m", "fp32", throughput=100), cell("m", "amp_fp16", throughput=200)]
    needs = claim(baseline=["fp32"], requires=["tensor_cores"])
    assert claims.tensor_cores(None, summary(cells)) == (True, "NVIDIA TEST GPU (not checked)")
    assert claims.evaluate_claim(needs, summary(cells), None)["verdict"] == "holds"
    on_cpu = claims.evaluate_claim(needs, summary(cells, gpu=None), None)
    assert on_cpu["verdict"] == "not_measurable" and "; no CUDA GPU: paper preset on CPU" in on_cpu["reason"]


@pytest.mark.parametrize("status", ["failed", "skipped"])
def test_a_baseline_that_did_not_run_ok_gives_no_value_even_with_a_throughput_recorded(status):
    cells = [cell("m", "fp32", status=status, throughput=50, reason="out of memory"),
             cell("m", "amp_fp16", throughput=200)]
    result = claims.evaluate_claim(claim(baseline=["fp32"]), summary(cells), TENSOR_CORES)
    assert result["verdict"] == "not_measurable"
    assert result["reason"] == f"m/fp32 {status}: out of memory"
    model = result["by_baseline"]["fp32"]["models"]["m"]
    assert model["values"] == {} and "median" not in model


def test_only_seeds_whose_baseline_ran_ok_count():
    cells = [cell("m", "fp32", 0, status="failed", throughput=10, reason="crash"),
             cell("m", "amp_fp16", 0, throughput=200),
             cell("m", "fp32", 1, throughput=100), cell("m", "amp_fp16", 1, throughput=200)]
    model = claims.evaluate_claim(claim(baseline=["fp32"]), summary(cells), TENSOR_CORES)["by_baseline"]["fp32"][
        "models"]["m"]
    assert model["values"] == {1: pytest.approx(2.0)} and model["n_seeds"] == 1 and model["verdict"] == "holds"


def test_a_variant_seed_that_did_not_run_ok_gives_no_value():
    cells = [cell("m", "fp32", 0, throughput=100), cell("m", "amp_fp16", 0, status="failed", throughput=900),
             cell("m", "fp32", 1, throughput=100), cell("m", "amp_fp16", 1, throughput=210)]
    model = claims.evaluate_claim(claim(baseline=["fp32"]), summary(cells), TENSOR_CORES)["by_baseline"]["fp32"][
        "models"]["m"]
    assert model["values"] == {1: pytest.approx(2.1)}


@pytest.mark.parametrize("variant_throughputs, borderline", [
    ([190, 200, 210], False),  # 1.9x-2.1x, all inside 2.0 ± 0.2
    ([180, 200, 230], True),   # the max (2.3x) is above the band: the spread straddles its edge
    ([170, 200, 205], True),   # the min (1.7x) is below it
    ([170, 200, 240], True),   # both
    ([230, 240, 250], False),  # all above: exceeds, and not borderline
])
def test_borderline_means_the_spread_over_seeds_straddles_a_band_edge(variant_throughputs, borderline):
    cells = [c for seed, value in enumerate(variant_throughputs)
             for c in (cell("m", "fp32", seed, throughput=100), cell("m", "amp_fp16", seed, throughput=value))]
    model = claims.evaluate_claim(claim(baseline=["fp32"]), summary(cells), TENSOR_CORES)["by_baseline"]["fp32"][
        "models"]["m"]
    assert model["borderline"] is borderline
    assert ("(the spread straddles the band edge)" in model["reason"]) is borderline


# ---------------------------------------------------------------------------------------------------------------------
# Every field of a result, the texts, the wiring of proxies, convergence and regimes, and the command line (in process,
# for mutation testing: docs/mutation.md)

TENSOR_CORES_FAIL = {"checks": [{"name": "Tensor Cores", "status": "fail", "detail": ""}]}


def two_models():
    return [cell("a", "fp32", throughput=100), cell("a", "tf32", throughput=200), cell("a", "amp_fp16", throughput=250),
            cell("b", "fp32", throughput=100), cell("b", "amp_fp16", throughput=400)]


def test_a_result_carries_the_claim_its_models_and_every_text():
    c = claim(models=["any"], claimed={"between": [2.0, 3.0]}, tolerance=0, note="n", caveats=["c1"])
    result = claims.evaluate_claim(c, summary(two_models()), TENSOR_CORES)
    assert {k: result[k] for k in ("id", "statement", "model", "models", "metric", "variant", "baselines", "claimed",
                                   "tolerance", "claimed_text", "source", "note", "caveats", "matched_models")} == {
        "id": "c", "statement": "s", "model": "Model", "models": ["any"], "metric": "speedup", "variant": "amp_fp16",
        "baselines": ["fp32", "tf32"], "claimed": {"between": [2.0, 3.0]}, "tolerance": 0,
        "claimed_text": claimmetrics.claimed_text(c), "source": {"file": "000.txt", "title": "t"}, "note": "n",
        "caveats": ["c1"], "matched_models": ["a", "b"]}
    assert result["verdict"] == "depends_on_baseline"
    assert result["verdict_text"] == "exceeds the claim vs strict FP32; falls short vs TF32"
    assert result["reason"] == ("vs strict FP32: holds for a; exceeds the claim for b (of 2 models): a: 2.50× (1 "
                                "seed); b: 4.00× (1 seed), above the claimed band | vs TF32: a: 1.25× (1 seed), below "
                                "the claimed band")
    assert result["measured_text"] == "vs strict FP32: a 2.50× (1 seed), b 4.00× (1 seed); vs TF32: 1.25× (1 seed)"
    assert list(result["by_baseline"]["tf32"]["models"]) == ["a"]  # b has no TF32 cell: not in that baseline's scope
    assert result["by_baseline"]["tf32"]["models"]["a"] == {
        "model": "a", "baseline": "tf32", "variant": "amp_fp16", "values": {0: 1.25}, "verdict": "falls_short",
        "reason": "a: 1.25× (1 seed), below the claimed band", "median": 1.25, "min": 1.25, "max": 1.25,
        "n_seeds": 1, "borderline": False, "setting": "", "measured_text": "1.25× (1 seed)"}
    bare = claims.evaluate_claim(claim(), summary(two_models()), TENSOR_CORES)  # no note, no caveats
    assert (bare["note"], bare["caveats"], bare["matched_models"]) == ("", [], [])
    assert (bare["verdict"], bare["measured_text"]) == ("not_measurable", "")


def test_the_verdict_text_names_the_baselines_only_where_there_are_several():
    cells = [cell("m", "fp32", throughput=100), cell("m", "tf32", throughput=100),
             cell("m", "amp_fp16", throughput=200)]
    both = claims.evaluate_claim(claim(), summary(cells), TENSOR_CORES)
    assert (both["verdict"], both["verdict_text"]) == ("holds", "holds vs strict FP32 and TF32")
    one = claims.evaluate_claim(claim(), summary(cells[::2]), TENSOR_CORES)  # no TF32 cell: measured vs FP32 only
    assert one["verdict_text"] == "holds vs strict FP32"
    assert one["reason"] == "vs strict FP32: m: 2.00× (1 seed) | vs TF32: no m/tf32 cell in this run"
    single = claims.evaluate_claim(claim(baseline=["fp32"]), summary(cells), TENSOR_CORES)
    assert single["verdict_text"] == "holds"


def test_a_named_model_that_did_not_measure_reads_n_a_among_the_others():
    cells = [cell("a", "fp32", throughput=100), cell("a", "amp_fp16", throughput=200), cell("b", "fp32", throughput=1)]
    result = claims.evaluate_claim(claim(models=["a", "b"], baseline=["fp32"]), summary(cells), TENSOR_CORES)
    assert result["measured_text"] == "vs strict FP32: a 2.00× (1 seed), b n/a"
    assert result["reason"] == "vs strict FP32: a: 2.00× (1 seed); not measured: no b/amp_fp16 cell in this run"


def test_what_a_claim_this_run_cannot_judge_says():
    c = claim(models=["m", "n"], requires=["tensor_cores"])
    assert claims.evaluate_claim(c, {"versions": {}}, TENSOR_CORES)["reason"] == (
        "no Model cell ran (m/n): ? preset on CPU (models here: none)")
    ran = summary([cell("x", "fp32")], gpu=None, preset="smoke")
    assert claims.evaluate_claim(claim(), ran)["reason"] == (
        "no Model cell ran (m): smoke preset on CPU (models here: x)")
    two = summary([cell("x", "fp32"), cell("y", "fp32")])
    assert claims.evaluate_claim(claim(), two)["reason"].endswith("paper preset on NVIDIA TEST GPU (models here: x, y)")
    generic = claims.evaluate_claim(claim(models=["any"], requires=["tensor_cores"]), summary([], gpu=None))
    assert generic["reason"] == ("needs a Tensor Core GPU (compute capability ≥ 7.0); no CUDA GPU: paper preset on "
                                 "CPU")
    none_ran = claims.evaluate_claim(claim(models=["m"]), summary([cell("m", "tf32")]), TENSOR_CORES)
    assert none_ran["reason"] == "no m/amp_fp16 cell in this run"  # the same reason for both baselines, once
    cells = [cell("m", "amp_fp16", throughput=1)]
    assert claims.evaluate_claim(claim(), summary(cells), TENSOR_CORES)["reason"] == (
        "no m/fp32 cell in this run; no m/tf32 cell in this run")
    overridden = claim(not_measurable="the article gives no batch size")
    by_override = claims.evaluate_claim(overridden, summary(two_models()))
    assert (by_override["reason"], by_override["matched_models"]) == ("the article gives no batch size", [])
    judged = claims.evaluate_claim(overridden, summary(cells), TENSOR_CORES, use_override=False)
    assert judged["reason"].startswith("no m/fp32 cell")


def test_the_reasons_of_several_models_are_grouped_and_joined():
    cells = [cell(m, "fp32", throughput=100) for m in "abcd"] + [
        cell("a", "amp_fp16", throughput=250), cell("b", "amp_fp16", throughput=260), cell("c", "amp_fp16",
                                                                                            throughput=100)]
    result = claims.evaluate_claim(claim(models=["a", "b", "c", "d"], baseline=["fp32"], claimed={"between": [2, 3]},
                                         tolerance=0), summary(cells), TENSOR_CORES)
    assert result["by_baseline"]["fp32"]["reason"] == (
        "holds for a, b; falls short for c (of 3 models): a: 2.50× (1 seed); b: 2.60× (1 seed); c: 1.00× (1 seed), "
        "below the claimed band; not measured: no d/amp_fp16 cell in this run")
    grouped = claimmodels._grouped_reasons
    rows = [{"model": "cnn", "reason": "cnn/amp_fp16 skipped: no GPU"},
            {"model": "transformer", "reason": "transformer/amp_fp16 skipped: no GPU"},
            {"model": "gpt", "reason": "gpt/amp_fp16 failed: OOM"}]
    assert grouped(rows[:2]) == "amp_fp16 skipped: no GPU (cnn, transformer)"
    assert grouped(rows) == "amp_fp16 skipped: no GPU (cnn, transformer); amp_fp16 failed: OOM (gpt)"
    assert grouped(rows[2:]) == "gpt/amp_fp16 failed: OOM"
    assert grouped([{"model": "x", "reason": "no reason about x/"}]) == "no reason about x/"
    assert grouped([{"model": "x", "reason": "a x/"}, {"model": "y", "reason": "a x/"}]) == "a x/ (x, y)"


def test_one_models_reasons_it_could_not_measure():
    def reason(*cells, **claimed):
        return claimmodels.evaluate_model(claim(**claimed), claimmodels._index(summary(list(cells))), "m", "fp32")

    assert reason(cell("m", "fp32")) == {"model": "m", "baseline": "fp32", "variant": "amp_fp16", "values": {},
                                         "verdict": "not_measurable", "reason": "no m/amp_fp16 cell in this run"}
    assert reason(cell("m", "amp_fp16", throughput=1))["reason"] == "no m/fp32 cell in this run"
    assert reason(cell("m", "fp32", throughput=1), cell("m", "amp_fp16", status="collapsed"))["reason"] == (
        "m/amp_fp16 collapsed (non-finite loss, seed 0)")
    assert reason(cell("m", "fp32", throughput=1), cell("m", "amp_fp16", status="collapsed", step=3))["reason"] == (
        "m/amp_fp16 collapsed (non-finite loss at step 3, seed 0)")
    assert reason(cell("m", "fp32", throughput=1), cell("m", "amp_fp16", status="skipped"))["reason"] == (
        "m/amp_fp16 skipped: no reason recorded")
    assert reason(cell("m", "fp32", status="failed", reason="OOM"), cell("m", "amp_fp16", throughput=1))["reason"] == (
        "m/fp32 failed: OOM")


def test_a_measured_models_reason_says_the_side_and_a_straddling_spread():
    cells = [cell("m", "fp32", s, throughput=100) for s in (0, 1)] + [
        cell("m", "amp_fp16", 0, throughput=190), cell("m", "amp_fp16", 1, throughput=250)]
    out = claimmodels.evaluate_model(claim(claimed={"about": 2.0}, tolerance=0.15),
                                     claimmodels._index(summary(cells)), "m", "fp32")
    assert out["reason"] == ("m: 2.20× (min–max 1.90× to 2.50×, 2 seeds), above the claimed band (the spread "
                             "straddles the band edge)")
    assert out["measured_text"] == "2.20× (min–max 1.90× to 2.50×, 2 seeds)" and out["borderline"] is True
    held = claimmodels.evaluate_model(claim(claimed={"about": 2.2}, tolerance=0.5),
                                      claimmodels._index(summary(cells)), "m", "fp32")
    assert held["reason"] == "m: 2.20× (min–max 1.90× to 2.50×, 2 seeds)" and held["borderline"] is False
    assert claimmodels.measured_text("speedup", {"median": 2.0, "min": 2.0, "max": 2.0, "n_seeds": 1}) == \
        "2.00× (1 seed)"


def test_the_setting_a_plan_ran_a_cell_at():
    setting = claimmodels.setting_text
    assert setting({"shape_name": "1B", "plan_note": ""}) == "at the 1B shape"
    assert setting({"shape_name": "1B", "plan_note": "llama 1B shape (1.2 B parameters)"}) == (
        "at the llama 1B shape (1.2 B parameters)")
    assert setting({"batch_size": 64, "preset_batch_size": 256, "plan_note": "fits in 11.5 GiB"}) == (
        "at batch 64: fits in 11.5 GiB")
    assert setting({"batch_size": 64, "preset_batch_size": 256}) == "at batch 64: "
    assert setting({"batch_size": 64, "preset_batch_size": None}) == ""
    assert setting({"batch_size": None, "preset_batch_size": 256}) == ""
    assert setting({"batch_size": 256, "preset_batch_size": 256}) == "" and setting({}) == ""


def test_a_model_whose_architecture_is_unknown_matches_by_its_own_name_only():
    assert claims.matching_models(["none", "xxxx"], ["m", "n"], {"n": "resnet"}) == []
    assert claims.matching_models(["resnet", "m"], ["m", "n"], {"n": "ResNet"}) == ["m", "n"]


def test_tensor_cores_from_the_sanity_record_or_the_gpu():
    gpu = summary([])
    assert claims.tensor_cores(TENSOR_CORES, gpu) == (True, "compute capability 9.0")
    assert claims.tensor_cores({"checks": [{"name": "Tensor Cores", "status": "pass"}]}, gpu) == (True, "")
    assert claims.tensor_cores(TENSOR_CORES_FAIL, gpu) == (False, "no Tensor Cores")
    assert claims.tensor_cores({"checks": [{"name": "Tensor Cores", "status": "fail", "detail": "sm 6.1"}]}, gpu) == (
        False, "sm 6.1")
    assert claims.tensor_cores(None, {}) == (False, "no CUDA GPU")
    assert claims.tensor_cores({"checks": [{"name": "other"}]}, gpu) == (True, "NVIDIA TEST GPU (not checked)")
    assert claimmodels.run_context({}) == "? preset on CPU"


def test_a_proxy_is_judged_with_the_sanity_record_the_data_and_its_own_name():
    c = claim(models=["llama7b"], baseline=["fp32"], requires=["tensor_cores"],
              proxy={"models": ["a", "b"], "note": "smaller models"})
    result = claims.evaluate_claim(c, summary(two_models()), TENSOR_CORES)
    alone = claims.evaluate_claim(claim(models=["a", "b"], baseline=["fp32"]), summary(two_models()), TENSOR_CORES)
    assert result["proxy"] == {"note": "smaller models", "models": ["a", "b"],
                               **{k: alone[k] for k in ("verdict", "verdict_text", "reason", "measured_text",
                                                        "by_baseline")}}
    assert (alone["verdict"], alone["measured_text"]) == ("exceeds",
                                                          "vs strict FP32: a 2.50× (1 seed), b 4.00× (1 seed)")
    assert result["verdict"] == "not_measurable"  # the proxy is context, not the claim's verdict
    no_tc = claims.evaluate_claim(c, summary(two_models()), TENSOR_CORES_FAIL)["proxy"]
    assert no_tc["verdict"] == "not_measurable" and no_tc["reason"].startswith("needs a Tensor Core GPU")
    gone = claims.evaluate_claim(c, summary([cell("x", "fp32")]), TENSOR_CORES)["proxy"]
    assert gone["reason"] == "no a/b cell ran (a/b): paper preset on NVIDIA TEST GPU (models here: x)"
    bench = claim(models=["llama7b"], baseline=["fp32"], proxy={"models": ["benchmark"], "note": "n"})
    data = {"a": "digits", "b": "synthetic_images"}
    judged = claims.evaluate_claim(bench, summary(two_models()), TENSOR_CORES, data=data)["proxy"]
    assert judged["measured_text"] == "vs strict FP32: 4.00× (1 seed)"  # b only: a is trained on real digits


def test_convergence_and_regimes_are_wired_into_the_result(monkeypatch):
    from amprepro.analysis import convergence, regimes

    seen = []

    def judge(claim_, summary_, records):
        seen.append(records)
        return verdicts.pop(0)

    monkeypatch.setattr(convergence, "judge_claim", judge)
    c = claim(models=["llama7b"], metric="accuracy_delta", claimed={"at_least": 0}, tolerance=0, baseline=["fp32"],
              convergence={"models": ["stdlib_gpt"], "margin": 0.01, "note": "n"})
    verdicts = [{"verdict": "holds", "verdict_text": "holds (x)", "reason": "r", "measured_text": "m",
                 "by_baseline": {"fp32": {}}},
                {"verdict": "not_measurable", "reason": "held-out loss cells: none"}, None]
    result = claims.evaluate_claim(c, summary([]), TENSOR_CORES, records={"stdlib_gpt": {"kind": "text"}})
    assert seen == [{"stdlib_gpt": {"kind": "text"}}]
    assert {k: result[k] for k in ("verdict", "verdict_text", "reason", "measured_text", "by_baseline",
                                   "convergence_models")} == {
        "verdict": "holds", "verdict_text": "holds (x)", "reason": "r", "measured_text": "m",
        "by_baseline": {"fp32": {}}, "convergence_models": ["stdlib_gpt"]}
    missing = claims.evaluate_claim(c, summary([]), TENSOR_CORES)
    assert missing["verdict"] == "not_measurable"
    assert missing["reason"] == ("no Model cell ran (llama7b): paper preset on NVIDIA TEST GPU (models here: none); "
                                 "held-out loss cells: none")
    assert claims.evaluate_claim(c, summary([]), TENSOR_CORES)["reason"].endswith("(models here: none)")  # None
    ran = summary([cell("llama7b", "fp32", accuracy=0.9), cell("llama7b", "amp_fp16", accuracy=0.9)])
    measured = claims.evaluate_claim(c, ran, TENSOR_CORES)
    assert measured["verdict"] == "holds" and "convergence_models" not in measured
    assert len(seen) == 3  # a claim this run measured asks no convergence cells
    monkeypatch.setattr(regimes, "for_claim", lambda claim_: {"rows": [claim_["id"]]})
    assert claims.evaluate_claim(claim(), summary([]), TENSOR_CORES)["regimes"] == {"rows": ["c"]}
    monkeypatch.setattr(regimes, "for_claim", lambda claim_: None)
    assert "regimes" not in claims.evaluate_claim(claim(), summary([]), TENSOR_CORES)


def metrics_file(runs, model, precision, seed, **fields):
    folder = runs / model / precision / f"seed{seed}"
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps(fields))


def test_the_cells_arch_data_and_data_record_are_read_from_their_metrics(tmp_path):
    runs = tmp_path / "runs"
    metrics_file(runs, "a", "fp32", 0, bad=1)
    (runs / "a" / "fp32" / "seed0" / "metrics.json").write_text("{half")  # read first; the rest still count
    metrics_file(runs, "cnn", "amp_fp16", 0, spec={"model_config": {"arch": "small_cnn", "data": "digits"}},
                 data_record={"kind": "digits"})
    metrics_file(runs, "cnn", "fp32", 0, spec={"model_config": {"arch": "later", "data": "other"}},
                 data_record={"kind": "later"})
    metrics_file(runs, "vit", "fp32", 0, spec={"model_config": {"arch": "", "data": "synthetic_images"}})
    metrics_file(runs, "bare", "fp32", 0)
    metrics_file(runs, "nocfg", "fp32", 0, spec={})
    assert claims.model_archs(runs) == {"cnn": "small_cnn"}
    assert claims.model_data(runs) == {"cnn": "digits", "vit": "synthetic_images"}
    assert claims.model_archs(str(runs)) == {"cnn": "small_cnn"}
    assert claims._model_config_field(runs, "data_record", top=True) == {"cnn": {"kind": "digits"}}
    assert claims._model_config_field(runs, "data_record") == {}
    assert claims.model_archs(tmp_path / "none") == {} and claims.model_data(None) == {}


def test_evaluate_and_evaluate_run_pass_everything_on(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(claims, "evaluate_claim", lambda c, s, sanity, archs, data=None, records=None, specs=None:
                        seen.append((c["id"], s, sanity, archs, data, records, specs)) or {"id": c["id"]})
    assert claims.evaluate([claim()], {"cells": []}, {"checks": []}, {"m": "resnet"}, {"m": "d"}, {"m": {}},
                           {"m": {"model_config": {}}}) == [{"id": "c"}]
    assert seen == [("c", {"cells": []}, {"checks": []}, {"m": "resnet"}, {"m": "d"}, {"m": {}},
                     {"m": {"model_config": {}}})]
    runs = tmp_path / "runs"
    spec = {"model_config": {"arch": "resnet", "data": "d"}}
    metrics_file(runs, "m", "fp32", 0, spec=spec, data_record={"k": 1})
    seen.clear()
    claims.evaluate_run(CLAIMS, {"cells": []}, {"checks": []}, runs)
    assert {s[0] for s in seen} == {c["id"] for c in claimfile.load_claims(CLAIMS)}
    assert seen[0][1:] == ({"cells": []}, {"checks": []}, {"m": "resnet"}, {"m": "d"}, {"m": {"k": 1}}, {"m": spec})


def test_the_command_line_prints_each_verdict_and_writes_the_json(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "claims.yaml").write_text(yaml.safe_dump({"claims": [
        {"id": "c", "source": {"file": "000.txt", "title": "t"}, "statement": "s", "model": "Model",
         "models": ["m"], "metric": "speedup", "baseline": ["fp32"], "variant": "amp_fp16",
         "claimed": {"about": 2.0}, "tolerance": 0.2, "requires": ["tensor_cores"]},
        {"id": "d", "source": {"file": "000.txt", "title": "t"}, "statement": "s", "model": "Other",
         "models": ["other"], "metric": "speedup", "baseline": ["fp32"], "variant": "amp_fp16",
         "claimed": {"about": 2.0}, "tolerance": 0.2}]}))
    for folder in ("summary", "sanity"):
        (tmp_path / "results" / folder).mkdir(parents=True)
    metrics_file(tmp_path / "results" / "runs", "m", "fp32", 0, spec={"model_config": {"arch": "other"}})
    cells = [cell("m", "fp32", throughput=100), cell("m", "amp_fp16", throughput=200)]
    (tmp_path / "results/summary/summary.json").write_text(json.dumps(summary(cells)))
    (tmp_path / "results/sanity/sanity.json").write_text(json.dumps(TENSOR_CORES_FAIL))
    claims.main(["--json", "out/claims.json"])
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "c: NOT MEASURABLE HERE — needs a Tensor Core GPU (compute capability ≥ 7.0); no Tensor Cores: paper preset on "
        "NVIDIA TEST GPU (claimed about 2.00× (accepted 1.80× to 2.20×))",
        "d: HOLDS — vs strict FP32: 2.00× (1 seed) (claimed about 2.00× (accepted 1.80× to 2.20×))"]  # m is an "other"
    written = json.loads((tmp_path / "out/claims.json").read_text())
    assert [r["id"] for r in written["claims"]] == ["c", "d"]
    assert written["counts"] == {"holds": 1, "exceeds": 0, "falls_short": 0, "depends_on_baseline": 0,
                                 "not_settled": 0, "nothing_to_rescue": 0,
                                 "not_measurable": 1}
    (tmp_path / "results/sanity/sanity.json").unlink()  # without a sanity record: the GPU counts, unchecked
    claims.main([])
    assert capsys.readouterr().out.splitlines()[0] == (
        "c: HOLDS — vs strict FP32: 2.00× (1 seed) (claimed about 2.00× (accepted 1.80× to 2.20×))")
    assert claims.summary_lines([{"id": "x", "verdict": "holds", "verdict_text": "holds vs TF32", "reason": "r",
                                  "measured_text": "m", "claimed_text": "t"}]) == ["x: HOLDS VS TF32 — m (claimed t)"]
    with pytest.raises(SystemExit):
        claims.main(["--help"])
    usage = " ".join(capsys.readouterr().out.split())
    assert "--json JSON write the evaluated claims here" in usage
    assert ("The blog posts' claims as data (config/claims.yaml), validated, and evaluated against one run of the "
            "pipeline.") in usage and "A claim names a metric" not in usage


def test_a_generic_claim_without_its_kind_of_model_says_which_kind_in_words():
    """Issue 41: "no any model (generic) cell ran (benchmark)"."""
    from amprepro.analysis.claims import no_model_ran

    claim = {"model": "any model (generic)", "models": ["benchmark"]}
    assert no_model_ran(claim, {"benchmark"}) == ("no benchmark model (synthetic data, sized for throughput) is in "
                                                  "this run")
    assert no_model_ran({"model": "any model (generic)", "models": ["any"]}, {"any"}) == "no model is in this run"
    named = {"model": "ResNet-50", "models": ["resnet50"]}
    assert no_model_ran(named, {"resnet50"}) == "no ResNet-50 cell ran (resnet50)"


def test_the_regimes_table_says_its_verdicts_are_predictions_and_that_nothing_was_measured():
    """Issue 41: beside a claim this run could not measure, the regimes table's "holds" / "falls short" read like
    results."""
    from amprepro.analysis import regimes
    from amprepro.report import reporthtml

    claim = next(c for c in claimfile.load_claims(CLAIMS) if regimes.applies_to(c))
    table = regimes.for_claim(claim)
    words = {row["predicted_verdict"] for row in table["rows"]}
    assert words <= {"holds", "exceeds", "falls_short"} and words
    view = reporthtml.regimes_view({"id": claim["id"], "verdict": "not_measurable", "regimes": table})
    assert {row["verdict"] for row in view["rows"]} <= {"would hold", "would exceed the claim", "would fall short"}
    assert view["intro"].startswith("This run measured nothing for this claim (its verdict: not measurable here)")
    measured = reporthtml.regimes_view({"id": claim["id"], "verdict": "holds", "regimes": table})
    assert measured["intro"] == table["intro"]
    result = claims.evaluate_claim(claim, json.loads((SMOKE / "summary" / "summary.json").read_text()))
    assert result["verdict"] == "not_measurable"  # the smoke run on a CPU: the report's case
    html = reporthtml.claims_detail_html([result])
    assert "This run measured nothing for this claim" in html and ("would fall short" in html or "would hold" in html)


def test_a_claim_the_seeds_do_not_settle_shows_its_numbers_and_is_counted_apart():
    from amprepro.report import reporthtml

    unsettled = {"verdict": "not_settled", "measured_text": "paired gap +1.38 % (95 % +0.04 % to +2.71 %)",
                 "reason": "stdlib_gpt/apex_o1: not settled by 8 seeds", "by_baseline": {}}
    assert reporthtml.measured_items(unsettled) == [{"kind": "why", "text": unsettled["measured_text"]}]
    counted = claims.counts([unsettled, {**unsettled, "verdict": "nothing_to_rescue"}])
    assert (counted["not_settled"], counted["nothing_to_rescue"], counted["not_measurable"]) == (1, 1, 0)

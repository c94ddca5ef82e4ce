"""One cell against the reference (amprepro.verify.cellcompare), on hand-made rows: every verdict and its note, the
band edges of both kinds, the text of a failure and the warnings over all cells. In process and fast, so that mutation
testing (docs/mutation.md) sees every line."""

from __future__ import annotations

import pytest

from amprepro.verify import cellcompare
from amprepro.verify.cellcompare import check_metric, compare, compare_cell

REL = {"rel_floor": 0.10, "k": 2}
ABS = {"abs_floor": 0.5, "k": 2}
RULES = {"throughput_per_s": REL, "final_loss": ABS}
ONE_RUN_WHY = "the floor: one run, no spread"


def stats(median, low=None, high=None, n=1) -> dict:
    return {"median": median, "min": median if low is None else low, "max": median if high is None else high, "n": n}


def here(status="ok", throughput=100.0, loss=2.0, **extra) -> dict:
    return {"model": "m", "precision": "fp32", "seed": 0, "status": status, "throughput_per_s": throughput,
            "final_loss": loss, **extra}


def ref(status="ok", throughput=100.0, loss=2.0, n_runs=1, statuses=None, **extra) -> dict:
    return {"model": "m", "precision": "fp32", "seed": 0, "status": status, "n_runs": n_runs, "n_machines": 1,
            "statuses": {status: n_runs} if statuses is None else statuses,
            "metrics": {"throughput_per_s": stats(throughput), "final_loss": stats(loss)} if status == "ok" else {},
            **extra}


def verdict(row_here, row_ref, spec_here=None, spec_ref=None, plan=None) -> tuple[str, str]:
    cell = compare_cell("m/fp32/seed0", row_here, row_ref, RULES, spec_here, spec_ref, plan)
    return cell["verdict"], cell["note"]


# ----------------------------------------------------------------------------------------------------------------------
# One metric against its band


def test_a_relative_band_its_edges_and_how_far_outside():
    inside = check_metric("throughput_per_s", REL, 90.0, stats(100.0))
    assert inside["ok"] is True and "outside_pct" not in inside
    assert check_metric("throughput_per_s", REL, 110.0, stats(100.0))["ok"] is True
    below = check_metric("throughput_per_s", REL, 89.0, stats(100.0))
    assert below["ok"] is False
    assert {k: below[k] for k in ("metric", "here", "reference", "note", "reference_runs", "reference_min",
                                  "reference_max")} == {
        "metric": "throughput_per_s", "here": 89.0, "reference": 100.0, "note": "", "reference_runs": 1,
        "reference_min": 100.0, "reference_max": 100.0}
    assert below["ratio"] == pytest.approx(0.89) and below["deviation_pct"] == pytest.approx(-11.0)
    assert below["band_ratio"] == pytest.approx([0.9, 1.1]) and below["outside_pct"] == pytest.approx(-1 / 0.9)
    assert below["allowed"] == f"0.9–1.1× reference median ({ONE_RUN_WHY})"
    assert below["band"] == {"kind": "relative", "half_width": 0.10, "from": "floor", "why": ONE_RUN_WHY, "n_runs": 1}
    above = check_metric("throughput_per_s", REL, 121.0, stats(100.0))
    assert above["ok"] is False and above["outside_pct"] == pytest.approx(10.0)
    # exactly at the edges (1 ± half-width, widened by 1e-12 for float rounding): inside
    assert check_metric("throughput_per_s", REL, 1 - 0.10 - 1e-12, stats(1.0))["ok"] is True
    assert check_metric("throughput_per_s", REL, 1 + 0.10 + 1e-12, stats(1.0))["ok"] is True
    just_above = check_metric("throughput_per_s", REL, 110.55, stats(100.0))  # 0.5 % above the upper edge
    assert just_above["outside_pct"] == pytest.approx(0.5)
    assert check_metric("throughput_per_s", REL, 89.999, stats(100.0))["ok"] is False
    assert check_metric("throughput_per_s", REL, 110.001, stats(100.0))["ok"] is False
    wide = check_metric("throughput_per_s", REL, 61.0, stats(100.0, 90.0, 110.0, n=3))  # 2 x 20 %: 0.6–1.4
    assert wide["ok"] is True and wide["allowed"] == "0.6–1.4× reference median (2 x the observed range over 3 runs)"
    assert wide["reference_runs"] == 3 and (wide["reference_min"], wide["reference_max"]) == (90.0, 110.0)


def test_an_absolute_band_its_edges_and_the_difference():
    assert check_metric("final_loss", ABS, 2.5, stats(2.0))["ok"] is True
    assert check_metric("final_loss", ABS, 1.5, stats(2.0))["ok"] is True
    assert check_metric("final_loss", ABS, 1.499, stats(2.0))["ok"] is False
    assert check_metric("final_loss", ABS, 0.5 + 1e-12, stats(0.0))["ok"] is True  # the edge, float slack included
    out = check_metric("final_loss", ABS, 2.6, stats(2.0))
    assert out["ok"] is False and out["deviation_abs"] == pytest.approx(0.6)
    assert out["allowed"] == f"±0.5 around the reference median ({ONE_RUN_WHY})"
    assert out["band_ratio"] == pytest.approx([0.75, 1.25])
    assert out["ratio"] == pytest.approx(1.3) and out["deviation_pct"] == pytest.approx(30.0)
    assert "outside_pct" not in out
    at_zero = check_metric("final_loss", ABS, 0.4, stats(0.0))  # an absolute band needs no ratio
    assert at_zero["ok"] is True and at_zero["ratio"] is None and "band_ratio" not in at_zero
    assert "deviation_pct" not in at_zero and at_zero["deviation_abs"] == pytest.approx(0.4)
    assert check_metric("final_loss", ABS, -0.6, stats(0.0))["ok"] is False


def test_a_relative_band_around_zero_asks_for_zero():
    zero = check_metric("throughput_per_s", REL, 0.0, stats(0.0))
    assert (zero["ok"], zero["note"], zero["ratio"]) == (True, "reference value is 0", None)
    assert "band_ratio" not in zero and "deviation_pct" not in zero
    assert check_metric("throughput_per_s", REL, 1.0, stats(0.0))["ok"] is False


def test_a_value_missing_on_either_side_is_not_compared():
    assert check_metric("final_loss", ABS, None, stats(2.0)) == {
        "metric": "final_loss", "here": None, "reference": 2.0, "ratio": None, "ok": None, "allowed": "",
        "note": "not recorded here", "reference_runs": 1}
    assert check_metric("final_loss", ABS, 2.0, None) == {
        "metric": "final_loss", "here": 2.0, "reference": None, "ratio": None, "ok": None, "allowed": "",
        "note": "not recorded in the reference", "reference_runs": 0}
    assert check_metric("final_loss", ABS, None, None)["note"] == "not recorded here"


# ----------------------------------------------------------------------------------------------------------------------
# What a failure says


def test_a_relative_failure_says_the_values_the_ratio_and_how_far_outside_the_band():
    check = check_metric("throughput_per_s", REL, 50.0, stats(100.0, 95.0, 105.0, n=3))
    assert cellcompare.describe_failure("m/fp32/seed0", check) == (
        "m/fp32/seed0: throughput 50.0/s vs reference median 100.0/s (runs 95.0/s–105.0/s, n=3) = 0.500× (-50.0 %, "
        "37.5 % below the band); allowed 0.8–1.2× reference median (2 x the observed range over 3 runs)")
    check = check_metric("peak_allocated_bytes", REL, 3 * 2**30, stats(2 * 2**30))
    assert cellcompare.describe_failure("c", check) == (
        "c: peak GPU memory 3.00 GiB vs reference median 2.00 GiB = 1.500× (+50.0 %, 36.4 % above the band); allowed "
        f"0.9–1.1× reference median ({ONE_RUN_WHY})")


def test_a_value_just_outside_a_band_says_which_side():
    just_above = check_metric("throughput_per_s", REL, 110.55, stats(100.0))  # 0.5 % above the upper edge
    assert cellcompare.describe_failure("c", just_above).endswith(
        f"(+10.5 %, 0.5 % above the band); allowed 0.9–1.1× reference median ({ONE_RUN_WHY})")
    just_below = check_metric("throughput_per_s", REL, 89.1, stats(100.0))  # 1 % below the lower edge
    assert cellcompare.describe_failure("c", just_below).endswith("(-10.9 %, 1.0 % below the band); allowed 0.9–1.1× "
                                                                   f"reference median ({ONE_RUN_WHY})")


def test_an_absolute_failure_says_the_difference():
    check = check_metric("final_loss", ABS, 2.75, stats(2.0, 1.95, 2.05, n=2))
    assert cellcompare.describe_failure("c", check) == (
        "c: final loss 2.75 vs reference median 2 (runs 1.95–2.05, n=2) = 1.375× (+37.5 %) (difference +0.75); "
        "allowed ±0.5 around the reference median (the floor (the 2 runs' range x 2 is smaller))")
    check = check_metric("eval_accuracy", {"abs_floor": 0.02, "k": 2}, 0.5, stats(0.0))
    assert cellcompare.describe_failure("c", check) == (
        "c: eval accuracy 0.5 vs reference median 0 (difference +0.5); allowed ±0.02 around the reference median "
        f"({ONE_RUN_WHY})")
    odd = {"metric": "skipped_steps", "here": 3, "reference": 1, "reference_runs": 1, "allowed": "a"}
    assert cellcompare.describe_failure("c", odd) == "c: skipped_steps 3 vs reference median 1; allowed a"


def test_values_are_written_in_their_unit():
    fmt = cellcompare._fmt
    assert fmt("peak_allocated_bytes", 1.5 * 2**30) == "1.50 GiB"
    assert fmt("throughput_per_s", 12345.67) == "12,345.7/s"
    assert fmt("step_time_median_s", 0.0123456) == "12.35 ms"
    assert fmt("final_loss", 2.123456) == "2.123"
    assert fmt("final_loss", None) == "n/a" and fmt("peak_allocated_bytes", None) == "n/a"


# ----------------------------------------------------------------------------------------------------------------------
# One cell's verdict


def test_a_cell_within_every_band_passes_and_one_metric_out_fails():
    cell = compare_cell("m/fp32/seed0", here(), ref(), RULES, None, None)
    assert {k: cell[k] for k in ("model", "precision", "seed", "cell", "status_here", "status_reference",
                                 "reference_runs", "reference_machines", "verdict", "note")} == {
        "model": "m", "precision": "fp32", "seed": 0, "cell": "m/fp32/seed0", "status_here": "ok",
        "status_reference": "ok", "reference_runs": 1, "reference_machines": 1, "verdict": "pass", "note": ""}
    assert [(c["metric"], c["ok"]) for c in cell["checks"]] == [("throughput_per_s", True), ("final_loss", True)]
    failing = compare_cell("m/fp32/seed0", here(loss=3.0), ref(), RULES, None, None)
    assert failing["verdict"] == "fail" and [c["ok"] for c in failing["checks"]] == [True, False]
    missing = compare_cell("m/fp32/seed0", here(loss=None), ref(), RULES, None, None)
    assert missing["verdict"] == "pass" and missing["checks"][1]["ok"] is None
    bare = {k: v for k, v in ref().items() if k != "metrics"}  # a reference row without metrics: nothing recorded
    unmeasured = compare_cell("m/fp32/seed0", here(), bare, RULES, None, None)
    assert unmeasured["verdict"] == "pass"
    assert [c["note"] for c in unmeasured["checks"]] == ["not recorded in the reference"] * 2


def test_a_cell_on_one_side_only():
    assert verdict(None, ref()) == ("not_run_here", "in the reference, not in this run's matrix")
    assert verdict(here(), None) == ("not_in_reference", "the reference has no such cell")
    cell = compare_cell("x", None, {**ref(), "model": "r", "seed": "3"}, RULES, None, None)
    assert (cell["model"], cell["seed"], cell["status_here"], cell["reference_runs"]) == ("r", 3, None, 1)
    cell = compare_cell("x", here(seed="2"), None, RULES, None, None)
    assert (cell["seed"], cell["status_reference"], cell["reference_runs"], cell["reference_machines"]) == (2, None,
                                                                                                            0, 0)


def test_a_cell_every_reference_run_failed():
    failed_ref = ref(status="failed", n_runs=0, statuses={}, reason="CUDA error in the reference")
    assert verdict(here(), failed_ref) == (
        "not_in_reference", "every reference run failed this cell, so there is nothing to compare: CUDA error in the "
                            "reference")
    assert verdict(here(status="failed", reason="CUDA error here"), failed_ref) == (
        "fail", "failed here and in every reference run: CUDA error here")


def test_other_settings_are_not_comparable_and_a_lowered_preset_batch_is_not_comparable_here():
    spec = {"model_config": {"batch_size": 256, "arch": "resnet50"}, "train": {"steps": 40}}
    lowered = {**spec, "model_config": {"batch_size": 64, "arch": "resnet50"}}
    plan = {"source": "preset", "why": "64 fits in 11.5 GiB"}
    assert verdict(here(), ref(), lowered, spec, plan) == (
        "not_comparable_here", "not comparable here (planned batch 64, reference 256): 64 fits in 11.5 GiB")
    assert verdict(here(), ref(), lowered, spec, {**plan, "source": "config"}) == (
        "not_comparable", "settings differ: model_config.batch_size 256 in the reference, 64 here")
    assert verdict(here(), ref(), lowered, spec, None)[0] == "not_comparable"
    longer = {**lowered, "train": {"steps": 80}}
    assert verdict(here(), ref(), longer, spec, plan) == (
        "not_comparable", "settings differ: model_config.batch_size 256 in the reference, 64 here; train.steps 40 in "
                          "the reference, 80 here")
    assert verdict(here(), ref(), spec, spec, plan)[0] == "pass"
    assert verdict(here(), ref(), None, spec)[0] == "pass" and verdict(here(), ref(), spec, None)[0] == "pass"


def test_without_this_runs_specs_the_summary_rows_batch_and_shape_are_checked():
    spec = {"model_config": {"batch_size": 256, "arch": "resnet50"}, "train": {"steps": 40}}
    assert verdict(here(batch_size=256, shape=None), ref(), None, spec)[0] == "pass"
    assert verdict(here(batch_size="256", shape=""), ref(), None, spec)[0] == "pass"  # summary.csv's text, no shape
    assert verdict(here(batch_size=176, shape=None), ref(), None, spec) == (
        "not_comparable", "settings differ (this run's summary; give its runs folder for every setting): "
                          "model_config.batch_size 256 in the reference, 176 here")
    llama = {"model_config": {"batch_size": 1, "arch": "llama"}}
    assert verdict(here(batch_size=1, shape="tinyllama_1b"), ref(), None, llama)[1].endswith(
        "model_config.shape None in the reference, 'tinyllama_1b' here")
    assert verdict(here(batch_size=2, shape="tinyllama_1b"), ref(), None, llama)[1].endswith(
        "setting): model_config.batch_size 1 in the reference, 2 here; model_config.shape None in the reference, "
        "'tinyllama_1b' here")
    assert cellcompare.summary_difference(here(shape="tinyllama_1b"), llama) == [  # no batch column: the shape still
        "model_config.shape None in the reference, 'tinyllama_1b' here"]
    assert cellcompare.summary_difference(here(), llama) == []  # a row without the columns: nothing to check
    assert verdict(here(batch_size=176), ref(), None, None)[0] == "pass"  # no reference spec either


def test_a_cell_this_machine_or_the_references_cannot_run_is_not_comparable_here():
    skip = {"status": "skipped", "skip_cause": "machine"}
    assert verdict(here(**skip, reason="needs 2 GPUs"), ref()) == (
        "not_comparable_here", "this machine cannot run it: needs 2 GPUs")
    assert verdict(here(**skip, reason="", skip_needs="bf16"), ref()) == (
        "not_comparable_here", "this machine cannot run it: bf16")
    assert verdict(here(), ref(status="skipped", skip_cause="machine", reason="no apex there", n_runs=0,
                          statuses={})) == ("not_comparable_here", "no reference machine could run it: no apex there")
    # skipped for the machine on both sides, or here for software where no reference machine could run it: nothing
    # was compared, so not a pass (a capped card whose reference skipped the same cells once got a PASS about nothing)
    machine_ref = ref(status="skipped", skip_cause="machine", reason="needs 2 GPUs there", n_runs=0, statuses={})
    assert verdict(here(**skip, reason="needs 2 GPUs"), machine_ref) == (
        "not_comparable_here", "this machine cannot run it: needs 2 GPUs")
    assert verdict(here(status="skipped", skip_cause="software", reason="no torchvision"), machine_ref) == (
        "not_comparable_here", "no reference machine could run it: needs 2 GPUs there")
    software_ref = ref(status="skipped", skip_cause="software", reason="no apex", statuses={"skipped": 1})
    assert verdict(here(**skip, reason="no bf16"), software_ref) == ("not_comparable_here",
                                                                    "this machine cannot run it: no bf16")
    # skipped for another reason here: a failure, named with the reason
    assert verdict(here(status="skipped", skip_cause="software", reason="no torchvision"), ref()) == (
        "fail", "status skipped here, 1 ok in the reference (no torchvision)")
    assert cellcompare._machine_skip({"status": "skipped", "skip_cause": "machine"}) is True
    assert cellcompare._machine_skip({"status": "failed", "skip_cause": "machine"}) is False
    assert cellcompare._machine_skip({"status": "skipped", "skip_cause": None}) is False
    assert cellcompare._machine_skip(None) is False and cellcompare._machine_skip({}) is False


def test_a_status_the_reference_never_had_fails_and_names_what_it_had():
    assert verdict(here(status="collapsed"), ref()) == ("fail", "status collapsed here, 1 ok in the reference")
    assert verdict(here(), ref(status="collapsed", reason="loss went NaN at step 3")) == (
        "fail", "status ok here, 1 collapsed in the reference (loss went NaN at step 3)")
    mixed = ref(statuses={"ok": 2, "collapsed": 1}, n_runs=3)
    assert verdict(here(status="failed"), mixed) == ("fail", "status failed here, 2 ok, 1 collapsed in the reference")
    assert verdict(here(status="failed"), {**ref(), "statuses": {}}) == (
        "fail", "status failed here, ok in the reference")


def test_the_same_status_that_is_not_ok_matches_and_runs_that_disagree_are_noted():
    assert verdict(here(status="collapsed", throughput=1.0), ref(status="collapsed")) == (
        "pass", "collapsed here and in the reference")
    cell = compare_cell("c", here(), ref(statuses={"ok": 2, "collapsed": 1}, n_runs=3), RULES, None, None)
    assert cell["verdict"] == "pass" and len(cell["checks"]) == 2
    assert cell["note"] == "the reference runs disagree on this cell's status: 2 ok, 1 collapsed"
    assert compare_cell("c", here(status="collapsed"), ref(statuses={"ok": 2, "collapsed": 1}), RULES, None,
                        None)["verdict"] == "pass"


# ----------------------------------------------------------------------------------------------------------------------
# Spec differences


def test_settings_differences_are_named_key_by_key_nested_and_sorted():
    assert cellcompare._spec_diff({"b": 1, "a": {"x": 1, "y": 2}, "c": 3}, {"b": 2, "a": {"x": 1, "y": 3}, "d": 4}) == [
        "a.y 3 in the reference, 2 here", "b 2 in the reference, 1 here", "c None in the reference, 3 here",
        "d 4 in the reference, None here"]
    assert cellcompare._spec_diff({"a": {"x": 1}}, {"a": 5}) == ["a 5 in the reference, {'x': 1} here"]
    assert cellcompare._spec_diff({"a": "s"}, {"a": "t"}, "p.") == ["p.a 't' in the reference, 's' here"]


def test_a_planned_difference_is_only_the_preset_plans_batch_or_shape():
    spec = {"model": "m", "model_config": {"batch_size": 8, "shape": None, "arch": "llama"}, "train": {"steps": 4}}
    both = {**spec, "model_config": {"batch_size": 2, "shape": "1b", "arch": "llama"}}
    plan = {"source": "preset", "shape_name": "llama 1B"}
    planned = cellcompare.planned_difference
    assert planned(both, spec, plan) == "planned shape llama 1B, reference the 7B, planned batch 2, reference 8"
    assert planned(both, {**spec, "model_config": {**spec["model_config"], "shape": "3b"}}, {"source": "preset"}) == (
        "planned shape 1b, reference 3b, planned batch 2, reference 8")
    shape_only = {**spec, "model_config": {**spec["model_config"], "shape": "1b"}}
    assert planned(shape_only, spec, plan) == "planned shape llama 1B, reference the 7B"
    batch_only = {**spec, "model_config": {**spec["model_config"], "batch_size": 2}}
    assert planned(batch_only, spec, plan) == "planned batch 2, reference 8"
    assert planned(batch_only, spec, None) is None and planned(batch_only, spec, {}) is None
    assert planned(batch_only, spec, {"source": "config"}) is None
    assert planned(spec, spec, plan) is None  # nothing the plan changes differs
    other = {**batch_only, "model_config": {**batch_only["model_config"], "arch": "gpt"}}
    assert planned(other, spec, plan) is None  # and something else differs too
    assert planned({**batch_only, "train": {"steps": 8}}, spec, plan) is None
    assert planned({"train": 1}, {"train": 2}, plan) is None  # no model_config on either side: nothing planned
    assert spec["model_config"] == {"batch_size": 8, "shape": None, "arch": "llama"}  # the inputs are not changed
    assert both["model_config"] == {"batch_size": 2, "shape": "1b", "arch": "llama"}


# ----------------------------------------------------------------------------------------------------------------------
# All cells


def summary_of(*rows) -> dict:
    return {"cells": [dict(r) for r in rows]}


def aggregate_of(*rows) -> dict:
    return {"cells": {f"{r['model']}/{r['precision']}/{int(r['seed'])}": r for r in rows}}


TOLERANCES = {"metrics": {"throughput_per_s": REL}, "overrides": [
    {"match": {"precision": ["amp_bf16"], "seed": [1]}, "metrics": {"throughput_per_s": {"rel_floor": 0.5, "k": 2}}}]}


def test_compare_goes_over_this_runs_cells_then_the_references_and_counts_each_verdict():
    bf16 = {"precision": "amp_bf16"}
    outcome = compare(summary_of(here(throughput=50.0), {**here(**bf16), "seed": 1, "throughput_per_s": 60.0},
                                 {**here(), "model": "new"}),
                      aggregate_of(ref(), {**ref(**bf16), "seed": 1}, {**ref(), "model": "old"}), TOLERANCES)
    assert [(c["cell"], c["verdict"]) for c in outcome["cells"]] == [
        ("m/fp32/seed0", "fail"), ("m/amp_bf16/seed1", "pass"), ("new/fp32/seed0", "not_in_reference"),
        ("old/fp32/seed0", "not_run_here")]
    assert outcome["counts"] == {"pass": 1, "fail": 1, "not_comparable_here": 0, "not_comparable": 0,
                                 "not_in_reference": 1, "not_run_here": 1}
    assert outcome["failures"] == [cellcompare.describe_failure("m/fp32/seed0", outcome["cells"][0]["checks"][0])]
    assert [c["metric"] for c in outcome["cells"][0]["checks"]] == ["throughput_per_s"]  # the tolerances' metrics
    assert outcome["cells"][1]["checks"][0]["band"]["half_width"] == 0.5  # the override for amp_bf16, seed 1
    assert outcome["warnings"] == ["1 cell(s) of this run are not in the reference",
                                   "1 reference cell(s) did not run here"]


def test_a_failure_without_a_metric_out_of_band_is_named_by_its_note():
    outcome = compare(summary_of(here(status="failed", reason="OOM")), aggregate_of(ref()), TOLERANCES)
    assert outcome["failures"] == ["m/fp32/seed0: status failed here, 1 ok in the reference (OOM)"]
    assert outcome["counts"]["fail"] == 1 and outcome["warnings"] == []


def test_compare_uses_this_runs_specs_and_plans_and_the_references_spec():
    spec = {"model_config": {"batch_size": 256}}
    lowered = {"model_config": {"batch_size": 64}}
    row_ref = {**ref(), "spec": spec}
    plan = {"m/fp32/0": {"source": "preset", "why": "fits"}}
    outcome = compare(summary_of(here()), aggregate_of(row_ref), TOLERANCES, {"m/fp32/0": lowered}, plan)
    assert outcome["cells"][0]["verdict"] == "not_comparable_here"
    assert outcome["warnings"] == ["1 cell(s) not comparable here, not counted as failures: m/fp32/seed0 (not "
                                   "comparable here (planned batch 64, reference 256): fits)"]
    outcome = compare(summary_of(here()), aggregate_of(row_ref), TOLERANCES, {"m/fp32/0": lowered})
    assert outcome["cells"][0]["verdict"] == "not_comparable"
    assert outcome["warnings"] == ["1 cell(s) not compared: their settings differ from the reference's"]
    assert compare(summary_of(here()), aggregate_of(row_ref), TOLERANCES, {"m/fp32/0": spec})["counts"]["pass"] == 1
    assert compare(summary_of(here()), aggregate_of(row_ref), TOLERANCES)["counts"]["pass"] == 1
    assert compare({}, {}, TOLERANCES) == {"cells": [], "failures": [], "warnings": [], "counts": {
        v: 0 for v in cellcompare.VERDICTS}}


def test_the_warnings_count_and_list_each_kind():
    cells = [{"cell": "a", "verdict": "not_comparable_here", "note": "n1"},
             {"cell": "b", "verdict": "pass", "note": "ignored"},
             {"cell": "c", "verdict": "not_comparable_here", "note": "n2"}]
    counts = {"not_comparable_here": 2, "not_comparable": 3, "not_in_reference": 4, "not_run_here": 5}
    assert cellcompare.comparison_warnings(cells, counts) == [
        "2 cell(s) not comparable here, not counted as failures: a (n1); c (n2)",
        "3 cell(s) not compared: their settings differ from the reference's",
        "4 cell(s) of this run are not in the reference",
        "5 reference cell(s) did not run here"]
    assert cellcompare.comparison_warnings([], dict.fromkeys(counts, 0)) == []


def test_other_step_counts_compare_speed_and_memory_not_the_loss():
    spec = {"model_config": {"batch_size": 128, "arch": "vit_b_16"}, "train": {"steps": 30, "warmup_steps": 10}}
    fewer = {**spec, "train": {"steps": 13, "warmup_steps": 3}}
    cell = compare_cell("m/fp32/seed0", here(loss=9.0), ref(), RULES, fewer, spec)
    assert (cell["verdict"], cell["note"]) == ("pass", "")
    throughput, loss = cell["checks"]
    assert throughput["metric"] == "throughput_per_s" and throughput["ok"] is True
    assert loss == {"metric": "final_loss", "here": 9.0, "reference": None, "ratio": None, "ok": None, "allowed": "",
                    "note": "not compared: the reference ran 10 warm-up + 20 timed steps, this run 3 warm-up + 10 "
                            "timed, which none of its runs ran (speed and memory are compared)", "reference_runs": 0}
    slow = compare_cell("m/fp32/seed0", here(throughput=50.0), ref(), RULES, fewer, spec)
    assert slow["verdict"] == "fail" and slow["checks"][0]["ok"] is False
    other = {**fewer, "train": {"steps": 13, "warmup_steps": 3, "lr": 0.1}}
    assert compare_cell("m/fp32/seed0", here(), ref(), RULES, other, spec)["verdict"] == "not_comparable"
    result = compare({"cells": [here(loss=9.0)]}, {"cells": {"m/fp32/0": {**ref(), "spec": spec}}},
                     {"metrics": RULES}, {"m/fp32/0": fewer})
    assert result["counts"]["pass"] == 1 and result["warnings"] == [
        "1 cell(s) compared on speed and memory only: the reference has no run at their step counts, so their final "
        "loss is not compared (promote this run to add it)"]


def test_from_a_summary_alone_its_step_columns_say_whether_the_loss_is_compared():
    spec = {"model_config": {"batch_size": 128, "arch": "vit_b_16"}, "train": {"steps": 13, "warmup_steps": 3}}
    old = compare_cell("m/fp32/seed0", here(loss=9.0, steps="30", warmup_steps="10"), ref(), RULES, None, spec)
    assert old["verdict"] == "pass" and old["checks"][1]["note"] == (
        "not compared: the reference ran 3 warm-up + 10 timed steps, this run 10 warm-up + 20 timed, which none of its "
        "runs ran (speed and memory are compared)")
    assert compare_cell("m/fp32/seed0", here(loss=9.0, steps=13, warmup_steps=3), ref(), RULES, None,
                        spec)["verdict"] == "fail"
    # A summary without the columns (before 2026-12-04) is compared on everything, as it always was.
    assert compare_cell("m/fp32/seed0", here(loss=9.0), ref(), RULES, None, spec)["verdict"] == "fail"
    assert compare_cell("m/fp32/seed0", here(loss=9.0, steps="", warmup_steps=""), ref(), RULES, None,
                        spec)["verdict"] == "fail"


@pytest.mark.parametrize("busy, said", [(6.04, True), (1.0, True), (0.99, False), (None, False), ("", False)])
def test_a_timing_failure_says_how_busy_the_host_was_while_the_cell_was_timed(busy, said):
    """A cell timed beside a compile (its summary row's host_busy_cpus, from its host_load) fails with that context;
    its loss failure does not get it, and a quiet host or a row without the field adds nothing."""
    outcome = compare(summary_of(here(throughput=50.0, loss=9.0, host_busy_cpus=busy)), aggregate_of(ref()),
                      {"metrics": RULES})
    speed, loss = outcome["failures"]
    assert speed.startswith("m/fp32/seed0: throughput") and loss.startswith("m/fp32/seed0: final loss")
    note = f"; measured while other processes kept {float(busy or 0):.1f} CPUs busy (the cell's host_load"
    assert (note in speed) is said and speed.endswith("on a quiet machine it may pass") is said
    assert "CPUs busy" not in loss


@pytest.mark.parametrize("p90, ref_p90, throughput, said", [
    (0.2959, None, 50.0, True), (0.2625, None, 50.0, True), (0.2624, None, 50.0, False), (None, None, 50.0, False),
    ("", None, 50.0, False),
    (0.2959, 0.3500, 50.0, False),  # the reference's steps are as far apart (a launch-bound model): nothing to say
    (0.2959, 0.2550, 50.0, True), (0.2959, 0.2850, 50.0, False),
    (0.2959, None, 150.0, False)])  # faster than the band: slow steps did not do that
def test_a_slow_timing_failure_says_when_its_timed_steps_were_further_apart_than_the_references(p90, ref_p90,
                                                                                                 throughput, said):
    """A cell whose timed steps were far apart (p90 over the median step time) against the reference runs' (the same
    over their medians; 1.0 without them), by 0.05 or more, fails slow with that context, as llama7b/apex_o1 did on an
    H100 at 2 + 4 steps (1.077); its loss failure, and a failure above the band, do not get it."""
    extra = {} if ref_p90 is None else {"step_time_median_s": stats(0.25), "step_time_p90_s": stats(ref_p90)}
    reference = ref()
    reference["metrics"].update(extra)
    outcome = compare(summary_of(here(throughput=throughput, loss=9.0, step_time_median_s=0.25,
                                      step_time_p90_s=p90)), aggregate_of(reference), {"metrics": RULES})
    speed, loss = outcome["failures"]
    assert ("; its timed steps were uneven (the slowest tenth" in speed) is said
    if said and ref_p90 is None:
        assert "18.4 % above their median, 0.0 % in the reference" in speed or "5.0 % above" in speed
    assert "uneven" not in loss

"""amprepro.analysis.claimmetrics on its own: each metric's value for one seed's pair of cells, the bigger-batch claim's
interval (largest_batch_bounds, batch_ratio, metric_bounds, decided_value), the claimed band and verdict at its
edges, and how values and bands are written. Every expected value is worked out by hand from the inputs here."""

from __future__ import annotations

import math

import pytest

from amprepro.analysis import claimmetrics as cm

INF = float("inf")


def cell(precision="amp_fp16", model="vit", **values):
    return {"model": model, "precision": precision, "seed": 0, "status": "ok", **values}


def search(precision, largest, bound="exact", failing=None, grid=None):
    return cell(precision, largest_batch=largest, largest_batch_bound=bound, largest_batch_failing=failing,
                largest_batch_grid=grid)


def claim(metric="speedup", tolerance=0.0, **claimed):
    return {"id": "c", "metric": metric, "claimed": claimed, "tolerance": tolerance}


def test_each_metric_of_one_pair_of_cells():
    assert cm.metric_value("speedup", cell(throughput_per_s=300.0), cell(throughput_per_s=120.0)) == (2.5, "")
    assert cm.metric_value("speedup", cell(throughput_per_s=300.0), cell()) == (None, "no throughput recorded")
    assert cm.metric_value("speedup", cell(), cell(throughput_per_s=1.0)) == (None, "no throughput recorded")
    value, why = cm.metric_value("memory_reduction", cell(peak_allocated_bytes=600), cell(peak_allocated_bytes=800))
    assert value == pytest.approx(0.25) and why == ""  # 1 - 600/800
    rss = ("peak memory here is the CPU process RSS, not the GPU allocator peak the claim is about")
    assert cm.metric_value("memory_reduction", cell(peak_rss_bytes=600), cell(peak_rss_bytes=800)) == (None, rss)
    # either side's RSS alone is enough to say so
    assert cm.metric_value("memory_reduction", cell(peak_allocated_bytes=600), cell(peak_rss_bytes=9)) == (None, rss)
    assert cm.metric_value("memory_reduction", cell(peak_rss_bytes=9), cell()) == (None, rss)
    assert cm.metric_value("memory_reduction", cell(), cell(peak_allocated_bytes=800)) == (
        None, "no peak memory recorded")
    assert cm.metric_value("memory_reduction", cell(peak_allocated_bytes=600), cell()) == (
        None, "no peak memory recorded")
    value, why = cm.metric_value("accuracy_delta", cell(eval_accuracy=0.91), cell(eval_accuracy=0.935))
    assert value == pytest.approx(-0.025) and why == ""
    assert cm.metric_value("accuracy_delta", cell(eval_accuracy=0.0), cell(eval_accuracy=0.0)) == (0.0, "")
    assert cm.metric_value("accuracy_delta", cell(model="gpt"), cell(eval_accuracy=0.5)) == (
        None, "no eval accuracy: gpt trains on synthetic tensors here (throughput only)")
    assert cm.metric_value("accuracy_delta", cell(eval_accuracy=0.5), cell())[0] is None
    with pytest.raises(ValueError, match="unknown metric energy"):
        cm.metric_value("energy", cell(), cell())


def test_the_largest_batch_columns_of_a_search_record():
    record = {"largest_batch": 640, "bound": "at_least", "smallest_failing_batch": 704, "grid_step": 32}
    assert cm.largest_batch_fields(record) == {"largest_batch": 640, "largest_batch_bound": "at_least",
                                               "largest_batch_failing": 704, "largest_batch_grid": 32}
    assert cm.largest_batch_fields({"largest_batch": 8, "bound": "exact"}) == {
        "largest_batch": 8, "largest_batch_bound": "exact", "largest_batch_failing": None,
        "largest_batch_grid": None}
    assert cm.largest_batch_fields(None) == dict.fromkeys(
        ["largest_batch", "largest_batch_bound", "largest_batch_failing", "largest_batch_grid"])


@pytest.mark.parametrize("row, bounds", [
    (search("fp32", 200, "exact"), (200, 200)),
    (search("fp32", 200, "capped"), (200, INF)),                               # fits at the cap: at least the cap
    (search("fp32", 200, "at_least", failing=264, grid=32), (200, 232)),       # one grid step under the failure
    (search("fp32", 200, "at_least", failing=208), (200, 207)),                # no grid recorded: a step of 1
    (search("fp32", 200, "at_least"), (200, INF)),                             # nothing failed
    (search("fp32", 200, "capped", failing=264, grid=32), (200, INF)),         # only at_least uses the failure
    (search("fp32", None), (None, None)),
    (search("fp32", 0, "exact"), (None, None)),
    (cell("fp32"), (None, None)),
])
def test_where_the_largest_batch_lies(row, bounds):
    assert cm.largest_batch_bounds(row) == bounds


def test_the_batch_ratio_is_the_interval_of_the_two_searches():
    # variant 300..(400 - 10) over baseline 150..(200 - 50): 300/150 to 390/150 ... low is v_low / b_high
    variant = search("apex_o1", 300, "at_least", failing=400, grid=10)
    baseline = search("fp32", 150, "at_least", failing=200, grid=50)
    assert cm.batch_ratio(variant, baseline) == (300 / 150, 390 / 150, "")
    baseline = search("fp32", 120, "at_least", failing=200, grid=50)   # 120..150
    assert cm.batch_ratio(variant, baseline) == (300 / 150, 390 / 120, "")
    low, high, why = cm.batch_ratio(search("apex_o1", None), baseline)
    assert (low, high) == (None, None) and why == ("no largest-batch search for vit here (runs.largest_batch.models; "
                                                   "it runs on a GPU, after the cells)")
    assert cm.batch_ratio(variant, search("fp32", None))[:2] == (None, None)
    assert cm.metric_value("batch_ratio", search("apex_o1", 300), search("fp32", 200)) == (1.5, "")
    assert cm.metric_value("batch_ratio", variant, baseline) == (
        None, "the searches leave an interval: metric_bounds")
    assert cm.metric_value("batch_ratio", search("apex_o1", None), baseline)[1].startswith("no largest-batch search")


def test_metric_bounds_are_a_point_but_for_the_batch_ratio():
    assert cm.metric_bounds("speedup", cell(throughput_per_s=3.0), cell(throughput_per_s=2.0)) == (1.5, 1.5, "")
    assert cm.metric_bounds("speedup", cell(), cell()) == (None, None, "no throughput recorded")
    capped = search("apex_o1", 400, "capped")
    assert cm.metric_bounds("batch_ratio", capped, search("fp32", 200)) == (2.0, INF, "")
    # the baseline found no batch that fails: the ratio is 0..inf, no bound at all
    low, high, why = cm.metric_bounds("batch_ratio", capped, search("fp32", 200, "at_least"))
    assert (low, high) == (None, None)
    assert why == ("neither search bounds the ratio (apex_o1: capped at 400, nothing larger tried; fp32: at_least at "
                   "200, nothing larger tried): the fp32 search found no batch that fails, so no ratio")
    # bounded from above only (low 0) is still an interval
    assert cm.metric_bounds("batch_ratio", search("apex_o1", 300), search("fp32", 300, "at_least")) == (0.0, 1.0, "")
    assert cm.metric_bounds("batch_ratio", search("apex_o1", None), search("fp32", 300))[:2] == (None, None)


def test_a_search_is_written_as_its_answer():
    assert cm.search_text(search("fp32", 616)) == "fp32: 616"
    assert cm.search_text(search("fp32", 616, "at_least", failing=640, grid=8)) == (
        "fp32: at_least at 616, fails at 640")
    assert cm.search_text(search("fp32", 616, "capped")) == "fp32: capped at 616, nothing larger tried"


BIGGER = claim("batch_ratio", at_least=1.1)


@pytest.mark.parametrize("low, high, decided", [
    (1.2, 1.2, 1.2), (0.9, 0.9, 0.9),
    (1.2, INF, 1.2),     # holds everywhere: the lower end, nearer the band
    (0.5, 1.0, 1.0),     # falls short everywhere: the upper end, the most favourable reading
    (1.0, 1.3, None),    # straddles the band's edge
])
def test_an_interval_is_decided_by_its_end_nearer_the_band(low, high, decided):
    assert cm.decided_value(BIGGER, low, high) == decided


def test_on_a_lower_is_better_metric_the_least_favourable_end_is_the_other_one(monkeypatch):
    monkeypatch.setitem(cm.HIGHER_IS_BETTER, "batch_ratio", False)
    # the band is [1.1, inf); lower is now better, so a value below it exceeds the claim
    assert cm.verdict_for(BIGGER, 1.2) == "holds" and cm.verdict_for(BIGGER, 1.0) == "exceeds"
    assert cm.decided_value(BIGGER, 1.2, 1.5) == 1.5  # holds: the worse (higher) end
    assert cm.decided_value(BIGGER, 0.5, 1.0) == 1.0  # exceeds: the end nearer the band


@pytest.mark.parametrize("claimed, tolerance, band", [
    ({"about": 2.0}, 0.25, (1.75, 2.25)),
    ({"at_least": 1.5}, 0.1, (1.4, INF)),
    ({"at_most": 0.5}, 0.1, (-INF, 0.6)),
    ({"between": [1.2, 1.8]}, 0.05, (1.15, 1.85)),
    ({"between": [1.2, 1.8]}, 0.0, (1.2, 1.8)),
])
def test_the_claimed_band_widens_the_claim_by_its_tolerance(claimed, tolerance, band):
    low, high = cm.claimed_band(claim(tolerance=tolerance, **claimed))
    assert low == pytest.approx(band[0]) and high == pytest.approx(band[1])


@pytest.mark.parametrize("value, verdict, side", [
    (1.5, "holds", "in the band"), (2.0, "holds", "in the band"),            # both edges are in the band
    (1.5 - 5e-10, "holds", "below the claimed band"),                        # within EPS (1e-9) of the edge
    (2.0 + 5e-10, "holds", "above the claimed band"),
    (1.5 - 2e-9, "falls_short", "below the claimed band"),
    (2.0 + 2e-9, "exceeds", "above the claimed band"),
    (0.5, "falls_short", "below the claimed band"), (9.0, "exceeds", "above the claimed band"),
])
def test_the_verdict_and_side_at_the_bands_edges(value, verdict, side):
    c = claim(between=[1.5, 2.0])
    assert cm.verdict_for(c, value) == verdict and cm.in_band(c, value) == (verdict == "holds")
    assert cm.band_side(c, value) == side


def test_the_band_includes_its_edges_widened_by_eps_exactly():
    c = claim(between=[1.5, 2.0])
    assert cm.in_band(c, 1.5 - cm.EPS) and cm.in_band(c, 2.0 + cm.EPS)
    assert cm.verdict_for(c, 1.5 - cm.EPS) == "holds" and cm.verdict_for(c, 2.0 + cm.EPS) == "holds"


def test_on_memory_and_accuracy_above_the_band_is_better():
    memory = claim("memory_reduction", at_most=0.3)
    assert cm.verdict_for(memory, 0.5) == "exceeds" and cm.verdict_for(memory, 0.2) == "holds"
    accuracy = claim("accuracy_delta", about=0.0, tolerance=0.005)
    assert cm.verdict_for(accuracy, -0.01) == "falls_short" and cm.verdict_for(accuracy, 0.01) == "exceeds"


@pytest.mark.parametrize("metric, value, text", [
    ("speedup", 1.234, "1.23×"), ("speedup", None, "n/a"),
    ("memory_reduction", 0.25, "−25.0 %"), ("memory_reduction", -0.125, "+12.5 %"),
    ("accuracy_delta", -0.0123, "−1.23 pp"), ("accuracy_delta", 0.005, "+0.50 pp"),
    ("batch_ratio", 1.5, "1.50× the batch"), ("batch_ratio", INF, "unbounded"),
    ("other", 1234.5678, "1.23e+03"),
])
def test_values_are_written_in_their_metrics_unit(metric, value, text):
    assert cm.fmt_value(metric, value) == text


def test_the_claim_is_written_with_its_accepted_band():
    assert cm.claimed_text(claim(about=2.0, tolerance=0.25)) == "about 2.00× (accepted 1.75× to 2.25×)"
    assert cm.claimed_text(claim(at_least=1.5, tolerance=0.1)) == "at least 1.50× (accepted from 1.40×)"
    assert cm.claimed_text(claim(at_least=1.5)) == "at least 1.50×"
    assert cm.claimed_text(claim("memory_reduction", at_most=0.3, tolerance=0.05)) == (
        "at most −30.0 % (accepted to −35.0 %)")
    assert cm.claimed_text(claim(at_most=3.0)) == "at most 3.00×"
    assert cm.claimed_text(claim(between=[1.2, 1.8], tolerance=0.1)) == "1.20× to 1.80× (accepted 1.10× to 1.90×)"
    assert cm.claimed_text(claim(between=[1.2, 1.8])) == "1.20× to 1.80×"
    assert cm.fmt_range("speedup", 1.0, 2.0) == "1.00× to 2.00×"
    assert math.isinf(cm.claimed_band(claim(at_least=1.0))[1])

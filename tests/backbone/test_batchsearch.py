"""The largest-batch search (issue 21, item 3): the search on fake cards, its guess, the config that asks for it, the
claim metric and the summary and report that carry it. The GPU part (one real step per try) runs on a GPU only."""

from __future__ import annotations

from pathlib import Path

import pytest

from amprepro import config as cfg
from amprepro import memory
from amprepro.analysis import claimmetrics, claimmodels, summary
from amprepro.cellid import CellId
from amprepro.cellspec import CellSpec
from amprepro.report import reporthtml
from amprepro.train import batchsearch


@pytest.fixture(autouse=True)
def estimates_end(monkeypatch):
    """memory.estimate, failing after 2,000 calls in one test (a bisection of batchsearch's asks a dozen): a bisection
    that never ends fails, not hangs."""
    from amprepro import memory as memory_model

    real, calls = memory_model.estimate, []

    def estimate(*args, **kwargs):
        calls.append(1)
        if len(calls) > 2000:
            raise AssertionError("the bisection on the memory model does not end")
        return real(*args, **kwargs)

    monkeypatch.setattr(memory_model, "estimate", estimate)


def card(limit, calls=None):
    """A fake card where a batch fits when it is at most `limit`; records the batches tried. A search that tries more
    than 64 batches fails (every search here needs at most 16): a search that never ends fails, not hangs."""
    tried = []

    def trial(batch):
        tried.append(batch)
        if len(tried) > 64:
            raise AssertionError(f"the search does not end: {tried[:8]} ...")
        if calls is not None:
            calls.append(batch)
        return batch <= limit, batch * 1000, "" if batch <= limit else "CUDA out of memory (fake)"
    return trial


@pytest.mark.parametrize("limit, guess", [(1000, 960), (1000, 2000), (1000, 256), (1000, 1000), (263, 300),
                                          (256, 256), (1003, 1003)])
def test_the_answer_is_the_largest_batch_on_the_grid_that_fits(limit, guess):
    calls = []
    s = batchsearch.search(card(limit, calls), planned=256, up_to_factor=8, guess=guess, seconds=60)
    assert s.bound == "exact", s.why
    assert s.largest == limit // 8 * 8 and s.smallest_failing == s.largest + 8
    assert all(b % 8 == 0 and 256 < b <= 2048 for b in calls)  # on the grid, above the known fit, within the cap
    assert len(calls) == len(set(calls))  # no batch tried twice
    assert [t["batch"] for t in s.tries] == calls and all(t["fits"] == (t["batch"] <= limit) for t in s.tries)


def test_a_good_guess_takes_two_tries_and_a_bad_one_stays_logarithmic():
    assert len(batchsearch.search(card(1000), 256, 8, 1000, 60).tries) == 2
    assert len(batchsearch.search(card(1000), 256, 8, 2040, 60).tries) <= 16


def test_after_a_fitting_guess_the_batch_expected_to_fail_brackets_the_answer():
    calls = []
    s = batchsearch.search(card(1003, calls), 256, 8, guess=960, seconds=60, over=1040)
    assert calls[:2] == [960, 1040] and (s.largest, s.bound) == (1000, "exact")
    calls = []
    batchsearch.search(card(1100, calls), 256, 8, guess=960, seconds=60, over=1040)  # the model was low: walk on
    assert calls[:3] == [960, 1040, 1056]
    calls = []
    batchsearch.search(card(900, calls), 256, 8, guess=960, seconds=60, over=1040)  # the guess failed: over unused
    assert 1040 not in calls


def test_a_search_its_time_cuts_short_keeps_the_batch_that_failed(monkeypatch):
    clock = iter(range(0, 10_000, 5))  # every try takes 5 s
    monkeypatch.setattr(batchsearch.time, "perf_counter", lambda: next(clock))
    s = batchsearch.search(card(1003), 256, 8, guess=960, seconds=12, over=1040)
    assert (s.bound, s.largest, s.smallest_failing) == ("at_least", 960, 1040)


def test_the_batch_expected_to_fail_is_just_over_the_headroom():
    c = {"arch": "vit_b_16", "data": "synthetic_images", "batch_size": 128, "image_size": 224}
    at = lambda b: memory.estimate(c, "fp32", "adamw", batch=b).total  # noqa: E731
    budget = at(400)
    guess, _ = batchsearch.guess_batch(c, "fp32", "adamw", 128, at(128), budget, 1024)
    over = batchsearch.over_batch(c, "fp32", "adamw", 128, at(128), budget, 1024)
    assert over % 8 == 0 and over > guess and at(over - 8) <= batchsearch.OVER_MARGIN * budget < at(over)
    assert memory.HEADROOM < batchsearch.OVER_MARGIN
    assert batchsearch.over_batch(c, "fp32", "adamw", 128, at(128), 10**15, 1024) is None  # all fits to the cap


def test_a_batch_that_is_no_multiple_of_8_searches_every_batch():
    s = batchsearch.search(card(13), planned=5, up_to_factor=8, guess=7, seconds=60)
    assert (s.step, s.largest, s.smallest_failing, s.bound) == (1, 13, 14, "exact")


def test_fitting_at_the_cap_is_a_lower_bound_and_the_data_can_lower_the_cap():
    s = batchsearch.search(card(10**6), planned=256, up_to_factor=8, guess=300, seconds=60)
    assert (s.largest, s.bound) == (2048, "capped") and "search's cap" in s.why
    s = batchsearch.search(card(10**6), planned=64, up_to_factor=8, guess=300, seconds=60, most=300)
    assert (s.largest, s.bound, s.up_to) == (296, "capped", 296) and "the data has no more" in s.why


def test_the_time_budget_ends_the_search_with_a_lower_bound(monkeypatch):
    clock = iter(range(0, 10_000, 5))  # every try takes 5 s
    monkeypatch.setattr(batchsearch.time, "perf_counter", lambda: next(clock))
    s = batchsearch.search(card(1000), planned=256, up_to_factor=8, guess=264, seconds=12)
    assert s.bound == "at_least" and s.largest < 1000 and "12 s of trial steps" in s.why
    assert s.as_record()["trial_seconds"] <= 12 + 5  # the first try always runs; none starts past the budget


def test_the_guess_scales_the_estimate_to_the_measured_peak():
    c = {"arch": "vit_b_16", "data": "synthetic_images", "batch_size": 128, "image_size": 224}
    at = lambda b: memory.estimate(c, "fp32", "adamw", batch=b).total  # noqa: E731
    budget = at(400)
    guess, how = batchsearch.guess_batch(c, "fp32", "adamw", 128, at(128), budget, 1024)
    margin = batchsearch.GUESS_MARGIN
    assert guess % 8 == 0 and at(guess) <= margin * budget < at(guess + 8) and "1.00" in how
    assert margin < memory.HEADROOM  # a guess a try would call over the headroom wastes the try
    smaller, _ = batchsearch.guess_batch(c, "fp32", "adamw", 128, 2 * at(128), budget, 1024)  # measured: 2x the model
    assert smaller < guess and smaller >= 128
    assert batchsearch.guess_batch(c, "fp32", "adamw", 128, at(128), 10**15, 1024)[0] == 1024


def test_no_search_without_a_cell_that_ran_or_without_cuda():
    spec = CellSpec("m", "fp32", 0, {"arch": "small_cnn", "data": "digits", "batch_size": 64},
                    {"lr": 0.001, "optimizer": "adamw", "steps": 2, "warmup_steps": 1})
    record = batchsearch.run(spec, {"status": "skipped", "reason": "needs a GPU"}, None, {}, 8, 10)
    assert record["status"] == "skipped"
    assert "did not run at the planned batch (skipped: needs a GPU" in record["reason"]
    import torch
    if not torch.cuda.is_available():
        record = batchsearch.run(spec, {"status": "ok"}, None, {}, 8, 10)
        assert record["status"] == "skipped" and "no CUDA GPU" in record["reason"]


def runs(**largest):
    model = {"arch": "small_cnn", "data": "digits", "batch_size": 64}
    return {"models": {"a": model, "b": {**model, "seeds": [7, 8]}, "ddp": {**model, "gpus": 2}},
            "precisions": ["fp32", "amp_fp16"], "seeds": [0, 1], "largest_batch": largest,
            "train": {"steps": 2, "warmup_steps": 1, "lr": 0.001, "optimizer": "adamw"}}


def test_the_config_names_models_of_the_run_on_one_gpu():
    with pytest.raises(cfg.ConfigError, match=r"runs.largest_batch.models: nope is not a model of this run"):
        cfg.check_largest_batch(runs(models=["nope"]))
    with pytest.raises(cfg.ConfigError, match="data-parallel or compiled"):
        cfg.check_largest_batch(runs(models=["ddp"]))
    searches = cfg.largest_batch_searches(runs(models=["a", "b"]))
    assert [(s["model"], s["precision"], s["seed"]) for s in searches] == [
        ("a", "fp32", 0), ("a", "amp_fp16", 0), ("b", "fp32", 7), ("b", "amp_fp16", 7)]
    compiled = {**runs(models=["a"]), "precisions": ["fp32", "amp_bf16_compile", "fp8_tensorwise"]}
    assert [s["precision"] for s in cfg.largest_batch_searches(compiled)] == ["fp32"]  # compiled ones: no search
    with pytest.raises(cfg.ConfigError, match="largest_batch.up_to"):
        cfg.validate({**runs(models=["a"]), "largest_batch": {"up_to": 1}}, "runs", "runs")


def row(precision, largest, bound, model="vit_b_16", failing=None):
    return {"model": model, "precision": precision, "seed": 0, "status": "ok", "largest_batch": largest,
            "largest_batch_bound": bound, "largest_batch_failing": failing, "largest_batch_grid": 8}


def test_the_claim_metric_is_the_interval_the_two_searches_leave():
    exact, inf = row("fp32", 200, "exact"), float("inf")
    assert claimmetrics.metric_bounds("batch_ratio", row("apex_o1", 300, "exact"), exact) == (1.5, 1.5, "")
    assert claimmetrics.metric_value("batch_ratio", row("apex_o1", 300, "exact"), exact) == (1.5, "")
    assert claimmetrics.metric_bounds("batch_ratio", row("apex_o1", 400, "capped"), exact)[:2] == (2.0, inf)
    # FP32's search cut short by its time after a batch failed: its largest is 200..(248 - 8), so the ratio 300 / 240
    # to 300 / 200
    cut = row("fp32", 200, "at_least", failing=248)
    assert claimmetrics.metric_bounds("batch_ratio", row("apex_o1", 300, "exact"), cut)[:2] == (1.25, 1.5)
    assert claimmetrics.metric_bounds("batch_ratio", row("apex_o1", 300, "at_least"), cut)[:2] == (1.25, inf)
    value, why = claimmetrics.metric_value("batch_ratio", row("apex_o1", 300, "exact"), cut)
    assert value is None and "interval" in why  # no single value: metric_bounds has the interval
    for variant, baseline, said in [(row("apex_o1", 300, "at_least"), row("fp32", 200, "at_least"), "no ratio"),
                                    (row("apex_o1", None, None), row("fp32", 200, "exact"), "no largest-batch search")]:
        low, high, why = claimmetrics.metric_bounds("batch_ratio", variant, baseline)
        assert low is None and high is None and said in why
    # an unbounded baseline still bounds the ratio from above
    assert claimmetrics.metric_bounds("batch_ratio", row("apex_o1", 300, "exact"), row("fp32", 300, "at_least"))[:2] \
        == (0.0, 1.0)
    assert claimmetrics.fmt_value("batch_ratio", 1.5) == "1.50× the batch"


CLAIM = {"id": "bigger", "metric": "batch_ratio", "variant": "apex_o1", "claimed": {"at_least": 1.1}, "tolerance": 0.0}


@pytest.mark.parametrize("low, high, decided", [(1.2, 1.2, 1.2), (1.2, float("inf"), 1.2), (1.25, 1.5, 1.25),
                                                (0.5, 1.0, 1.0), (1.0, 1.3, None), (0.0, float("inf"), None)])
def test_an_interval_gets_a_verdict_only_where_both_ends_agree(low, high, decided):
    assert claimmetrics.decided_value(CLAIM, low, high) == decided


def test_the_claim_holds_on_a_ratio_bounded_from_below_and_says_so():
    cells = {CellId("vit_b_16", "apex_o1", 0): row("apex_o1", 936, "at_least"),
             CellId("vit_b_16", "fp32", 0): row("fp32", 616, "at_least", failing=640)}
    out = claimmodels.evaluate_model(CLAIM, cells, "vit_b_16", "fp32")
    assert out["verdict"] == "holds" and out["values"] == {0: 936 / 632}
    assert out["measured_text"] == "1.48× the batch (1 seed) (bounded: 1.48× the batch to unbounded)"
    assert claimmodels.bounds_text("batch_ratio", {0: [1.25, 1.5], 1: [1.3, float("inf")]}) == \
        " (bounded: 1.25× the batch to 1.50× the batch; 1.30× the batch to unbounded)"
    cells[CellId("vit_b_16", "apex_o1", 0)] = row("apex_o1", 680, "exact")
    out = claimmodels.evaluate_model(CLAIM, cells, "vit_b_16", "fp32")  # 680 / 632 .. 680 / 616 straddles 1.1
    assert out["verdict"] == "not_measurable" and out["reason"] == (
        "from 1.08× the batch to 1.10× the batch (seed 0), which straddles the claim's at least 1.10× the batch: the "
        "searches did not narrow it enough")


def record(precision, largest, bound="exact", status="ok", failing=None):
    return {"model": "vit_b_16", "precision": precision, "seed": 0, "status": status, "largest_batch": largest,
            "bound": bound, "smallest_failing_batch": failing, "grid_step": 8, "why": f"fits at {largest}",
            "planned_batch": 128, "tries": [{}, {}], "trial_seconds": 1.5,
            "reason": "its cell did not run"}


def test_the_summary_puts_each_answer_on_its_cell_and_the_report_shows_the_ratio():
    records = [record("fp32", 200), record("apex_o1", 320), record("amp_bf16", 1024, "capped"),
               record("tf32", None, status="skipped")]
    rows = summary.add_largest_batch([row("fp32", None, None), row("apex_o1", None, None), {**row("fp32", 0, 0),
                                      "seed": 1}], records)
    assert [(r["largest_batch"], r["largest_batch_bound"]) for r in rows] == [(200, "exact"), (320, "exact"),
                                                                              (None, None)]
    found = summary.largest_batch({"models": ["vit_b_16"], "note": ""}, records)
    html = reporthtml.largest_batch_section({"largest_batch": found})
    assert "Largest batch per precision" in html and "1.60×" in html and "≥ 5.12×" in html
    assert "not searched: its cell did not run" in html
    cut = [record("fp32", 616, "at_least", failing=640), record("apex_o1", 936, "at_least"),
           record("amp_bf16", 700)]
    assert summary.add_largest_batch([row("fp32", None, None)], cut)[0]["largest_batch_failing"] == 640
    html = reporthtml.largest_batch_section({"largest_batch": summary.largest_batch({"models": ["vit_b_16"]}, cut)})
    assert "≥ 1.48×" in html and "1.11× to 1.14×" in html
    none = summary.largest_batch({"models": ["vit_b_16"], "note": "this run has no GPU"}, [])
    assert "nothing to show on this run: this run has no GPU" in reporthtml.largest_batch_section(
        {"largest_batch": none})


def test_the_search_draws_its_synthetic_batches_where_the_device_is_and_the_cells_keep_theirs():
    # The cells' values are drawn on the CPU (the same on every machine); the search's tries draw on the device (only
    # the shape matters there). On the CPU both are CPU tensors: the cell's values are unchanged by the option.
    import torch

    from amprepro.train import data

    cell = data.SyntheticImages(4, 32, 0, "cpu")
    reference = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    assert torch.equal(cell.x, reference)
    tried = data.SyntheticImages(4, 32, 0, "cpu", on_device=True)
    assert tried.x.shape == cell.x.shape and tried.x.dtype == cell.x.dtype
    assert tried.y.min() >= 0 and tried.y.max() < data.SyntheticImages.num_classes
    tokens = data.SyntheticTokens(2, 16, 50, 1, "cpu", on_device=True)
    assert tokens.x.shape == (2, 16) and torch.equal(tokens.x[:, 1:], tokens.y[:, :-1])


def test_a_baselines_search_gets_two_shares_of_the_runs_seconds():
    # The paper preset's 18 searches: 3 models x (fp32, tf32 at two shares + 4 AMP precisions at one) = 24 shares.
    searches = [{"model": m, "precision": p} for m in ("a", "b", "c")
                for p in ("fp32", "tf32", "amp_fp16", "amp_bf16", "apex_o1", "apex_o2")]
    assert cfg.largest_batch_seconds(searches, 90, "fp32") == 7.5
    assert cfg.largest_batch_seconds(searches, 90, "tf32") == 7.5
    assert cfg.largest_batch_seconds(searches, 90, "apex_o1") == 3.75
    shares = sum(cfg.largest_batch_seconds(searches, 90, s["precision"]) for s in searches)
    assert abs(shares - 90) < 0.05  # the run's seconds, shared out, no more
    assert cfg.largest_batch_seconds([{"model": "a", "precision": "amp_bf16"}], 90, "amp_bf16") == 90


def test_the_paper_presets_searches_are_what_the_bigger_batch_claim_reads_at_the_old_shares():
    import yaml

    repo = Path(__file__).resolve().parents[2]
    base = yaml.safe_load((repo / "config" / "config.yaml").read_text())
    config = cfg.validate_config(cfg.deep_merge(base, {"preset": "paper"}))
    runs, _ = cfg.resolve_runs(config, repo / "config" / "presets", ["NVIDIA H200"], "test probe")
    searches = cfg.largest_batch_searches(runs)
    assert [(s["model"], s["precision"]) for s in searches] == [("vit_b_16", p) for p in ("fp32", "tf32", "apex_o1")]
    seconds = runs["largest_batch"]["seconds"]  # 8 s a baseline, 4 s apex O1: as when 18 searches shared 90 s
    assert [cfg.largest_batch_seconds(searches, seconds, s["precision"]) for s in searches] == [8.0, 8.0, 4.0]


def test_a_try_starts_without_optimizer_state_and_its_first_step_builds_it():
    import torch

    weight = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.AdamW([weight], lr=0.1)
    weight.grad = torch.ones(3)
    optimizer.step()
    assert set(optimizer.state[weight]) >= {"exp_avg", "exp_avg_sq"}
    batchsearch.forget_optimizer_state(optimizer)
    assert len(optimizer.state) == 0
    weight.grad = torch.ones(3)
    optimizer.step()  # AdamW builds a missing state at its next step, as at a fresh cell's first
    assert float(optimizer.state[weight]["step"]) == 1.0

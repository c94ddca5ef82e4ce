"""amprepro.train.batchsearch's public functions at their edges, with exact records and texts: the grid, the next
batch of each phase, each way a search ends and what it records, the guess and the batch expected to fail, a skipped
search's record (docs/mutation.md: these tests, with test_batchsearch.py, are what mutation testing runs here)."""

from __future__ import annotations

import types

import pytest

from amprepro import memory
from amprepro.cellspec import CellSpec
from amprepro.train import batchsearch as bs


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


def card(limit, peak_per_item=1000):
    tried = []

    def trial(batch):  # a search that tries more than 64 batches fails (none here needs 10): it never ends
        tried.append(batch)
        if len(tried) > 64:
            raise AssertionError(f"the search does not end: {tried[:8]} ...")
        return batch <= limit, batch * peak_per_item, "" if batch <= limit else "oom"
    return trial


@pytest.fixture
def clock(monkeypatch):
    """perf_counter that advances by `per_try` seconds between a try's start and end."""
    state = {"now": 0.0, "per_try": 1.0, "calls": 0}

    def perf_counter():
        state["calls"] += 1
        if state["calls"] % 2 == 0:
            state["now"] += state["per_try"]
        return state["now"]

    monkeypatch.setattr(bs.time, "perf_counter", perf_counter)
    return state


def test_the_grid_is_8_for_a_multiple_of_8_and_1_otherwise():
    assert [bs.grid_step(b) for b in (8, 16, 256, 7, 9, 12, 1)] == [8, 8, 8, 1, 1, 1, 1]
    assert [bs.snap(b, 8) for b in (0, 7, 8, 15, 16, 17)] == [8, 8, 8, 8, 16, 16]
    assert [bs.snap(b, 1) for b in (0, 1, 5)] == [1, 1, 5]


def test_as_record_is_every_field_and_the_trial_seconds_rounded():
    s = bs.Search(planned=16, up_to=128, step=8, largest=40, smallest_failing=48,
                  tries=[{"seconds": 0.1234}, {"seconds": 1.0001}], bound="exact", why="w")
    assert s.as_record() == {"planned_batch": 16, "up_to_batch": 128, "grid_step": 8, "largest_batch": 40,
                             "smallest_failing_batch": 48, "bound": "exact", "why": "w",
                             "tries": [{"seconds": 0.1234}, {"seconds": 1.0001}], "trial_seconds": 1.123}
    assert bs.Search(8, 64, 8, 8).as_record()["trial_seconds"] == 0
    assert (bs.Search(8, 64, 8, 8).smallest_failing, bs.Search(8, 64, 8, 8).tries) == (None, [])
    assert (bs.Search(8, 64, 8, 8).bound, bs.Search(8, 64, 8, 8).why) == ("", "")


def test_next_batch_of_each_phase():
    s = bs.Search(planned=16, up_to=128, step=8, largest=16)
    assert bs.next_batch(s, 40) == 40  # the guess first
    assert bs.next_batch(s, 41) == 40  # on the grid
    assert bs.next_batch(s, 8) == 24  # at least one step above what fits
    assert bs.next_batch(s, 500) == 128  # at most the cap
    s.tries, s.largest = [{"fits": True}], 40
    assert bs.next_batch(s, 40, over=72) == 72  # the batch expected to fail, after a fitting guess
    assert bs.next_batch(s, 40, over=40) == 48  # not above what fits: walk on instead
    assert bs.next_batch(s, 40) == 48  # stride 8 after one try
    s.tries = [{"fits": True}, {"fits": True}]
    assert bs.next_batch(s, 40, over=72) == 56  # over only right after the guess; stride 16
    s.tries = [{"fits": True}] * 3
    assert bs.next_batch(s, 40) == 72  # stride 32
    s = bs.Search(planned=16, up_to=128, step=8, largest=16, smallest_failing=120, tries=[{"fits": False}])
    assert bs.next_batch(s, 40) == 112  # down by one stride from the failure
    s.tries = [{"fits": False}, {"fits": False}]
    assert bs.next_batch(s, 40) == 104  # stride 16
    s.tries = [{"fits": False}] * 4
    assert bs.next_batch(s, 40) == 56  # stride 64: 120 - 64
    s = bs.Search(planned=16, up_to=128, step=8, largest=40, smallest_failing=80,
                  tries=[{"fits": True}, {"fits": False}])
    assert bs.next_batch(s, 40) == 56  # bisection: (40 + 80) // 2 = 60, on the grid
    s.smallest_failing = 56
    assert bs.next_batch(s, 40) == 48  # (40 + 56) // 2, below the failure by a step at most


def test_next_batch_off_the_grid_steps_by_one():
    s = bs.Search(planned=5, up_to=40, step=1, largest=5)
    assert bs.next_batch(s, 5) == 6
    s.tries, s.largest, s.smallest_failing = [{"fits": True}, {"fits": False}], 9, 12
    assert bs.next_batch(s, 5) == 10


def test_an_exact_answer_says_where_it_fits_and_where_not(clock):
    s = bs.search(card(100), 16, 8, guess=96, seconds=60, over=104)
    assert (s.bound, s.largest, s.smallest_failing) == ("exact", 96, 104)
    assert s.why == "fits at 96, not at 104"
    assert s.tries == [{"batch": 96, "fits": True, "peak_allocated_bytes": 96000, "seconds": 1.0, "note": ""},
                       {"batch": 104, "fits": False, "peak_allocated_bytes": 104000, "seconds": 1.0, "note": "oom"}]
    assert (s.planned, s.up_to, s.step) == (16, 128, 8)


def test_a_search_that_fits_at_its_cap_says_which_cap(clock):
    s = bs.search(card(10_000), 16, 4, guess=64, seconds=60)
    assert (s.bound, s.largest, s.up_to) == ("capped", 64, 64)
    assert s.why == "fits at 64, 4x the planned batch (the search's cap)"
    s = bs.search(card(10_000), 16, 4, guess=64, seconds=60, most=40)
    assert (s.bound, s.largest, s.up_to) == ("capped", 40, 40)
    assert s.why == "fits at 40, 2.5x the planned batch (the data has no more)"
    s = bs.search(card(10_000), 16, 4, guess=64, seconds=60, most=64)  # the data allows exactly the cap
    assert s.why == "fits at 64, 4x the planned batch (the search's cap)"
    s = bs.search(card(10_000), 16, 4, guess=64, seconds=60, most=100)
    assert s.why == "fits at 64, 4x the planned batch (the search's cap)"
    s = bs.search(card(10_000), 16, 4, guess=64, seconds=60, most=8)  # less than planned: the planned batch
    assert (s.up_to, s.bound, s.tries) == (16, "capped", [])
    assert s.why == "fits at 16, 1x the planned batch (the data has no more)"


def test_a_search_its_time_ends_says_so_with_and_without_a_failure(clock):
    clock["per_try"] = 4.0
    s = bs.search(card(1000), 16, 8, guess=40, seconds=6)
    # 40 fits in 4 s (0.1 s an item); the next, 48, would take 4.8 s more: over the 6 s
    assert (s.bound, s.largest, s.smallest_failing) == ("at_least", 40, None)
    assert s.why == "fits at 40; the search's 6 s of trial steps were spent before it tried 48"
    s = bs.search(card(60), 16, 8, guess=40, seconds=12, over=72)  # 4 s + 7.2 s for 72; then 8 s + 5.6 s for 56
    assert (s.bound, s.largest, s.smallest_failing) == ("at_least", 40, 72)
    assert s.why == ("fits at 40; the search's 12 s of trial steps were spent before it tried 56 (fails at 72)")
    s = bs.search(card(1000), 16, 8, guess=40, seconds=0)  # the first try always runs
    assert [t["batch"] for t in s.tries] == [40] and s.bound == "at_least"
    assert "the search's 0 s of trial steps" in s.why


def test_the_time_check_uses_the_slowest_fitting_try_per_item(clock):
    clock["per_try"] = 1.0
    # every try takes 1 s: 0.0625 s an item at 16; the next try (24 items) is predicted at 1.5 s
    s = bs.search(card(1000), 8, 8, guess=16, seconds=2.4)
    assert [t["batch"] for t in s.tries] == [16]
    s = bs.search(card(1000), 8, 8, guess=16, seconds=2.5)  # 1 + 1.5 = 2.5: not over
    assert [t["batch"] for t in s.tries] == [16, 24]
    s = bs.search(card(8), 8, 8, guess=16, seconds=1.0)  # a failure sets no rate: the next try runs
    assert [t["batch"] for t in s.tries][:2] == [16]


GPT = {"arch": "gpt_tiny", "data": "synthetic_tokens", "batch_size": 16, "seq_len": 64}


def test_the_guess_and_the_batch_expected_to_fail_bracket_the_budget():
    at = lambda b: memory.estimate(GPT, "fp32", "adamw", batch=b).total  # noqa: E731
    budget = at(200)
    guess, how = bs.guess_batch(GPT, "fp32", "adamw", 16, None, budget, 1024)
    assert guess % 8 == 0 and at(guess) <= bs.GUESS_MARGIN * budget < at(guess + 8)
    assert how == "the memory model scaled by 1.00 (measured/estimated peak at 16)"
    over = bs.over_batch(GPT, "fp32", "adamw", 16, None, budget, 1024)
    assert over % 8 == 0 and at(over - 8) <= bs.OVER_MARGIN * budget < at(over)
    assert bs.over_batch(GPT, "fp32", "adamw", 16, None, 10**15, 1024) is None
    assert bs.over_batch(GPT, "fp32", "adamw", 16, None, 10**15, 1027) is None  # the cap on the grid: 1024
    doubled, how = bs.guess_batch(GPT, "fp32", "adamw", 16, 2 * at(16), budget, 1024)
    assert how == "the memory model scaled by 2.00 (measured/estimated peak at 16)"
    assert at(doubled) * 2 <= bs.GUESS_MARGIN * budget < at(doubled + 8) * 2
    assert bs.guess_batch(GPT, "fp32", "adamw", 16, None, 1, 1024)[0] == 16  # never below the planned batch
    off_grid = bs.guess_batch({**GPT, "batch_size": 5}, "fp32", "adamw", 5, None, budget, 100)[0]
    assert at(off_grid) <= bs.GUESS_MARGIN * budget < at(off_grid + 1) or off_grid == 100
    assert bs.GUESS_MARGIN == 0.93 and bs.OVER_MARGIN == 0.97 and bs.STEPS_PER_TRY == 2


def test_forget_optimizer_state_empties_the_state_only():
    class Opt:
        def __init__(self):
            self.state, self.param_groups = {"w": {"exp_avg": 1}}, [{"lr": 1}]

    opt = Opt()
    bs.forget_optimizer_state(opt)
    assert opt.state == {} and opt.param_groups == [{"lr": 1}]


SPEC = CellSpec("m", "fp32", 3, {"arch": "small_cnn", "data": "digits", "batch_size": 64},
                {"lr": 0.001, "optimizer": "adamw", "steps": 2, "warmup_steps": 1})


def test_a_skipped_search_records_its_cell_and_reason():
    assert bs.not_searched(SPEC, "why", x=1) == {"model": "m", "precision": "fp32", "seed": 3, "status": "skipped",
                                                "reason": "why", "x": 1}
    long = "r" * 300
    assert bs.run(SPEC, {"status": "failed", "reason": long}, None, {}, 8, 10) == bs.not_searched(
        SPEC, f"its cell did not run at the planned batch (failed: {'r' * 160})")
    assert bs.run(SPEC, {}, None, {}, 8, 10)["reason"] == "its cell did not run at the planned batch (None: )"


def test_without_cuda_nothing_is_searched(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bs.run(SPEC, {"status": "ok"}, None, {}, 8, 10) == bs.not_searched(
        SPEC, "the largest batch is a GPU-memory measurement; torch sees no CUDA GPU here")


def test_main_reads_its_files_runs_the_search_and_writes_the_record(tmp_path, monkeypatch, capsys):
    import json

    seen = []

    def run(spec, cell, plan, apex, up_to, seconds, init_cache):
        seen.append((spec, cell, plan, apex, up_to, seconds, init_cache))
        return {"status": "ok", "why": "fits at 96, not at 104"}

    monkeypatch.setattr(bs, "run", run)
    (tmp_path / "cell.json").write_text(json.dumps({"status": "ok", "peak_allocated_bytes": 5}))
    (tmp_path / "plan.json").write_text(json.dumps({"batch_size": 32}))
    (tmp_path / "apex.json").write_text(json.dumps({"status": "missing"}))
    out = tmp_path / "out" / "m" / "fp32.json"
    bs.main(["--spec", json.dumps(SPEC.as_dict()), "--cell", str(tmp_path / "cell.json"), "--plan",
             str(tmp_path / "plan.json"), "--apex", str(tmp_path / "apex.json"), "--up-to", "4", "--seconds", "2.5",
             "--init-cache", str(tmp_path / "init"), "--out", str(out)])
    assert seen == [(SPEC, {"status": "ok", "peak_allocated_bytes": 5}, {"batch_size": 32}, {"status": "missing"},
                     4, 2.5, str(tmp_path / "init"))]
    record = json.loads(out.read_text())
    assert record.pop("wall_seconds") >= 0
    assert record == {"status": "ok", "why": "fits at 96, not at 104"}
    assert capsys.readouterr().out == "m/fp32: ok fits at 96, not at 104\n"
    seen.clear()
    monkeypatch.setattr(bs, "run", lambda *args: seen.append(args) or {"status": "skipped", "reason": "no GPU"})
    bs.main(["--spec", json.dumps(SPEC.as_dict()), "--cell", str(tmp_path / "cell.json"), "--out", str(out)])
    [(_, _, plan, apex, up_to, seconds, init_cache)] = seen
    assert (plan, up_to, seconds, init_cache) == (None, 8, 10.0, None)
    assert apex.get("status") != "built"  # no --apex: no apex build is put on the path
    assert capsys.readouterr().out == "m/fp32: skipped no GPU\n"
    assert json.loads(out.read_text())["reason"] == "no GPU"


def test_main_needs_its_files_and_says_what_it_does(capsys):
    with pytest.raises(SystemExit) as ended:
        bs.main([])
    assert ended.value.code == 2
    assert "the following arguments are required: --spec, --cell, --out" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bs.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert bs.__doc__.splitlines()[0] in text
    for help_text in ("--spec SPEC JSON of the cell's settings (as the train job gets it)",
                      "--cell CELL the cell's metrics.json at the planned batch",
                      "--plan PLAN results/plan/models/<model>.json",
                      "--apex APEX results/apex/runs.json, for an apex precision",
                      "--up-to UP_TO the largest batch tried, times the planned batch",
                      "--seconds SECONDS trial-step seconds this search may spend", "--out OUT"):
        assert help_text in text


@pytest.fixture
def fake_gpu(monkeypatch):
    """run()'s GPU on the CPU: torch.cuda's queries, the cell's model, optimizer, data and trainer answered by fakes.
    A batch above `oom_above` runs out of memory; a step's allocator peak is 100 bytes an item."""
    import torch

    from amprepro import datakinds
    from amprepro.train import cell, measure, oom, precision

    state = types.SimpleNamespace(peak=0, oom_above=120, calls=[], steps=[], limit=10_000, state_at_try=[],
                                  most=None, scaler=None, batch=None, inputs=None, model=None, plans=[],
                                  error=RuntimeError("CUDA out of memory. Tried to allocate 2 GiB\nmore text"))
    cuda = torch.device("cuda")

    def on_card(device):  # every query and every part of the cell is asked about the cell's device
        if device != cuda:
            raise AssertionError(f"asked about {device!r}, not the cell's device")

    class Trainer:
        def __init__(self, name, model, optimizer, loss_fn, device, wrap=None, recomputes=False,
                     scaler_init_scale=None):
            state.calls.append(("Trainer", name, device.type, recomputes, loss_fn is cell.cross_entropy))
            on_card(device)
            assert model is state.model
            self.optimizer, self.scaler = optimizer, state.scaler

        def step(self, x, y):
            assert x is state.inputs and y is state.batch[1]  # the batch as Cell.inputs gives it, its own labels
            batch = x.shape[0]
            state.steps.append(batch)
            state.peak = batch * 100
            if self.scaler is not None:
                self.scaler._per_optimizer_states["optimizer"] = "mid-step"
            if batch > state.oom_above:
                raise state.error
            self.optimizer.state["w"] = "built"

        def zero_grad(self):
            state.calls.append(("zero_grad",))

    class Batches:
        def __init__(self, config):
            self.config = config

        def next(self):
            state.state_at_try.append(dict(state.optimizer.state))
            if state.scaler is not None:
                assert state.scaler._per_optimizer_states == {}  # what the last try left is gone
            state.batch = torch.zeros(self.config.batch_size, 4), torch.zeros(self.config.batch_size)
            return state.batch

    def inputs(self, x):
        assert x is state.batch[0]
        state.inputs = x.clone()
        return state.inputs

    def make_optimizer(name, params, lr, weight_decay, device):
        state.calls.append(("optimizer", name, len(params), lr, weight_decay))
        state.optimizer = types.SimpleNamespace(state={})
        return state.optimizer

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for name in ("synchronize", "reset_peak_memory_stats"):
        monkeypatch.setattr(torch.cuda, name, lambda device, name=name: on_card(device) or state.calls.append((name,)))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: state.calls.append(("empty_cache",)))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: on_card(device) or state.peak)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: on_card(device) or (7000, 20_000))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: on_card(device) or 500)
    monkeypatch.setattr(cell, "seed_everything", lambda seed, deterministic: state.calls.append(("seed", seed,
                                                                                                   deterministic)))
    monkeypatch.setattr(precision, "configure_tf32", lambda name: state.calls.append(("tf32", name)))
    monkeypatch.setattr(oom, "apply_memory_limit", lambda plan, device: on_card(device) or state.plans.append(plan)
                        or state.limit)
    model = torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.Linear(2, 2))
    model[1].weight.requires_grad_(False)
    state.model = model
    monkeypatch.setattr(cell, "prepare_model",
                        lambda config, device, init_cache=None, built=None: (on_card(device) or model, None))
    monkeypatch.setattr(cell.Cell, "inputs", inputs)
    monkeypatch.setattr(cell, "make_optimizer", make_optimizer)
    monkeypatch.setattr(precision, "Trainer", Trainer)
    def make_data(config, seed, device, model, on_device):
        on_card(device)
        assert model is state.model
        state.calls.append(("data", seed, on_device))
        return Batches(config)

    def largest_batch(name):
        assert name == "synthetic_tokens"
        return state.most

    monkeypatch.setattr(cell, "make_data", make_data)
    monkeypatch.setattr(measure, "hardware", lambda device: on_card(device) or {"gpu": "fake"})
    monkeypatch.setattr(datakinds, "largest_batch", largest_batch)
    def plain(known):  # the settings record as the dict it was written from (ModelSettings.as_dict)
        return (known[0].as_dict(), *known[1:]) if hasattr(known[0], "as_dict") else known

    monkeypatch.setattr(bs, "guess_batch", lambda *known: (state.calls.append(("guess", plain(known))) or (64, "how")))
    monkeypatch.setattr(bs, "over_batch", lambda *known: state.calls.append(("over", plain(known))) or 104)
    return state


GPU_SPEC = CellSpec("m", "fp32", 3, {"arch": "gpt_tiny", "data": "synthetic_tokens", "batch_size": 16,
                                     "seq_len": 8}, {"lr": 0.5, "optimizer": "adamw", "steps": 2, "warmup_steps": 1,
                                                     "weight_decay": 0.1})


def test_run_searches_on_the_card_and_records_every_try(fake_gpu):
    record = bs.run(GPU_SPEC, {"status": "ok", "peak_allocated_bytes": 1700}, None, {}, 8, 60)
    tries = record.pop("tries")
    assert [(t["batch"], t["fits"], t["peak_allocated_bytes"]) for t in tries] == [
        (64, True, 6400), (104, False, 10400), (80, True, 8000), (88, True, 8800), (96, False, 9600)]
    over = f"its step ran, but its peak is over {memory.HEADROOM:.0%} of the budget"
    assert [t["note"] for t in tries] == ["", over, "", "", over]
    assert all(isinstance(t["data_seconds"], float) for t in tries)
    assert record.pop("warm_seconds") >= 0 and record.pop("trial_seconds") >= 0
    assert record == {"model": "m", "precision": "fp32", "seed": 3, "spec": GPU_SPEC.as_dict(),
                      "hardware": {"gpu": "fake"}, "budget_bytes": 10_000, "allocator_limit_bytes": 10_000,
                      "cap_gib": None, "warm_peak_allocated_bytes": 1600, "status": "ok", "guess_batch": 64,
                      "guess_how": "how", "over_batch": 104, "seconds_allowed": 60, "planned_batch": 16,
                      "up_to_batch": 128, "grid_step": 8, "largest_batch": 88, "smallest_failing_batch": 96,
                      "bound": "exact", "why": "fits at 88, not at 96"}
    # the planned batch once (one step), then STEPS_PER_TRY steps a try but where the first ran out of memory
    assert fake_gpu.steps == [16, 64, 64, 104, 104, 80, 80, 88, 88, 96, 96]
    assert all(s == {} for s in fake_gpu.state_at_try)  # each try starts without optimizer state
    calls = fake_gpu.calls
    assert calls[:2] == [("seed", 3, False), ("tf32", "fp32")]
    assert ("optimizer", "adamw", 3, 0.5, 0.1) in calls  # the trainable parameters only (not the frozen weight)
    assert ("Trainer", "fp32", "cuda", False, True) in calls
    known = (GPU_SPEC.model_config, "fp32", "adamw", 16, 1700, 10_000, 128)
    assert ("guess", known) in calls and ("over", known) in calls
    assert ("data", 3, True) in calls


def test_run_without_a_cap_takes_the_cards_free_memory_and_the_warm_peak(fake_gpu):
    fake_gpu.limit = None
    record = bs.run(GPU_SPEC, {"status": "ok"}, None, {}, 8, 60)
    assert (record["budget_bytes"], record["allocator_limit_bytes"]) == (7500, None)
    known = (GPU_SPEC.model_config, "fp32", "adamw", 16, 1600, 7500, 128)
    assert ("guess", known) in fake_gpu.calls


def test_run_that_runs_out_of_memory_at_the_planned_batch_says_so(fake_gpu):
    fake_gpu.oom_above = 16
    record = bs.run(GPU_SPEC, {"status": "ok"}, {"cap_gib": 12, "batch_size": 24}, {}, 8, 60)  # the plan's batch
    assert record["status"] == "skipped" and record["cap_gib"] == 12
    assert record["reason"] == ("out of memory at the planned batch 24 in the search's process (CUDA out of memory. "
                                "Tried to allocate 2 GiB)")
    assert fake_gpu.steps == [24]
    assert not any(call[0] in ("guess", "over") for call in fake_gpu.calls)


@pytest.fixture
def linear(monkeypatch):
    """memory.estimate as 100 bytes an item plus 50, recording what it is asked; a test that asks more than 500
    times fails (a loop that never ends is a failure here, not a timeout)."""
    calls = []

    def estimate(settings, precision, optimizer, batch=None):
        calls.append((settings, precision, optimizer, batch))
        if len(calls) > 500:
            raise AssertionError("the bisection does not end")
        return types.SimpleNamespace(total=100 * batch + 50)

    monkeypatch.setattr(memory, "estimate", estimate)
    return calls


def test_largest_under_is_the_largest_batch_on_the_grid_under_the_limit(linear):
    for planned, up_to, step in ((16, 128, 8), (16, 131, 8), (5, 40, 1), (8, 8, 8), (3, 4, 1)):
        top = up_to // step * step
        for scale in (1.0, 0.5, 2.0):
            for limit in (0, 1, 49, *range(100, int(100 * (up_to + 3) * scale) + 200, 23)):
                linear.clear()
                fitting = [b for b in range(planned, top + 1, step) if (100 * b + 50) * scale <= limit]
                largest = bs._largest_under("S", "fp16", "sgd", planned, scale, limit, up_to)
                assert largest == max(fitting, default=planned), (planned, up_to, scale, limit)
                assert type(largest) is int  # a batch size, not 64.0
                assert all(c[:3] == ("S", "fp16", "sgd") and c[3] % step == 0 and planned < c[3] <= top
                           for c in linear)
    linear.clear()
    assert bs._largest_under("S", "fp16", "sgd", 16, 1.0, 100 * 64 + 50, 128) == 64  # at the limit: fits
    assert bs._largest_under("S", "fp16", "sgd", 16, 1.0, 100 * 64 + 49, 128) == 56  # a byte over: does not
    assert len(linear) <= 2 * 4  # two bisections over the 14 grid batches above 16: about log2(14) estimates each


def test_scale_is_the_measured_over_the_estimated_peak_at_the_planned_batch(linear):
    assert bs._scale("S", "fp16", "sgd", 16, None) == 1.0 and bs._scale("S", "fp16", "sgd", 16, 0) == 1.0
    assert linear == []
    assert bs._scale("S", "fp16", "sgd", 16, 3300) == 2.0
    assert linear == [("S", "fp16", "sgd", 16)]
    assert bs._scale("S", "fp16", "sgd", 8, 425) == 0.5


def test_guess_and_over_batch_read_the_scaled_estimate(linear):
    budget = 100_000
    # scale 2 (3300 measured / 1650 estimated at 16): 2 * (100 b + 50) <= 0.93 * budget: b <= 464.5, on the grid 464
    assert bs.guess_batch("S", "fp16", "sgd", 16, 3300, budget, 1024) == (
        464, "the memory model scaled by 2.00 (measured/estimated peak at 16)")
    assert all(c[:3] == ("S", "fp16", "sgd") for c in linear)
    # 2 * (100 b + 50) <= 0.97 * budget: b <= 484.5: 480 is the last under, 488 the first over
    assert bs.over_batch("S", "fp16", "sgd", 16, 3300, budget, 1024) == 488
    assert bs.over_batch("S", "fp16", "sgd", 16, None, budget, 1024) == 976  # scale 1: 969.5 -> 968 under, 976 over
    assert bs.over_batch("S", "fp16", "sgd", 16, None, budget, 968) is None  # even the cap is under
    assert bs.over_batch("S", "fp16", "sgd", 16, None, budget, 975) is None  # the cap on the grid: 968
    assert bs.over_batch("S", "fp16", "sgd", 16, None, budget, 976) == 976  # the cap is the first over
    assert bs.over_batch("S", "fp16", "sgd", 5, None, budget, 1000) == 970  # off the grid: 969 under, 970 over
    assert bs.over_batch("S", "fp16", "sgd", 5, None, budget, 969) is None
    assert bs.guess_batch("S", "fp16", "sgd", 5, None, budget, 1000)[0] == 929  # 100 b + 50 <= 93,000
    assert bs.guess_batch("S", "fp16", "sgd", 16, 0, budget, 1024)[1] == (
        "the memory model scaled by 1.00 (measured/estimated peak at 16)")
    linear.clear()
    bs.guess_batch("S", "fp16", "sgd", 16, 3300, budget, 1024)
    bs.over_batch("S", "fp16", "sgd", 16, 3300, budget, 1024)
    assert linear[0] == ("S", "fp16", "sgd", 16)  # the scale at the planned batch
    assert {c[:3] for c in linear} == {("S", "fp16", "sgd")}


def test_next_batch_stays_under_the_failure_and_the_cap():
    s = bs.Search(planned=16, up_to=128, step=8, largest=16, smallest_failing=64, tries=[{"fits": False}])
    assert bs.next_batch(s, 40) == 56  # one stride down from 64, below it
    s = bs.Search(planned=16, up_to=128, step=8, largest=40, smallest_failing=64,
                  tries=[{"fits": True}, {"fits": False}])
    assert bs.next_batch(s, 40, over=200) == 48  # bisection: (40 + 64) // 2 = 52 -> 48; over is not used
    s.smallest_failing = 72
    assert bs.next_batch(s, 40) == 56
    s = bs.Search(planned=16, up_to=128, step=8, largest=40, tries=[{"fits": True}])
    assert bs.next_batch(s, 40, over=500) == 128  # the batch expected to fail, at most the cap
    assert bs.next_batch(s, 40, over=48) == 48
    s = bs.Search(planned=16, up_to=128, step=8, largest=120, tries=[{"fits": True}] * 2)
    assert bs.next_batch(s, 40) == 128  # largest + 16, at most the cap
    s = bs.Search(planned=8, up_to=64, step=8, largest=8, smallest_failing=64, tries=[{"fits": False}] * 3)
    assert bs.next_batch(s, 40) == 32  # 64 - 32
    s.tries = [{"fits": False}] * 2
    assert bs.next_batch(s, 40) == 48  # 64 - 16


def test_a_search_at_its_cap_tries_nothing_more_and_a_bracket_one_step_wide_ends_it(clock):
    s = bs.search(card(10_000), 16, 4, guess=64, seconds=60)  # fits at the cap at once
    assert [t["batch"] for t in s.tries] == [64] and s.bound == "capped"
    s = bs.search(card(72), 16, 8, guess=72, seconds=60, over=80)  # 72 fits, 80 does not: one step apart
    assert [t["batch"] for t in s.tries] == [72, 80] and (s.bound, s.largest, s.smallest_failing) == ("exact", 72, 80)
    s = bs.search(card(72), 16, 8, guess=72, seconds=60, over=88)  # 72 fits, 88 does not: 80 is tried
    assert [t["batch"] for t in s.tries] == [72, 88, 80] and s.why == "fits at 72, not at 80"
    s = bs.search(card(7), 5, 4, guess=8, seconds=60)  # off the grid: steps of one
    assert [t["batch"] for t in s.tries] == [8, 7] and s.why == "fits at 7, not at 8"
    s = bs.search(card(16), 16, 8, guess=24, seconds=60)  # fails just above the planned batch
    assert [t["batch"] for t in s.tries] == [24] and s.why == "fits at 16, not at 24"


def test_a_search_records_each_tries_seconds_rounded(monkeypatch):
    ticks = iter([0.0, 0.1234567, 1.0, 1.5, 2.0, 2.6666666, 3.0, 3.0])
    monkeypatch.setattr(bs.time, "perf_counter", lambda: next(ticks))
    s = bs.search(card(56), 16, 8, guess=48, seconds=60, over=64)
    assert [(t["batch"], t["seconds"]) for t in s.tries] == [(48, 0.123), (64, 0.5), (56, 0.667)]
    assert s.bound == "exact" and s.as_record()["trial_seconds"] == 1.29


def test_run_stops_where_the_data_has_no_more_and_clears_the_scaler_after_each_try(fake_gpu):
    fake_gpu.most = 100  # digits' training split, say: the search's cap is 96, the estimate's 100
    fake_gpu.scaler = types.SimpleNamespace(_per_optimizer_states={})
    record = bs.run(GPU_SPEC, {"status": "ok", "peak_allocated_bytes": 1700}, None, {}, 8, 60)
    known = (GPU_SPEC.model_config, "fp32", "adamw", 16, 1700, 10_000, 100)
    assert ("guess", known) in fake_gpu.calls and ("over", known) in fake_gpu.calls
    assert [(t["batch"], t["fits"]) for t in record["tries"]] == [(64, True), (96, False), (80, True), (88, True)]
    assert (record["up_to_batch"], record["bound"], record["why"]) == (96, "exact", "fits at 88, not at 96")
    assert fake_gpu.scaler._per_optimizer_states == {}
    tries = 1 + len(record["tries"])
    assert fake_gpu.calls.count(("zero_grad",)) == tries
    assert fake_gpu.calls.count(("empty_cache",)) == 2 * tries  # before the try and after it is freed
    assert fake_gpu.calls.count(("reset_peak_memory_stats",)) == tries
    assert fake_gpu.plans == [None]
    fake_gpu.most, fake_gpu.plans = 1000, []
    plan = {"batch_size": 16, "cap_gib": 3}
    assert bs.run(GPU_SPEC, {"status": "ok"}, plan, {}, 2, 60)["up_to_batch"] == 32  # the search's cap is lower
    assert fake_gpu.plans == [plan]


def test_run_rounds_its_seconds(fake_gpu, monkeypatch):
    now = [0.0]

    def perf_counter():  # 0.1234567 s between any two readings
        now[0] += 0.1234567
        return now[0]

    monkeypatch.setattr(bs.time, "perf_counter", perf_counter)
    record = bs.run(GPU_SPEC, {"status": "ok", "peak_allocated_bytes": 1700}, None, {}, 8, 60)
    # the warm try: its start, its batch made, its end; a search's try: the search's start, the trial's, its batch
    # made, its end
    assert record["warm_seconds"] == round(3 * 0.1234567, 3) == 0.37
    assert [(t["seconds"], t["data_seconds"]) for t in record["tries"]] == [(0.37, 0.123)] * 5
    assert record["trial_seconds"] == 1.85


def test_main_rounds_its_wall_seconds_prints_an_empty_reason_and_keeps_its_usage_lines(tmp_path, monkeypatch,
                                                                                      capsys):
    import json

    (tmp_path / "cell.json").write_text(json.dumps({"status": "ok"}))
    ticks = iter([10.0, 11.234567])
    monkeypatch.setattr(bs.time, "monotonic", lambda: next(ticks))
    monkeypatch.setattr(bs, "run", lambda *args: {"status": "ok"})
    out = tmp_path / "fp32.json"
    bs.main(["--spec", json.dumps(SPEC.as_dict()), "--cell", str(tmp_path / "cell.json"), "--out", str(out)])
    assert json.loads(out.read_text()) == {"status": "ok", "wall_seconds": 1.23}
    assert capsys.readouterr().out == "m/fp32: ok \n"  # neither a why nor a reason
    with pytest.raises(SystemExit):
        bs.main(["--help"])
    lines = capsys.readouterr().out.splitlines()
    for line in bs.__doc__.splitlines()[2:4]:  # the usage as written, not re-wrapped
        assert line in lines


def test_an_out_of_memory_tries_note_is_its_first_line_at_most_200_characters(fake_gpu):
    import torch

    fake_gpu.oom_above = 15
    fake_gpu.error = RuntimeError("CUDA out of memory. " + "x" * 300 + "\nmore")
    record = bs.run(GPU_SPEC, {"status": "ok"}, None, {}, 8, 60)
    assert record["reason"] == ("out of memory at the planned batch 16 in the search's process (CUDA out of memory. "
                                + "x" * 180 + ")")
    fake_gpu.error, fake_gpu.steps = torch.cuda.OutOfMemoryError(" \n "), []
    record = bs.run(GPU_SPEC, {"status": "ok"}, None, {}, 8, 60)
    assert record["reason"] == "out of memory at the planned batch 16 in the search's process ()"  # no text
    fake_gpu.error = ValueError("CUDA out of memory, but not an allocation failure's type")
    with pytest.raises(ValueError):  # anything but an allocation failure is raised, not an answer
        bs.run(GPU_SPEC, {"status": "ok"}, None, {}, 8, 60)

import json
import math
import os

import pytest
import torch

from amprepro.train import cell, precision, train

NO_APEX = {"status": "skipped", "reason": "no apex source configured"}


def spec(precision_name="fp32", arch="small_cnn", steps=12, lr=0.002, optimizer="adamw", **model):
    return {"model": "m", "precision": precision_name, "seed": 0,
            "model_config": {"arch": arch, "data": "digits", "batch_size": 32, **model},
            "train": {"steps": steps, "warmup_steps": 2, "lr": lr, "optimizer": optimizer}}


def test_a_finished_cell_says_where_its_seconds_went():
    """Issue 40: phase_seconds, each phase the wall time since the one before, and the loop at least the run's own
    wall_seconds (which it contains); a forked or fresh process also says how long it lived before the run."""
    metrics, _ = train.run(spec(steps=4), NO_APEX, threads=1)
    phases = metrics["phase_seconds"]
    assert list(phases) == ["process_start_to_run", "device_and_provenance", "fit_check", "build", "data", "loop"]
    assert all(value >= 0 for value in phases.values() if value is not None)
    assert phases["process_start_to_run"] is None or phases["process_start_to_run"] > 0
    assert phases["loop"] >= metrics["wall_seconds"] - 0.01
    # over the timed steps (from the end of the warm-up to the last step read back), the CPUs other processes kept busy
    load = metrics["host_load"]
    assert 0 < load["timed_seconds"] < phases["loop"] and load["busy_cpus_others"] >= 0.0
    from amprepro.cellrecord import CellRecord

    assert CellRecord.from_dict(metrics, source="test").as_dict()["phase_seconds"] == phases


@pytest.fixture
def deferred_claim(tmp_path, monkeypatch):
    """This process as a cell that gpuslots --defer started: an open, unlocked descriptor of its GPU's lock file."""
    from amprepro import gpuslots

    fd = gpuslots.open_lock(tmp_path / "gpu0.lock")
    monkeypatch.setenv(gpuslots.CLAIM_ENV, str(fd))
    yield tmp_path / "gpu0.lock"
    os.close(fd)


def test_a_staged_cell_builds_before_it_locks_its_gpu_and_trains_exactly_as_an_unstaged_one(deferred_claim,
                                                                                              monkeypatch):
    """Issue 40: a cell started while another trains (amprepro.gpuslots --defer) seeds and builds its model first,
    then locks its GPU, and only then asks for its device; it goes on from the random state its build left, so its
    losses are those of the same cell started on a free GPU."""
    from amprepro import gpuslots
    from amprepro.train import distributed

    order = []
    real_build, real_claim, real_device = cell.build_weights, gpuslots.claim_deferred, distributed.Dist.device
    monkeypatch.setattr(cell, "build_weights", lambda *a, **k: order.append("build") or real_build(*a, **k))
    monkeypatch.setattr(gpuslots, "claim_deferred", lambda *a, **k: order.append("claim") or real_claim(*a, **k))
    monkeypatch.setattr(distributed.Dist, "device", lambda self: order.append("device") or real_device(self))
    # GPT-tiny's builder draws its weights from the CPU generator: what is drawn after the model (dropout, LoRA's
    # adapters) must come from where the build left it, as in a cell started on a free GPU
    tokens = {"arch": "gpt_tiny", "data": "synthetic_tokens", "batch_size": 2, "seq_len": 32}
    cell_spec = {**spec(steps=6), "model_config": tokens}
    after_build = []
    real_prepare = cell.prepare_model
    monkeypatch.setattr(cell, "prepare_model", lambda *a, **k: (real_prepare(*a, **k),
                                                                after_build.append(torch.get_rng_state()))[0])
    staged, staged_rows = train.run(cell_spec, NO_APEX, threads=1)
    assert order == ["build", "claim", "device"]
    assert gpuslots.CLAIM_ENV not in os.environ, "claimed once: nothing this cell starts locks it again"
    fd = os.open(deferred_claim, os.O_RDWR)
    assert not gpuslots.lock_nb(fd, gpuslots.fcntl.LOCK_EX), "the cell holds its GPU's lock"
    os.close(fd)
    assert list(staged["phase_seconds"])[:4] == ["process_start_to_run", "staged_build", "gpu_wait",
                                                  "device_and_provenance"]
    plain, plain_rows = train.run(cell_spec, NO_APEX, threads=1)
    assert order.count("claim") == 1 and "staged_build" not in plain["phase_seconds"]
    assert [r["loss"] for r in staged_rows] == [r["loss"] for r in plain_rows]
    assert len(after_build) == 2 and torch.equal(*after_build), "the random state after the model differs"
    assert staged["final_loss"] == plain["final_loss"] and staged["status"] == "ok"


STAGED_IMAGES = """
import json, os, sys, tempfile, types
# this venv's torchvision is the CUDA wheel beside a CPU torch: its operator registrations fail, its models build
sys.modules["torchvision._meta_registrations"] = types.ModuleType("torchvision._meta_registrations")
from amprepro import gpuslots
from amprepro.train import train

order = []
real_make, real_claim = train.make_data, gpuslots.claim_deferred
train.make_data = lambda *a, **k: order.append(f"data on {a[2]}") or real_make(*a, **k)
gpuslots.claim_deferred = lambda *a, **k: order.append("claim") or real_claim(*a, **k)
images = {"model": "m", "precision": "fp32", "seed": 0,
          "model_config": {"arch": "resnet50", "data": "synthetic_images", "batch_size": 2, "image_size": 32},
          "train": {"steps": 3, "warmup_steps": 1, "lr": 0.002, "optimizer": "adamw"}}
os.environ[gpuslots.CLAIM_ENV] = str(gpuslots.open_lock(os.path.join(tempfile.mkdtemp(), "gpu0.lock")))
staged, staged_rows = train.run(images, {"status": "skipped", "reason": "none"}, 1)
plain, plain_rows = train.run(images, {"status": "skipped", "reason": "none"}, 1)
print(json.dumps({"order": order, "status": [staged["status"], plain["status"]],
                  "losses": [[r["loss"] for r in staged_rows], [r["loss"] for r in plain_rows]]}))
"""


def test_a_staged_cell_draws_its_synthetic_images_before_the_claim_and_moves_them_after():
    """A benchmark cell's one synthetic image batch comes from its own generator: drawn on the CPU while the cell
    before trains, moved to the device once the GPU is held, the same values as drawn after (ResNet-50, in a
    subprocess for this venv's torchvision)."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    run = subprocess.run([sys.executable, "-c", STAGED_IMAGES], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(repo / "workflow")})
    assert run.returncode == 0, run.stderr[-2000:]
    found = json.loads(run.stdout.splitlines()[-1])
    # staged: drawn once, before the claim, not again after; then the unstaged cell draws it after its build
    assert found["order"] == ["data on cpu", "claim", "data on cpu"]
    assert found["status"] == ["ok", "ok"] and found["losses"][0] == found["losses"][1]


def test_a_staged_build_that_fails_is_built_again_once_the_gpu_is_held(deferred_claim, monkeypatch, capsys):
    from amprepro import gpuslots

    real_build = cell.build_weights
    calls = []

    def build_once_broken(*args, **kwargs):
        calls.append(gpuslots.CLAIM_ENV in os.environ)
        if len(calls) == 1:
            raise OSError("disk gone")
        return real_build(*args, **kwargs)

    monkeypatch.setattr(cell, "build_weights", build_once_broken)
    metrics, rows = train.run(spec(steps=4), NO_APEX, threads=1)
    assert metrics["status"] == "ok" and calls == [True, False]
    assert "building the model before the GPU was free failed" in capsys.readouterr().err
    assert [r["loss"] for r in rows] == [r["loss"] for r in train.run(spec(steps=4), NO_APEX, threads=1)[1]]


def test_fp32_run_writes_metrics_and_steps():
    metrics, rows = train.run(spec(), NO_APEX, threads=1)
    assert metrics["status"] == "ok"
    assert len(rows) == 12 and metrics["timed_steps"] == 10
    assert metrics["throughput_per_s"] > 0 and metrics["throughput_unit"] == "samples/s"
    assert 0.0 <= metrics["eval_accuracy"] <= 1.0
    assert metrics["tf32"] == {"matmul_allow_tf32": False, "cudnn_allow_tf32": False}
    assert metrics["software"]["torch"] == torch.__version__


def test_same_seed_gives_the_same_losses_on_cpu():
    first = [r["loss"] for r in train.run(spec(steps=6), NO_APEX, 1)[1]]
    second = [r["loss"] for r in train.run(spec(steps=6), NO_APEX, 1)[1]]
    assert first == second


def test_bf16_autocast_runs_on_cpu_and_learns():
    metrics, rows = train.run(spec("amp_bf16", arch="tiny_transformer", steps=40), NO_APEX, threads=1)
    assert metrics["status"] == "ok"
    assert rows[-1]["loss"] < rows[0]["loss"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU skip reasons")
@pytest.mark.parametrize("name, words", [("tf32", "TF32"), ("amp_fp16", "no CUDA GPU"), ("apex_o1", "CUDA"),
                                         ("apex_o2", "CUDA")])
def test_cells_this_machine_cannot_run_are_skipped_with_a_reason(name, words):
    metrics, rows = train.run(spec(name), NO_APEX, threads=1)
    assert metrics["status"] == "skipped" and words in metrics["reason"] and rows == []


def test_apex_cell_names_an_apex_without_amp():
    reason = precision.unsupported_reason("apex_o1", torch.device("cuda"),
                                          {"status": "built", "has_amp": False, "commit": "abc1234"})
    assert "no apex.amp" in reason and "25.05" in reason


def test_diverging_run_is_a_finding_not_a_crash():
    metrics, rows = train.run(spec(arch="tiny_transformer", lr=1e6, optimizer="sgd", steps=15), NO_APEX, 1)
    assert metrics["status"] == "collapsed"
    assert metrics["first_nonfinite_step"] is not None and metrics["nonfinite_steps"] >= 1
    assert not math.isfinite(rows[-1]["loss"])


def test_numerics_counts_skipped_steps_and_scale():
    rows = [{"step": 0, "loss": 2.0, "loss_scale": 65536.0, "skipped": True},
            {"step": 1, "loss": float("nan"), "loss_scale": 32768.0, "skipped": True},
            {"step": 2, "loss": 1.0, "loss_scale": 16384.0, "skipped": False}]
    assert train.numerics(rows) == {"nonfinite_steps": 1, "first_nonfinite_step": 1, "skipped_steps": 2,
                                    "loss_scale_initial": 65536.0, "loss_scale_final": 16384.0,
                                    "loss_scale_min": 16384.0}


def test_main_writes_steps_then_metrics(tmp_path):
    apex = tmp_path / "apex.json"
    apex.write_text(json.dumps(NO_APEX))
    train.main(["--spec", json.dumps(spec(steps=5)), "--apex", str(apex), "--metrics", str(tmp_path / "m.json"),
                "--steps", str(tmp_path / "s.csv")])
    assert json.loads((tmp_path / "m.json").read_text())["status"] == "ok"
    assert (tmp_path / "s.csv").read_text().splitlines()[0] == ",".join(train.STEP_FIELDS)
    assert not list(tmp_path.glob(".*"))  # no temp files left behind


class ZeroGradWithoutSetToNone(torch.optim.SGD):
    """Like apex's FusedAdam and O2's patched optimizer: zero_grad() takes no set_to_none (it broke H200 runs)."""

    def zero_grad(self):
        super().zero_grad(set_to_none=False)


def test_optimizers_whose_zero_grad_takes_no_set_to_none_still_train():
    model = torch.nn.Linear(4, 2)
    optimizer = ZeroGradWithoutSetToNone(model.parameters(), lr=0.1)
    trainer = precision.Trainer("fp32", model, optimizer, torch.nn.functional.cross_entropy, torch.device("cpu"))
    result = trainer.step(torch.randn(8, 4), torch.randint(0, 2, (8,)))
    assert torch.isfinite(result.loss)
    assert all(float(p.grad.abs().sum()) == 0.0 for p in model.parameters())


def test_apex_cast_cache_is_emptied_with_the_gradients():
    """A backward outside apex's scale_loss (FLOP counting) must not leave O1's cast cache behind for eval."""
    from types import SimpleNamespace

    cleared = []
    model = torch.nn.Linear(4, 2)
    trainer = precision.Trainer("fp32", model, ZeroGradWithoutSetToNone(model.parameters(), lr=0.1),
                                torch.nn.functional.cross_entropy, torch.device("cpu"))
    handle = SimpleNamespace(_clear_cache=lambda: cleared.append(True))  # stands in for apex's AmpHandle
    trainer.amp = SimpleNamespace(_amp_state=SimpleNamespace(handle=handle))
    trainer.zero_grad()
    assert cleared == [True]


@pytest.mark.parametrize("recomputes, cached", [(True, False), (False, True)])
def test_apex_o1_casts_afresh_when_the_model_recomputes_its_blocks(monkeypatch, recomputes, cached):
    """apex 25.05's O1 cast cache fails on a weight cast twice in one step (activation checkpointing): off then."""
    import sys
    from types import ModuleType, SimpleNamespace

    handle = SimpleNamespace(_enable_caching=True, _clear_cache=lambda: None)
    amp = SimpleNamespace(_amp_state=SimpleNamespace(handle=handle),
                          initialize=lambda model, optimizer, **kwargs: (model, optimizer))
    monkeypatch.setitem(sys.modules, "apex", ModuleType("apex"))
    monkeypatch.setattr(sys.modules["apex"], "amp", amp, raising=False)
    model = torch.nn.Linear(4, 2)
    trainer = precision.Trainer("apex_o1", model, torch.optim.SGD(model.parameters(), lr=0.1),
                                torch.nn.functional.cross_entropy, torch.device("cpu"), recomputes=recomputes)
    assert trainer.apex_cast_cache is cached and handle._enable_caching is cached


def test_fp16_scaler_steps_report_scale_and_skips_without_reading_back_inside_the_step():
    """The loss scale stays a device tensor inside the step (no host sync there) and is read back after it."""
    model = torch.nn.Linear(4, 2)
    blow_up = {"now": False}

    def loss_fn(logits, target):
        loss = torch.nn.functional.cross_entropy(logits.float(), target)
        return loss * float("inf") if blow_up["now"] else loss

    trainer = precision.Trainer("amp_fp16", model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn,
                                torch.device("cpu"))
    x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
    result = trainer.step(x, y)
    assert isinstance(result.scale, torch.Tensor)
    assert result.read_back() == (65536.0, False)
    blow_up["now"] = True
    before = [p.detach().clone() for p in model.parameters()]
    assert trainer.step(x, y).read_back() == (65536.0, True)  # the scale this step used; the step was skipped
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    blow_up["now"] = False
    assert trainer.step(x, y).read_back() == (32768.0, False)


def test_a_cell_that_breaks_is_recorded_as_failed_with_the_reason(monkeypatch, capsys):
    def broken(model_config, device, init_cache=None, built=None):
        raise TypeError("zero_grad() got an unexpected keyword argument 'set_to_none'")

    monkeypatch.setattr(cell, "prepare_model", broken)
    metrics, rows = train.run(spec(), NO_APEX, 1)
    assert metrics["status"] == "failed" and rows == []
    assert metrics["reason"].startswith("TypeError: zero_grad() got an unexpected keyword argument")
    assert "--forcerun" in metrics["reason"]
    assert "Traceback" in capsys.readouterr().err  # the whole traceback is in the cell's log


def test_out_of_memory_is_a_skip_that_names_the_batch_size(monkeypatch):
    def too_big(model_config, device, init_cache=None, built=None):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(cell, "prepare_model", too_big)
    metrics, _ = train.run(spec(), NO_APEX, 1)
    assert metrics["status"] == "skipped"
    assert metrics["reason"].startswith("out of GPU memory at batch size 32: CUDA out of memory")
    assert "a batch written in your config is kept as written: lower it" in metrics["reason"]


def test_the_timed_window_opens_on_the_last_warmup_steps_end_once_the_first_timed_step_is_queued(monkeypatch):
    """Issue 40, results-reference/perf/first-timed-step: the loop hands the window the last warm-up step's timer
    before the first timed step, and opens it only once that step is queued, so the GPU's queue never runs out."""
    from amprepro.train import measure

    events, timers = [], []

    class Timer(measure.StepTimer):
        def __enter__(self):
            timers.append(self)
            return super().__enter__()

    class Window(measure.TimedWindow):
        def before_first(self, last_warmup, device):
            events.append(("before", timers.index(last_warmup)))
            super().before_first(last_warmup, device)

        def after_first_queued(self):
            events.append("after")
            super().after_first_queued()

    real_step = precision.Trainer.step
    monkeypatch.setattr(precision.Trainer, "step", lambda self, x, y: events.append("step") or real_step(self, x, y))
    monkeypatch.setattr(measure, "StepTimer", Timer)
    monkeypatch.setattr(measure, "TimedWindow", Window)
    metrics, _ = train.run(spec(steps=5), NO_APEX, threads=1)
    assert metrics["status"] == "ok" and metrics["timed_steps"] == 3
    assert events == ["step", "step", ("before", 1), "step", "after", "step", "step"]


def test_progress_reads_wait_for_their_own_steps_end_and_read_on_a_side_stream(monkeypatch):
    """Review of 70e81ac: at 3 warm-up steps the progress read of step 0 comes at step 2. Read on the loop's stream
    (float(loss)), it waited for everything queued, step 2 included, so the first timed step started with nothing
    queued and the timed window never took its new path. Each read now waits for its own step's end event, then reads
    in measure.SideReads."""
    from amprepro.train import measure

    events = []

    class Reads(measure.SideReads):
        def __enter__(self):
            events.append("side")
            return super().__enter__()

        def __exit__(self, *exc):
            events.append("main")
            return super().__exit__(*exc)

    class Timer(measure.StepTimer):
        def settle(self):
            events.append("its end")
            return super().settle()

    real = precision.StepResult.read_back
    monkeypatch.setattr(precision.StepResult, "read_back", lambda self: events.append("read") or real(self))
    monkeypatch.setattr(measure, "SideReads", Reads)
    monkeypatch.setattr(measure, "StepTimer", Timer)
    cell_spec = spec(steps=5)
    cell_spec["train"]["warmup_steps"] = 3
    metrics, rows = train.run(cell_spec, NO_APEX, threads=1)
    assert metrics["status"] == "ok" and len(rows) == 5
    assert events == ["its end", "side", "read", "main"] * 5

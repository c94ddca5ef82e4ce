import json
import math

import pytest
import torch

from amprepro import precision, train

NO_APEX = {"status": "skipped", "reason": "no apex source configured"}


def spec(precision_name="fp32", arch="small_cnn", steps=12, lr=0.002, optimizer="adamw", **model):
    return {"model": "m", "precision": precision_name, "seed": 0,
            "model_config": {"arch": arch, "data": "digits", "batch_size": 32, **model},
            "train": {"steps": steps, "warmup_steps": 2, "lr": lr, "optimizer": optimizer}}


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

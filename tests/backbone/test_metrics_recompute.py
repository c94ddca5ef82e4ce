"""Every figure of a cell's metrics.json, recomputed independently from its steps.csv and the batch it really had."""

from __future__ import annotations

import csv
import json
import math
import statistics

import numpy as np
import pytest

from amprepro.train import train

DIGITS_TRAIN_SPLIT = 1797 - 359  # sklearn's 1797 digits less the 20 % test split
CELLS = {
    "digits": ({"arch": "tiny_transformer", "data": "digits", "batch_size": 48}, 48, "samples"),
    "tokens": ({"arch": "gpt_tiny", "data": "synthetic_tokens", "batch_size": 3, "seq_len": 16}, 3 * 16, "tokens"),
}


@pytest.fixture(scope="module", params=sorted(CELLS))
def cell(request, tmp_path_factory):
    model_config, items, unit = CELLS[request.param]
    spec = {"model": request.param, "precision": "fp32", "seed": 0, "model_config": model_config,
            "train": {"steps": 24, "warmup_steps": 4, "lr": 0.002, "optimizer": "adamw", "weight_decay": 0.0}}
    out = tmp_path_factory.mktemp(request.param)
    (out / "apex.json").write_text(json.dumps({"status": "skipped", "reason": "test"}))
    train.main(["--spec", json.dumps(spec), "--apex", str(out / "apex.json"), "--metrics", str(out / "metrics.json"),
                "--steps", str(out / "steps.csv")])
    rows = list(csv.DictReader((out / "steps.csv").open()))
    return json.loads((out / "metrics.json").read_text()), rows, spec, items, unit


def test_the_digits_split_size_is_the_one_validation_uses():
    from amprepro import datakinds
    from amprepro.train import data

    assert datakinds.digits_train_size() == DIGITS_TRAIN_SPLIT == len(data.digits_split()[0][1])


def test_every_timing_figure_follows_from_steps_csv_and_the_real_batch(cell):
    metrics, rows, spec, items, unit = cell
    assert metrics["status"] == "ok", metrics.get("reason")
    seconds = [float(r["step_time_s"]) for r in rows]
    timed = seconds[spec["train"]["warmup_steps"]:]
    assert [int(r["step"]) for r in rows] == list(range(spec["train"]["steps"]))
    assert metrics["timed_steps"] == len(timed) and metrics["warmup_steps"] == spec["train"]["warmup_steps"]
    assert metrics["step_time_median_s"] == pytest.approx(statistics.median(timed), rel=1e-12)
    assert metrics["step_time_p90_s"] == pytest.approx(float(np.percentile(timed, 90)), rel=1e-12)
    assert metrics["step_time_mean_s"] == pytest.approx(sum(timed) / len(timed), rel=1e-12)
    assert metrics["items_per_step"] == items and metrics["throughput_unit"] == f"{unit}/s"
    assert metrics["throughput_per_s"] == pytest.approx(items / statistics.median(timed), rel=1e-12)
    assert metrics["achieved_tflops"] == pytest.approx(
        metrics["flops_per_step"] / statistics.median(timed) / 1e12, rel=1e-12)


def test_every_loss_figure_follows_from_steps_csv(cell):
    metrics, rows, _, _, _ = cell
    losses = [float(r["loss"]) for r in rows]
    assert metrics["final_loss"] == pytest.approx(losses[-1], rel=1e-12)
    assert metrics["final_loss_mean10"] == pytest.approx(sum(losses[-10:]) / 10, rel=1e-12)
    assert metrics["nonfinite_steps"] == sum(not math.isfinite(v) for v in losses) == 0
    assert metrics["skipped_steps"] == sum(r["skipped"] == "True" for r in rows)
    assert metrics["loss_scale_initial"] is metrics["loss_scale_final"] is None  # fp32: no scaler


def test_figures_a_cpu_cell_cannot_measure_are_absent_not_guessed(cell):
    metrics, _, spec, _, _ = cell
    assert metrics["energy_j_per_item"] is None and metrics["datasheet_peak_tflops"] is None
    assert metrics["datasheet_note"] == "no GPU: no datasheet peak"
    assert metrics["epoch_hours_derived"] is None and metrics["peak_allocated_bytes"] is None
    assert metrics["world_size"] == 1 and metrics["spec"] == spec

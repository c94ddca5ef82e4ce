"""Every committed reference run's figures, recomputed from its step data: each ok cell's median and p90 step time,
throughput, final loss, skipped steps and speedups follow from the cell's steps.csv (in the run's steps.tar.gz) and
the settings its provenance records, with the same warm-up. A run promoted without step data must say so in its
provenance and be listed in NO_STEP_DATA; any other run without it fails here."""

from __future__ import annotations

import csv
import io
import json
import statistics
import tarfile
from pathlib import Path

import numpy as np
import pytest

REFERENCE = Path(__file__).resolve().parents[2] / "reference"
RUNS = sorted(path for path in REFERENCE.glob("*/runs/*") if path.is_dir())
# Runs whose steps.csv files were never kept (README: reference/README.md), with why.
NO_STEP_DATA = {
    "nvidia-h200/runs/2026-11-30-960f4eaf": "promoted in the one-run layout, before step data was kept (issue 12)",
}


def run_id(path: Path) -> str:
    return path.relative_to(REFERENCE).as_posix()


WITH_STEPS = [run for run in RUNS if run_id(run) not in NO_STEP_DATA]
WITHOUT_STEPS = [run for run in RUNS if run_id(run) in NO_STEP_DATA]


def steps_of(run: Path) -> dict[str, list[dict]]:
    with tarfile.open(run / "steps.tar.gz") as archive:
        return {member.name: list(csv.DictReader(io.TextIOWrapper(archive.extractfile(member), encoding="utf-8")))
                for member in archive.getmembers() if member.isfile()}


def items_per_step(model_config: dict) -> int:
    """What one step trains on, from the recorded settings (amprepro.train.train.items_per_step counts it from the
    batch itself): the batch, in tokens for token data, synthetic or the stdlib's bytes (batch x sequence length,
    1024 unless set)."""
    if model_config["data"] in ("synthetic_tokens", "python_stdlib"):
        return model_config["batch_size"] * model_config.get("seq_len", 1024)
    return model_config["batch_size"]


def test_there_are_reference_runs_and_the_list_of_runs_without_step_data_is_current():
    assert len(RUNS) >= 5 and WITH_STEPS, RUNS
    assert set(NO_STEP_DATA) <= {run_id(run) for run in RUNS}, "NO_STEP_DATA names a run that is not committed"


@pytest.mark.parametrize("run", WITHOUT_STEPS, ids=run_id)
def test_a_run_without_step_data_says_so(run):
    provenance = json.loads((run / "provenance.json").read_text())
    assert provenance["steps"]["kept"] is False and provenance["steps"]["cells"] == 0, provenance["steps"]
    assert "not kept" in provenance["steps"]["why"]
    assert not (run / "steps.tar.gz").exists()


@pytest.mark.parametrize("run", WITH_STEPS, ids=run_id)
def test_every_figure_of_a_reference_run_follows_from_its_steps(run):
    provenance = json.loads((run / "provenance.json").read_text())
    assert provenance["steps"]["kept"] is True, f"{run_id(run)}: no step data; if so, list it in NO_STEP_DATA"
    steps = steps_of(run)
    assert len(steps) == provenance["steps"]["cells"]
    rows = list(csv.DictReader((run / "summary.csv").open(encoding="utf-8")))
    throughput, checked = {}, 0
    for row in rows:
        cell = (row["model"], row["precision"], int(row["seed"]))
        if row["status"] != "ok":
            continue
        spec = provenance["specs"]["{}/{}/{}".format(*cell)]
        step_rows = steps[f"runs/{row['model']}/{row['precision']}/seed{row['seed']}/steps.csv"]
        assert [int(r["step"]) for r in step_rows] == list(range(spec["train"]["steps"])), cell
        timed = [float(r["step_time_s"]) for r in step_rows][spec["train"]["warmup_steps"]:]
        median = statistics.median(timed)
        where = f"{run_id(run)} {cell}"
        assert float(row["step_time_median_s"]) == pytest.approx(median, rel=1e-12), where
        assert float(row["step_time_p90_s"]) == pytest.approx(float(np.percentile(timed, 90)), rel=1e-12), where
        throughput[cell] = items_per_step(spec["model_config"]) / median
        assert float(row["throughput_per_s"]) == pytest.approx(throughput[cell], rel=1e-12), where
        assert float(row["final_loss"]) == pytest.approx(float(step_rows[-1]["loss"]), rel=1e-12), where
        assert int(row["skipped_steps"]) == sum(r["skipped"] == "True" for r in step_rows), where
        checked += 1
    for row in rows:
        model, precision, seed = row["model"], row["precision"], int(row["seed"])
        for baseline in ("fp32", "tf32"):
            value, base = throughput.get((model, precision, seed)), throughput.get((model, baseline, seed))
            column = row[f"speedup_vs_{baseline}"]
            if value and base:
                assert float(column) == pytest.approx(value / base, rel=1e-12), (run_id(run), model, precision)
            else:
                assert column == "", (run_id(run), model, precision, baseline, column)
    assert checked == sum(row["status"] == "ok" for row in rows) > 0

"""amprepro.cellrecord: every committed metrics.json round-trips through CellRecord to the same dict and the same bytes,
unknown keys are refused by name, absent keys stay absent, every field says what it holds; and the train job's writer
(amprepro.train.record.write_results) writes through it the bytes the dict alone gave."""

from __future__ import annotations

import dataclasses
import inspect
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from amprepro import cellrecord
from amprepro.cellrecord import ABSENT, CellRecord, CellRecordError
from amprepro.files import write_json
from amprepro.train import train

ROOT = Path(__file__).resolve().parents[2]
# the committed records of real runs: results-reference/ and reference/ (the smoke fixture is a real smoke run's copy)
RECORDS = sorted(p for base in ("results-reference", "reference", "tests/report/fixtures/smoke")
                 for p in (ROOT / base).rglob("metrics.json"))
NO_APEX = {"status": "skipped", "reason": "no apex source configured"}


def spec(steps=5):
    return {"model": "m", "precision": "fp32", "seed": 0,
            "model_config": {"arch": "small_cnn", "data": "digits", "batch_size": 32},
            "train": {"steps": steps, "warmup_steps": 2, "lr": 0.002, "optimizer": "adamw"}}


def written(path: Path, data) -> str:
    write_json(path, data)
    return path.read_text()


def test_the_committed_records_are_found():
    assert len([p for p in RECORDS if "results-reference" in p.parts]) >= 24
    assert len([p for p in RECORDS if "smoke" in p.parts]) == 12


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_committed_metrics_json_round_trips_to_the_same_dict_and_bytes(path, tmp_path):
    data = json.loads(path.read_text())
    fields = CellRecord.from_dict(data).as_dict()
    assert fields == data
    assert CellRecord.read(path).as_dict() == data
    assert written(tmp_path / "metrics.json", fields) == path.read_text()


def test_an_unknown_key_is_refused_by_name():
    with pytest.raises(CellRecordError, match=r"cells/m.json has keys a cell's record does not know: "
                                              r"speedup_vs_fp32, zeta"):
        CellRecord.from_dict({"model": "m", "precision": "fp32", "seed": 0, "status": "ok", "zeta": 1,
                              "speedup_vs_fp32": 2.0}, source="cells/m.json")
    record = CellRecord.from_dict({"model": "m", "precision": "fp32", "seed": 0, "status": "ok"})
    with pytest.raises(CellRecordError, match="no keys zeta"):
        record.with_fields(zeta=1)


def test_a_missing_required_key_is_refused_by_name():
    with pytest.raises(CellRecordError, match="lacks the keys every cell's record has: seed, status"):
        CellRecord.from_dict({"model": "m", "precision": "fp32"})


def test_absent_keys_stay_absent_and_none_stays_none():
    record = CellRecord.from_dict({"model": "m", "precision": "fp32", "seed": 0, "status": "skipped",
                                   "plan": None, "reason": "no GPU"})
    assert record.as_dict() == {"model": "m", "precision": "fp32", "seed": 0, "plan": None, "status": "skipped",
                                "reason": "no GPU"}
    assert record.gpu_shared is ABSENT and not record.has("gpu_shared") and record.has("plan")
    assert record.with_fields(gpu_shared={"cells_per_gpu": 2}).as_dict()["gpu_shared"] == {"cells_per_gpu": 2}
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.status = "ok"


def test_every_field_says_what_it_holds():
    lines = inspect.getsource(cellrecord.CellRecord).splitlines()
    undocumented = []
    for field in dataclasses.fields(CellRecord):
        at = next(i for i, line in enumerate(lines) if line.strip().startswith(f"{field.name}:"))
        if not lines[at - 1].strip().startswith("#:"):
            undocumented.append(field.name)
    assert undocumented == []


def test_the_writer_writes_through_the_record_the_bytes_of_the_dict(tmp_path):
    finished, rows = train.run(spec(), NO_APEX, threads=1)
    skipped, _ = train.run({**spec(), "precision": "apex_o1"}, NO_APEX, threads=1)
    assert (finished["status"], skipped["status"]) == ("ok", "skipped")
    for index, (metrics, steps) in enumerate(((finished, rows), (skipped, []))):
        args = SimpleNamespace(metrics=tmp_path / f"m{index}.json", steps=tmp_path / f"s{index}.csv")
        train.write_results(args, metrics, steps)
        assert args.metrics.read_text() == written(tmp_path / f"dict{index}.json", metrics)
        assert CellRecord.read(args.metrics).as_dict() == metrics


def test_the_writer_refuses_a_key_the_record_does_not_know_before_writing_anything(tmp_path):
    metrics, rows = train.run(spec(), NO_APEX, threads=1)
    args = SimpleNamespace(metrics=tmp_path / "m.json", steps=tmp_path / "s.csv")
    with pytest.raises(CellRecordError, match="does not know: throughput_per_hour"):
        train.write_results(args, {**metrics, "throughput_per_hour": 1.0}, rows)
    assert list(tmp_path.iterdir()) == []


def test_a_cell_its_launcher_cannot_start_is_written_through_the_record(tmp_path):
    metrics = tmp_path / "metrics.json"
    train.write_not_run(["--spec", json.dumps(spec()), "--metrics", str(metrics), "--steps", str(tmp_path / "s.csv")],
                        "machine", "2 GPUs", "needs 2 GPUs, has 0")
    data = json.loads(metrics.read_text())
    assert CellRecord.read(metrics).as_dict() == data
    assert (data["status"], data["skip_cause"], data["skip_needs"], data["world_size"], data["nodes"]) == (
        "skipped", "machine", "2 GPUs", 0, 0)


def test_a_gpu_cell_without_a_plan_records_the_free_memory_it_started_with(monkeypatch):
    """oom.does_not_fit adds free_bytes_at_start to the record of a GPU cell run without a memory plan."""
    import torch

    from amprepro.train import oom

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (1000, 2000))
    from amprepro import memory
    from amprepro.cellspec import CellSpec

    cell = CellSpec.of(spec())
    estimate = memory.estimate(cell.settings, cell.precision, cell.optimizer).as_record()
    base = {"model": "m", "precision": "fp32", "seed": 0, "spec": spec(), "memory_estimate": estimate}
    record = oom.does_not_fit(cell, base, None, SimpleNamespace(type="cuda"))
    assert record["status"] == "skipped" and CellRecord.from_dict(record).free_bytes_at_start == 1000
    assert CellRecord.from_dict(record).as_dict() == record

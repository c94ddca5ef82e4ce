"""The summary job through `summary.main(argv)` in this process (the pipeline runs it as a subprocess, which mutation
testing cannot see): every cell's row in summary.csv and summary.json from hand-made metrics.json files, the
flattened memory records, the batch plan, the largest-batch columns, the versions block and the interpreter check.
Every expected figure is computed by hand from the inputs written here. CPU only, no torch."""

from __future__ import annotations

import csv
import json
import os
import re

import pytest

from amprepro.analysis import summary

SOFTWARE = {"python": "3.11.7", "prefix": "/work/.venv", "torch": "2.13.0+cu130", "cuda": "13.0"}
ENVIRONMENT = {"python": {"version": "3.11.7"},
               "torch": {"version": "2.13.0+cu130", "cuda": "13.0", "cudnn": 91000, "nccl": "2.27.3"},
               "isolation": {"mode": "current", "prefix": "/work/.venv"},
               "packages": {"torch": "2.13.0", "numpy": "2.1.0", "pandas": "2.2.0", "snakemake": "9.1.0"}}
HARDWARE = {"gpu_name": "NVIDIA H200", "gpu_count": 2, "driver": "580.1", "cpu": "Xeon",
            "gpu_memory_bytes": 150_121_480_192}
PEAK = {"status": "ok", "tflops": {"fp32": 50.0, "tf32": 400.0, "bf16": 800.0, "fp16": 800.0}}


def metrics(model, precision, seed=0, status="ok", **values):
    return {"model": model, "precision": precision, "seed": seed, "status": status, "software": SOFTWARE, **values}


def cells():
    fp32 = metrics("vit", "fp32", throughput_per_s=100.0, peak_allocated_bytes=8000, achieved_tflops=10.0,
                   world_size=1, datasheet_peak_tflops=60.0, energy_j_per_item=2.0, hardware=HARDWARE,
                   memory_breakdown_bytes={"weights": 11, "gradients": 12, "optimizer_state": 13,
                                           "master_weights": 14, "activations_and_workspace": 15},
                   memory_estimate={"total_bytes": 99},
                   spec={"model_config": {"batch_size": 64, "shape": [4, 256]}},
                   plan={"preset_batch_size": 128, "shape_name": "small", "why": "the batch halved to fit",
                         "cap_gib": 40},
                   parameters=12345, host_load={"cpus": 16, "load_1min": 7.5, "busy_cpus_others": 6.04})
    bf16 = metrics("vit", "amp_bf16", throughput_per_s=250.0, peak_allocated_bytes=5000, achieved_tflops=300.0,
                   world_size=2, datasheet_peak_tflops=1000.0, energy_j_per_item=0.5,
                   spec={"model_config": {"batch_size": 32}}, plan={})
    tf32 = metrics("vit", "tf32", throughput_per_s=125.0, peak_allocated_bytes=8000)
    skipped = metrics("vit", "apex_o1", status="skipped", reason="no apex", throughput_per_s=None)
    failed = metrics("cnn", "fp32", status="failed", reason="OOM")
    collapsed = metrics("cnn", "amp_fp16", status="collapsed", throughput_per_s=3.0)
    return [fp32, bf16, tf32, skipped, failed, collapsed]


def write_inputs(tmp_path, records, environment=ENVIRONMENT, searches=()):
    paths = []
    for index, record in enumerate(records):
        path = tmp_path / "cells" / str(index) / "metrics.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(record))
        paths.append(str(path))
    for name, value in (("env.json", environment), ("apex.json", {"status": "built", "commit": "abc123"}),
                        ("peak.json", PEAK)):
        (tmp_path / name).write_text(json.dumps(value))
    search_paths = []
    for index, record in enumerate(searches):
        path = tmp_path / f"search{index}.json"
        path.write_text(json.dumps(record))
        search_paths.append(str(path))
    argv = ["--metrics", *paths, "--env", str(tmp_path / "env.json"), "--apex", str(tmp_path / "apex.json"),
            "--peak", str(tmp_path / "peak.json"), "--preset", json.dumps({"preset": "smoke", "why": "CI"}),
            "--csv", str(tmp_path / "summary.csv"), "--json", str(tmp_path / "summary.json")]
    if search_paths:
        argv += ["--largest-batch", *search_paths]
    return argv


SEARCHES = [
    {"model": "vit", "precision": "amp_bf16", "seed": 0, "status": "ok", "largest_batch": 640, "bound": "at_least",
     "smallest_failing_batch": 704, "grid_step": 32},
    {"model": "vit", "precision": "fp32", "seed": 0, "status": "failed", "largest_batch": 999, "bound": "exact"},
    {"model": "vit", "precision": "fp32", "seed": 1, "status": "ok", "largest_batch": 7, "bound": "exact"},
]


def run_main(tmp_path, capsys, argv_extra=(), **kw):
    argv = write_inputs(tmp_path, cells(), **kw) + list(argv_extra)
    summary.main(argv)
    out = capsys.readouterr().out
    made = json.loads((tmp_path / "summary.json").read_text())
    with (tmp_path / "summary.csv").open(newline="") as handle:
        reader = csv.DictReader(handle)
        header, rows = reader.fieldnames, list(reader)
    return out, made, header, rows


def test_main_writes_every_cell_with_its_speedups_mfu_and_energy(tmp_path, capsys):
    out, made, header, rows = run_main(tmp_path, capsys, searches=SEARCHES)
    assert out.strip() == ("summary: 6 cells, {'ok': 3, 'skipped': 1, 'collapsed': 1, 'failed': 1}")
    assert made["counts"] == {"ok": 3, "skipped": 1, "collapsed": 1, "failed": 1}
    assert header == summary.COLUMNS
    assert [(r["model"], r["precision"], r["status"]) for r in rows] == [
        ("vit", "fp32", "ok"), ("vit", "amp_bf16", "ok"), ("vit", "tf32", "ok"), ("vit", "apex_o1", "skipped"),
        ("cnn", "fp32", "failed"), ("cnn", "amp_fp16", "collapsed")]
    by = {(c["model"], c["precision"]): c for c in made["cells"]}
    bf16, fp32 = by["vit", "amp_bf16"], by["vit", "fp32"]
    assert bf16["speedup_vs_fp32"] == pytest.approx(250 / 100)
    assert bf16["speedup_vs_tf32"] == pytest.approx(250 / 125)
    assert bf16["memory_ratio_vs_fp32"] == pytest.approx(5000 / 8000)
    # one GPU's measured bf16 peak (800) times the cell's two GPUs; the datasheet figure is already the cell's
    assert bf16["mfu_vs_measured_peak"] == pytest.approx(300 / (800 * 2))
    assert bf16["mfu_vs_datasheet"] == pytest.approx(300 / 1000)
    assert bf16["achieved_tflops"] == 300.0 and bf16["energy_j_per_item"] == 0.5
    assert fp32["mfu_vs_measured_peak"] == pytest.approx(10 / 50) and fp32["mfu_vs_datasheet"] == pytest.approx(1 / 6)
    assert fp32["energy_j_per_item"] == 2.0
    assert fp32["speedup_vs_fp32"] == 1.0 and fp32["speedup_vs_tf32"] == pytest.approx(100 / 125)
    assert by["vit", "tf32"]["speedup_vs_tf32"] == 1.0
    for key in (("vit", "apex_o1"), ("cnn", "fp32"), ("cnn", "amp_fp16")):
        assert by[key]["speedup_vs_fp32"] is None and by[key]["memory_ratio_vs_fp32"] is None
    assert by["vit", "apex_o1"]["reason"] == "no apex" and by["cnn", "fp32"]["reason"] == "OOM"
    # the CSV holds the same figures as text
    csv_bf16 = rows[1]
    assert float(csv_bf16["speedup_vs_fp32"]) == pytest.approx(2.5)
    assert float(csv_bf16["mfu_vs_measured_peak"]) == pytest.approx(0.1875)
    assert csv_bf16["throughput_per_s"] == "250.0" and rows[3]["speedup_vs_fp32"] == ""


def test_main_flattens_the_memory_records_and_the_batch_plan(tmp_path, capsys):
    _, made, _, rows = run_main(tmp_path, capsys)
    fp32, bf16 = made["cells"][0], made["cells"][1]
    assert [fp32[column] for column, _, _ in summary.MEMORY_COLUMNS] == [11, 12, 13, 14, 15, 99]
    assert all(bf16[column] is None for column, _, _ in summary.MEMORY_COLUMNS)
    assert rows[0]["mem_activations_bytes"] == "15" and rows[0]["mem_estimate_total_bytes"] == "99"
    assert (fp32["batch_size"], fp32["preset_batch_size"], fp32["shape"], fp32["shape_name"]) == (
        64, 128, [4, 256], "small")
    assert fp32["parameters"] == 12345 and fp32["plan_note"] == "the batch halved to fit"
    # no plan record: the preset's batch is the batch the cell ran at
    assert (bf16["batch_size"], bf16["preset_batch_size"], bf16["shape"], bf16["shape_name"], bf16["plan_note"]) == (
        32, 32, None, None, None)
    # the CPUs other processes kept busy while each cell was timed (its host_load), where the cell measured them
    assert fp32["host_busy_cpus"] == 6.04 and rows[0]["host_busy_cpus"] == "6.04" and bf16["host_busy_cpus"] is None
    tf32 = made["cells"][2]
    assert tf32["batch_size"] is None and tf32["preset_batch_size"] is None and tf32["parameters"] is None


def test_main_records_the_versions_peak_and_preset(tmp_path, capsys):
    _, made, _, _ = run_main(tmp_path, capsys)
    assert made["preset"] == {"preset": "smoke", "why": "CI"}
    assert made["peak"] == PEAK
    assert made["versions"] == {
        "python": "3.11.7", "torch": "2.13.0+cu130", "cuda": "13.0", "cudnn": 91000, "nccl": "2.27.3",
        "apex_status": "built", "apex_commit": "abc123", "gpu": "NVIDIA H200", "gpu_count": 2, "driver": "580.1",
        "cpu": "Xeon", "isolation": "current", "gpu_memory_limit_gib": 40, "gpu_memory_bytes": 150_121_480_192,
        # only the key packages; pandas is not one of them
        "packages": {"torch": "2.13.0", "numpy": "2.1.0", "snakemake": "9.1.0"}}


def test_main_puts_each_search_on_the_row_it_started_from(tmp_path, capsys):
    _, made, _, rows = run_main(tmp_path, capsys, searches=SEARCHES,
                                argv_extra=["--largest-batch-asked", json.dumps({"models": ["vit"]})])
    fields = ["largest_batch", "largest_batch_bound", "largest_batch_failing", "largest_batch_grid"]
    by = {(c["model"], c["precision"]): c for c in made["cells"]}
    assert [by["vit", "amp_bf16"][f] for f in fields] == [640, "at_least", 704, 32]
    # the fp32 search of seed 0 failed, and seed 1's has no cell here: no answer on the seed-0 row
    assert [by["vit", "fp32"][f] for f in fields] == [None, None, None, None]
    assert rows[1]["largest_batch"] == "640" and rows[0]["largest_batch"] == ""
    assert made["largest_batch"] == {"models": ["vit"], "records": SEARCHES, "why_none": ""}


def test_the_largest_batch_block_says_why_there_are_no_searches():
    assert summary.largest_batch({}, []) == {"models": [], "records": [],
                                             "why_none": "runs.largest_batch.models names no model"}
    asked = {"models": ["vit"], "note": "no CUDA GPU: the search runs on a GPU"}
    assert summary.largest_batch(asked, []) == {"models": ["vit"], "records": [],
                                                "why_none": "no CUDA GPU: the search runs on a GPU"}
    assert summary.largest_batch({"models": ["vit"]}, [])["why_none"] == ""
    # a note but no model: the missing model is the reason
    assert summary.largest_batch({"note": "x"}, [])["why_none"] == "runs.largest_batch.models names no model"
    assert summary.largest_batch({"models": ["vit"], "note": "x"}, [{"a": 1}])["why_none"] == ""


def test_the_memory_limit_is_the_first_cells_cap():
    assert summary.memory_limit([{}, {"plan": None}, {"plan": {"cap_gib": 0}}, {"plan": {"cap_gib": 24}},
                                 {"plan": {"cap_gib": 80}}]) == 24
    assert summary.memory_limit([{"plan": {}}, {}]) is None


def test_main_stops_on_another_interpreter_and_writes_nothing(tmp_path, capsys):
    other = {**ENVIRONMENT, "torch": {"version": "2.12.0", "cuda": "12.8"}}
    argv = write_inputs(tmp_path, cells(), environment=other)
    with pytest.raises(SystemExit) as stopped:
        summary.main(argv)
    assert stopped.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith(f"ERROR: {tmp_path / 'env.json'} describes python 3.11.7 at /work/.venv, torch 2.12.0, "
                          "CUDA 12.8, but cell vit/fp32/seed0 ran in python 3.11.7 at /work/.venv, torch "
                          "2.13.0+cu130, CUDA 13.0.")
    assert not (tmp_path / "summary.csv").exists() and not (tmp_path / "summary.json").exists()


def test_the_interpreter_check_compares_only_what_the_cell_recorded(tmp_path):
    recorded = {"python": "3.11.7", "torch": "2.13.0", "cuda": None, "prefix": str(tmp_path / "venv")}
    (tmp_path / "venv").mkdir()
    os.symlink(tmp_path / "venv", tmp_path / "link")
    assert summary.differences(recorded, {"python": "3.11.7", "torch": "2.13.0", "cuda": None,
                                          "prefix": str(tmp_path / "link")}) == []  # the same directory
    assert summary.differences(recorded, {"python": None, "prefix": None, "torch": "2.13.0", "cuda": None}) == []
    assert summary.differences(recorded, {"torch": "2.13.0"}) == []
    assert summary.differences(recorded, {"cuda": "13.0", "torch": None}) == ["torch", "cuda"]
    assert summary.differences(recorded, {"python": "3.12.1", "prefix": "/usr", "torch": "2.13.0", "cuda": None}) == [
        "python", "prefix"]
    # a prefix recorded on one side only is a difference
    assert summary.differences({**recorded, "prefix": None}, {"prefix": "/usr"}) == ["prefix"]
    assert summary.interpreter_of_record(ENVIRONMENT) == {"python": "3.11.7", "torch": "2.13.0+cu130",
                                                          "cuda": "13.0", "prefix": "/work/.venv"}
    assert summary.interpreter_of_record({}) == {"python": None, "torch": None, "cuda": None, "prefix": None}
    assert summary.interpreter_of_cell({"software": SOFTWARE}) == SOFTWARE
    assert summary.interpreter_of_cell({}) == {"python": None, "torch": None, "cuda": None, "prefix": None}
    # a cell without a software record is not checked
    summary.check_environment({}, [{"model": "m", "precision": "fp32", "seed": 0}])


def test_a_cell_row_holds_only_the_summarys_columns(tmp_path, capsys):
    _, made, _, _ = run_main(tmp_path, capsys, searches=SEARCHES)
    for row in made["cells"]:
        assert set(row) <= set(summary.COLUMNS), set(row) - set(summary.COLUMNS)
        assert {"model", "precision", "seed", "status"} <= set(row)


def test_the_interpreter_check_names_the_record_and_looks_past_cells_without_one(tmp_path):
    other = {**ENVIRONMENT, "torch": {"version": "2.12.0", "cuda": "12.8"}}
    cells_ = [{"model": "m", "precision": "fp32", "seed": 0}, metrics("vit", "tf32", seed=3)]
    with pytest.raises(summary.EnvironmentMismatch) as stopped:
        summary.check_environment(other, cells_)  # the default name of the record
    assert str(stopped.value) == (
        "environment.json describes python 3.11.7 at /work/.venv, torch 2.12.0, CUDA 12.8, but cell vit/tf32/seed3 "
        "ran in python 3.11.7 at /work/.venv, torch 2.13.0+cu130, CUDA 13.0. The record was made by another Python "
        "than the cells' (a run started with another `python` first on PATH). Fix: run `make run` again, or "
        "`snakemake --forcerun environment` from the shell the cells run in (venv active), to record the cells' "
        "interpreter.")
    path = tmp_path / "metrics.json"
    path.write_text(json.dumps(cells_[1]))
    with pytest.raises(summary.EnvironmentMismatch, match=r"^environment\.json describes "):
        summary.summarize([str(path)], other, {}, {})


@pytest.mark.parametrize("left_out", ["--metrics", "--env", "--apex", "--peak", "--preset", "--csv", "--json"])
def test_main_refuses_a_command_line_without_a_required_argument(tmp_path, capsys, left_out):
    argv = write_inputs(tmp_path, cells()[:1])
    start = argv.index(left_out)
    end = next((i for i in range(start + 1, len(argv)) if argv[i].startswith("--")), len(argv))
    with pytest.raises(SystemExit) as stopped:
        summary.main(argv[:start] + argv[end:])
    assert stopped.value.code == 2
    assert f"the following arguments are required: {left_out}" in capsys.readouterr().err
    assert not (tmp_path / "summary.json").exists()


def test_main_help_says_what_the_job_writes_and_what_the_json_arguments_hold(capsys):
    with pytest.raises(SystemExit) as stopped:
        summary.main(["--help"])
    assert stopped.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the help
    assert "One table of every cell (with speedups against strict FP32 and against TF32) plus the software" in text
    assert re.search(r"(?<!\w)JSON: which preset ran and why(?!\w)", text)
    assert re.search(r"(?<!\w)results/largest_batch/<model>/<precision>\.json(?!\w)", text)
    assert "JSON: runs.largest_batch.models and, where no search runs, why" in text

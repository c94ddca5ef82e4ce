"""The verify gate, in process: `verify.main(argv)` and the functions behind it on small hand-made summaries and
references in tmp_path (no subprocess, no Snakemake), so that mutation testing (docs/mutation.md) sees every line.

The gate's contract (verify.GATE, docs/report.md): PASS 0, FAIL 1, a usage, file or reference error 2, no reference
for this GPU or no GPU a WARNING with 0, a reference but not one comparable cell NOTHING COMPARED with 3 (never a PASS).
"""

from __future__ import annotations

import csv
import hashlib
import json
from pathlib import Path

import pytest

from amprepro import gpuslots
from amprepro.verify import reference, verify

GPU_NAME = "NVIDIA H200"
STACK = {"torch": "2.11.0+cu130", "cuda": "13.0", "cudnn": 91900, "apex_commit": "379937e1", "driver": "580.1"}
TOLERANCES = """metrics:
  throughput_per_s: {rel_floor: 0.10, k: 2}
  final_loss: {abs_floor: 0.5, k: 2}
  peak_allocated_bytes: null
"""
COLUMNS = ["model", "precision", "seed", "status", "skip_cause", "reason", "throughput_per_s", "final_loss"]


def row(model="m", precision="fp32", seed=0, status="ok", throughput=100.0, loss=2.0, **extra) -> dict:
    return {"model": model, "precision": precision, "seed": seed, "status": status,
            "throughput_per_s": throughput if status == "ok" else None,
            "final_loss": loss if status == "ok" else None, **extra}


def write_run(folder: Path, run_id: str, rows: list[dict], machine: str = "machine-a", specs=None, **stack) -> None:
    """One reference run as `verify promote` leaves it: summary.csv and a provenance.json with its sha256."""
    run = folder / "runs" / run_id
    run.mkdir(parents=True)
    with (run / "summary.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows({k: ("" if v is None else v) for k, v in r.items()} for r in rows)
    provenance = {"run_id": run_id, "gpu": GPU_NAME, **STACK, **stack, "created_utc": f"{run_id[:10]}T00:00:00Z",
                  "machine": {"id": machine, "gpu_count": 1}, "specs": specs or {},
                  "summary_csv_sha256": hashlib.sha256((run / "summary.csv").read_bytes()).hexdigest()}
    (run / "provenance.json").write_text(json.dumps(provenance))


def make_reference(root: Path, *runs: list[dict], tolerances: str = TOLERANCES, specs=None) -> Path:
    """reference/ with one GPU model's runs (one list of rows each) and its aggregate; returns reference/."""
    folder = root / "reference" / "nvidia-h200"
    for index, rows in enumerate(runs):
        write_run(folder, f"2026-01-0{index + 1}-0000000{index}", rows, machine=f"machine-{index}", specs=specs)
    reference.rebuild(folder)
    (root / "reference" / "tolerances.yaml").write_text(tolerances)
    return root / "reference"


def make_summary(*cells: dict, gpu: str | None = GPU_NAME, **versions) -> dict:
    return {"preset": {"preset": "paper"}, "versions": {**({"gpu": gpu} if gpu else {}), **STACK, "gpu_count": 1,
                                                        **versions},
            "cells": [dict(c) for c in cells]}


def one_gpu():
    return [GPU_NAME], "nvidia-smi lists 1 GPU(s): NVIDIA H200"


def no_smi():
    return [], "no nvidia-smi on PATH"


def check(summary: dict, reference_dir: Path, runs_dir=None, probe=one_gpu) -> dict:
    return verify.verify(summary, reference_dir, runs_dir, probe=probe)


@pytest.fixture
def ref(tmp_path) -> Path:
    """Two cells, one reference run: m/fp32/0 (throughput 100, loss 2.0), m/amp_bf16/0 (throughput 200, loss 1.5)."""
    return make_reference(tmp_path, [row(), row(precision="amp_bf16", throughput=200.0, loss=1.5)])


@pytest.fixture(autouse=True)
def one_visible_gpu(monkeypatch):
    """main() asks nvidia-smi where verify runs; here it lists one H200, wherever the tests run."""
    monkeypatch.setattr(gpuslots, "visible_gpus", one_gpu)


def write_summary(tmp_path: Path, summary: dict) -> str:
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(summary))
    return str(path)


def gate_of(tmp_path: Path, summary: dict, reference_dir: Path, capsys) -> tuple[int, int, int, str]:
    """compare (plain and --strict) and then gate on its verify.json: their three exit codes and what gate printed."""
    args = ["compare", "--summary", write_summary(tmp_path, summary), "--runs-dir", str(tmp_path / "no-runs"),
            "--reference-dir", str(reference_dir)]
    out = tmp_path / "verify.json"
    plain = verify.main(args)
    strict = verify.main([*args, "--strict", "--json", str(out)])
    capsys.readouterr()
    gated = verify.main(["gate", "--verify", str(out)])
    return plain, strict, gated, capsys.readouterr().out


# ----------------------------------------------------------------------------------------------------------------------
# The exit codes, through main(argv)


def test_pass_exits_0_and_says_how_many_cells_against_what(tmp_path, ref, capsys):
    plain, strict, gated, out = gate_of(tmp_path, make_summary(row(), row(precision="amp_bf16", throughput=210.0,
                                                                         loss=1.5)), ref, capsys)
    assert (plain, strict, gated) == (0, 0, 0)
    folder = ref / "nvidia-h200"
    assert out.splitlines() == [
        f"verify: PASS: all 2 compared cells within tolerance of {folder}: median of 1 run(s) on 1 machine(s), bands "
        "at their floor (one run)",
        "  this machine: 1 GPU(s) (nvidia-smi lists 1 GPU(s): NVIDIA H200); gate PASS, exit code 0"]


def test_fail_exits_1_with_strict_and_from_the_gate_and_0_from_a_plain_compare(tmp_path, ref, capsys):
    summary = make_summary(row(throughput=89.0), row(precision="amp_bf16", throughput=200.0, loss=1.5))
    plain, strict, gated, out = gate_of(tmp_path, summary, ref, capsys)
    assert (plain, strict, gated) == (0, 1, 1)
    lines = out.splitlines()
    assert lines[0] == (f"verify: FAIL: 1 of 2 cells out of tolerance against {ref / 'nvidia-h200'}: median of 1 "
                        "run(s) on 1 machine(s), bands at their floor (one run)")
    assert lines[1].endswith("; gate FAIL, exit code 1")
    assert lines[2] == ("  out of tolerance: m/fp32/seed0: throughput 89.0/s vs reference median 100.0/s = 0.890× "
                        "(-11.0 %, 1.1 % below the band); allowed 0.9–1.1× reference median (the floor: one run, no "
                        "spread)")
    assert len(lines) == 3


def test_nothing_comparable_exits_3_and_is_not_a_pass(tmp_path, ref, capsys):
    skipped = {"status": "skipped", "skip_cause": "machine", "reason": "needs 2 GPUs; 1 visible"}
    summary = make_summary(row(**skipped), row(precision="amp_bf16", **skipped))
    plain, strict, gated, out = gate_of(tmp_path, summary, ref, capsys)
    assert (plain, strict, gated) == (0, 3, 3)
    assert out.splitlines()[0] == (
        f"verify: NOTHING COMPARED: a reference exists ({ref / 'nvidia-h200'}) but no cell of this run is comparable "
        "with it; 2 not comparable here (this machine cannot run them): nothing was judged, which is not a pass")
    assert "gate NOTHING COMPARED, exit code 3" in out
    verdict = json.loads((tmp_path / "verify.json").read_text())
    assert verdict["status"] == "not_comparable" and verdict["counts"]["pass"] == 0
    assert verdict["gate"] == {"result": "NOTHING COMPARED", "exit_code": 3, "gpu_count": 1}


def test_cells_skipped_for_the_machine_here_and_in_the_reference_compare_nothing(tmp_path, capsys):
    skipped = {"status": "skipped", "skip_cause": "machine", "reason": "needs 2 GPUs; 1 visible"}
    ref = make_reference(tmp_path, [row(**skipped), row(precision="amp_bf16", throughput=200.0, loss=1.5)])
    summary = make_summary(row(**skipped), row(precision="amp_bf16", **skipped))
    assert gate_of(tmp_path, summary, ref, capsys)[1:3] == (3, 3)
    result = check(summary, ref)
    assert result["status"] == "not_comparable" and result["counts"]["not_comparable_here"] == 2


def test_a_reference_whose_cells_are_all_missing_here_compares_nothing(tmp_path, ref):
    result = check(make_summary(row(model="other")), ref)
    assert result["status"] == "not_comparable" and result["gate"]["exit_code"] == 3
    assert result["counts"] == {"pass": 0, "fail": 0, "not_comparable_here": 0, "not_comparable": 0,
                                "not_in_reference": 1, "not_run_here": 2}
    assert result["message"] == (f"a reference exists ({ref / 'nvidia-h200'}) but no cell of this run is comparable "
                                 "with it: nothing was judged, which is not a pass")


def test_without_a_reference_nothing_is_judged_and_the_result_says_so(tmp_path, ref):
    result = check(make_summary(row(), gpu="NVIDIA B200"), ref)
    del result["tolerances"], result["message"]
    assert result == {"gpu": "NVIDIA B200", "slug": "nvidia-b200", "reference": None, "cells": [], "failures": [],
                      "warnings": [], "counts": {}, "differences": [], "stack": {"same": None, "differences": []},
                      "machine": {"gpu_count": 1, "source": "nvidia-smi lists 1 GPU(s): NVIDIA H200",
                                  "gpus_seen_by_cells": None, "gpu_memory_limit_gib": None},
                      "status": "no_reference", "gate": {"result": "WARNING", "exit_code": 0, "gpu_count": 1}}


def test_no_reference_for_this_gpu_warns_exits_0_and_says_how_to_add_one(tmp_path, ref, capsys):
    summary = make_summary(row(), gpu="NVIDIA B200")
    plain, strict, gated, out = gate_of(tmp_path, summary, ref, capsys)
    assert (plain, strict, gated) == (0, 0, 0)
    assert out.splitlines() == [
        f"verify: WARNING: no reference results for NVIDIA B200 ({ref / 'nvidia-b200'}/ does not exist; references "
        "exist for: nvidia-h200); nothing was compared",
        "  this machine: 1 GPU(s) (nvidia-smi lists 1 GPU(s): NVIDIA H200); gate WARNING, exit code 0",
        "  to add one from a run on this GPU: .venv/bin/python -m amprepro.verify.verify promote results --note '...' "
        "(writes reference/nvidia-b200/runs/)"]
    empty = tmp_path / "empty"
    empty.mkdir()
    result = check(summary, empty)
    assert result["message"] == (f"no reference results for NVIDIA B200 ({empty / 'nvidia-b200'}/ does not exist; no "
                                 "reference is committed yet); nothing was compared")
    assert result["slug"] == "nvidia-b200" and result["reference"] is None and result["cells"] == []


def test_a_run_without_a_gpu_warns_and_exits_0(tmp_path, ref, capsys):
    summary = make_summary(row(), gpu=None)
    plain, strict, gated, out = gate_of(tmp_path, summary, ref, capsys)
    assert (plain, strict, gated) == (0, 0, 0)
    assert out.splitlines() == [
        "verify: WARNING: this run has no GPU (paper preset on CPU); reference results are per GPU model, so nothing "
        "was compared",
        "  this machine: 1 GPU(s) (nvidia-smi lists 1 GPU(s): NVIDIA H200); gate WARNING, exit code 0"]
    result = check(summary, ref)
    assert (result["gpu"], result["slug"], result["status"]) == (None, None, "no_reference")
    assert result["tolerances"]["sources"] == ["built-in defaults", str(ref / "tolerances.yaml")]
    assert check({"cells": []}, ref)["message"].startswith("this run has no GPU (? preset on CPU)")


def test_usage_and_file_errors_exit_2_with_a_message(tmp_path, ref, capsys):
    for argv in ([], ["no-such-command"], ["promote"], ["rebuild"], ["compare", "--no-such-option"]):
        with pytest.raises(SystemExit) as stop:
            verify.main(argv)
        assert stop.value.code == 2, argv
    capsys.readouterr()
    assert verify.main(["gate", "--verify", str(tmp_path / "missing.json")]) == 2
    err = capsys.readouterr()
    assert err.out == "" and err.err.startswith("verify: ERROR: ") and "missing.json" in err.err
    (tmp_path / "broken.json").write_text("{not json")
    assert verify.main(["gate", "--verify", str(tmp_path / "broken.json")]) == 2
    (ref / "tolerances.yaml").write_text("metrics:\n  throughput_per_s: {rel_floor: 0.1}\n")
    summary = write_summary(tmp_path, make_summary(row()))
    assert verify.main(["compare", "--summary", summary, "--reference-dir", str(ref), "--strict"]) == 2
    assert "field metrics.throughput_per_s" in capsys.readouterr().err
    assert verify.main(["rebuild", "--reference", str(tmp_path / "nowhere")]) == 2
    assert "holds no run" in capsys.readouterr().err


def test_compare_writes_the_json_and_one_csv_row_per_cell_and_metric(tmp_path, ref, capsys):
    summary = write_summary(tmp_path, make_summary(row(throughput=105.0, loss=2.25), row(model="extra")))
    out, table = tmp_path / "v" / "verify.json", tmp_path / "v" / "verify.csv"
    args = ["compare", "--summary", summary, "--reference-dir", str(ref), "--runs-dir", str(tmp_path)]
    assert verify.main([*args, "--json", str(out), "--csv", str(table)]) == 0
    result = json.loads(out.read_text())
    assert result["status"] == "pass" and result["counts"]["pass"] == 1
    rows = list(csv.DictReader(table.open()))
    assert list(rows[0]) == verify.CSV_COLUMNS
    assert [(r["model"], r["precision"], r["metric"], r["verdict"]) for r in rows] == [
        ("m", "fp32", "throughput_per_s", "pass"), ("m", "fp32", "final_loss", "pass"),
        ("extra", "fp32", "", "not_in_reference"), ("m", "amp_bf16", "", "not_run_here")]
    assert rows[0]["ratio"] == "1.05" and rows[1]["here"] == "2.25" and rows[1]["reference"] == "2.0"
    assert rows[2]["note"] == "the reference has no such cell"
    capsys.readouterr()
    assert verify.main(args) == 0  # no --json, no --csv: prints, writes nothing
    assert capsys.readouterr().out.startswith("verify: PASS: all 1 compared cells")
    assert sorted(p.name for p in (tmp_path / "v").iterdir()) == ["verify.csv", "verify.json"]


def test_rebuild_and_promote_through_main(tmp_path, ref, capsys):
    folder = ref / "nvidia-h200"
    (folder / "aggregate.json").unlink()
    assert verify.main(["rebuild", "--reference", str(folder)]) == 0
    assert capsys.readouterr().out == f"{folder}/aggregate.json: 1 run(s) on 1 machine(s)\n"
    assert reference.load_aggregate(folder)["n_runs"] == 1
    results = tmp_path / "results"
    cell = results / "runs" / "m" / "fp32" / "seed0"
    cell.mkdir(parents=True)
    (cell / "metrics.json").write_text(json.dumps({"model": "m", "precision": "fp32", "seed": 0, "status": "ok",
                                                   "hardware": {"gpu_uuid": "GPU-1", "gpu_count": 1}}))
    (results / "summary").mkdir()
    (results / "summary" / "summary.json").write_text(json.dumps(make_summary(row(throughput=101.0))))
    (results / "summary" / "summary.csv").write_text("model,precision,seed,status,throughput_per_s\nm,fp32,0,ok,101\n")
    assert verify.main(["promote", str(results), "--note", "test run", "--reference-dir", str(ref)]) == 0
    (added,) = [p for p in (folder / "runs").iterdir() if not p.name.startswith("2026-01-01")]
    assert capsys.readouterr().out == (f"reference run added: {added}; {folder}/aggregate.json now holds 2 run(s) on "
                                       f"2 machine(s). Review and commit {folder}/.\n")
    assert verify.main(["promote", str(results), "--note", " ", "--reference-dir", str(ref)]) == 2
    assert "--note is empty" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------------------------------
# verify(): the status, the message and the band edges


def test_the_band_edges_are_inside_and_just_beyond_them_is_outside(tmp_path, ref):
    def verdict(throughput, loss=2.0):
        return check(make_summary(row(throughput=throughput, loss=loss)), ref)["cells"][0]["verdict"]

    assert [verdict(t) for t in (90.0, 110.0, 89.99, 110.01)] == ["pass", "pass", "fail", "fail"]
    assert [verdict(100.0, loss) for loss in (1.5, 2.5, 1.49, 2.51)] == ["pass", "pass", "fail", "fail"]


def test_with_several_runs_the_band_grows_with_their_spread_and_the_message_says_so(tmp_path):
    ref = make_reference(tmp_path, [row(throughput=90.0)], [row(throughput=100.0)], [row(throughput=110.0)])
    result = check(make_summary(row(throughput=60.0)), ref)  # band 1 ± 2 x 20 % = 0.6–1.4
    assert result["status"] == "pass"
    assert result["message"] == (f"all 1 compared cells within tolerance of {ref / 'nvidia-h200'}: median of 3 run(s) "
                                 "on 3 machine(s)")
    assert result["reference"] == {"path": str(ref / "nvidia-h200"), "n_runs": 3, "n_machines": 3,
                                   "runs": reference.load_aggregate(ref / "nvidia-h200")["runs"]}
    assert check(make_summary(row(throughput=59.0)), ref)["status"] == "fail"


def test_a_failure_among_cells_not_comparable_here_is_still_a_fail_and_says_both(tmp_path, ref):
    summary = make_summary(row(throughput=50.0),
                           row(precision="amp_bf16", status="skipped", skip_cause="machine", reason="no bf16"))
    result = check(summary, ref)
    assert result["status"] == "fail" and result["gate"] == {"result": "FAIL", "exit_code": 1, "gpu_count": 1}
    assert result["message"] == (f"1 of 1 cells out of tolerance against {ref / 'nvidia-h200'}: median of 1 run(s) on "
                                 "1 machine(s), bands at their floor (one run); 1 not comparable here (this machine "
                                 "cannot run them)")
    assert result["counts"]["not_comparable_here"] == 1 and len(result["failures"]) == 1
    assert result["warnings"] == ["1 cell(s) not comparable here, not counted as failures: m/amp_bf16/seed0 (this "
                                  "machine cannot run it: no bf16)"]


def test_a_pass_with_cells_not_comparable_here_says_how_many(tmp_path, ref):
    summary = make_summary(row(), row(precision="amp_bf16", status="skipped", skip_cause="machine", reason="no bf16"))
    result = check(summary, ref)
    assert result["status"] == "pass" and result["gate"]["exit_code"] == 0
    assert result["message"].endswith("(one run); 1 not comparable here (this machine cannot run them)")
    assert result["message"].startswith("all 1 compared cells within tolerance")


def test_the_result_names_the_machine_the_stack_and_the_reference(tmp_path, ref):
    result = check(make_summary(row(), row(precision="amp_bf16", throughput=200.0, loss=1.5)), ref)
    assert result["stack"] == {"same": True, "differences": []} and result["differences"] == []
    assert result["machine"] == {"gpu_count": 1, "source": "nvidia-smi lists 1 GPU(s): NVIDIA H200",
                                 "gpus_seen_by_cells": None, "gpu_memory_limit_gib": None}
    assert (result["gpu"], result["slug"]) == (GPU_NAME, "nvidia-h200")
    other = check(make_summary(row(), torch="2.13.0+cu130"), ref, probe=lambda: ([GPU_NAME] * 2, "nvidia-smi: 2"))
    assert other["stack"]["same"] is False
    assert other["differences"] == ["torch: 2.13.0+cu130 here; 2.11.0+cu130 (1 run) in the reference",
                                    "GPU count: 2 here; 1 (1 run) in the reference"]
    assert other["gate"]["gpu_count"] == 2


# ----------------------------------------------------------------------------------------------------------------------
# The machine, the stack and the run's own files


def write_cell_metrics(runs: Path, model: str, precision: str, seed: int, **fields) -> None:
    folder = runs / model / precision / f"seed{seed}"
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps({"model": model, "precision": precision, "seed": seed, **fields}))


def test_machine_here_is_what_nvidia_smi_lists_else_what_the_cells_saw_else_the_summary(tmp_path):
    runs = tmp_path / "runs"
    write_cell_metrics(runs, "m", "fp32", 0, hardware={"gpu_uuid": "GPU-a", "gpu_count": 4})
    summary = {"versions": {"gpu_count": 2, "gpu_memory_limit_gib": 40}}
    assert verify.machine_here(summary, runs, lambda: (["A", "B", "C"], "nvidia-smi: 3")) == {
        "gpu_count": 3, "source": "nvidia-smi: 3", "gpus_seen_by_cells": 4, "gpu_memory_limit_gib": 40}
    assert verify.machine_here(summary, runs, no_smi) == {
        "gpu_count": 4, "source": "GPUs the cells saw; no nvidia-smi on PATH where verify ran", "gpus_seen_by_cells": 4,
        "gpu_memory_limit_gib": 40}
    assert verify.machine_here(summary, tmp_path / "none", no_smi) == {
        "gpu_count": 2, "source": "the summary's GPU count; no nvidia-smi on PATH", "gpus_seen_by_cells": None,
        "gpu_memory_limit_gib": 40}
    assert verify.machine_here({}, None, no_smi) == {
        "gpu_count": 0, "source": "the summary's GPU count; no nvidia-smi on PATH", "gpus_seen_by_cells": None,
        "gpu_memory_limit_gib": None}
    cpu_runs = tmp_path / "cpu"
    write_cell_metrics(cpu_runs, "m", "fp32", 0, hardware={})  # the cells saw no GPU: the summary's count
    assert verify.machine_here(summary, cpu_runs, no_smi)["gpu_count"] == 2


def test_machine_here_asks_nvidia_smi_when_no_probe_is_given(tmp_path, monkeypatch):
    monkeypatch.setattr(gpuslots, "visible_gpus", lambda: (["X"] * 5, "five"))
    assert verify.machine_here({}, None)["gpu_count"] == 5
    assert verify.verify(make_summary(gpu=None), tmp_path)["machine"]["source"] == "five"


def test_same_apex_commit_matches_a_short_and_a_full_hash_of_one_commit():
    full = "379937e1aabbccddeeff00112233445566778899"
    assert verify._same("apex_commit", "379937e1", full) and verify._same("apex_commit", full, "379937e")
    assert not verify._same("apex_commit", "379937f1", full)
    assert not verify._same("apex_commit", "379937", full)  # 6 digits: too short to be one commit's
    assert not verify._same("apex_commit", full, "379937")
    assert verify._same("apex_commit", "379937", "379937")
    assert not verify._same("apex_commit", "379937e1", None) and verify._same("apex_commit", None, None)
    assert not verify._same("torch", "2.11.0", "2.11.0+cu130") and verify._same("torch", "2.11.0", "2.11.0")


def test_stack_differences_name_each_key_its_kind_and_every_value_the_runs_had():
    machine = {"gpu_count": 2}
    runs = {"a": {"stack": {**STACK, "gpu_count": 1}}, "b": {"stack": {**STACK, "gpu_count": 1, "torch": "2.12"}},
            "c": {"stack": {**STACK, "gpu_count": 1, "torch": "2.12"}}}
    summary = {"versions": {**STACK, "torch": "2.13", "apex_commit": "379937e1ffff", "driver": "590"}}
    differences = verify.stack_differences(summary, machine, {"runs": runs})
    assert differences == [
        {"key": "torch", "kind": "software", "here": "2.13", "reference": ["2.11.0+cu130", "2.12"],
         "text": "torch: 2.13 here; 2.11.0+cu130 (1 run), 2.12 (2 runs) in the reference"},
        {"key": "driver", "kind": "machine", "here": "590", "reference": ["580.1"],
         "text": "driver: 590 here; 580.1 (3 runs) in the reference"},
        {"key": "gpu_count", "kind": "machine", "here": 2, "reference": [1],
         "text": "GPU count: 2 here; 1 (3 runs) in the reference"}]
    summary["versions"].update(torch="2.12", apex_commit="2222222", driver="580.1")
    assert [d["text"] for d in verify.stack_differences(summary, {"gpu_count": 1}, {"runs": runs})] == [
        "apex commit: 2222222 here; 379937e1 (3 runs) in the reference"]
    nothing = verify.stack_differences({}, {"gpu_count": None}, {})  # no reference run: everything differs
    assert [(d["key"], d["text"]) for d in nothing][-1] == ("gpu_count", "GPU count: None here;  in the reference")
    assert [d["key"] for d in nothing] == ["torch", "cuda", "cudnn", "apex_commit", "driver", "gpu_count"]


def test_cell_specs_reads_each_cells_spec_or_plan_and_skips_what_it_cannot(tmp_path):
    runs = tmp_path / "runs"
    write_cell_metrics(runs, "m", "fp32", 0, spec={"batch": 8}, plan={"source": "preset"})
    write_cell_metrics(runs, "m", "amp_bf16", 1, spec={"batch": 4})
    write_cell_metrics(runs, "n", "fp32", 0)
    (runs / "a" / "fp32" / "seed1").mkdir(parents=True)  # read first: the cells after it are still read
    (runs / "a" / "fp32" / "seed1" / "metrics.json").write_text("{half written")
    assert verify.cell_specs(runs) == {"m/fp32/0": {"batch": 8}, "m/amp_bf16/1": {"batch": 4}}
    assert verify.cell_specs(runs, "plan") == {"m/fp32/0": {"source": "preset"}}
    assert verify.cell_specs(tmp_path / "none") == {} and verify.cell_specs(None) == {}
    assert verify.cell_specs(str(runs)) == verify.cell_specs(runs)


def test_reference_inputs_are_the_reference_and_tolerance_files(tmp_path, ref):
    (ref / "nvidia-h200" / "notes.txt").write_text("not an input")
    (ref / "nvidia-h200" / "extra.yaml").mkdir()  # a folder, whatever its name
    folder = ref / "nvidia-h200"
    run = folder / "runs" / "2026-01-01-00000000"
    assert verify.reference_inputs(ref) == sorted(str(p) for p in [
        folder / "aggregate.json", run / "summary.csv", run / "provenance.json", ref / "tolerances.yaml"])
    assert verify.reference_inputs(str(ref)) == verify.reference_inputs(ref)
    assert verify.reference_inputs(tmp_path / "none") == []


def test_run_verify_evaluates_the_claims_with_the_sanity_record_when_asked(tmp_path, ref, monkeypatch):
    from amprepro.analysis import claimmodels, claims

    seen = []
    monkeypatch.setattr(claims, "evaluate_run", lambda *args: seen.append(args) or [
        {"id": "c1", "verdict": "holds"}, {"id": "c2", "verdict": "not_measurable"}])
    summary = write_summary(tmp_path, make_summary(row()))
    sanity = tmp_path / "sanity.json"
    sanity.write_text(json.dumps({"checks": [{"name": "tensor_cores"}]}))
    result = verify.run_verify(summary, str(ref), str(tmp_path), "claims.yaml", str(sanity))
    assert result["status"] == "pass"
    assert seen == [("claims.yaml", json.loads(Path(summary).read_text()), {"checks": [{"name": "tensor_cores"}]},
                     str(tmp_path))]
    assert result["claims"] == [{"id": "c1", "verdict": "holds"}, {"id": "c2", "verdict": "not_measurable"}]
    assert result["claims_counts"] == {**{v: 0 for v in claimmodels.VERDICT_TEXT}, "holds": 1, "not_measurable": 1}
    verify.run_verify(summary, str(ref), None, "claims.yaml", str(tmp_path / "no-sanity.json"))
    verify.run_verify(summary, str(ref), None, "claims.yaml", None)
    assert [args[2] for args in seen[1:]] == [None, None]
    assert "claims" not in verify.run_verify(summary, str(ref), None) and len(seen) == 3


# ----------------------------------------------------------------------------------------------------------------------
# What it writes and prints


def test_csv_rows_one_per_check_and_one_for_a_cell_without_checks():
    cell = {"model": "m", "precision": "fp32", "seed": 0, "verdict": "fail", "status_here": "ok",
            "status_reference": "ok", "reference_runs": 3, "note": "cell note",
            "checks": [{"metric": "a", "here": 1, "reference": 2, "ratio": 0.5, "allowed": "x", "deviation_pct": -50,
                        "reference_runs": 3, "ok": False, "note": ""},
                       {"metric": "b", "here": 1, "reference": 1, "allowed": "y", "reference_runs": 2, "ok": True,
                        "note": "own note"},
                       {"metric": "c", "here": None, "reference": 1, "allowed": "", "reference_runs": 1, "ok": None,
                        "note": "not recorded here"}]}
    bare = {"model": "n", "precision": "tf32", "seed": 1, "verdict": "not_run_here", "status_here": None,
            "status_reference": "ok", "note": "in the reference, not in this run's matrix", "checks": [],
            "reference_runs": 2}
    base = {"model": "m", "precision": "fp32", "seed": 0, "status_here": "ok", "status_reference": "ok"}
    assert verify.csv_rows({"cells": [cell, bare]}) == [
        {**base, "verdict": "fail", "metric": "a", "here": 1, "reference": 2, "ratio": 0.5, "allowed": "x",
         "deviation_pct": -50, "reference_runs": 3, "note": "cell note"},
        {**base, "verdict": "pass", "metric": "b", "here": 1, "reference": 1, "ratio": None, "allowed": "y",
         "deviation_pct": None, "reference_runs": 2, "note": "own note"},
        {**base, "verdict": "not_compared", "metric": "c", "here": None, "reference": 1, "ratio": None, "allowed": "",
         "deviation_pct": None, "reference_runs": 1, "note": "not recorded here"},
        {"model": "n", "precision": "tf32", "seed": 1, "verdict": "not_run_here", "status_here": None,
         "status_reference": "ok", "reference_runs": 2, "note": "in the reference, not in this run's matrix"}]
    assert verify.csv_rows({}) == []
    assert verify.csv_rows({"cells": [{**bare, "reference_runs": None}]})[0]["reference_runs"] is None


def printed(**result) -> list[str]:
    base = {"status": "pass", "message": "msg", "failures": [], "warnings": [],
            "machine": {"gpu_count": 2, "source": "nvidia-smi"}}
    return verify.report_lines({**base, **result})


def test_report_lines_say_what_differs_first_then_the_verdict_the_machine_and_the_reasons():
    stack = {"differences": [{"text": "torch: 2.13 here; 2.11 (1 run) in the reference"}]}
    assert printed(stack=stack, failures=["cell a out"], warnings=["w1", "w2"],
                   machine={"gpu_count": 2, "source": "nvidia-smi", "gpu_memory_limit_gib": 11.5},
                   gate={"result": "PASS"}) == [
        "verify: NOTE: this run's software or machine differs from the reference's; the bands were measured on the "
        "reference's:",
        "  torch: 2.13 here; 2.11 (1 run) in the reference",
        "verify: PASS: msg",
        "  this machine: 2 GPU(s) (nvidia-smi), memory capped at 11.5 GiB (gpu_memory_limit_gib); gate PASS, exit code "
        "0",
        "  out of tolerance: cell a out",
        "  warning: w1",
        "  warning: w2"]
    assert printed(status="fail", machine={}) == ["verify: FAIL: msg",
                                                  "  this machine: None GPU(s) (None); gate FAIL, exit code 1"]
    assert printed(status="not_comparable", stack={"differences": []})[1].endswith(
        "gate NOTHING COMPARED, exit code 3")
    assert printed(status="no_reference", slug=None) == ["verify: WARNING: msg",
                                                         "  this machine: 2 GPU(s) (nvidia-smi); gate WARNING, exit "
                                                         "code 0"]
    assert printed(machine=None)[1] == "  this machine: None GPU(s) (None); gate PASS, exit code 0"


def test_report_lines_list_the_claims_shortened_and_their_other_regimes():
    from amprepro.analysis.regimes import lines as regime_lines

    long = "ab " * 50  # a space at index 140: the cut keeps 46 words
    rows = [{"key": "k", "baseline": "fp32", "variant": "amp_bf16", "predicted": {"baseline_peak_bytes": 2**31,
             "variant_peak_bytes": 2**30}, "predicted_text": "halves", "measured": None}]
    claims = [{"id": "a", "verdict": "holds", "verdict_text": "holds", "measured_text": "1.50× measured",
               "reason": "unused"},
              {"id": "b", "verdict": "not_measurable", "verdict_text": "not measurable", "measured_text": "unused",
               "reason": "no GPU"},
              {"id": "c", "verdict": "falls_short", "verdict_text": "falls short", "measured_text": long.strip(),
               "reason": "", "regimes": {"rows": rows}}]
    lines = printed(claims=claims)
    assert lines[2:] == [
        "claims (informational; they do not change the exit code):",
        "  a: holds — 1.50× measured",
        "  b: not measurable — no GPU",
        "  c: falls short — " + ("ab " * 46).strip() + " …",
        "    c in other regimes (predicted unless measured; not a verdict):",
        *(f"      {line}" for line in regime_lines(rows))]
    assert lines[-1] == "      k: fp32 2.0 GiB → amp_bf16 1.0 GiB: halves"
    spaced = "ab  " * 50  # the text before the cut is kept as it is, up to its last space
    assert printed(claims=[{**claims[0], "measured_text": spaced}])[3] == f"  a: holds — {'ab  ' * 34}ab  …"
    exact = "x" * 140
    assert printed(claims=[{**claims[0], "measured_text": exact}])[3] == f"  a: holds — {exact}"
    assert printed(claims=[{**claims[0], "measured_text": exact + "y"}])[3] == f"  a: holds — {exact} …"
    assert len(printed(claims=[])) == 2


# ----------------------------------------------------------------------------------------------------------------------
# This run's cells: their settings and plans, through verify(), run_verify() and main()


SPEC = {"model_config": {"arch": "resnet50", "batch_size": 256}, "train": {"steps": 40}}
LOWERED = {"model_config": {"arch": "resnet50", "batch_size": 64}, "train": {"steps": 40}}


def runs_with(tmp_path: Path, spec: dict, plan: dict | None = None, gpus: int = 1) -> Path:
    runs = tmp_path / "runs"
    write_cell_metrics(runs, "m", "fp32", 0, spec=spec, hardware={"gpu_count": gpus},
                       **({"plan": plan} if plan else {}))
    return runs


def test_the_cells_settings_and_memory_plan_decide_what_is_comparable(tmp_path):
    ref = make_reference(tmp_path, [row()], specs={"m/fp32/0": SPEC})
    summary = make_summary(row())
    planned = runs_with(tmp_path / "planned", LOWERED, {"source": "preset", "why": "64 fits in 11.5 GiB"})
    cell = check(summary, ref, planned)["cells"][0]
    assert (cell["verdict"], cell["note"]) == ("not_comparable_here", "not comparable here (planned batch 64, "
                                                                      "reference 256): 64 fits in 11.5 GiB")
    changed = runs_with(tmp_path / "changed", LOWERED)
    cell = check(summary, ref, changed)["cells"][0]
    assert (cell["verdict"], cell["note"]) == ("not_comparable", "settings differ: model_config.batch_size 256 in the "
                                                                 "reference, 64 here")
    assert check(summary, ref, runs_with(tmp_path / "same", SPEC))["cells"][0]["verdict"] == "pass"
    assert check(summary, ref, None)["cells"][0]["verdict"] == "pass"
    # the run's own cells, through run_verify and main: their settings are read from --runs-dir
    path = write_summary(tmp_path, summary)
    assert verify.run_verify(path, str(ref), str(changed))["status"] == "not_comparable"
    assert verify.run_verify(path, str(ref), str(changed / "none"))["status"] == "pass"
    out = tmp_path / "verify.json"
    assert verify.main(["compare", "--summary", path, "--reference-dir", str(ref), "--runs-dir", str(planned),
                        "--json", str(out), "--strict"]) == 3
    assert json.loads(out.read_text())["counts"]["not_comparable_here"] == 1


def test_verify_counts_the_gpus_the_cells_saw_when_nvidia_smi_lists_none(tmp_path, ref):
    runs = runs_with(tmp_path, SPEC, gpus=4)
    result = check(make_summary(row()), ref, runs, probe=no_smi)
    assert result["machine"]["gpu_count"] == 4 and result["gate"]["gpu_count"] == 4
    assert result["differences"] == ["GPU count: 4 here; 1 (1 run) in the reference"]


def test_main_passes_the_claims_and_the_sanity_record_on(tmp_path, ref, monkeypatch):
    from amprepro.analysis import claims

    seen = []
    monkeypatch.setattr(claims, "evaluate_run", lambda *args: seen.append(args) or [])
    sanity = tmp_path / "sanity.json"
    sanity.write_text(json.dumps({"checks": []}))
    runs = runs_with(tmp_path, SPEC)
    summary = write_summary(tmp_path, make_summary(row()))
    assert verify.main(["compare", "--summary", summary, "--reference-dir", str(ref), "--runs-dir", str(runs),
                        "--claims", "my-claims.yaml", "--sanity", str(sanity)]) == 0
    assert [(a[0], a[2], a[3]) for a in seen] == [("my-claims.yaml", {"checks": []}, str(runs))]


def test_the_defaults_are_where_the_pipeline_writes_and_the_reference_is_committed(tmp_path, monkeypatch, capsys):
    args = verify.parse_args(["compare"])
    assert (args.summary, args.runs_dir, args.reference_dir, args.claims, args.sanity, args.json, args.csv,
            args.strict) == ("results/summary/summary.json", "results/runs", "reference", None, None, None, None,
                             False)
    assert verify.parse_args(["compare", "--strict"]).strict is True
    assert verify.parse_args(["gate"]).verify == "results/verify/verify.json"
    promote = verify.parse_args(["promote", "--note", "n"])
    assert (promote.results, promote.reference_dir, promote.note) == ("results", "reference", "n")
    assert verify.parse_args(["promote", "elsewhere", "--note", "n"]).results == "elsewhere"
    assert verify.parse_args(["rebuild", "--reference", "r"]).reference == "r"
    # and in a checkout laid out that way, the commands need no paths
    monkeypatch.chdir(tmp_path)
    make_reference(tmp_path, [row()])
    (tmp_path / "results" / "summary").mkdir(parents=True)
    (tmp_path / "results" / "summary" / "summary.json").write_text(json.dumps(make_summary(row(throughput=50.0))))
    assert verify.main(["compare", "--strict", "--json", "results/verify/verify.json"]) == 1
    assert verify.main(["gate"]) == 1
    assert "verify: FAIL: 1 of 1 cells out of tolerance against reference/nvidia-h200" in capsys.readouterr().out
    assert verify.verify(make_summary(row()), probe=one_gpu)["reference"]["path"] == "reference/nvidia-h200"
    assert verify.reference_inputs() == verify.reference_inputs("reference") != []
    assert verify.reference_inputs()[0] == "reference/nvidia-h200/aggregate.json"


def help_text(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as stop:
        verify.main([*argv, "--help"])
    assert stop.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def test_the_help_says_what_each_command_does_and_its_exit_codes(capsys):
    top = help_text(capsys)
    assert ("Compare this run, cell by cell, with the committed reference of the same GPU model; promote a run into "
            "it.") in top and "Subcommands:" not in top
    assert ("compare write verify.json (+csv); exit 0, or with --strict the gate's code: 1 out of tolerance, 3 nothing "
            "compared") in top
    assert ("gate print verify.json's outcome; exit 1 when a cell is out of tolerance, 3 when nothing was "
            "compared") in top
    assert "promote add a finished GPU run to reference/<gpu-slug>/runs/ and rebuild the aggregate" in top
    assert "rebuild recompute reference/<gpu-slug>/aggregate.json from its runs" in top
    compare = help_text(capsys, "compare")
    for option, text in [("--claims CLAIMS", "also evaluate these claims (config/claims.yaml) into verify.json"),
                         ("--json JSON", "write the result here"), ("--csv CSV", "one row per cell and metric"),
                         ("--strict", "exit with the gate's code: 1 when a cell is out of tolerance, 3 when nothing "
                                      "was compared")]:
        assert f"{option} {text}" in compare
    assert "--verify VERIFY" in help_text(capsys, "gate")
    promote = help_text(capsys, "promote")
    assert "[results]" in promote
    assert "results the run's results directory (summary/, runs/, environment/); default results" in promote
    assert "--note NOTE who ran it, on which machine (kind, lease), anything unusual" in promote
    assert ("--reference REFERENCE the GPU model's folder, e.g. reference/nvidia-h200"
            in help_text(capsys, "rebuild"))


def test_a_gpu_models_own_tolerances_apply_to_its_cells(tmp_path, ref):
    summary = make_summary(row(throughput=85.0))
    assert check(summary, ref)["status"] == "fail"  # 0.85 is outside reference/tolerances.yaml's 0.9–1.1
    (ref / "nvidia-h200" / "tolerances.yaml").write_text("metrics:\n  throughput_per_s: {rel_floor: 0.2, k: 2}\n")
    result = check(summary, ref)
    assert result["status"] == "pass"
    assert result["tolerances"]["sources"] == ["built-in defaults", str(ref / "tolerances.yaml"),
                                               str(ref / "nvidia-h200" / "tolerances.yaml")]


def test_no_reference_names_every_gpu_model_that_has_one(tmp_path, ref):
    (ref / "nvidia-a100").mkdir()
    result = check(make_summary(row(), gpu="NVIDIA B200"), ref)
    assert "; references exist for: nvidia-a100, nvidia-h200); nothing was compared" in result["message"]

"""verify: per-cell comparison with the reference of the same GPU model, on a passing and a failing fixture."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from report_helpers import GPU, REFERENCE_FAIL, REFERENCE_PASS, REPO, SMOKE, workflow_with_results

from amprepro.verify import cellcompare, reference, verify

GPU_SUMMARY = GPU / "summary/summary.json"


def run_cli(*args, cwd=REPO):
    env = {**os.environ, "PYTHONPATH": str(REPO / "workflow")}
    return subprocess.run([sys.executable, "-m", "amprepro.verify.verify", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def NO_SMI():  # a probe passed where visible_gpus would be
    return [], "no nvidia-smi (test)"


def check(summary: dict, reference: Path, runs: Path | None = GPU / "runs") -> dict:
    return verify.verify(summary, reference, runs, probe=NO_SMI)


def test_slug():
    assert verify.gpu_slug("NVIDIA H200") == "nvidia-h200"
    assert verify.gpu_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"


def test_passing_fixture_passes():
    result = check(load(GPU_SUMMARY), REFERENCE_PASS)
    assert result["status"] == "pass", result["failures"]
    assert result["counts"]["pass"] == 36 and not result["failures"]
    assert result["message"].startswith("all 36 compared cells within tolerance")
    assert "median of 1 run(s) on 1 machine(s), bands at their floor (one run)" in result["message"]
    assert result["gate"] == {"result": "PASS", "exit_code": 0, "gpu_count": 1}


def test_failing_fixture_names_the_cells_and_by_how_much():
    result = check(load(GPU_SUMMARY), REFERENCE_FAIL)
    assert result["status"] == "fail" and result["gate"]["exit_code"] == 1
    text = "\n".join(result["failures"])
    # resnet50/amp_fp16: this run is 0.78x the reference (22 % slower), band 0.90-1.10: 13.3 % below its lower edge
    assert "resnet50/amp_fp16/seed0: throughput" in text and "0.780×" in text and "−22.0 %" in text.replace("-", "−")
    assert "13.3 % below the band" in text and "allowed 0.9–1.1× reference median (the floor: one run" in text
    # vit_b_16/apex_o1/seed1: 12 % more peak memory, band 0.95-1.05
    assert "vit_b_16/apex_o1/seed1: peak GPU memory" in text and "1.120×" in text and "6.7 % above the band" in text
    # a cell that ran here and collapsed in the reference fails on status
    assert "gpt124m/amp_bf16/seed1: status ok here, 1 collapsed in the reference" in text
    assert result["counts"]["fail"] == 4
    failed = {c["cell"] for c in result["cells"] if c["verdict"] == "fail"}
    assert failed == {"resnet50/amp_fp16/seed0", "resnet50/amp_fp16/seed1", "vit_b_16/apex_o1/seed1",
                      "gpt124m/amp_bf16/seed1"}


def test_cli_compare_strict_and_gate_exit_codes(tmp_path):
    out = tmp_path / "verify.json"
    bad = run_cli("compare", "--summary", str(GPU_SUMMARY), "--runs-dir", str(GPU / "runs"), "--reference-dir",
                  str(REFERENCE_FAIL), "--json", str(out), "--csv", str(tmp_path / "verify.csv"), "--strict")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "verify: FAIL: 4 of 36 cells out of tolerance" in bad.stdout
    assert "out of tolerance: resnet50/amp_fp16/seed0" in bad.stdout
    assert load(out)["gate"]["result"] == "FAIL" and load(out)["machine"]["gpu_count"] >= 1
    gate = run_cli("gate", "--verify", str(out))
    assert gate.returncode == 1 and "resnet50/amp_fp16/seed1" in gate.stdout and "gate FAIL, exit code 1" in gate.stdout
    assert "resnet50,amp_fp16,0,fail" in (tmp_path / "verify.csv").read_text()
    good = run_cli("compare", "--summary", str(GPU_SUMMARY), "--runs-dir", str(GPU / "runs"), "--reference-dir",
                   str(REFERENCE_PASS), "--json", str(out), "--strict")
    assert good.returncode == 0 and "verify: PASS" in good.stdout
    assert run_cli("gate", "--verify", str(out)).returncode == 0


def test_no_reference_for_this_gpu_warns_and_exits_zero(tmp_path):
    result = check(load(GPU_SUMMARY), tmp_path / "empty-reference")
    assert result["status"] == "no_reference" and result["gate"]["exit_code"] == 0
    assert "no reference results for NVIDIA H200" in result["message"]
    out = run_cli("compare", "--summary", str(GPU_SUMMARY), "--reference-dir", str(tmp_path), "--strict")
    assert out.returncode == 0 and "verify: WARNING: no reference results for NVIDIA H200" in out.stdout
    assert "amprepro.verify.verify promote" in out.stdout


def test_cpu_run_has_no_reference_and_the_repository_holds_no_made_up_data():
    result = check(load(SMOKE / "summary/summary.json"), REPO / "reference", SMOKE / "runs")
    assert result["status"] == "no_reference" and "no GPU" in result["message"]
    runs = list((REPO / "reference").glob("*/runs/*/summary.csv"))
    assert runs
    for summary_csv in runs:  # every committed reference run names its origin and its machine
        provenance = load(summary_csv.parent / "provenance.json")
        assert provenance.get("gpu") and provenance.get("created_utc") and "FIXTURE" not in json.dumps(provenance)
        assert provenance["machine"]["id"] and provenance["run_id"] == summary_csv.parent.name


def test_changed_settings_make_a_cell_not_comparable():
    here = {k: json.loads(json.dumps(v)) for k, v in verify.cell_specs(GPU / "runs").items()}
    here["resnet50/fp32/0"]["model_config"]["batch_size"] = 128
    aggregate = reference.load_aggregate(REFERENCE_PASS / "nvidia-h200")
    tolerances = reference.load_tolerances(REFERENCE_PASS, "nvidia-h200")
    result = cellcompare.compare(load(GPU_SUMMARY), aggregate, tolerances, here)
    (cell,) = [c for c in result["cells"] if c["cell"] == "resnet50/fp32/seed0"]
    assert cell["verdict"] == "not_comparable"
    assert "model_config.batch_size 256 in the reference, 128 here" in cell["note"]
    assert any("not compared" in w for w in result["warnings"])


def planned(here: dict, batch: int, source: str = "preset") -> dict:
    spec = json.loads(json.dumps(here))
    spec["model_config"]["batch_size"] = batch
    return spec, {"batch_size": batch, "preset_batch_size": here["model_config"]["batch_size"], "source": source,
                  "why": f"{batch} of the preset's 256: the largest at which resnet50/strict FP32 fits in 11.5 GiB"}


def test_a_batch_the_memory_plan_lowered_is_not_comparable_here_and_says_both_batches():
    here = verify.cell_specs(GPU / "runs")
    specs, plans = dict(here), {}
    for precision in ("fp32", "amp_bf16"):
        key = f"resnet50/{precision}/0"
        specs[key], plans[key] = planned(here[key], 64)
    aggregate = reference.load_aggregate(REFERENCE_PASS / "nvidia-h200")
    tolerances = reference.load_tolerances(REFERENCE_PASS, "nvidia-h200")
    result = cellcompare.compare(load(GPU_SUMMARY), aggregate, tolerances, specs, plans)
    (cell,) = [c for c in result["cells"] if c["cell"] == "resnet50/fp32/seed0"]
    assert cell["verdict"] == "not_comparable_here"
    assert cell["note"].startswith("not comparable here (planned batch 64, reference 256): 64 of the preset's 256")
    assert result["counts"]["not_comparable_here"] == 2 and not result["failures"]
    # the same batch written by the user in their config is a settings difference, not this machine's limit
    specs["resnet50/fp32/0"], plans["resnet50/fp32/0"] = planned(here["resnet50/fp32/0"], 64, source="config")
    result = cellcompare.compare(load(GPU_SUMMARY), aggregate, tolerances, specs, plans)
    (cell,) = [c for c in result["cells"] if c["cell"] == "resnet50/fp32/seed0"]
    assert cell["verdict"] == "not_comparable"


def test_the_gates_contract_pass_fail_nothing_compared_no_reference_and_usage_errors(tmp_path):
    """PASS 0, FAIL 1, usage or file error 2, nothing compared 3 (never a PASS), no reference / no GPU 0 (a warning)."""
    out = tmp_path / "verify.json"
    args = ["compare", "--summary", str(GPU_SUMMARY), "--runs-dir", str(GPU / "runs"), "--json", str(out)]
    assert run_cli(*args, "--reference-dir", str(REFERENCE_PASS), "--strict").returncode == 0
    assert run_cli(*args, "--reference-dir", str(REFERENCE_FAIL), "--strict").returncode == 1
    summary = load(GPU_SUMMARY)
    for cell in summary["cells"]:  # every cell skipped for this machine: a reference exists, nothing compares
        cell.update(status="skipped", skip_cause="machine", reason="needs more GPU memory")
    none_path = tmp_path / "summary.json"
    none_path.write_text(json.dumps(summary))
    nothing = run_cli("compare", "--summary", str(none_path), "--runs-dir", str(GPU / "runs"), "--json", str(out),
                      "--reference-dir", str(REFERENCE_PASS), "--strict")
    assert nothing.returncode == 3, nothing.stdout + nothing.stderr
    assert "verify: NOTHING COMPARED:" in nothing.stdout and "which is not a pass" in nothing.stdout
    assert load(out)["gate"] == {"result": "NOTHING COMPARED", "exit_code": 3, "gpu_count": load(out)["gate"][
        "gpu_count"]}
    assert run_cli("gate", "--verify", str(out)).returncode == 3
    assert run_cli(*args, "--reference-dir", str(tmp_path / "none"), "--strict").returncode == 0
    assert run_cli("gate", "--verify", str(tmp_path / "missing.json")).returncode == 2
    assert run_cli("no-such-command").returncode == 2


def test_tolerance_overrides_and_bad_tolerance_file(tmp_path):
    tolerances = reference.load_tolerances(REPO / "reference", None)
    rule = reference.band_for(tolerances, {"model": "m", "precision": "apex_o1", "seed": 0})["throughput_per_s"]
    assert rule == {"rel_floor": 0.10, "k": 2}
    assert reference.band_for(tolerances, {"model": "m", "precision": "fp32", "seed": 0})["throughput_per_s"] == {
        "rel_floor": 0.08, "k": 2}
    digits = reference.band_for(tolerances, {"model": "transformer", "precision": "fp32", "seed": 0})
    assert "throughput_per_s" not in digits and digits["eval_accuracy"] == {"abs_floor": 0.02, "k": 2}
    for bad, field in [("{ratio: [0.9, 1.1]}", "metrics.throughput_per_s"),
                       ("{rel_floor: 0.1}", "metrics.throughput_per_s"),
                       ("{rel_floor: 0.1, abs_floor: 1, k: 2}", "metrics.throughput_per_s")]:
        (tmp_path / "tolerances.yaml").write_text(f"metrics:\n  throughput_per_s: {bad}\n")
        with pytest.raises(verify.VerifyError, match=f"field {field}.*rel_floor: F, k: K"):
            reference.load_tolerances(tmp_path, None)


def test_band_is_the_floor_for_one_run_and_k_times_the_spread_beyond_it():
    rule = {"rel_floor": 0.08, "k": 2}
    one = reference.band(rule, {"median": 100.0, "min": 100.0, "max": 100.0, "n": 1})
    assert one["half_width"] == 0.08 and one["from"] == "floor" and "one run" in one["why"]
    steady = reference.band(rule, {"median": 100.0, "min": 99.0, "max": 101.0, "n": 3})
    assert steady["half_width"] == 0.08 and steady["from"] == "floor"
    noisy = reference.band(rule, {"median": 100.0, "min": 95.0, "max": 105.0, "n": 3})
    assert noisy["half_width"] == pytest.approx(0.20) and noisy["from"] == "spread" and "3 runs" in noisy["why"]
    accuracy = reference.band({"abs_floor": 0.02, "k": 2}, {"median": 0.9, "min": 0.88, "max": 0.9, "n": 2})
    assert accuracy["half_width"] == pytest.approx(0.04) and accuracy["kind"] == "absolute"
    assert cellcompare.check_metric("throughput_per_s", rule, 85.0, {"median": 100.0, "min": 95.0, "max": 105.0,
                                                                 "n": 3})["ok"] is True
    assert cellcompare.check_metric("throughput_per_s", rule, 85.0, {"median": 100.0, "min": 99.0, "max": 101.0,
                                                                 "n": 3})["ok"] is False


def test_the_committed_h200_reference_under_its_own_bands():
    """Every committed run lies in the aggregate's bands; a benchmark model slowing down, or lost accuracy, fails."""
    folder = REPO / "reference/nvidia-h200"
    aggregate = reference.load_aggregate(folder)  # refuses an aggregate that does not match runs/
    tolerances = reference.load_tolerances(REPO / "reference", "nvidia-h200")
    runs = reference.read_runs(folder)
    assert aggregate["n_runs"] == len(runs) >= 1
    for run in runs:
        summary = {"cells": json.loads(json.dumps(list(run.rows.values())))}
        specs = {k: v for k, v in run.specs.items()}
        outcome = cellcompare.compare(summary, aggregate, tolerances, specs)
        # A cell that failed in a run (llama7b/apex_o1 in the 2026-11-30 two-run lease) is left out of the aggregate
        # and still fails the gate: those, and only those, may fail here.
        crashed = {f"{c['model']}/{c['precision']}/seed{c['seed']}"
                   for c in summary["cells"] if c["status"] == "failed"}
        assert {f.split(":")[0] for f in outcome["failures"]} == crashed, run.id
    whole = max(reversed(runs), key=lambda run: len(run.rows))  # the newest run of the whole preset (one is 7B only)
    summary = {"cells": json.loads(json.dumps(list(whole.rows.values())))}
    crashed = {f"{c['model']}/{c['precision']}/seed{c['seed']}" for c in summary["cells"] if c["status"] == "failed"}
    by_name = {(c["model"], c["precision"]): c for c in summary["cells"]}
    by_name["transformer", "fp32"]["throughput_per_s"] *= 1.27  # a digits model: launch-bound, not compared
    # with its specs: its benchmark cells ran 10 + 20 steps, the newest runs 3 + 10 (their loss is not compared)
    assert [f for f in cellcompare.compare(summary, aggregate, tolerances, whole.specs)["failures"]
            if f.split(":")[0] not in crashed] == []
    by_name["transformer", "fp32"]["eval_accuracy"] -= 0.03
    by_name["resnet50", "amp_fp16"]["throughput_per_s"] *= 0.85
    failures = "\n".join(cellcompare.compare(summary, aggregate, tolerances, whole.specs)["failures"])
    assert "transformer/fp32/seed0: eval accuracy" in failures and "resnet50/amp_fp16/seed0: throughput" in failures


def with_cell(summary: dict, model: str, precision: str, **changes) -> dict:
    summary = json.loads(json.dumps(summary))
    for cell in summary["cells"]:
        if (cell["model"], cell["precision"]) == (model, precision):
            for key in ("throughput_per_s", "peak_allocated_bytes", "final_loss"):
                cell[key] = None
            cell.update(changes)
    return summary


def test_a_cell_this_machine_cannot_run_is_not_comparable_here_and_does_not_fail_the_gate():
    summary = with_cell(load(GPU_SUMMARY), "gpt124m", "tf32", status="skipped", skip_cause="machine",
                        skip_needs="2 GPUs", reason="this cell asks for 2 GPUs; 1 visible")
    result = check(summary, REFERENCE_PASS)
    assert result["status"] == "pass" and result["gate"]["exit_code"] == 0, result["failures"]
    assert result["counts"]["not_comparable_here"] == 2 and result["counts"]["pass"] == 34
    assert "2 not comparable here" in result["message"]
    text = "\n".join(verify.report_lines(result))
    assert "gpt124m/tf32/seed0 (this machine cannot run it: this cell asks for 2 GPUs; 1 visible)" in text


@pytest.mark.parametrize("status, cause", [("skipped", "software"), ("skipped", None), ("failed", None),
                                           ("collapsed", None)])
def test_a_cell_missing_for_another_reason_still_fails(status, cause):
    summary = with_cell(load(GPU_SUMMARY), "gpt124m", "tf32", status=status, skip_cause=cause,
                        reason="vit_b_16 comes from torchvision, which is not importable here")
    result = check(summary, REFERENCE_PASS)
    assert result["status"] == "fail" and result["counts"]["fail"] == 2
    assert f"gpt124m/tf32/seed0: status {status} here, 1 ok in the reference" in "\n".join(result["failures"])


def test_a_cell_that_ran_and_disagrees_fails_even_when_others_are_not_comparable_here():
    summary = with_cell(load(GPU_SUMMARY), "gpt124m", "tf32", status="skipped", skip_cause="machine", reason="x")
    for cell in summary["cells"]:
        if (cell["model"], cell["precision"], cell["seed"]) == ("resnet50", "fp32", 0):
            cell["throughput_per_s"] *= 0.8
    result = check(summary, REFERENCE_PASS)
    assert result["status"] == "fail" and result["counts"]["fail"] == 1 and result["counts"]["not_comparable_here"] == 2


def test_another_software_stack_or_gpu_count_is_said_first(tmp_path):
    summary = load(GPU_SUMMARY)
    summary["versions"]["torch"] = "2.13.0+cu130"
    result = verify.verify(summary, REFERENCE_PASS, GPU / "runs", probe=lambda: (["NVIDIA H200"] * 2, "nvidia-smi"))
    assert result["stack"]["same"] is False
    texts = [d["text"] for d in result["stack"]["differences"]]
    assert "torch: 2.13.0+cu130 here; 2.11.0+cu130 (1 run) in the reference" in texts
    assert "GPU count: 2 here; 1 (1 run) in the reference" in texts
    assert result["machine"]["gpu_count"] == 2 and result["gate"]["gpu_count"] == 2
    lines = verify.report_lines(result)
    assert lines[0].startswith("verify: NOTE: this run's software or machine differs")
    assert lines[1].strip().startswith("torch: 2.13.0") and lines.index(next(x for x in lines if "PASS" in x)) > 1
    same = check(load(GPU_SUMMARY), REFERENCE_PASS)  # the fixture's apex commit is a prefix of itself; driver same
    assert same["stack"]["same"] and not verify.report_lines(same)[0].startswith("verify: NOTE")


# ---------------------------------------------------------------------------------------------------------------------
# make verify: the Snakemake target rule in a workflow copy whose results/ is the GPU-like fixture


FIXTURE_PRESET = """# the gpu fixture's matrix (tests only)
models:
  resnet50: {arch: resnet50, data: synthetic_images, batch_size: 256, image_size: 224}
  vit_b_16: {arch: vit_b_16, data: synthetic_images, batch_size: 128, image_size: 224}
  gpt124m: {arch: gpt, data: synthetic_tokens, batch_size: 16, seq_len: 1024}
precisions: [fp32, tf32, amp_fp16, amp_bf16, apex_o1, apex_o2]
seeds: [0, 1]
train: {steps: 40, warmup_steps: 10, lr: 0.0001, optimizer: adamw, weight_decay: 0.0, deterministic: false}
"""


def make_verify(workdir: Path) -> subprocess.CompletedProcess:
    venv = Path(sys.prefix)  # the venv running the tests (make test: .venv)
    env = {**os.environ, "PATH": f"{venv / 'bin'}:{os.environ['PATH']}"}
    # -o: never rebuild the venv from here; --allowed-rules: never train, only compare and gate.
    return subprocess.run(["make", "verify", f"VENV={venv}", "-o", f"{venv}/.amprepro-installed",
                           "SNAKEMAKE_ARGS=--config preset=paper --allowed-rules verify_compare verify"],
                          cwd=workdir, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("reference, code", [(REFERENCE_FAIL, 2), (REFERENCE_PASS, 0), (None, 0)])
def test_make_verify_on_the_fixture(tmp_path, reference, code):
    workdir = workflow_with_results(tmp_path / "amprepro", GPU, reference)
    preset = workdir / "config/presets/paper.yaml"
    preset.write_text(FIXTURE_PRESET)
    os.utime(preset, (os.path.getmtime(workdir / "Snakefile"),) * 2)
    result = make_verify(workdir)
    output = result.stdout + result.stderr
    assert result.returncode == code, output[-6000:]
    assert "Rule: train" not in output and "rule train" not in output
    verdict = load(workdir / "results/verify/verify.json")
    assert verdict["gate"]["exit_code"] == (1 if code else 0) and "gpu_count" in verdict["machine"]
    if reference is REFERENCE_FAIL:
        assert verdict["status"] == "fail"
        assert "verify: FAIL: 4 of 36 cells out of tolerance" in output
        assert "out of tolerance: resnet50/amp_fp16/seed0: throughput" in output
        assert "out of tolerance: vit_b_16/apex_o1/seed1: peak GPU memory" in output
    elif reference is REFERENCE_PASS:
        assert verdict["status"] == "pass" and "verify: PASS" in output
    else:
        assert verdict["status"] == "no_reference"
        assert "verify: WARNING: no reference results for NVIDIA H200" in output
    assert {c["id"] for c in verdict["claims"]} >= {"vit-apex-o1-speed", "fp16-tensor-core-throughput"}


def test_the_report_says_what_differs_and_what_is_not_comparable_here():
    from amprepro.report import reporthtml

    summary = with_cell(load(GPU_SUMMARY), "gpt124m", "tf32", status="skipped", skip_cause="machine",
                        reason="this cell asks for 2 GPUs; 1 visible")
    summary["versions"]["torch"] = "2.13.0+cu130"
    result = check(summary, REFERENCE_PASS)
    html = reporthtml.verify_html(result)
    assert "Not the reference's stack:</b> torch: 2.13.0+cu130 here; 2.11.0+cu130 (1 run) in the reference" in html
    assert html.index("Not the reference's stack") < html.index("<table")
    assert "not comparable here" in html and "the median of 1 run(s) on 1 machine(s)" in html
    assert "one run: every band is its floor" in html and "This machine: 1 GPU(s)" in html
    data = {"summary": summary, "environment": {}, "sanity": {}, "apex": {}, "verify": result}
    glance = reporthtml.glance_html(data)
    assert "Not the reference's stack" in glance and "2 not comparable here" in glance

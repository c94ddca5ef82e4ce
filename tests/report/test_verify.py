"""verify: per-cell comparison with the reference of the same GPU model, on a passing and a failing fixture."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from amprepro import verify
from report_helpers import GPU, REFERENCE_FAIL, REFERENCE_PASS, REPO, SMOKE, workflow_with_results

GPU_SUMMARY = GPU / "summary/summary.json"


def run_cli(*args, cwd=REPO):
    env = {**os.environ, "PYTHONPATH": str(REPO / "workflow")}
    return subprocess.run([sys.executable, "-m", "amprepro.verify", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def test_slug():
    assert verify.gpu_slug("NVIDIA H200") == "nvidia-h200"
    assert verify.gpu_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"


def test_passing_fixture_passes():
    result = verify.verify(load(GPU_SUMMARY), REFERENCE_PASS, GPU / "runs")
    assert result["status"] == "pass", result["failures"]
    assert result["counts"]["pass"] == 36 and not result["failures"]
    assert result["message"].startswith("all 36 compared cells within tolerance")


def test_failing_fixture_names_the_cells_and_by_how_much():
    result = verify.verify(load(GPU_SUMMARY), REFERENCE_FAIL, GPU / "runs")
    assert result["status"] == "fail"
    text = "\n".join(result["failures"])
    # resnet50/amp_fp16: this run is 0.78x the reference (22 % slower), band 0.90-1.10: 13.3 % below its lower edge
    assert "resnet50/amp_fp16/seed0: throughput" in text and "0.780×" in text and "−22.0 %" in text.replace("-", "−")
    assert "13.3 % below the band" in text and "allowed 0.9–1.1× reference" in text
    # vit_b_16/apex_o1/seed1: 12 % more peak memory, band 0.95-1.05
    assert "vit_b_16/apex_o1/seed1: peak GPU memory" in text and "1.120×" in text and "6.7 % above the band" in text
    # a cell that ran here and collapsed in the reference fails on status
    assert "gpt124m/amp_bf16/seed1: status ok here, collapsed in the reference" in text
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
    gate = run_cli("gate", "--verify", str(out))
    assert gate.returncode == 1 and "resnet50/amp_fp16/seed1" in gate.stdout
    assert "resnet50,amp_fp16,0,fail" in (tmp_path / "verify.csv").read_text()
    good = run_cli("compare", "--summary", str(GPU_SUMMARY), "--runs-dir", str(GPU / "runs"), "--reference-dir",
                   str(REFERENCE_PASS), "--json", str(out), "--strict")
    assert good.returncode == 0 and "verify: PASS" in good.stdout
    assert run_cli("gate", "--verify", str(out)).returncode == 0


def test_no_reference_for_this_gpu_warns_and_exits_zero(tmp_path):
    result = verify.verify(load(GPU_SUMMARY), tmp_path / "empty-reference", GPU / "runs")
    assert result["status"] == "no_reference"
    assert "no reference results for NVIDIA H200" in result["message"]
    out = run_cli("compare", "--summary", str(GPU_SUMMARY), "--reference-dir", str(tmp_path), "--strict")
    assert out.returncode == 0 and "verify: WARNING: no reference results for NVIDIA H200" in out.stdout
    assert "amprepro.verify promote" in out.stdout


def test_cpu_run_has_no_reference_and_the_repository_holds_no_made_up_data():
    result = verify.verify(load(SMOKE / "summary/summary.json"), REPO / "reference", SMOKE / "runs")
    assert result["status"] == "no_reference" and "no GPU" in result["message"]
    for summary_csv in (REPO / "reference").glob("*/summary.csv"):  # every committed reference names its origin
        provenance = load(summary_csv.parent / "provenance.json")
        assert provenance.get("gpu") and provenance.get("created_utc") and "FIXTURE" not in json.dumps(provenance)


def test_changed_settings_make_a_cell_not_comparable():
    ref_specs = verify.cell_specs(GPU / "runs")
    here = {k: json.loads(json.dumps(v)) for k, v in ref_specs.items()}
    here["resnet50/fp32/0"]["model_config"]["batch_size"] = 128
    rows = verify.read_reference_rows(REFERENCE_PASS / "nvidia-h200/summary.csv")
    result = verify.compare(load(GPU_SUMMARY), rows, verify.load_tolerances(REFERENCE_PASS, "nvidia-h200"), here,
                            ref_specs)
    (cell,) = [c for c in result["cells"] if c["cell"] == "resnet50/fp32/seed0"]
    assert cell["verdict"] == "not_comparable"
    assert "model_config.batch_size 256 in the reference, 128 here" in cell["note"]
    assert any("not compared" in w for w in result["warnings"])


def test_tolerance_overrides_and_bad_tolerance_file(tmp_path):
    tolerances = verify.load_tolerances(REPO / "reference", None)
    assert verify.band_for(tolerances, {"model": "m", "precision": "apex_o1", "seed": 0})["throughput_per_s"] == {
        "ratio": [0.85, 1.15]}
    assert verify.band_for(tolerances, {"model": "m", "precision": "fp32", "seed": 0})["throughput_per_s"] == {
        "ratio": [0.90, 1.10]}
    digits = verify.band_for(tolerances, {"model": "transformer", "precision": "fp32", "seed": 0})
    assert "throughput_per_s" not in digits and digits["eval_accuracy"] == {"abs": 0.02}
    (tmp_path / "tolerances.yaml").write_text("metrics:\n  throughput_per_s: {ratio: [0.9]}\n")
    with pytest.raises(verify.VerifyError, match="field metrics.throughput_per_s"):
        verify.load_tolerances(tmp_path, None)


def test_the_committed_h200_reference_under_the_committed_bands():
    """A digits model moving by launch-bound noise passes; a benchmark model slowing down, or lost accuracy, fails."""
    rows = verify.read_reference_rows(REPO / "reference/nvidia-h200/summary.csv")
    tolerances = verify.load_tolerances(REPO / "reference", "nvidia-h200")
    summary = {"cells": json.loads(json.dumps(rows))}
    assert verify.compare(summary, rows, tolerances)["failures"] == []
    by_name = {(c["model"], c["precision"]): c for c in summary["cells"]}
    by_name["transformer", "fp32"]["throughput_per_s"] *= 1.27  # measured between two sessions
    assert verify.compare(summary, rows, tolerances)["failures"] == []
    by_name["transformer", "fp32"]["eval_accuracy"] -= 0.03
    by_name["resnet50", "amp_fp16"]["throughput_per_s"] *= 0.85
    failures = "\n".join(verify.compare(summary, rows, tolerances)["failures"])
    assert "transformer/fp32/seed0: eval accuracy" in failures and "resnet50/amp_fp16/seed0: throughput" in failures


def test_promote_refuses_cpu_and_round_trips_a_gpu_run(tmp_path):
    with pytest.raises(verify.VerifyError, match="no GPU"):
        verify.promote(str(SMOKE / "summary/summary.json"), str(SMOKE / "summary/summary.csv"), str(SMOKE / "runs"),
                       str(tmp_path))
    folder = verify.promote(str(GPU_SUMMARY), str(GPU / "summary/summary.csv"), str(GPU / "runs"), str(tmp_path))
    assert folder == tmp_path / "nvidia-h200"
    assert load(folder / "provenance.json")["specs"]["resnet50/fp32/0"]["model_config"]["batch_size"] == 256
    result = verify.verify(load(GPU_SUMMARY), tmp_path, GPU / "runs")
    assert result["status"] == "pass" and result["counts"]["pass"] == 36
    for check in (ch for c in result["cells"] for ch in c["checks"]):
        assert check["ratio"] == pytest.approx(1.0)
    with pytest.raises(verify.VerifyError, match="already holds a reference"):
        verify.promote(str(GPU_SUMMARY), str(GPU / "summary/summary.csv"), str(GPU / "runs"), str(tmp_path))


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
    return subprocess.run(["make", "verify", f"VENV={venv}", "-o", f"{venv}/bin/activate",
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

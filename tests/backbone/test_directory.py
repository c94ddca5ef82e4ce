"""The workflow runs from another directory: `snakemake -s <workflow>/Snakefile --directory <workdir>` from a third
directory finds the amprepro package and the workflow's files (config, presets, claims, reference, notebook) in the
workflow, and writes results/ and .snakemake/ in the working directory only."""

import json
import subprocess

import pytest

from workflow_testing import SNAKEMAKE, copy_workflow, job_env

pytestmark = pytest.mark.e2e
CELL = "results/runs/cnn/fp32/seed0/metrics.json"


@pytest.fixture(scope="module")
def three_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("elsewhere")
    workflow = copy_workflow(root / "workflow-copy")
    workdir, cwd = root / "workdir", root / "cwd"
    workdir.mkdir()
    cwd.mkdir()
    return workflow, workdir, cwd


def run_elsewhere(three_dirs, *args):
    workflow, workdir, cwd = three_dirs
    command = [*SNAKEMAKE, "-s", str(workflow / "Snakefile"), "--directory", str(workdir), "--cores", "1", *args,
               "--config", "preset=smoke"]
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600, env=job_env())
    assert result.returncode == 0, f"{' '.join(args)} failed ({result.returncode}):\n{result.stderr[-4000:]}"
    return result


def test_dry_run_plans_the_whole_smoke_preset_from_another_directory(three_dirs):
    workflow, _, _ = three_dirs
    result = run_elsewhere(three_dirs, "-n")
    assert "train" in result.stdout and "report" in result.stdout
    # the workflow's own files are read from the workflow, by absolute path
    assert str(workflow / "notebooks" / "report.ipynb") in result.stdout
    assert str(workflow / "config" / "claims.yaml") in result.stdout


def test_a_cell_runs_from_another_directory_and_writes_only_to_the_working_directory(three_dirs):
    workflow, workdir, cwd = three_dirs
    run_elsewhere(three_dirs, "results/environment/environment.json", CELL)
    env = json.loads((workdir / "results/environment/environment.json").read_text())
    assert env
    metrics = json.loads((workdir / CELL).read_text())
    assert metrics["status"] == "ok", metrics
    assert metrics["precision"] == "fp32"
    assert list(cwd.iterdir()) == []
    assert not (workflow / "results").exists() and not (workflow / ".snakemake").exists()

"""`snakemake --use-conda --cores 1`, the README's conda command, for real and offline (docs/conda.md says what this
proves and what not).

In a copy of the workflow, with the rattler-backed conda stand-in (testing only) first on PATH and a local conda-forge
built from the project's venv: the test env files (envs/train.yaml and envs/report.yaml with the local versions) are
pinned with `snakedeploy pin-conda-envs`, as .github/workflows/pin-envs.yml does, and the smoke preset runs. Then:
every job ran inside the .snakemake/conda/<hash>_ env Snakemake made for it; the envs came from the pin files; a
package absent from an env cannot be imported there; the environment stage recorded the env; a second run reuses it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conda_offline_checks import (
    ENVS_RUN_HERE,
    REPO,
    Standin,
    copy_workflow,
    isolation_problems,
    jobs_in_log,
    offline_env,
    read_probe,
)

pytestmark = pytest.mark.e2e
README_COMMAND = ["snakemake", "--use-conda", "--cores", "1"]
# The copy's config/config.yaml runs the smoke preset in two of its precisions (4 cells, not 12), as a user who edits
# `runs:` there would: every rule still runs in its env, and each more cell is a torch start in the env, on 2 cores.
PRECISIONS = ["fp32", "amp_bf16"]
CELLS = 2 * len(PRECISIONS)  # the smoke preset's two models


def run(command: list[str], workdir: Path, standin: Standin, probe: Path, timeout: int = 1200):
    started = time.monotonic()
    done = subprocess.run(command, cwd=workdir, capture_output=True, text=True, timeout=timeout,
                          env=standin.env(AMPREPRO_PROBE_LOG=str(probe)))
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout[-3000:]}\n"
                             f"{done.stderr[-6000:]}")
    return done.stdout + done.stderr, time.monotonic() - started


def env_dirs(workdir: Path) -> dict[str, tuple[int, int]]:
    conda = workdir / ".snakemake" / "conda"
    return {p.name: (p.stat().st_ino, (conda / f"{p.name}.env_setup_done").stat().st_mtime_ns)
            for p in conda.iterdir() if p.is_dir()}


@pytest.fixture(scope="module")
def offline_run(channel_standin: Standin, tmp_path_factory) -> dict:
    standin = channel_standin
    workdir = copy_workflow(tmp_path_factory.mktemp("conda-run") / "amprepro")
    probe = workdir.parent / "probe.jsonl"
    config = workdir / "config" / "config.yaml"
    assert "\nruns: {}\n" in config.read_text()
    runs = f"\nruns: {{precisions: [{', '.join(PRECISIONS)}]}}\n"
    config.write_text(config.read_text().replace("\nruns: {}\n", runs))
    for env in ENVS_RUN_HERE:
        (workdir / "envs" / env).write_text(offline_env(REPO / "envs" / env, standin.channel))
    pin, _ = run([str(standin.venv / "bin" / "snakedeploy"), "pin-conda-envs", "--conda-frontend", "conda",
                  *(f"envs/{env}" for env in ENVS_RUN_HERE)], workdir, standin, probe)
    result = {"workdir": workdir, "standin": standin, "pin_log": pin}
    result["log"], result["seconds"] = run(README_COMMAND, workdir, standin, probe)
    result["starts"] = read_probe(probe)
    result["envs"] = env_dirs(workdir)
    result["log2"], result["seconds2"] = run(README_COMMAND, workdir, standin, probe)
    result["starts2"] = read_probe(probe)[len(result["starts"]):]
    result["envs2"] = env_dirs(workdir)
    result["log3"], _ = run([*README_COMMAND, "--forcerun", "summary"], workdir, standin, probe)
    result["starts3"] = read_probe(probe)[len(result["starts"]) + len(result["starts2"]):]
    result["envs3"] = env_dirs(workdir)
    print(f"offline --use-conda run: {result['seconds']:.0f} s, no-op rerun {result['seconds2']:.0f} s")
    return result


def test_pin_files_from_the_local_channel_are_what_snakemake_installs(offline_run):
    workdir, log = offline_run["workdir"], offline_run["log"]
    for env in ENVS_RUN_HERE:
        pin = workdir / "envs" / env.replace(".yaml", ".linux-64.pin.txt")
        lines = pin.read_text().splitlines()
        assert "@EXPLICIT" in lines, pin
        packages = [line for line in lines if line.startswith("file://")]
        assert packages and all(str(offline_run["standin"].channel) in line and "#" in line for line in packages)
        assert re.search(rf"Using pinnings from \S*/envs/{re.escape(pin.name)}\.", log), f"{pin.name} not used"
    assert "Failed to install conda environment from pin file" not in log
    assert log.count("Creating conda environment") == len(ENVS_RUN_HERE)


def test_every_job_ran_inside_its_snakemake_conda_env(offline_run):
    workdir = offline_run["workdir"]
    jobs = jobs_in_log(offline_run["log"])
    assert sum(1 for job in jobs if job.rule == "train") == CELLS, "the smoke preset's cells in PRECISIONS"
    assert {"environment", "apex", "sanity", "summary", "report"} <= {job.rule for job in jobs}
    assert isolation_problems(workdir, jobs, offline_run["starts"]) == []
    envs = {job.rule: (workdir / job.env).resolve() for job in jobs if job.env}
    conda = workdir / ".snakemake" / "conda"
    # each env is the one its rule declares: Snakemake keeps a copy of what it installed from (here the pin file)
    for rule, env in (("train", "train"), ("report", "report")):
        copy = conda / f"{envs[rule].name}.pin.txt"
        assert copy.read_text() == (workdir / "envs" / f"{env}.linux-64.pin.txt").read_text(), rule
    assert envs["train"] != envs["report"]
    assert (workdir / "results" / "report" / "report.html").stat().st_size > 0


def test_a_package_absent_from_an_env_cannot_be_imported_there(offline_run):
    workdir = offline_run["workdir"]
    jobs = jobs_in_log(offline_run["log"])
    env = {job.rule: (workdir / job.env).resolve() for job in jobs if job.env}

    def imports(python: Path, module: str) -> bool:
        return subprocess.run([str(python), "-c", f"import {module}"], capture_output=True).returncode == 0

    launcher = Path(sys.executable)  # the project's venv, which runs Snakemake
    for module in ("torch", "papermill", "snakemake"):
        assert imports(launcher, module), f"the launching venv should have {module}"
    assert imports(env["train"] / "bin" / "python", "torch")
    assert not imports(env["train"] / "bin" / "python", "papermill"), "train env must not see the report env/venv"
    assert imports(env["report"] / "bin" / "python", "papermill")
    assert not imports(env["report"] / "bin" / "python", "torch"), "report env must not see the train env/venv"
    for python in (env["train"] / "bin" / "python", env["report"] / "bin" / "python"):
        assert not imports(python, "snakemake"), f"{python} sees Snakemake's venv"


def test_the_environment_stage_recorded_the_env(offline_run):
    workdir = offline_run["workdir"]
    record = json.loads((workdir / "results" / "environment" / "environment.json").read_text())
    train_env = next((workdir / j.env).resolve() for j in jobs_in_log(offline_run["log"]) if j.rule == "environment")
    assert record["isolation"]["mode"] == "conda" and record["isolation"]["isolated"] is True
    assert Path(record["isolation"]["prefix"]).resolve() == train_env
    assert Path(record["python"]["executable"]).resolve().is_relative_to(train_env)
    explicit = record["conda_explicit"].splitlines()
    assert "@EXPLICIT" in explicit
    assert any(line.split("#")[0].endswith("/pytorch-2.13.0-cpu_pypi_0.conda") for line in explicit)
    assert "papermill" not in record["packages"], "the train env's package list must not include the report env's"
    assert record["torch"]["version"].startswith("2.13.0")


def test_a_second_run_reuses_the_envs(offline_run):
    assert "Nothing to be done" in offline_run["log2"]
    assert offline_run["starts2"] == [], "the no-op rerun started no job"
    for log in (offline_run["log2"], offline_run["log3"]):
        assert "Creating conda environment" not in log
    assert offline_run["envs"] == offline_run["envs2"] == offline_run["envs3"], "env dirs were rebuilt"
    # a forced rerun of summary (and so the report and the reference comparison) runs in the very same env dirs
    jobs = jobs_in_log(offline_run["log3"])
    assert {job.rule for job in jobs if job.outputs} == {"summary", "report", "verify_compare"}
    assert isolation_problems(offline_run["workdir"], jobs, offline_run["starts3"]) == []
    assert {Path(j.env).name for j in jobs if j.env} <= set(offline_run["envs"])

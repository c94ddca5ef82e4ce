"""`snakemake --use-conda` failure paths: each ends in one message from amprepro (workflow/rules/conda_check.smk,
amprepro.env.condacheck) before Snakemake's own conda error, and the isolation check itself catches a job that ran
outside
its env."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conda_offline_checks import (
    REPO,
    Standin,
    copy_workflow,
    isolation_problems,
    jobs_in_log,
    offline_env,
)

from amprepro.env import condacheck

DRY_RUN = ["snakemake", "--use-conda", "--cores", "1", "-n"]


def snakemake(workdir: Path, env: dict) -> subprocess.CompletedProcess:
    done = subprocess.run(DRY_RUN, cwd=workdir, capture_output=True, text=True, env=env, timeout=600)
    done.stderr = done.stdout + done.stderr  # Snakemake prints some errors on stdout
    return done


def test_no_conda_on_path(tmp_path):
    workdir = copy_workflow(tmp_path / "amprepro")
    path = os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin", "/bin"])
    if shutil.which("conda", path=path):
        pytest.skip(f"a real conda is installed in /usr/bin or /bin ({shutil.which('conda', path=path)})")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONDA", "AMPREPRO_"))} | {"PATH": path}
    done = snakemake(workdir, env)
    assert done.returncode != 0
    assert "amprepro: `snakemake --use-conda` needs the `conda` command, but there is no `conda` on PATH" in done.stderr
    assert "Fix: Install Miniforge" in done.stderr
    assert "Error running conda info" not in done.stderr, "amprepro must speak before Snakemake's conda check"


def test_conda_too_old(standin: Standin, tmp_path):
    workdir = copy_workflow(tmp_path / "amprepro")
    done = snakemake(workdir, standin.env(CONDA_STANDIN_REPORTED_VERSION="23.11.0"))
    assert done.returncode != 0
    assert f"amprepro: conda 23.11.0 ({standin.base / 'bin' / 'conda'}) is too old" in done.stderr
    assert "needs conda >= 24.7.1" in done.stderr and "conda update -n base -c conda-forge conda" in done.stderr
    assert "CreateCondaEnvironmentException" not in done.stderr


def test_unsolvable_pin(channel_standin: Standin, tmp_path):
    workdir = copy_workflow(tmp_path / "amprepro")
    for env in ("train.yaml", "report.yaml"):
        (workdir / "envs" / env).write_text(offline_env(REPO / "envs" / env, channel_standin.channel))
    train = workdir / "envs" / "train.yaml"
    train.write_text(train.read_text().replace("- numpy=", "- numpy=1.0.0.1 # was "))
    done = snakemake(workdir, channel_standin.env())
    assert done.returncode != 0
    assert "amprepro: the pinned conda env envs/train.yaml cannot be solved (PackagesNotFoundError)" in done.stderr
    assert "numpy 1.0.0.1" in done.stderr, "the message names the spec that has no candidate"
    assert "Fix: in envs/train.yaml, pin versions that exist on its channels (conda-forge" in done.stderr
    assert "Creating conda environment" not in done.stdout + done.stderr, "it stopped before Snakemake tried"


def test_the_preflight_passes_and_stays_quiet_when_all_is_well(channel_standin: Standin, tmp_path):
    workdir = copy_workflow(tmp_path / "amprepro")
    for env in ("train.yaml", "report.yaml"):
        (workdir / "envs" / env).write_text(offline_env(REPO / "envs" / env, channel_standin.channel))
    done = snakemake(workdir, channel_standin.env())
    assert done.returncode == 0, done.stderr[-3000:]
    assert "amprepro:" not in done.stderr
    assert "Conda environment envs/train.yaml will be created." in done.stdout + done.stderr


# ------------------------------------------------------------------------------------------------- unit tests
def test_isolation_check_reports_a_job_that_ran_outside_its_env(tmp_path):
    env = tmp_path / ".snakemake" / "conda" / ("a" * 32 + "_")
    (env / "bin").mkdir(parents=True)
    log = ("localcheckpoint sanity:\n    output: results/sanity/sanity.json\n    jobid: 4\n"
           f"Activating conda environment: .snakemake/conda/{env.name}\n"
           "localrule summary:\n    output: results/summary/summary.csv, results/summary/summary.json\n"
           f"Activating conda environment: .snakemake/conda/{env.name}\n"
           "localrule report:\n    output: results/report/report.html\n"
           "localrule all:\n    input: results/report/report.html\n")
    inside = {"argv": ["python", "-m", "amprepro.env.sanity", "--out", "results/sanity/sanity.json"],
              "prefix": str(env),
              "executable": str(env / "bin" / "python"), "conda_prefix": str(env), "snakemake_importable": False}
    venv = {"argv": ["python", "-m", "amprepro.analysis.summary", "--csv", "results/summary/summary.csv"],
            "prefix": sys.prefix, "executable": sys.executable, "conda_prefix": str(env),
            "snakemake_importable": True}
    jobs = jobs_in_log(log)
    assert [j.rule for j in jobs] == ["sanity", "summary", "report", "all"]
    problems = isolation_problems(tmp_path, jobs, [inside, venv])
    assert any(p.startswith("summary results/summary/summary.csv: python ") for p in problems)
    assert any(p.startswith("summary: snakemake was importable") for p in problems)
    assert "report results/report/report.html: Snakemake activated no conda env" in problems
    assert not any(p.startswith("sanity") for p in problems)
    assert isolation_problems(tmp_path, jobs[:1], [inside]) == []
    assert isolation_problems(tmp_path, jobs[:1], []) == [
        "sanity results/sanity/sanity.json: no python of a conda env ran it (ran outside its env?)"]


def test_condacheck_reads_real_conda_errors(tmp_path, monkeypatch):
    """The JSON real conda prints for `conda create --dry-run --json` on an unsolvable spec."""
    env = tmp_path / "x.yaml"
    env.write_text("channels: [conda-forge, nodefaults]\ndependencies:\n  - numpy=0.0.1\n")
    real = {"caused_by": "None", "channel_urls": ["https://conda.anaconda.org/conda-forge/linux-64"],
            "error": "PackagesNotFoundError: The following packages are not available from current channels:\n\n"
                     "  - numpy=0.0.1*", "exception_name": "PackagesNotFoundError",
            "message": "The following packages are not available from current channels:\n\n  - numpy=0.0.1*"}
    fake = subprocess.CompletedProcess([], 1, stdout=json.dumps(real), stderr="")
    monkeypatch.setattr(condacheck.subprocess, "run", lambda *a, **k: fake)
    with pytest.raises(condacheck.CondaProblem) as problem:
        condacheck.check_solvable("conda", env)
    assert "cannot be solved (PackagesNotFoundError)" in str(problem.value)
    assert "  - numpy=0.0.1*" in str(problem.value)
    assert condacheck.solve_command("conda", env) == [
        "conda", "create", "--dry-run", "--json", "--name", "amprepro-solve-check", "--override-channels",
        "--channel", "conda-forge", "numpy=0.0.1"]


def test_condacheck_versions_pip_sections_pin_files_and_deployed_envs(tmp_path):
    condacheck.check_version("conda", "24.7.1")
    condacheck.check_version("conda", "25.11.0")
    with pytest.raises(condacheck.CondaProblem, match="conda 24.7.0 .* is too old"):
        condacheck.check_version("conda", "24.7.0")
    env = tmp_path / "envs" / "x.yaml"
    env.parent.mkdir()
    env.write_text("channels: [conda-forge]\ndependencies:\n  - python=3.11\n  - pip:\n    - tabulate\n")
    with pytest.raises(condacheck.CondaProblem, match="has a `pip:` section"):
        condacheck.solve_command("conda", env)
    assert condacheck.pin_file(env) is None
    (env.parent / f"x.{condacheck.conda_platform()}.pin.txt").write_text("@EXPLICIT\n")
    assert condacheck.pin_file(env) is not None
    prefix = tmp_path / ".snakemake" / "conda"
    prefix.mkdir(parents=True)
    (prefix / "abc_.yaml").write_bytes(env.read_bytes())
    assert not condacheck.deployed(env, prefix), "an env whose setup did not finish is not deployed"
    (prefix / "abc_.env_setup_done").touch()
    assert condacheck.deployed(env, prefix)

"""The Makefile's venv is finished only when its stamp says so: a venv made by `python -m venv` alone (torch installed
into it by hand first), or one whose install failed or was interrupted during pip, is completed by the next make, and
pip keeps a torch that already satisfies the pin.

Offline stand-in for the package index: a .pth file in the venv puts this test interpreter's site-packages (which
holds every pinned package) after the venv's own, and PIP_NO_INDEX=1, so pip finds each requirement already satisfied
and can download nothing. What pip must still do is install amprepro itself (editable), which only a completed
install does. The venv's bundled setuptools (65.5) is removed: torch requires setuptools>=77.0.3, which pip could not
fetch offline; the test interpreter's newer one is then the one seen.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from workflow_testing import HOLD_SOURCE, REPO, copy_workflow, hold_env

STAMP = ".amprepro-installed"
USER_TORCH = "2.13.0+cu129"  # not the test interpreter's build: kept only if pip leaves the user's torch alone


def purelib(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True, timeout=120)
    return Path(out.stdout.strip())


@pytest.fixture
def workdir(tmp_path) -> Path:
    root = copy_workflow(tmp_path / "amprepro")
    shutil.copy2(REPO / "pyproject.toml", root / "pyproject.toml")
    return root


def offline_env(tmp_path: Path) -> dict:
    env = {name: value for name, value in os.environ.items()
           if name not in ("CORES", "SNAKEMAKE_ARGS", "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "PYTHONPATH")}
    links = tmp_path / "no-wheels"
    links.mkdir(exist_ok=True)
    return {**env, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(links), "PIP_NO_BUILD_ISOLATION": "0",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1", "AMPREPRO_FRESH_CELLS": "1"}


def bare_venv(venv: Path) -> Path:
    """`python -m venv` alone; its site-packages."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    return purelib(venv / "bin" / "python")


def give_index(venv: Path) -> None:
    """The stand-in for the package index (see the module's docstring)."""
    site = purelib(venv / "bin" / "python")
    for name in ("setuptools", "_distutils_hack", "pkg_resources", "distutils-precedence.pth"):
        target = site / name
        shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)
    for info in site.glob("setuptools-*.dist-info"):
        shutil.rmtree(info)
    (site / "zz-test-index.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")


def make(workdir: Path, env: dict, *targets: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", "VENV=venv", f"PYTHON={sys.executable}", *targets],
                          cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout)


def expected_hash(workdir: Path, env: dict) -> str:
    return make(workdir, env, "venv-hash").stdout.strip()


def imports_amprepro(venv: Path, tmp_path: Path) -> bool:
    """Whether the venv's python imports amprepro from a directory that holds nothing of it (no PYTHONPATH)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    probe = subprocess.run([str(venv / "bin" / "python"), "-c", "import amprepro.config"], cwd=elsewhere,
                           capture_output=True, text=True, timeout=120)
    return probe.returncode == 0


def interrupted_during_pip(workdir: Path, env: dict, log: Path) -> int:
    """`make` started as a terminal starts it, Ctrl-C (SIGINT to its process group) while pip works; make's status.
    The pip process is held as it starts (HOLD_SOURCE, imported by a .pth in the venv, keyed on `requirements.txt` in
    its argv), so the Ctrl-C always lands inside pip (which, every requirement satisfied, ends within a second)."""
    site = purelib(workdir / "venv" / "bin" / "python")
    (site / "amprepro_test_hold.py").write_text(HOLD_SOURCE)
    (site / "zz-test-hold.pth").write_text("import amprepro_test_hold\n")
    held = log.with_name("pip-held")
    with log.open("w") as sink:
        started = subprocess.Popen(["make", "--no-print-directory", "VENV=venv", f"PYTHON={sys.executable}",
                                    f"venv/{STAMP}"], cwd=workdir, env={**env, **hold_env("requirements.txt", held)},
                                   stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not held.exists():
            assert started.poll() is None, log.read_text()[-2000:]
            assert time.monotonic() < deadline, "pip never started"
            time.sleep(0.01)
        os.killpg(started.pid, signal.SIGINT)
        return started.wait(timeout=120)
    finally:
        if started.poll() is None:
            os.killpg(started.pid, signal.SIGKILL)
        (site / "zz-test-hold.pth").unlink()
        (site / "amprepro_test_hold.py").unlink()


def test_a_venv_whose_install_failed_or_was_interrupted_is_completed_and_keeps_the_users_torch(workdir, tmp_path):
    env, venv = offline_env(tmp_path), workdir / "venv"
    site = bare_venv(venv)  # `python -m venv .venv`, then docs/running.md's tip: torch from another index first
    user_torch = site / f"torch-{USER_TORCH}.dist-info"  # what `pip install torch==2.13.0 --index-url ...` leaves
    user_torch.mkdir()
    (user_torch / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {USER_TORCH}\n")
    (user_torch / "INSTALLER").write_text("pip\n")
    (user_torch / "RECORD").write_text("")
    assert (venv / "bin" / "activate").exists() and not imports_amprepro(venv, tmp_path)  # looks made, is not

    dropped = make(workdir, env, "run")  # the network drops: pip finds none of the requirements
    assert dropped.returncode != 0
    assert "the install into venv did not finish; run make again" in dropped.stderr, dropped.stderr[-2000:]
    assert "amprepro.env.launch" not in dropped.stdout  # nothing ran on a half-made venv
    assert not (venv / STAMP).exists()

    give_index(venv)  # the network is back; this time Ctrl-C while pip works
    assert interrupted_during_pip(workdir, env, tmp_path / "make.log") != 0
    assert not (venv / STAMP).exists() and not imports_amprepro(venv, tmp_path)

    run = make(workdir, env, "run", "SNAKEMAKE_ARGS=-n --config preset=smoke")
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    assert "installing the pinned requirements into venv" in run.stdout
    assert (venv / STAMP).read_text().strip() == expected_hash(workdir, env)
    assert imports_amprepro(venv, tmp_path)
    version = subprocess.run([str(venv / "bin" / "python"), "-c",
                              "import importlib.metadata as m; print(m.version('torch'))"],
                             capture_output=True, text=True, timeout=120).stdout.strip()
    assert version == USER_TORCH and user_torch.is_dir()  # the user's torch was kept, not replaced
    again = make(workdir, env, "run", "SNAKEMAKE_ARGS=-n --config preset=smoke")
    assert again.returncode == 0 and "installing" not in again.stdout  # finished: no second install


def test_changed_requirements_make_the_stamp_stale(workdir, tmp_path):
    env = offline_env(tmp_path)
    before = expected_hash(workdir, env)
    (workdir / "venv").mkdir()
    (workdir / "venv" / STAMP).write_text(before + "\n")
    assert "installing" not in make(workdir, env, "-n", "run").stdout
    with (workdir / "requirements.txt").open("a") as requirements:
        requirements.write("# a comment changes the hash too\n")
    assert expected_hash(workdir, env) != before
    assert "installing the pinned requirements" in make(workdir, env, "-n", "run").stdout


def test_make_run_installs_no_developer_tools_and_make_test_adds_them(workdir, tmp_path):
    env = offline_env(tmp_path)
    (workdir / "venv").mkdir()
    (workdir / "venv" / STAMP).write_text(expected_hash(workdir, env) + "\n")
    run = make(workdir, env, "-n", "run").stdout
    assert "installing" not in run and "requirements-dev.txt" not in run  # the run's venv is finished as it is
    test = make(workdir, env, "-n", "test").stdout
    assert "installing the developer tools" in test and "pinned requirements" not in test
    (workdir / "venv" / ".amprepro-dev-installed").write_text("an older hash\n")
    assert "installing the developer tools" in make(workdir, env, "-n", "lint").stdout  # a stale dev stamp too


def test_every_make_target_ci_calls_exists():
    """.ci/run calls make targets by name (the venv in the background, then the tests): each must be one the Makefile
    has, or CI stops in its first second (it did, when the venv's file target was renamed to its stamp)."""
    import re
    script = (REPO / ".ci" / "run").read_text()
    targets = re.findall(r"\bmake\s+([A-Za-z][\w./-]*)", script)
    assert "test" in targets and len(targets) >= 2, targets
    for target in targets:
        out = subprocess.run(["make", "-n", "-C", str(REPO), target], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, f"make {target}: {out.stderr.strip()}"

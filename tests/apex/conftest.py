"""Fixtures for the apex build tests: one real build of fake_apex per session, and an environment without CUDA."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from apex_fakes import FAKE_APEX, REPO, Built, Echo, fake_cuda_wheels, fake_python_packages, make_repo, settings_for

from amprepro.env import apexbuild
from amprepro.env.apexbuild import cudakit, toolchain


@pytest.fixture(scope="session")
def fake_repo(tmp_path_factory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("fake_apex_repo")
    commit = make_repo(FAKE_APEX, root / "fake_apex")
    return root / "fake_apex", commit


@pytest.fixture(scope="session")
def built(fake_repo, tmp_path_factory) -> Built:
    """The one real compile of the session: fake_apex built into a shared cache."""
    repo, commit = fake_repo
    root = tmp_path_factory.mktemp("first_build")
    settings = settings_for(repo, commit, cache_dir=root / "cache")
    echo = Echo()
    start = time.monotonic()
    env = {**os.environ, **pip_route_env(root)}
    record = apexbuild.build_and_verify(settings, jobs=2, results_dir=root / "results", env=env, echo=echo)
    built = Built(settings, record, root / "results", root / "cache", echo, time.monotonic() - start, commit, repo)
    built.env = env
    return built


def pip_route_env(root: Path) -> dict:
    """The environment the pip route gives a build (CUDA_HOME, PATH, CPATH of a toolkit installed from fake wheels
    into root/venv): the session's one compile runs in it, so the fixture's C++ extension is shown to compile there."""
    torch_site = fake_python_packages(root / "torch_site")
    (torch_site / "nvidia" / "cu13" / "include").mkdir(parents=True)
    wheels = fake_cuda_wheels(root / "wheels", REPO / "requirements-cuda13.0.txt")
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels), "AMPREPRO_NVCC": "pip"}
    nvcc, _ = cudakit.choose(env, "13.0", None, None, prefix=root / "venv", torch_site=str(torch_site),
                             echo=lambda *a, **k: None)
    return nvcc.env


@pytest.fixture
def bare_env(tmp_path, monkeypatch) -> dict:
    """An environment with no CUDA anywhere: PATH holds only an empty bin dir plus the system compilers. The pip
    route (cudakit) would install into tmp_path/venv, never into the test's own env, and finds no index."""
    monkeypatch.setattr(toolchain, "DEFAULT_CUDA_HOMES", ())
    monkeypatch.setattr(cudakit, "env_prefix", lambda env: tmp_path / "venv")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH", "CONDA_PREFIX", "PYTHONPATH",
                                                             "CXX", "CC", "MAX_JOBS", "TORCH_CUDA_ARCH_LIST", "CPATH",
                                                             "AMPREPRO_NVCC") and not k.startswith("PIP_")}
    env["PATH"] = os.pathsep.join([str(bin_dir), "/usr/bin", "/bin"])
    env["PIP_NO_INDEX"] = "1"
    return env



"""Fixtures for the apex build tests: one real build of fake_apex per session, and an environment without CUDA."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from apex_fakes import FAKE_APEX, Built, Echo, make_repo, settings_for

from amprepro.env import apexbuild
from amprepro.env.apexbuild import toolchain


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
    record = apexbuild.build_and_verify(settings, jobs=2, results_dir=root / "results", echo=echo)
    return Built(settings, record, root / "results", root / "cache", echo, time.monotonic() - start, commit, repo)


@pytest.fixture
def bare_env(tmp_path, monkeypatch) -> dict:
    """An environment with no CUDA anywhere: PATH holds only an empty bin dir plus the system compilers."""
    monkeypatch.setattr(toolchain, "DEFAULT_CUDA_HOMES", ())
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH", "CONDA_PREFIX", "PYTHONPATH",
                                                             "CXX", "CC", "MAX_JOBS", "TORCH_CUDA_ARCH_LIST")}
    env["PATH"] = os.pathsep.join([str(bin_dir), "/usr/bin", "/bin"])
    return env



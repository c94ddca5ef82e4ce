"""Fixtures of the offline conda tests: the rattler-backed conda stand-in (testing only) and its local channel.

Both are built fresh for each pytest session under its tmp dir; only the stand-in's own venv is kept in
vendor/conda-offline/venv (gitignored), made by .ci/setup/30-conda.sh or, when missing, here (needs PyPI).
"""

from __future__ import annotations

import pytest
from conda_offline_checks import ENVS_RUN_HERE, REPO, Standin, build_channel, env_specs, install_standin, spec_name


@pytest.fixture(scope="session")
def standin(tmp_path_factory) -> Standin:
    """A conda base prefix whose bin/conda is the stand-in, with no channel yet."""
    return install_standin(tmp_path_factory.mktemp("conda-base"))


@pytest.fixture(scope="session")
def channel_standin(standin: Standin) -> Standin:
    """The stand-in with its local conda-forge: every package envs/train.yaml and envs/report.yaml name."""
    names = sorted({spec_name(spec) for env in ENVS_RUN_HERE for spec in env_specs(REPO / "envs" / env)})
    build_channel(standin, names)
    return standin

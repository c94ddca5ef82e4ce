"""Isolation is recognised from where the job's interpreter lives: an env Snakemake created (its
`<env>.env_setup_done` marker next to it) under any conda-prefix, e.g. the shared `conda-prefix` docs/slurm.md
recommends for clusters, not only under .snakemake/conda. A real interpreter in a custom prefix, not a mock."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ENV_HASH = "3f2a9c0d1e5b7a4c6d8e0f1a2b3c4d5e"  # the shape of Snakemake's env directory names


def isolation_seen_by(python: Path) -> dict:
    out = subprocess.run([str(python), "-c", "import json; from amprepro.env.environment import isolation; "
                          "print(json.dumps(isolation()))"], env={"PYTHONPATH": str(REPO / "workflow")},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def custom_prefix_env(tmp_path_factory) -> Path:
    """An env at <custom conda-prefix>/<hash>, with the marker Snakemake writes once it has created an env."""
    env = tmp_path_factory.mktemp("shared") / "conda-envs" / ENV_HASH
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=120)
    return env


def test_an_env_snakemake_made_under_a_custom_prefix_is_isolated(custom_prefix_env):
    marker = custom_prefix_env.with_name(ENV_HASH + ".env_setup_done")
    marker.touch()
    try:
        record = isolation_seen_by(custom_prefix_env / "bin" / "python")
    finally:
        marker.unlink()
    assert record["isolated"] is True and record["mode"] == "conda", record
    assert Path(record["prefix"]) == custom_prefix_env.resolve()


def test_the_same_env_without_snakemake_marker_and_the_launching_venv_are_not_isolated(custom_prefix_env):
    for python in (custom_prefix_env / "bin" / "python", Path(sys.executable)):
        record = isolation_seen_by(python)
        assert record["isolated"] is False and record["message"].startswith("NOT ISOLATED"), (python, record)

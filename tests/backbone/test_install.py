"""The package is installable: pyproject.toml builds it (setuptools, package-dir workflow/), and once `make` has run
`pip install -e .` the venv's python imports amprepro from any directory, with no PYTHONPATH."""

import os
import subprocess
import sys
import tomllib

import pytest

from workflow_testing import REPO


def test_pyproject_finds_the_package_under_workflow():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["build-system"]["build-backend"] == "setuptools.build_meta"
    assert project["tool"]["setuptools"]["package-dir"] == {"": "workflow"}
    assert project["tool"]["setuptools"]["packages"]["find"]["where"] == ["workflow"]
    pinned = {line.split("==")[0].lower() for line in (REPO / "requirements.txt").read_text().splitlines()
              if line and not line.startswith("#")}
    assert {name.lower() for name in project["project"]["dependencies"]} == pinned


def test_the_installed_package_imports_from_any_directory(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = "import amprepro.config, amprepro.env.apexbuild.verify; print(amprepro.__file__)"
    result = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, env=env,
                            timeout=120)
    if "No module named 'amprepro'" in result.stderr:
        pytest.skip(f"amprepro is not installed in {sys.prefix} (make installs it: pip install -e .)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("amprepro/__init__.py")

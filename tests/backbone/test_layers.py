"""The package's layers (pyproject.toml's import-linter contracts, docs/layout.md): no module imports from a layer above
its own, lazy imports included, and no two modules or packages of one parent import each other in a cycle."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """lint-imports (pinned in requirements-dev.txt) over root/workflow/amprepro: pyproject.toml's contracts."""
    lint = Path(sys.executable).parent / "lint-imports"
    return subprocess.run([str(lint), "--no-cache"], cwd=root, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(root / "workflow")})


def test_the_package_keeps_its_layers_and_has_no_cycle():
    result = lint_imports(REPO)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "Contracts: 2 kept, 0 broken." in result.stdout


@pytest.fixture
def package_copy(tmp_path):
    shutil.copytree(REPO / "workflow" / "amprepro", tmp_path / "workflow" / "amprepro",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def add_lazy_import(module: Path, statement: str) -> None:
    with open(module, "a") as handle:
        handle.write(f"\n\ndef _added():\n    {statement}\n")


def test_a_lazy_upward_import_breaks_the_layers(package_copy):
    add_lazy_import(package_copy / "workflow/amprepro/analysis/summary.py", "from amprepro.report import reporthtml")
    result = lint_imports(package_copy)
    assert result.returncode != 0
    assert "amprepro.analysis.summary -> amprepro.report.reporthtml" in result.stdout, result.stdout[-4000:]
    # report imports analysis, so the upward import is a cycle between the two packages as well
    assert "- .analysis -> .report (1 import)" in result.stdout
    assert "Contracts: 0 kept, 2 broken." in result.stdout


def test_a_cycle_inside_one_layer_breaks_the_acyclic_contract(package_copy):
    add_lazy_import(package_copy / "workflow/amprepro/analysis/paired.py", "from amprepro.analysis import fp8")
    result = lint_imports(package_copy)
    assert result.returncode != 0
    assert "No cycles are allowed in amprepro.analysis." in result.stdout, result.stdout[-4000:]
    assert "- .paired -> .fp8 (1 import)" in result.stdout
    assert "Contracts: 1 kept, 1 broken." in result.stdout

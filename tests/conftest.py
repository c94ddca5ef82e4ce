"""Fixtures shared by every test folder; the helpers themselves live in workflow_testing.py (importable by name)."""

from pathlib import Path

import pytest

from workflow_testing import copy_workflow


@pytest.fixture
def workflow_copy(tmp_path: Path) -> Path:
    return copy_workflow(tmp_path / "amprepro")

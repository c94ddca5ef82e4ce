"""Session fixtures for the report tests: each fixture results tree rendered once (papermill + nbconvert)."""

from __future__ import annotations

from pathlib import Path

import pytest
from report_helpers import GPU, LLM7B, REFERENCE_FAIL, SMOKE, render_fixture


@pytest.fixture(scope="session")
def smoke_html(tmp_path_factory) -> Path:
    return render_fixture(SMOKE, tmp_path_factory.mktemp("smoke_report"), title="smoke fixture")


@pytest.fixture(scope="session")
def gpu_html(tmp_path_factory) -> Path:
    return render_fixture(GPU, tmp_path_factory.mktemp("gpu_report"), REFERENCE_FAIL, title="GPU-like fixture")


@pytest.fixture(scope="session")
def llm7b_html(tmp_path_factory) -> Path:
    return render_fixture(LLM7B, tmp_path_factory.mktemp("llm7b_report"), title="7B fixture")

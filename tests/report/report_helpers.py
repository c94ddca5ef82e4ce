"""Helpers for the report tests: fixture paths, rendering a fixture into HTML, a throwaway workflow copy.

A module of its own (not conftest.py) so that `from conftest import ...` in tests/backbone keeps meaning
tests/conftest.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from workflow_testing import copy_workflow

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
SMOKE = FIXTURES / "smoke"
GPU = FIXTURES / "gpu"
LLM7B = FIXTURES / "llm7b"
REFERENCE_PASS = FIXTURES / "reference_pass"
REFERENCE_FAIL = FIXTURES / "reference_fail"
CLAIMS = REPO / "config" / "claims.yaml"


def render_fixture(results: Path, out: Path, reference_dir: Path | None = None, title: str = "fixture report",
                   workers: int = 1) -> Path:
    """Run the real render step (papermill + nbconvert) on a fixture results tree; return report.html. workers: the
    processes drawing its figures (the report rule passes its threads)."""
    out.mkdir(parents=True, exist_ok=True)
    params = {"title": title, "summary": results / "summary/summary.json", "table": results / "summary/summary.csv",
              "environment": results / "environment/environment.json", "sanity": results / "sanity/sanity.json",
              "apex": results / "apex/apex.json", "runs_dir": results / "runs", "claims": CLAIMS,
              "reference_dir": reference_dir or (REPO / "reference"), "workers": workers}
    command = [sys.executable, "-m", "amprepro.report.render", "--notebook", str(REPO / "notebooks/report.ipynb"),
               "--executed", str(out / "report.ipynb"), "--html", str(out / "report.html")]
    for name, value in params.items():
        command += ["--param", f"{name}={value}"]
    env = {**os.environ, "PYTHONPATH": str(REPO / "workflow")}
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out / "report.html"


def set_tree_time(root: Path, when: float) -> None:
    for path in [root, *root.rglob("*")]:
        os.utime(path, (when, when), follow_symlinks=False)


def workflow_with_results(dest: Path, results: Path, reference: Path | None) -> Path:
    """A workflow copy whose results/ is a fixture, dated after the code so Snakemake takes it as up to date."""
    copy_workflow(dest)
    now = time.time()
    set_tree_time(dest, now - 3600)
    shutil.copytree(results, dest / "results")
    for committed in (dest / "reference").iterdir():  # the test decides which references exist, not the repo
        if committed.is_dir():
            shutil.rmtree(committed)
    if reference is not None:
        for folder in reference.iterdir():
            shutil.copytree(folder, dest / "reference" / folder.name)
    set_tree_time(dest / "reference", now - 3600)
    set_tree_time(dest / "results", now - 1800)
    return dest

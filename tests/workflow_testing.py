"""Shared test helpers: a throwaway copy of the workflow, as a fresh checkout would have it, and Snakemake in it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WORKFLOW_PARTS = ["Snakefile", "Makefile", "workflow", "config", "envs", "notebooks", "profiles", "reference",
                  "requirements.txt", "requirements-dev.txt", "requirements-cuda13.0.txt"]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]


def copy_workflow(dest: Path) -> Path:
    """Copy what a clone holds (no results, no .snakemake) into dest."""
    dest.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for part in WORKFLOW_PARTS:
        source = REPO / part
        if source.is_dir():
            shutil.copytree(source, dest / part, ignore=ignore)
        elif source.exists():
            shutil.copy2(source, dest / part)
    return dest


def job_env() -> dict:
    """The rules call `python`: make it this interpreter, as `make run` does with the venv."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def snakemake(workdir: Path, *args: str, check: bool = True, timeout: int = 900) -> subprocess.CompletedProcess:
    result = subprocess.run([*SNAKEMAKE, *args], cwd=workdir, capture_output=True, text=True, timeout=timeout,
                            env=job_env())
    if check and result.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return result

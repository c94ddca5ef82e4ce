"""Which Python the jobs run: the `python` first on PATH (every rule calls `python -m amprepro...`), found before any
job.

Without --use-conda (or a container) that interpreter is the jobs' whole software environment. Snakemake itself may
run from another one (`.venv/bin/snakemake` from a shell where the venv is not active), and then the cells would run
in, and results/environment/environment.json would describe, a Python the user did not mean. The workflow says so
before any job (warning) and gives the environment rule the interpreter as a parameter, so a change of the jobs'
Python re-runs it (amprepro.analysis.summary stops on a record that still differs from the cells').
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

PROBE = ("import importlib.util, json, sys; "
         "print(json.dumps({'prefix': sys.prefix, 'version': '.'.join(map(str, sys.version_info[:3])), "
         "'torch': importlib.util.find_spec('torch') is not None}))")


def job_python(path: str | None = None) -> dict:
    """{'executable', 'prefix', 'version', 'torch'} of the `python` on PATH; executable None when there is none."""
    found = shutil.which("python", path=path if path is not None else os.environ.get("PATH", os.defpath))
    if found is None:
        return {"executable": None, "prefix": None, "version": None, "torch": False}
    try:
        out = subprocess.run([found, "-c", PROBE], capture_output=True, text=True, timeout=60)
        probed = json.loads(out.stdout) if out.returncode == 0 else {}
    except (OSError, subprocess.TimeoutExpired, ValueError):
        probed = {}
    return {"executable": found, "prefix": probed.get("prefix"), "version": probed.get("version"),
            "torch": bool(probed.get("torch"))}


def same_prefix(a: str | None, b: str | None) -> bool:
    return a is not None and b is not None and os.path.realpath(a) == os.path.realpath(b)


def warning(job: dict, snakemake_prefix: str = sys.prefix) -> str | None:
    """The warning for jobs whose `python` is not the one running Snakemake, with the fix; None when they agree."""
    fix = ("Fix: activate the venv first (`source .venv/bin/activate`, then `snakemake ...`), or start the pipeline "
           "with `make run`, which puts .venv/bin first on PATH.")
    if job["executable"] is None:
        return (f"WARNING: the jobs run `python`, and there is none on PATH; Snakemake runs from {snakemake_prefix}. "
                f"Every job would fail. {fix}")
    if same_prefix(job["prefix"], snakemake_prefix):
        return None
    torch = "has torch" if job["torch"] else "has no torch"
    return (f"WARNING: the jobs run `python`, which on this PATH is {job['executable']} (Python {job['version']}, "
            f"prefix {job['prefix']}, {torch}), not the Python running Snakemake ({snakemake_prefix}). The cells "
            f"would run there and results/environment/environment.json would describe it. {fix}")


def parameter(job: dict) -> str:
    """The environment rule's parameter: a different interpreter, a different value, so Snakemake re-runs the rule.
    The prefix, not the path of the executable: .venv/bin/python and .venv/bin/python3 are one interpreter."""
    prefix = os.path.realpath(job["prefix"]) if job["prefix"] else None
    return f"python with prefix {prefix} (Python {job['version']})"

"""Record the software environment: Python, platform, packages, torch build, and whether it is an isolated env."""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

from amprepro.files import write_json

VENV_STAMP = ".amprepro-installed"  # the Makefile's VENV_STAMP


def packages() -> dict[str, str]:
    found = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata.get("Name")
        if name:
            found[name] = dist.version
    return dict(sorted(found.items(), key=lambda kv: kv[0].lower()))


def torch_build() -> dict:
    try:
        import torch
    except ImportError as exc:
        return {"importable": False, "error": str(exc)}
    info = {
        "importable": True,
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "nccl": None,
        "debug": torch.version.debug,
        "git_version": getattr(torch.version, "git_version", None),
    }
    if torch.cuda.is_available():
        try:
            info["nccl"] = ".".join(str(v) for v in torch.cuda.nccl.version())
        except Exception as exc:  # NCCL absent from some builds
            info["nccl"] = f"unavailable: {exc}"
    return info


def snakemake_env_of(interpreter_prefix: str) -> str | None:
    """The Snakemake-created conda env this interpreter lives in, or None. Snakemake marks every env it has finished
    creating with `<env dir>.env_setup_done` next to it, under whatever conda-prefix it used (snakemake.deployment.
    conda.get_env_setup_done_flag_file): that marker, not the path, says who made the env."""
    env = Path(os.path.realpath(interpreter_prefix))
    return str(env) if env.with_name(env.name + ".env_setup_done").is_file() else None


def isolation() -> dict:
    """Whether this job runs inside a Snakemake-created conda env or in whatever environment launched it."""
    prefix = snakemake_env_of(sys.prefix)
    in_snakemake_env = prefix is not None
    if in_snakemake_env:
        return {"mode": "conda", "isolated": True, "prefix": prefix, "message": f"Isolated conda env {prefix}."}
    stamp = Path(sys.prefix, VENV_STAMP)
    return {
        "mode": "current",
        "isolated": False,
        "prefix": sys.prefix,
        # The Makefile's venv (`make run`): its stamp, written after every pinned requirement was installed, holds the
        # requirements' sha256. The report names that route as such instead of warning about an unpinned environment.
        "project_venv": stamp.is_file(),
        "venv_stamp": stamp.read_text().strip() if stamp.is_file() else None,
        "message": (
            "NOT ISOLATED: jobs ran in the current environment "
            f"({sys.prefix}), not in a pinned conda env. Versions below are whatever is installed there; "
            "run with `snakemake --use-conda` for the pinned envs."
        ),
    }


def conda_explicit() -> str | None:
    if not os.environ.get("CONDA_PREFIX") or shutil.which("conda") is None:
        return None
    try:
        out = subprocess.run(
            ["conda", "list", "--explicit", "--prefix", os.environ["CONDA_PREFIX"]],
            capture_output=True, text=True, timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"conda list --explicit failed: {exc}"
    return out.stdout if out.returncode == 0 else f"conda list --explicit failed: {out.stderr.strip()}"


def collect() -> dict:
    return {
        "python": {"version": platform.python_version(), "implementation": platform.python_implementation(),
                   "executable": sys.executable},
        "platform": {"system": platform.system(), "release": platform.release(), "machine": platform.machine(),
                     "node": platform.node(), "cpu_count": os.cpu_count()},
        "isolation": isolation(),
        "torch": torch_build(),
        "packages": packages(),
        "conda_explicit": conda_explicit(),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    record = collect()
    if not record["isolation"]["isolated"]:
        print("WARNING: " + record["isolation"]["message"], file=sys.stderr)
    write_json(args.out, record)
    print(f"environment: python {record['python']['version']}, torch {record['torch'].get('version')}, "
          f"{len(record['packages'])} packages, mode={record['isolation']['mode']}")


if __name__ == "__main__":
    main()

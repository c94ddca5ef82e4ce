"""Preflight for `snakemake --use-conda`: is there a conda, is it new enough, do the env files this run uses solve?

workflow/rules/conda_check.smk runs it while Snakemake parses the workflow, so each of these failures ends in one
message from amprepro that says what is wrong and how to fix it, before Snakemake's own traceback. Standalone:

    .venv/bin/python -m amprepro.env.condacheck envs/train.yaml envs/report.yaml

The solve check is a `conda create --dry-run --json` of the env file's dependencies. It is skipped for an env file that
has a pin file (<env>.<platform>.pin.txt, installed as is, without a solve) and for one already deployed under the
conda prefix (same content, setup finished), so it costs a solve only when Snakemake is about to solve anyway.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

try:
    from snakemake.deployment.conda import MIN_CONDA_VER as MIN_CONDA
except ImportError:  # run outside Snakemake's environment
    MIN_CONDA = "24.7.1"

SOLVE_TIMEOUT_S = 900
INSTALL_HINT = ("Install Miniforge (https://conda-forge.org/download/), which brings a current conda, and put its "
                "condabin/ on PATH; or run without --use-conda to use the current environment (the report then says "
                "NOT ISOLATED). See docs/conda.md.")


class CondaProblem(Exception):
    """Something that would make `snakemake --use-conda` fail; str() is the whole message for the user."""


def find_conda(path: str | None = None) -> str:
    conda = shutil.which("conda", path=path)
    if conda is None:
        raise CondaProblem(
            "amprepro: `snakemake --use-conda` needs the `conda` command, but there is no `conda` on PATH.\n"
            f"  Fix: {INSTALL_HINT}")
    return conda


def conda_version(conda: str) -> str:
    try:
        done = subprocess.run([conda, "--version"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CondaProblem(f"amprepro: `{conda} --version` failed ({exc}).\n  Fix: {INSTALL_HINT}") from exc
    versions = re.findall(r"\d+\.\d+\.\d+", done.stdout + done.stderr)
    if done.returncode != 0 or len(versions) != 1:
        raise CondaProblem(f"amprepro: cannot tell which conda {conda} is: `conda --version` exited "
                           f"{done.returncode} and printed {(done.stdout + done.stderr).strip()!r}.\n"
                           f"  Fix: {INSTALL_HINT}")
    return versions[0]


def check_version(conda: str, version: str, minimum: str = MIN_CONDA) -> None:
    if _numbers(version) < _numbers(minimum):
        raise CondaProblem(
            f"amprepro: conda {version} ({conda}) is too old: "
            f"Snakemake {_snakemake_version()} needs conda >= {minimum} "
            "for --use-conda.\n"
            "  Fix: update it with `conda update -n base -c conda-forge conda`, or install Miniforge "
            "(https://conda-forge.org/download/) and put its condabin/ first on PATH. See docs/conda.md.")


def conda_platform() -> str:
    system = {"Linux": "linux", "Darwin": "osx", "Windows": "win"}.get(platform.system(), platform.system().lower())
    machine = {"x86_64": "64", "AMD64": "64", "arm64": "arm64", "aarch64": "aarch64"}.get(platform.machine(), "64")
    return f"{system}-{machine}"


def pin_file(env_file: Path) -> Path | None:
    pin = env_file.with_suffix(f".{conda_platform()}.pin.txt")
    return pin if pin.exists() else None


def deployed(env_file: Path, conda_prefix: Path) -> bool:
    """Whether Snakemake already built an env from exactly this file under conda_prefix (its copy + done flag)."""
    content = env_file.read_bytes()
    for copy in conda_prefix.glob("*.yaml"):
        stem = copy.name[: -len(".yaml")]
        if (conda_prefix / f"{stem}.env_setup_done").exists() and copy.read_bytes() == content:
            return True
    return False


def solve_command(conda: str, env_file: Path) -> list[str]:
    env = yaml.safe_load(env_file.read_text()) or {}
    specs = env.get("dependencies") or []
    if any(not isinstance(spec, str) for spec in specs):
        raise CondaProblem(f"amprepro: {env_file} has a `pip:` section. Pin files cannot carry pip packages, so "
                           "amprepro's env files must not have one.\n  Fix: take the package from conda-forge instead.")
    channels = [c for c in env.get("channels") or [] if c != "nodefaults"]
    command = [conda, "create", "--dry-run", "--json", "--name", "amprepro-solve-check"]
    if channels:
        command.append("--override-channels")
        for channel in channels:
            command += ["--channel", channel]
    return command + specs


def check_solvable(conda: str, env_file: Path) -> None:
    command = solve_command(conda, env_file)
    shown = _shown(env_file)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=SOLVE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        print(f"amprepro: warning: solving {shown} took over {SOLVE_TIMEOUT_S} s; not checked", file=sys.stderr)
        return
    result = _last_json(done.stdout)
    if done.returncode == 0 and result.get("success", True):
        return
    name = result.get("exception_name") or f"exit status {done.returncode}"
    detail = (result.get("message") or result.get("error") or done.stderr or done.stdout).strip()
    detail = "\n".join("    " + line for line in detail.splitlines()[:25])
    raise CondaProblem(
        f"amprepro: the pinned conda env {shown} cannot be solved ({name}); `snakemake --use-conda` would fail "
        f"creating it.\n  conda said:\n{detail}\n"
        f"  Fix: in {shown}, pin versions that exist on its channels ({', '.join(_channels(env_file)) or 'default'}; "
        f"`conda search -c conda-forge <package>` lists them), then regenerate its pin file with "
        f"`snakedeploy pin-conda-envs --conda-frontend conda {shown}` (see docs/conda.md).\n"
        f"  Checked with: {' '.join(command)}")


def preflight(env_files: list[Path], conda_prefix: Path, solve: bool = True, path: str | None = None) -> list[str]:
    """Raise CondaProblem for the first problem; return notes on what was checked."""
    conda = find_conda(path)
    version = conda_version(conda)
    check_version(conda, version)
    notes = [f"conda {version} at {conda}"]
    for env_file in env_files:
        if not solve:
            break
        if (pin := pin_file(env_file)) is not None:
            notes.append(f"{_shown(env_file)}: pin file {pin.name} (installed as is, no solve to check)")
        elif conda_prefix.is_dir() and deployed(env_file, conda_prefix):
            notes.append(f"{_shown(env_file)}: already deployed in {conda_prefix}")
        else:
            check_solvable(conda, env_file)
            notes.append(f"{_shown(env_file)}: solves")
    return notes


def _numbers(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def _snakemake_version() -> str:
    try:
        from snakemake import __version__
    except ImportError:
        return "9"
    return __version__


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _channels(env_file: Path) -> list[str]:
    env = yaml.safe_load(env_file.read_text()) or {}
    return [c for c in env.get("channels") or [] if c != "nodefaults"]


def _last_json(text: str) -> dict:
    """conda --json prints one JSON document; tolerate noise before it."""
    start = text.find("{")
    while start != -1:
        try:
            found = json.loads(text[start:])
            return found if isinstance(found, dict) else {}
        except json.JSONDecodeError:
            start = text.find("{", start + 1)
    return {}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("env_files", nargs="*", type=Path)
    parser.add_argument("--conda-prefix", type=Path, default=Path(".snakemake/conda"))
    parser.add_argument("--no-solve", action="store_true", help="check only that conda is there and new enough")
    args = parser.parse_args(argv)
    try:
        notes = preflight(args.env_files, args.conda_prefix, solve=not args.no_solve)
    except CondaProblem as problem:
        print(problem, file=sys.stderr)
        sys.exit(1)
    print("\n".join(f"ok: {note}" for note in notes))


if __name__ == "__main__":
    main()

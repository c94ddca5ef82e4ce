"""Shared test helpers: a throwaway copy of the workflow, as a fresh checkout would have it, and Snakemake in it."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
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


# A python whose start imports HOLD_SOURCE (as a sitecustomize.py on its PYTHONPATH, or from a .pth in its venv) and
# whose environment holds hold_env(argument, held) stops at its start when `argument` is one of its argv's elements:
# it writes its pid into `held` and waits for a signal. A test that must kill or interrupt a short step waits for
# that file instead of racing the step (a second's pip or summary had ended before the signal on a busy CI machine).
# Without AMPREPRO_TEST_HOLD in the environment it does nothing.
HOLD_SOURCE = """\
import os
if os.environ.get("AMPREPRO_TEST_HOLD"):
    import signal
    from pathlib import Path
    if os.environ["AMPREPRO_TEST_HOLD"].encode() in Path("/proc/self/cmdline").read_bytes().split(b"\\0"):
        Path(os.environ["AMPREPRO_TEST_HELD"]).write_text(str(os.getpid()))
        while True:
            signal.pause()
"""


def hold_env(argument: str, held: Path) -> dict:
    """The environment that makes HOLD_SOURCE stop a python whose argv holds `argument` (see above)."""
    return {"AMPREPRO_TEST_HOLD": argument, "AMPREPRO_TEST_HELD": str(held)}


# Snakemake takes 3 s of a 2-core machine to import and a refused config or a dry run 0.3 s more: the tests run it
# dozens of times. So snakemake() runs the real `python -m snakemake` command line in a process forked from one that
# imported snakemake.cli once (a multiprocessing fork server, one per test process): the same code, arguments,
# working directory and environment as a fresh interpreter, without the import. The workflow's own package is not
# imported there, so every run imports amprepro from its own workflow copy, as a fresh `snakemake` would.
_FORKS = None
# CPU seconds of the forked runs and everything they waited for (their jobs): the fork server's children are not this
# process's, so tests/conftest.py's CPU accounting adds this.
FORKED_CPU_SECONDS = 0.0


def _forks():
    global _FORKS
    if _FORKS is None:
        _FORKS = multiprocessing.get_context("forkserver")
        _FORKS.set_forkserver_preload(["snakemake.cli"])
    return _FORKS


def _snakemake_main(args: list[str], cwd: str, env: dict, stdout: str, stderr: str, cpu: str) -> None:
    """In the forked process: what `python -m snakemake ARGS` does, its output into two files."""
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for fd, path in ((1, stdout), (2, stderr)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 (the process's own streams, new objects after the fork)
    sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
    sys.argv = ["snakemake", *args]  # runpy puts snakemake/__main__.py in sys.argv[0], as `python -m` does
    import runpy

    from snakemake.workflow import Workflow

    Workflow._rundir = str(Path.cwd().absolute())  # what a fresh import computes (it logs it as "Run directory")

    try:
        runpy.run_module("snakemake", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if not isinstance(stop.code, (int, type(None))):
            print(stop.code, file=sys.stderr)
    import logging

    logging.shutdown()  # what the interpreter's exit does for Snakemake's log handlers (a forked child skips it)
    sys.stdout.flush()
    sys.stderr.flush()
    import resource

    used = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    Path(cpu).write_text(str(sum(u.ru_utime + u.ru_stime for u in used)))
    os._exit(code)


def run_snakemake(workdir: Path, args: list[str], timeout: float,
                  env: dict | None = None) -> subprocess.CompletedProcess:
    """`python -m snakemake ARGS` in WORKDIR (forked, see above): a CompletedProcess, or subprocess.TimeoutExpired."""
    global FORKED_CPU_SECONDS
    with tempfile.TemporaryDirectory(prefix="snakemake-out-") as out:
        stdout, stderr, cpu = f"{out}/stdout", f"{out}/stderr", f"{out}/cpu"
        process = _forks().Process(target=_snakemake_main,
                                   args=(list(args), str(workdir), env or job_env(), stdout, stderr, cpu))
        process.start()
        process.join(timeout)
        if Path(cpu).exists():
            FORKED_CPU_SECONDS += float(Path(cpu).read_text())
        if process.exitcode is None:
            process.kill()
            process.join()
            raise subprocess.TimeoutExpired([*SNAKEMAKE, *args], timeout)
        read = lambda path: Path(path).read_text(errors="replace") if Path(path).exists() else ""  # noqa: E731
        # exitcode: negative for a signal, as subprocess's returncode
        return subprocess.CompletedProcess([*SNAKEMAKE, *args], process.exitcode, read(stdout), read(stderr))


def snakemake(workdir: Path, *args: str, check: bool = True, timeout: int = 900) -> subprocess.CompletedProcess:
    result = run_snakemake(workdir, list(args), timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return result

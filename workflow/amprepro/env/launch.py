"""Start Snakemake the way `make run` and `make verify` do: on the whole machine, and past the debris of a killed run.

    .venv/bin/python -m amprepro.env.launch [TARGET...]

Settings come from the environment (the Makefile exports them): CORES (default: every core this process may use),
SNAKEMAKE_ARGS (split like a shell would split it, but never run through one) and AMPREPRO_GPU_COUNT (GPUs to share
out; default: what `nvidia-smi -L` lists, as amprepro.gpuslots does). With the GPUs it sets `gpu_share`, the
cells that share a GPU (amprepro.plan.resources.shares_gpu): CELLS_PER_SHARED_GPU per GPU (amprepro.env.launchargs
builds the command line).

A run killed with SIGKILL, or cut by a power loss, leaves Snakemake's lock and its incomplete markers behind, and the
next plain `snakemake` stops with LockException or IncompleteFilesException. The launcher removes the lock only once
it has shown that nothing of that run is alive (amprepro.env.runlock: its own flock for the whole run, and /proc).
A live run is never touched: the launcher names it and exits with ANOTHER_RUN_ACTIVE. Incomplete outputs are re-run
(--rerun-incomplete); finished ones are kept.

For the run it also starts amprepro.plan.cellserver, which forks each one-process cell from a Python that imported
torch once, unless the jobs run in another Python or elsewhere (--use-conda, an executor, a profile), no job runs
at all (a dry run, --version), the target is `make verify`'s gate or AMPREPRO_FRESH_CELLS=1 asks for fresh
interpreters. It stops the server when Snakemake ends.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading

from amprepro.env.launchargs import (
    STAGE_ENV,
    SettingError,
    check_config_files,
    check_config_values,
    jobs_see_our_gpus,
    serves_cells,
    snakemake_command,
    stages_cells,
    user_args,
    workdir_of,
)
from amprepro.env.runlock import RunLock, another_run_message, pipeline_processes, recover
from amprepro.gpuslots import LISTING_ENV, list_gpus, listing_for_jobs
from amprepro.plan import cellserver

ANOTHER_RUN_ACTIVE = 75  # EX_TEMPFAIL: try again when the other run has ended
BAD_SETTING = 2


def say(line: str) -> None:
    print(f"amprepro: {line}", file=sys.stderr, flush=True)


INTERRUPTED = 128 + signal.SIGINT  # what a shell reports for a command ended by Ctrl-C


FORWARD_GRACE = 2.0  # seconds for Snakemake's last lines once it has ended


def forward(stream, interrupted: list, out=None) -> None:
    """Snakemake's stderr, line by line, to ours until Ctrl-C; after it, nothing: what Snakemake says then is a
    KeyboardInterrupt traceback and an "Error in rule" block for each job it stopped, none of it news to the person
    who pressed the keys. The launcher's one line says what happened instead."""
    out = out or sys.stderr.buffer
    for line in iter(stream.readline, b""):
        if not interrupted:
            out.write(line)
            out.flush()
    stream.close()


def run_snakemake(command: list[str], lock: RunLock, env: dict) -> int:
    # same process group: Ctrl-C reaches Snakemake and its jobs, which stop cleanly; its stderr comes through forward()
    child = subprocess.Popen(command, env=env, stderr=subprocess.PIPE)
    lock.record(os.getpid(), child.pid)
    interrupted = []  # Ctrl-C: Snakemake got it too (same process group); the launcher notes it and goes quiet
    previous = {signal.SIGINT: signal.signal(signal.SIGINT, lambda signum, frame: interrupted.append(signum)),
                signal.SIGTERM: signal.signal(signal.SIGTERM, lambda signum, frame: child.send_signal(signum))}
    forwarder = threading.Thread(target=forward, args=(child.stderr, interrupted), daemon=True)
    forwarder.start()
    try:
        code = child.wait()  # a handled signal does not end the wait (PEP 475)
        # What Snakemake wrote last, but no waiting for the end of the pipe: a job that outlives a killed Snakemake
        # holds it open (its shell's stderr), as long as it runs.
        forwarder.join(timeout=FORWARD_GRACE)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if interrupted and code != 0:
        # Finished outputs are kept; the stopped jobs' outputs are re-run.
        say("interrupted; `make run` continues where it stopped (finished cells are kept)")
        return INTERRUPTED
    return 128 - code if code < 0 else code  # killed by signal N: 128 + N, as a shell reports it


def with_gpu_listing(env: dict, extra: list[str]) -> dict:
    """The environment for Snakemake and its jobs. Where they run on this host and see its GPUs as this process does,
    it holds the run's one `nvidia-smi -L` (amprepro.gpuslots.LISTING_ENV: the GPU resource, the DAG build, each GPU
    job's slot and GPU check read it); elsewhere (an executor, a profile, a container) no listing, not even one
    inherited, so each job lists its own GPUs."""
    env = {name: value for name, value in env.items() if name != LISTING_ENV}
    if jobs_see_our_gpus(extra):
        env[LISTING_ENV] = listing_for_jobs(list_gpus())
    return env


def main(argv: list[str] | None = None, env: dict | None = None) -> int:
    env = dict(os.environ) if env is None else env
    targets = sys.argv[1:] if argv is None else argv
    try:
        extra = user_args(env)
        env = with_gpu_listing(env, extra)
        env[STAGE_ENV] = "1" if stages_cells(env, extra) else "0"  # for the Snakefile: --defer for the timed cells
        command, what = snakemake_command(targets, env)
        check_config_values(extra)
        check_config_files(extra)
        workdir = workdir_of(env)
    except SettingError as exc:
        say(str(exc))
        return BAD_SETTING
    lock = RunLock(workdir)
    if not lock.acquire():
        say(another_run_message(workdir, pipeline_processes(workdir) or lock.holders()))
        return ANOTHER_RUN_ACTIVE
    try:
        if active := pipeline_processes(workdir):
            say(another_run_message(workdir, active))
            return ANOTHER_RUN_ACTIVE
        if recovered := recover(workdir):
            say(recovered)
        say(f"{what}: snakemake {shlex.join(command[3:])}")
        server = cellserver.start(env, str(workdir)) if serves_cells(extra, targets) else None
        try:
            return run_snakemake(command, lock, {**env, cellserver.ENV: server[1]} if server else env)
        finally:
            if server:
                cellserver.stop(*server)
    finally:
        lock.release()


if __name__ == "__main__":
    sys.exit(main())

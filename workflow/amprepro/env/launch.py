"""Start Snakemake the way `make run` and `make verify` do: on the whole machine, and past the debris of a killed run.

    .venv/bin/python -m amprepro.env.launch [TARGET...]

Settings come from the environment (the Makefile exports them): CORES (default: every core this process may use),
SNAKEMAKE_ARGS (split like a shell would split it, but never run through one) and AMPREPRO_GPU_COUNT (GPUs to share
out; default: what `nvidia-smi -L` lists, as amprepro.gpuslots does). With the GPUs it sets `gpu_share`, the
cells that share a GPU (amprepro.plan.resources.shares_gpu): CELLS_PER_SHARED_GPU per GPU.

A run killed with SIGKILL, or cut by a power loss, leaves Snakemake's lock and its incomplete markers behind, and the
next plain `snakemake` stops with LockException or IncompleteFilesException. The launcher removes the lock only once
it has shown that nothing of that run is alive: it holds an flock on .snakemake/amprepro-run.lock for the whole run
(the kernel drops it when the launcher dies), and it looks in /proc for any snakemake or amprepro job process whose
working directory is this one (jobs can outlive a killed Snakemake). A live run is never touched: the launcher names
it and exits with ANOTHER_RUN_ACTIVE. Incomplete outputs are re-run (--rerun-incomplete); finished ones are kept.

For the run it also starts amprepro.plan.cellserver, which forks each one-process cell from a Python that imported
torch once, unless the jobs run in another Python or elsewhere (--use-conda, an executor, a profile), no job runs
at all (a dry run, --version) or AMPREPRO_FRESH_CELLS=1 asks for fresh interpreters. It stops the server when
Snakemake ends.
"""

from __future__ import annotations

import fcntl
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from amprepro.gpuslots import gpu_count
from amprepro.plan import cellserver
from amprepro.plan.resources import CELLS_PER_SHARED_GPU

ANOTHER_RUN_ACTIVE = 75  # EX_TEMPFAIL: try again when the other run has ended
BAD_SETTING = 2
RUN_LOCK = "amprepro-run.lock"
CORES_PATTERN = re.compile(r"all|[1-9][0-9]*")
COUNT_PATTERN = re.compile(r"[0-9]+")
CORES_OPTIONS = ("--cores", "-c", "--jobs", "-j")
RESOURCES_OPTIONS = ("--resources", "--res")
PROFILE_OPTIONS = ("--profile", "--workflow-profile")
DIRECTORY_OPTIONS = ("--directory", "-d")
# Jobs that would not run here in the launcher's Python: the cell server would only refuse them, one by one.
NOT_LOCAL_PYTHON_OPTIONS = ("--use-conda", "--sdm", "--software-deployment-method", "--executor", "-e",
                            "--use-singularity", "--use-apptainer", *PROFILE_OPTIONS)
# Runs in which no job runs at all: a server would import torch and the model libraries for nothing (on 2 CPU cores,
# more CPU than the dry run itself).
NO_JOB_OPTIONS = ("-n", "--dry-run", "--dryrun", "--version", "-v")
# `python -m snakemake ...`, a job's `bash -c "... python -m amprepro.train.train ..."`, torchrun's workers, the
# launcher.
PIPELINE_MODULE = re.compile(r"(?:^|\s)-m\s+(?:snakemake|amprepro(?:\.\w+)+)(?:\s|$)")


class SettingError(ValueError):
    """A setting is malformed; the message names it and the fix."""


@dataclass(frozen=True)
class Process:
    pid: int
    command: str

    def __str__(self) -> str:
        shown = self.command if len(self.command) <= 150 else self.command[:150] + "…"
        return f"pid {self.pid} ({shown})"


# ---- the command line ------------------------------------------------------------------------------------------


def user_args(env: dict) -> list[str]:
    try:
        return shlex.split(env.get("SNAKEMAKE_ARGS", ""))
    except ValueError as exc:
        raise SettingError(f"SNAKEMAKE_ARGS cannot be split into arguments ({exc}); quote values as in a shell, "
                           "e.g. SNAKEMAKE_ARGS=\"--config 'preset=smoke'\"") from None


def check_config_files(extra: list[str]) -> None:
    """Read every --configfile in SNAKEMAKE_ARGS as amprepro does, before Snakemake does: Snakemake gives no line for
    a YAML error and evaluates a file that sets __use_yte__ as a template that runs Python."""
    from amprepro.config import ConfigError, read_config_file

    index = option_index(extra, ("--configfile", "--configfiles"))
    if index is None:
        return
    inline = extra[index].partition("=")[2]
    for path in [inline] if inline else extra[index + 1:]:
        if path.startswith("-"):
            break
        try:
            read_config_file(path)
        except ConfigError as exc:
            raise SettingError(f"SNAKEMAKE_ARGS --configfile: {exc}") from None


CONFIG_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def option_values(args: list[str], names: tuple[str, ...]) -> list[str]:
    """The words an option takes: `--config a=1 b=2` or `--config=a=1`, up to the next word that starts with '-'."""
    index = option_index(args, names)
    if index is None:
        return []
    inline = args[index].partition("=")[2] if args[index].startswith("--") and "=" in args[index] else ""
    if inline:
        return [inline]
    values = []
    for arg in args[index + 1:]:
        if arg.startswith("-"):
            break
        values.append(arg)
    return values


def nested_form(key: str, value: str) -> str:
    """`runs.seeds=0` as the form Snakemake reads: `runs={seeds: 0}` (a YAML mapping per dot)."""
    top, *inner = key.split(".")
    for name in reversed(inner):
        value = f"{{{name}: {value}}}"
    return f"{top}={value}"


def check_config_values(extra: list[str]) -> None:
    """Snakemake's --config takes NAME=VALUE with a top-level NAME; `runs.seeds=abc`, the dotted form people try
    first, ends in a traceback from Snakemake's parser with no hint. Refused here, with the form that works."""
    for word in option_values(extra, ("--config", "-C")):
        key, equals, value = word.partition("=")
        if not equals:
            raise SettingError(f"SNAKEMAKE_ARGS --config {word!r}: a config value is NAME=VALUE, e.g. "
                               "--config preset=smoke")
        if not CONFIG_KEY.fullmatch(key):
            dotted = all(CONFIG_KEY.fullmatch(part) for part in key.split("."))
            form = shlex.quote(nested_form(key, value)) if dotted else "'runs={seeds: [0, 1]}'"
            raise SettingError(f"SNAKEMAKE_ARGS --config {word!r}: Snakemake's --config sets top-level keys only "
                               f"({key!r} is not one). Write a nested value as YAML: --config {form} "
                               "(or put it in a file given with --configfile; docs/config.md)")


def cores_setting(env: dict) -> tuple[str, str]:
    """(value for --cores, where it came from)."""
    cores = env.get("CORES", "").strip()
    if not cores:
        return str(len(os.sched_getaffinity(0))), "all usable"
    if not CORES_PATTERN.fullmatch(cores):
        raise SettingError(f"CORES={cores!r} is not a whole number above 0 or 'all'; e.g. make run CORES=8, "
                           "or leave it out to use every core")
    return cores, "CORES"


def gpus_to_share(env: dict) -> tuple[int, str]:
    """(GPU count, where it came from)."""
    wanted = env.get("AMPREPRO_GPU_COUNT", "").strip()
    if wanted:
        if not COUNT_PATTERN.fullmatch(wanted):
            raise SettingError(f"AMPREPRO_GPU_COUNT={wanted!r} is not a whole number; set it to the number of GPUs "
                               "the pipeline may use, or unset it to use every GPU nvidia-smi lists")
        return int(wanted), "AMPREPRO_GPU_COUNT"
    return gpu_count(), "nvidia-smi -L"


def option_index(args: list[str], names: tuple[str, ...]) -> int | None:
    for index, arg in enumerate(args):
        if arg in names or arg.startswith(tuple(f"{name}=" for name in names if name.startswith("--"))):
            return index
    return None


def resource_values(args: list[str], index: int) -> list[str]:
    """The NAME=VALUE words that follow --resources at args[index]."""
    values = []
    for arg in args[index + 1:]:
        if arg.startswith("-") or "=" not in arg:
            break
        values.append(arg)
    return values


def user_resource(extra: list[str], name: str) -> str | None:
    """The value SNAKEMAKE_ARGS' --resources gives `name`, or None."""
    index = option_index(extra, RESOURCES_OPTIONS)
    values = resource_values(extra, index) if index is not None else []
    return next((value.partition("=")[2] for value in values if value.startswith(f"{name}=")), None)


def user_sets_gpu(extra: list[str]) -> bool:
    return user_resource(extra, "gpu") is not None


def with_resources(extra: list[str], added: list[str]) -> tuple[list[str], list[str]]:
    """(arguments to add, user arguments) so that the NAME=VALUE words `added` are among the resources. Snakemake
    keeps only the last --resources, so a user's own --resources (mem_mb=...) gets them added rather than a second
    --resources."""
    if any(arg.startswith(("--resources=", "--res=")) for arg in extra):
        raise SettingError("SNAKEMAKE_ARGS: write --resources NAME=VALUE ... with a space, not --resources=...")
    if not added:
        return [], extra
    index = option_index(extra, RESOURCES_OPTIONS)
    if index is None:
        return ["--resources", *added], extra
    return [], [*extra[:index + 1], *added, *extra[index + 1:]]


def with_gpu_resource(extra: list[str], gpus: int) -> tuple[list[str], list[str]]:
    """with_resources for gpu=<gpus> and, unless the user sets it, gpu_share: CELLS_PER_SHARED_GPU per GPU (a timed
    job takes a GPU's worth, a cell that shares a GPU one: amprepro.plan.resources.shares_gpu)."""
    share = [] if user_resource(extra, "gpu_share") is not None else [f"gpu_share={CELLS_PER_SHARED_GPU * gpus}"]
    return with_resources(extra, [f"gpu={gpus}", *share])


def gpu_share_for_users_gpus(extra: list[str]) -> tuple[list[str], list[str]]:
    """The user sets gpu=M: gpu_share follows M (unless set too), so that the cells that share a GPU are counted."""
    gpus = user_resource(extra, "gpu")
    if user_resource(extra, "gpu_share") is not None or not COUNT_PATTERN.fullmatch(gpus or ""):
        return with_resources(extra, [])  # Snakemake itself refuses a gpu that is not a number
    return with_resources(extra, [f"gpu_share={CELLS_PER_SHARED_GPU * int(gpus)}"])


def snakemake_command(targets: list[str], env: dict) -> tuple[list[str], str]:
    """The Snakemake command line and one line saying what it uses. Raises SettingError before anything runs."""
    extra = user_args(env)
    command = [sys.executable, "-m", "snakemake", *targets]
    if option_index(extra, PROFILE_OPTIONS) is not None:
        return [*command, "--rerun-incomplete", *extra], "cores and resources as the profile in SNAKEMAKE_ARGS sets"
    said = []
    if option_index(extra, CORES_OPTIONS) is None:
        cores, source = cores_setting(env)
        command += ["--cores", cores]
        said.append(f"{cores} cores ({source})")
    else:
        said.append("cores as SNAKEMAKE_ARGS sets")
    if user_sets_gpu(extra):
        added, extra = gpu_share_for_users_gpus(extra)
        command += added
        said.append("GPUs as SNAKEMAKE_ARGS sets")
    elif (found := gpus_to_share(env))[0]:
        added, extra = with_gpu_resource(extra, found[0])
        command += added
        said.append(f"{found[0]} GPU(s) ({found[1]})")
    else:
        said.append(f"no GPU (none listed by {found[1]})")
    return [*command, "--rerun-incomplete", *extra], ", ".join(said)


def serves_cells(extra: list[str]) -> bool:
    """Whether the cells run here, in this Python: only then does a cell server (amprepro.plan.cellserver) help."""
    return option_index(extra, NOT_LOCAL_PYTHON_OPTIONS) is None and option_index(extra, NO_JOB_OPTIONS) is None


def workdir_of(env: dict) -> Path:
    extra = user_args(env)
    index = option_index(extra, DIRECTORY_OPTIONS)
    if index is None:
        return Path.cwd()
    value = extra[index].partition("=")[2] if "=" in extra[index] else (extra[index + 1:] or [""])[0]
    return Path(value).resolve()


# ---- is a run alive in this directory? -------------------------------------------------------------------------


def command_of(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def is_pipeline_command(argv: list[str]) -> bool:
    """Snakemake itself (`snakemake ...`, `python .../snakemake ...`, `python -m snakemake`) or an amprepro job."""
    if any(Path(arg).name == "snakemake" for arg in argv[:2]):
        return True
    return bool(PIPELINE_MODULE.search(" ".join(argv)))


def parent_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rpartition(")")[2].split()[1])  # the name in (...) may hold spaces


def self_and_ancestors() -> set[int]:
    found, pid = set(), os.getpid()
    while pid and pid not in found:
        found.add(pid)
        pid = parent_of(pid)
    return found


def runs_in(pid: int, workdir: Path) -> bool:
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:  # gone, a zombie, or another user's
        return False
    root = str(workdir)
    return cwd == root or cwd.startswith(root + os.sep)


def pipeline_processes(workdir: Path) -> list[Process]:
    """Live snakemake / amprepro processes working in workdir, other than this one and the ones that started it."""
    workdir, mine = workdir.resolve(), self_and_ancestors()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in mine:
            continue
        pid = int(entry.name)
        argv = command_of(pid)
        if argv and is_pipeline_command(argv) and runs_in(pid, workdir):
            found.append(Process(pid, " ".join(argv)))
    return sorted(found, key=lambda process: process.pid)


class RunLock:
    """An flock held for the whole run. The kernel releases it when the holder dies, however it dies."""

    def __init__(self, workdir: Path):
        self.path = workdir / ".snakemake" / RUN_LOCK
        self.fd: int | None = None

    def acquire(self) -> bool:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self.fd = fd
        self.record(os.getpid())
        return True

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the file drops the flock
            self.fd = None

    def record(self, *pids: int) -> None:
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, "".join(f"{pid}\n" for pid in pids).encode(), 0)

    def holders(self) -> list[Process]:
        try:
            pids = [int(word) for word in self.path.read_text().split()]
        except (OSError, ValueError):
            return []
        return [Process(pid, " ".join(command_of(pid))) for pid in pids if command_of(pid)]


def snakemake_locks(workdir: Path) -> list[Path]:
    """Lock files of Snakemake's (default) file persistence backend: .snakemake/locks/<n>.{input,output}.lock."""
    return sorted((workdir / ".snakemake" / "locks").glob("*.lock"))


def incomplete_markers(workdir: Path) -> list[Path]:
    """Snakemake's markers of outputs whose job started and did not end (long names are split into folders)."""
    folder = workdir / ".snakemake" / "incomplete"
    return [path for path in folder.rglob("*") if path.is_file() and path.name != "migration_underway"]


def another_run_message(workdir: Path, active: list[Process]) -> str:
    if not active:  # the lock's holder could not be read (it may be ending right now)
        return f"another run is active in {workdir}: pid unknown. Nothing was changed. Run again when it has ended."
    names = "; ".join(str(process) for process in active[:5])
    more = f" and {len(active) - 5} more" if len(active) > 5 else ""
    return (f"another run is active in {workdir}: {names}{more}. Nothing was changed. Wait for it to end, or stop it "
            f"(kill {' '.join(str(process.pid) for process in active)}), then run again.")


def recover(workdir: Path) -> str | None:
    """Remove what a dead run left; a line saying what was done, or None when there was nothing."""
    locks, markers = snakemake_locks(workdir), incomplete_markers(workdir)
    for lock in locks:
        lock.unlink(missing_ok=True)
    said = []
    if locks:
        said.append("removed the lock of an earlier run that is no longer alive (no snakemake or amprepro process "
                    "runs in this directory)")
    if markers:
        said.append(f"re-running {len(markers)} output(s) it left incomplete")
    return "; ".join(said) or None


# ---- the run ----------------------------------------------------------------------------------------------------


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


def main(argv: list[str] | None = None, env: dict | None = None) -> int:
    env = dict(os.environ) if env is None else env
    targets = sys.argv[1:] if argv is None else argv
    try:
        command, what = snakemake_command(targets, env)
        check_config_values(user_args(env))
        check_config_files(user_args(env))
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
        server = cellserver.start(env, str(workdir)) if serves_cells(user_args(env)) else None
        try:
            return run_snakemake(command, lock, {**env, cellserver.ENV: server[1]} if server else env)
        finally:
            if server:
                cellserver.stop(*server)
    finally:
        lock.release()


if __name__ == "__main__":
    sys.exit(main())

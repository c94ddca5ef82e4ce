"""Is a run alive in this directory, and what did a dead one leave? The launcher's flock, held for the whole run, the
live snakemake and amprepro processes found in /proc, and the removal of a dead run's Snakemake lock.

A run killed with SIGKILL, or cut by a power loss, leaves Snakemake's lock and its incomplete markers behind, and the
next plain `snakemake` stops with LockException or IncompleteFilesException. The lock is removed only once nothing of
that run is shown to be alive: the launcher holds an flock on .snakemake/amprepro-run.lock for the whole run (the
kernel drops it when the launcher dies), and /proc has no snakemake or amprepro job process whose working directory
is this one (jobs can outlive a killed Snakemake). Incomplete outputs are re-run (--rerun-incomplete); finished ones
are kept. The private socket folder of a cell server killed with SIGKILL, which nothing else removes, goes too.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import socket
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from amprepro.plan import cellserver

RUN_LOCK = "amprepro-run.lock"
# `python -m snakemake ...`, a job's `bash -c "... python -m amprepro.train.train ..."`, torchrun's workers, the
# launcher.
PIPELINE_MODULE = re.compile(r"(?:^|\s)-m\s+(?:snakemake|amprepro(?:\.\w+)+)(?:\s|$)")


@dataclass(frozen=True)
class Process:
    pid: int
    command: str

    def __str__(self) -> str:
        shown = self.command if len(self.command) <= 150 else self.command[:150] + "…"
        return f"pid {self.pid} ({shown})"


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
    if swept := sweep_server_folders():
        said.append(f"removed {swept} cell server socket folder(s) that killed runs left in {tempfile.gettempdir()}")
    return "; ".join(said) or None


def sweep_server_folders(tmp: str | None = None, min_age_s: float = 60.0) -> int:
    """Remove the private socket folders (amprepro.plan.cellserver.start) of servers killed with SIGKILL: this
    user's and this host's, at least min_age_s old (a server that is starting has not bound its socket yet), whose
    socket no server listens on. Returns how many."""
    removed = 0
    for folder in map(Path, cellserver.socket_folders(tmp or tempfile.gettempdir())):  # another host's never answers
        try:
            info = folder.lstat()
            if (not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid()
                    or time.time() - info.st_mtime < min_age_s or listening(folder / "socket")):
                continue
            shutil.rmtree(folder)
            removed += 1
        except OSError:  # another run swept it first, or it is not ours to remove
            continue
    return removed


def listening(path: Path) -> bool:
    """Whether a server may be listening on this Unix socket: False only when nothing is there or the connection is
    refused (the file a dead server left); a server too busy to answer within a second counts as listening."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
        return True
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except OSError:
        return True
    finally:
        probe.close()

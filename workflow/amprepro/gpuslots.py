"""Give each GPU job its own GPU(s) on a machine with several, then run the job's command.

    python -m amprepro.gpuslots --gpus N [--defer] -- COMMAND [ARGS...]
    python -m amprepro.gpuslots --gpus 0 --shared K -- COMMAND [ARGS...]

Snakemake's `--resources gpu=N` limits how many GPU jobs run at once but does not say which GPU each job gets:
without this every job would land on GPU 0 and two timed runs would share it. A job claims free GPUs by locking
one file per GPU (an fcntl lock dies with its process, so a killed job frees its GPU), sets CUDA_VISIBLE_DEVICES
and execs the command, which keeps the locks until it exits. GPUs already chosen by a scheduler (Slurm sets
CUDA_VISIBLE_DEVICES) are respected. Jobs of other amprepro pipelines on the same machine share the same locks.

A cell whose speed no claim judges (amprepro.plan.resources.shares_gpu) runs with --shared K: it takes a shared lock
(LOCK_SH) on one GPU's file, which any number of such cells may hold together and which keeps a timed job's exclusive
lock (LOCK_EX) out, plus an exclusive lock on one of that GPU's K slot files (gpu<i>.share<j>.lock), so that at most K
cells share a GPU whatever Snakemake's resources say. It prefers the lowest GPU that has a free slot, so shared cells
pack onto few GPUs, and a timed job tries the GPUs from the highest down, so the two meet as late as possible. Every
lock dies with its process, as above. The job's environment says it shares (SHARED_ENV=K, recorded in metrics.json).

A timed one-GPU cell may run with --defer (issue 40: the next cell prepares while one trains). Where the launcher
stages cells (STAGE_ENV) and there is one GPU to hand out here, the job takes no lock yet: its environment names the
GPU and carries an open descriptor of that GPU's lock file (CLAIM_ENV), and the cell locks it itself
(claim_deferred), exclusively, once it has done what needs no GPU (its model built on the CPU) and before CUDA starts.
The lock belongs to the open file, which the job's first process (this one, exec'd) keeps open until the cell has
exited, so the lock still ends only after the cell's process and its GPU memory are gone. With several GPUs, or a GPU
a scheduler chose, --defer claims at once, as without it.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

POLL_SECONDS = 1.0
SHARED_ENV = "AMPREPRO_GPU_SHARED"  # set to K in a cell that shares its GPU with up to K-1 others
# The run's one `nvidia-smi -L` (amprepro.env.launch), for its DAG build and its jobs on the same host: each GPU job
# asked nvidia-smi twice before (its slot here, the launcher's GPU check), and the DAG build and verify once more.
LISTING_ENV = "AMPREPRO_GPU_LISTING"
CLAIM_ENV = "AMPREPRO_GPU_CLAIM_FD"  # --defer: the descriptor of the GPU's lock file that the cell locks itself
# The jobs' environment says whether the next timed cell builds its model while the one before trains ("1", from the
# launcher: amprepro.env.launchargs.stages_cells; the Snakefile then starts timed cells with --defer). From the user,
# AMPREPRO_STAGE_CELLS=0: never.
STAGE_ENV = "AMPREPRO_STAGE_CELLS"
MAX_SHARED = 32  # the most cells one GPU may take (config schema and amprepro.plan.resources keep to it)


def lock_dir() -> Path:
    path = Path(os.environ.get("AMPREPRO_GPU_LOCKS", "/tmp/amprepro-gpu-locks"))
    path.mkdir(parents=True, exist_ok=True)
    try:
        path.chmod(0o1777)  # shared by every user's pipelines, like /tmp itself
    except PermissionError:
        pass
    return path


def visible_gpus(env=None) -> tuple[list[str], str]:
    """GPU names `nvidia-smi -L` lists, and how we found out: the one GPU listing (the DAG build, verify, the slots).
    No torch import: this runs at DAG build time. Where the run's launcher listed them on this host (LISTING_ENV),
    that listing, without asking nvidia-smi again."""
    return cached_listing(os.environ if env is None else env) or list_gpus()


def list_gpus() -> tuple[list[str], str]:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return [], "no nvidia-smi on PATH"
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [], f"nvidia-smi failed: {exc}"
    names = [line.split(":", 1)[1].split("(UUID")[0].strip()
             for line in out.stdout.splitlines() if line.startswith("GPU ")]
    if out.returncode != 0 or not names:
        return [], f"nvidia-smi lists no GPU (exit {out.returncode})"
    return names, f"nvidia-smi lists {len(names)} GPU(s): {', '.join(sorted(set(names)))}"


def listing_for_jobs(listing: tuple[list[str], str]) -> str:
    """LISTING_ENV's value: a visible_gpus() answer and the host it holds for (a job that lands on another host,
    through a cluster's executor, lists its own)."""
    names, how = listing
    return json.dumps({"host": socket.gethostname(), "names": names, "how": how})


def cached_listing(env) -> tuple[list[str], str] | None:
    """LISTING_ENV's listing where it was made on this host, else None (also for a value that is not one)."""
    try:
        found = json.loads(env.get(LISTING_ENV) or "null")
    except ValueError:
        return None
    if not isinstance(found, dict) or found.get("host") != socket.gethostname():
        return None
    names, how = found.get("names"), found.get("how")
    if not (isinstance(names, list) and all(isinstance(name, str) for name in names) and isinstance(how, str)):
        return None
    return names, how


def gpu_count(env=None) -> int:
    """GPUs to share out: AMPREPRO_GPU_COUNT when set (to keep some back), else what `nvidia-smi -L` lists."""
    env = os.environ if env is None else env
    if env.get("AMPREPRO_GPU_COUNT"):
        return int(env["AMPREPRO_GPU_COUNT"])
    return len(visible_gpus(env)[0])


def open_lock(path: Path) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except PermissionError:  # another user's lock file (umask): a read-only fd locks just as well
        return os.open(path, os.O_RDONLY)


def lock_nb(fd: int, operation: int) -> bool:
    try:
        fcntl.flock(fd, operation | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def sign(fd: int) -> None:
    """Write who holds the lock into its file, for whoever looks (holders)."""
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()}\n".encode())
    except OSError:
        pass


def try_claim(wanted: int, count: int, locks: Path) -> list[tuple[int, int]] | None:
    """Lock `wanted` free GPUs among `count`, highest first; (index, fd) pairs, or None (nothing held) when too few
    are free. A GPU is free when nothing holds its lock, shared or exclusive."""
    held = []
    for index in reversed(range(count)):
        fd = open_lock(locks / f"gpu{index}.lock")
        if not lock_nb(fd, fcntl.LOCK_EX):
            os.close(fd)
            continue
        sign(fd)
        held.append((index, fd))
        if len(held) == wanted:
            return sorted(held)
    for _, fd in held:
        os.close(fd)
    return None


def try_share(cells_per_gpu: int, count: int, locks: Path) -> tuple[int, list[int]] | None:
    """One GPU shared with other such cells: (index, [shared lock fd, slot fd]) for the lowest GPU that no timed job
    holds and that has one of its `cells_per_gpu` slots free, or None (nothing held)."""
    for index in range(count):
        fd = open_lock(locks / f"gpu{index}.lock")
        if not lock_nb(fd, fcntl.LOCK_SH):  # a timed job holds it
            os.close(fd)
            continue
        for slot in range(cells_per_gpu):
            slot_fd = open_lock(locks / f"gpu{index}.share{slot}.lock")
            if lock_nb(slot_fd, fcntl.LOCK_EX):
                sign(slot_fd)
                return index, [fd, slot_fd]
            os.close(slot_fd)
        os.close(fd)
    return None


def holders(count: int, locks: Path) -> list[str]:
    """'GPU i held by pid P (command)' for each GPU whose lock (or shared slot) names a live process."""
    found = []
    for index in range(count):
        for path in [locks / f"gpu{index}.lock", *sorted(locks.glob(f"gpu{index}.share*.lock"))]:
            try:
                pid = int(path.read_text().split()[1])
                command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except (OSError, IndexError, ValueError):
                continue
            command = command.strip()
            shown = f"{command[:150]}{'…' if len(command) > 150 else ''}"
            how = " (shared)" if ".share" in path.name else ""
            found.append(f"GPU {index} held{how} by pid {pid} ({shown})")
    return found


def claim(wanted: int, count: int, locks: Path) -> list[tuple[int, int]]:
    if wanted == count == 1:  # one GPU: wait in the kernel, not by polling, and start the moment it is free
        fd = open_lock(locks / "gpu0.lock")
        lock_waiting(fd, "GPU 0 to be free", locks)
        return [(0, fd)]
    return wait_for(lambda: try_claim(wanted, count, locks), f"{wanted} of {count} GPUs to be free", count, locks)


def share(cells_per_gpu: int, count: int, locks: Path) -> tuple[int, list[int]]:
    return wait_for(lambda: try_share(cells_per_gpu, count, locks),
                    f"a GPU of {count} that no timed job holds and fewer than {cells_per_gpu} cells share",
                    count, locks)


def wait_for(attempt, what: str, count: int, locks: Path):
    waited = False
    while (held := attempt()) is None:
        if not waited:
            say_waiting(what, count, locks)
            waited = True
        time.sleep(POLL_SECONDS)
    return held


def lock_waiting(fd: int, what: str, locks: Path) -> None:
    """Lock GPU 0's lock file `fd` exclusively, saying who holds it if it has to wait (in the kernel), and sign it."""
    if not lock_nb(fd, fcntl.LOCK_EX):
        say_waiting(what, 1, locks)
        fcntl.flock(fd, fcntl.LOCK_EX)
    sign(fd)


def say_waiting(what: str, count: int, locks: Path) -> None:
    # A job whose Snakemake was killed can outlive it and keep its GPU: name the holders so it can be found.
    who = "; ".join(holders(count, locks))
    print(f"gpuslots: waiting for {what} (locks in {locks})"
          + (f": {who}. A job left running by a killed run keeps its GPU until it ends (kill PID)" if who else ""),
          file=sys.stderr, flush=True)


def environment_for(wanted: int, env: dict, shared: int = 0, defer: bool = False) -> tuple[dict, list[int]]:
    """The job's environment and the lock fds it must keep; unchanged when nothing is to be assigned. shared=K: a cell
    that shares one GPU with up to K-1 others (wanted is then 0: Snakemake counts it in gpu_share, not gpu). defer: a
    one-GPU cell that locks its GPU itself (claim_deferred) where this machine has one GPU to hand out."""
    env = {name: value for name, value in env.items() if name != CLAIM_ENV}  # only this job's own descriptor counts
    if shared:
        return shared_environment(shared, env)
    if wanted <= 0 or env.get("CUDA_VISIBLE_DEVICES") is not None:
        return env, []
    count = gpu_count(env)
    if count == 0:
        return env, []
    if defer and wanted == 1 and count == 1 and env.get(STAGE_ENV) == "1":
        fd = open_lock(lock_dir() / "gpu0.lock")
        print("gpuslots: CUDA_VISIBLE_DEVICES=0, locked by the cell itself once it is ready for it (--defer)",
              file=sys.stderr, flush=True)
        return {**env, "CUDA_VISIBLE_DEVICES": "0", CLAIM_ENV: str(fd)}, [fd]
    # A cell asking for more GPUs than exist gets all of them and says itself why it cannot run.
    held = claim(min(wanted, count), count, lock_dir())
    indices = ",".join(str(index) for index, _ in held)
    print(f"gpuslots: CUDA_VISIBLE_DEVICES={indices}", file=sys.stderr, flush=True)
    return {**env, "CUDA_VISIBLE_DEVICES": indices}, [fd for _, fd in held]


def claim_pending(environ=None) -> bool:
    """Whether this process is a cell that must lock its GPU itself before it starts CUDA (--defer)."""
    return CLAIM_ENV in (os.environ if environ is None else environ)


def claim_deferred(environ=None) -> float | None:
    """In a cell started with --defer: lock its GPU now, exclusively, waiting (without polling) for the job that holds
    it; the seconds waited. None where there is nothing to lock (the job got its GPU another way). The variable is
    taken out of the environment, so that nothing this process starts locks it again."""
    environ = os.environ if environ is None else environ
    text = environ.pop(CLAIM_ENV, None)
    if text is None:
        return None
    start = time.monotonic()
    try:
        lock_waiting(int(text), "GPU 0 (the cell before this one)", lock_dir())
    except (ValueError, OSError) as exc:
        raise RuntimeError(f"{CLAIM_ENV}={text!r} is not the open lock file amprepro.gpuslots --defer passes "
                           f"({exc}); start the cell through amprepro.gpuslots, or unset {CLAIM_ENV}") from exc
    return round(time.monotonic() - start, 3)


def shared_environment(cells_per_gpu: int, env: dict) -> tuple[dict, list[int]]:
    """A GPU shared with other untimed cells; the record says so (SHARED_ENV), also where a scheduler chose the GPU.
    Unchanged where there is no GPU to share."""
    if env.get("CUDA_VISIBLE_DEVICES") is not None:
        return {**env, SHARED_ENV: str(cells_per_gpu)}, []
    count = gpu_count(env)
    if count == 0:
        return env, []
    env = {**env, SHARED_ENV: str(cells_per_gpu)}
    index, fds = share(cells_per_gpu, count, lock_dir())
    print(f"gpuslots: CUDA_VISIBLE_DEVICES={index} (shared by up to {cells_per_gpu} cells)", file=sys.stderr,
          flush=True)
    return {**env, "CUDA_VISIBLE_DEVICES": str(index)}, fds


def cells_per_gpu(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= MAX_SHARED:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number from 1 to {MAX_SHARED}")
    return int(text)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, required=True, help="GPUs this job needs (0: run as is)")
    parser.add_argument("--shared", type=cells_per_gpu, default=0, metavar="K",
                        help="share one GPU with up to K-1 other such cells (--gpus 0)")
    parser.add_argument("--defer", action="store_true",
                        help=f"the command can lock its GPU itself (claim_deferred): it does so where the launcher "
                             f"stages cells ({STAGE_ENV}=1), the job wants one GPU of its own and there is one to "
                             "hand out; otherwise the GPU is claimed now, as without --defer")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")
    if args.shared and args.gpus:
        parser.error("--shared K runs a cell on a GPU it shares: give --gpus 0 with it")
    env, fds = environment_for(args.gpus, dict(os.environ), args.shared, args.defer)
    for fd in fds:
        os.set_inheritable(fd, True)  # the exec'd command holds the locks until it exits
    os.execvpe(command[0], command, env)


if __name__ == "__main__":
    main()

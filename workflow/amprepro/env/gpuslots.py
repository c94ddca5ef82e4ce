"""Give each GPU job its own GPU(s) on a machine with several, then run the job's command.

    python -m amprepro.env.gpuslots --gpus N -- COMMAND [ARGS...]

Snakemake's `--resources gpu=N` limits how many GPU jobs run at once but does not say which GPU each job gets:
without this every job would land on GPU 0 and two timed runs would share it. A job claims free GPUs by locking
one file per GPU (an fcntl lock dies with its process, so a killed job frees its GPU), sets CUDA_VISIBLE_DEVICES
and execs the command, which keeps the locks until it exits. GPUs already chosen by a scheduler (Slurm sets
CUDA_VISIBLE_DEVICES) are respected. Jobs of other amprepro pipelines on the same machine share the same locks.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

POLL_SECONDS = 1.0


def lock_dir() -> Path:
    path = Path(os.environ.get("AMPREPRO_GPU_LOCKS", "/tmp/amprepro-gpu-locks"))
    path.mkdir(parents=True, exist_ok=True)
    try:
        path.chmod(0o1777)  # shared by every user's pipelines, like /tmp itself
    except PermissionError:
        pass
    return path


def visible_gpus() -> tuple[list[str], str]:
    """GPU names `nvidia-smi -L` lists, and how we found out: the one GPU listing (the DAG build, verify, the slots).
    No torch import: this runs at DAG build time."""
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


def gpu_count() -> int:
    """GPUs to share out: AMPREPRO_GPU_COUNT when set (to keep some back), else what `nvidia-smi -L` lists."""
    if os.environ.get("AMPREPRO_GPU_COUNT"):
        return int(os.environ["AMPREPRO_GPU_COUNT"])
    return len(visible_gpus()[0])


def try_claim(wanted: int, count: int, locks: Path) -> list[tuple[int, int]] | None:
    """Lock `wanted` free GPUs among `count`; (index, fd) pairs, or None (nothing held) when too few are free."""
    held = []
    for index in range(count):
        path = locks / f"gpu{index}.lock"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except PermissionError:  # another user's lock file (umask): a read-only fd locks just as well
            fd = os.open(path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"pid {os.getpid()}\n".encode())  # who holds it, for whoever looks
        except OSError:
            pass
        held.append((index, fd))
        if len(held) == wanted:
            return held
    for _, fd in held:
        os.close(fd)
    return None


def holders(count: int, locks: Path) -> list[str]:
    """'GPU i held by pid P (command)' for each GPU whose lock names a live process."""
    found = []
    for index in range(count):
        try:
            pid = int((locks / f"gpu{index}.lock").read_text().split()[1])
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue
        command = command.strip()
        found.append(f"GPU {index} held by pid {pid} ({command[:150]}{'…' if len(command) > 150 else ''})")
    return found


def claim(wanted: int, count: int, locks: Path) -> list[tuple[int, int]]:
    waited = False
    while (held := try_claim(wanted, count, locks)) is None:
        if not waited:
            # A job whose Snakemake was killed can outlive it and keep its GPU: name the holders so it can be found.
            who = "; ".join(holders(count, locks))
            print(f"gpuslots: waiting for {wanted} of {count} GPUs to be free (locks in {locks})"
                  + (f": {who}. A job left running by a killed run keeps its GPU until it ends (kill PID)"
                     if who else ""), file=sys.stderr, flush=True)
            waited = True
        time.sleep(POLL_SECONDS)
    return held


def environment_for(wanted: int, env: dict) -> tuple[dict, list[int]]:
    """The job's environment and the lock fds it must keep; unchanged when nothing is to be assigned."""
    if wanted <= 0 or env.get("CUDA_VISIBLE_DEVICES") is not None:
        return env, []
    count = gpu_count()
    if count == 0:
        return env, []
    # A cell asking for more GPUs than exist gets all of them and says itself why it cannot run.
    held = claim(min(wanted, count), count, lock_dir())
    indices = ",".join(str(index) for index, _ in held)
    print(f"gpuslots: CUDA_VISIBLE_DEVICES={indices}", file=sys.stderr, flush=True)
    return {**env, "CUDA_VISIBLE_DEVICES": indices}, [fd for _, fd in held]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, required=True, help="GPUs this job needs (0: run as is)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")
    env, fds = environment_for(args.gpus, dict(os.environ))
    for fd in fds:
        os.set_inheritable(fd, True)  # the exec'd command holds the locks until it exits
    os.execvpe(command[0], command, env)


if __name__ == "__main__":
    main()

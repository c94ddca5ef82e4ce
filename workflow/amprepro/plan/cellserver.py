"""Start each training cell in its own process without paying its imports again: a server that imported torch,
torch._dynamo, torchvision, timm and scikit-learn once forks one child per cell.

On the H200 box a fresh interpreter spends about 10 of a cell's 14 s importing (torch 3.4 s; torch._dynamo, which
the first optimizer step imports, about 4 s; torchvision 5 s with it; scikit-learn 2.8 s), while the timed steps take
1-4 s (tools/gpu/cell_profile.py). Each cell is still its own process: the child takes the job's environment
(CUDA_VISIBLE_DEVICES), working directory and output files, starts CUDA itself (the server never touches CUDA), and
ends with os._exit. apex, which O1 patches into torch, is imported only by the children whose cell uses it; where
the server's own imports loaded an apex (timm tries to), the jobs that use apex start fresh instead (stray_apex).

    python -m amprepro.plan.cellserver --socket PATH     # amprepro.env.launch starts it, AMPREPRO_CELL_SERVER=PATH
    run_cell(train_args)                                   # a cell's launcher: the exit code, or None (start afresh)
    python -m amprepro.plan.cellserver --run ENTRY -- ARGS # a one-process job (sanity, peak, plan, the apex checks'
                                                           # probes): forked or fresh

A cell starts a fresh interpreter instead when no server is announced or reachable, or when the server runs another
Python or sys.path, or an environment whose settings change what its imports did (TORCH_*, OMP_*, ...).
"""

from __future__ import annotations

import argparse
import ctypes
import importlib
import json
import os
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass

from amprepro.gpuslots import CLAIM_ENV

ENV = "AMPREPRO_CELL_SERVER"
SOCKET_PREFIX = "amprepro-cells-"  # start's private folder in the temporary directory (amprepro.env.runlock sweeps)
_RANDOM_PART = re.compile(r"[a-z0-9_]+")  # what tempfile.mkdtemp adds after the prefix: never a "-"
ORIGIN_ENV = "AMPREPRO_CELL_PROCESS"  # in a forked cell: which server it came from (recorded in metrics.json)
PRELOAD = ["torch", "torch._dynamo", "torch.utils.flop_counter", "torch.utils.checkpoint", "numpy", "threadpoolctl",
           "torchvision", "timm", "amprepro.train.train",
           "amprepro.train.models", "amprepro.train.precision", "amprepro.train.measure", "amprepro.train.flops",
           "amprepro.memory", "amprepro.cellspec", "amprepro.train.data", "amprepro.train.distributed",
           "amprepro.train.batchsearch"]
# What a forked child may run: a training cell, a largest-batch search (rules/largest_batch.smk), the record of a
# cell the launcher does not start (too few GPUs or nodes for it), and the three GPU jobs before the cells, which
# import what the server has imported: the stack's checks (rules/sanity.smk: 12 s on the H200 box, torch and
# torchvision alone about 8 s of it), the matmul peak (rules/runs.smk) and the memory plan (rules/plan.smk), 6 s each,
# about 4 of them importing torch (results-reference/perf/04ad031); and the apex build's checks (apex and apex_shell:
# one probe per opt level, each importing torch fresh, then about 4 s in its first GPU check on an H100 box, where
# the first optimizer step imports torch._dynamo: results-reference/perf/99d30cf-h100). A check in a child of the
# server checks what the cells, its other children, will import.
ENTRIES = {"train": "amprepro.train.train", "batchsearch": "amprepro.train.batchsearch",
           "notrun": "amprepro.train.notrun", "sanity": "amprepro.env.sanity", "peak": "amprepro.env.peak",
           "plan": "amprepro.plan.memplan", "apex_probe": "amprepro.env.apexbuild.verify_probe"}
# Settings read while those modules are imported: a job that sets them differently gets a fresh interpreter.
IMPORT_TIME_PREFIXES = ("TORCH", "PYTORCH", "OMP_", "KMP_", "MKL_", "OPENBLAS_", "GOTO", "LD_PRELOAD",
                        "LD_LIBRARY_PATH", "PYTHONHASHSEED", "PYTHONWARNINGS", "CUDA_MODULE_LOADING")
# Thread counts Snakemake sets for every job (its threads): they differ between jobs, so a forked cell applies them
# itself (torch.set_num_threads, threadpoolctl for the BLAS and OpenMP pools), as a fresh interpreter would read them.
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS",
               "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")
HEADER = struct.Struct("!I")
PR_SET_PDEATHSIG = 1


def import_settings(env: dict) -> dict:
    return {key: value for key, value in env.items()
            if key.startswith(IMPORT_TIME_PREFIXES) and key not in THREAD_VARS}


def thread_count(env: dict) -> int | str | None:
    """The one thread count the job's THREAD_VARS give (None: none set), or why it cannot be applied."""
    values = {env[key] for key in THREAD_VARS if key in env}
    if not values:
        return None
    if len(values) > 1 or not next(iter(values)).isdigit() or int(next(iter(values))) < 1:
        return f"the job's thread settings are not one whole number: {sorted(values)}"
    return int(values.pop())


def interpreter(cwd: str) -> dict:
    """What decides which modules an import finds: the prefix and sys.path (without the script's own entry)."""
    paths = []
    for entry in sys.path:
        path = os.path.realpath(entry or cwd)
        if path != os.path.realpath(cwd) and path not in paths:
            paths.append(path)
    return {"prefix": os.path.realpath(sys.prefix), "path": paths}


# ---- the client: a cell's launcher (amprepro.plan.launcher), torch-free -------------------------------------


def send_message(conn: socket.socket, message: dict, fds: list[int] | None = None) -> None:
    data = json.dumps(message).encode()
    if fds:
        socket.send_fds(conn, [HEADER.pack(len(data)) + data], fds)
    else:
        conn.sendall(HEADER.pack(len(data)) + data)


def receive_message(conn: socket.socket, want_fds: int = 0) -> tuple[dict | None, list[int]]:
    """One message, and the descriptors sent with it; (None, []) when the peer closed the connection first. It reads
    no byte past its message, so a next message already sent (the exit code right behind the pid) stays for the next
    call instead of being parsed with this one."""
    buffer, fds = b"", []

    def wanted() -> int:
        return HEADER.size + (HEADER.unpack(buffer[:HEADER.size])[0] if len(buffer) >= HEADER.size else 0)

    try:
        while len(buffer) < wanted():
            size = wanted() - len(buffer)
            if want_fds and not fds:
                chunk, fds, _, _ = socket.recv_fds(conn, size, want_fds)
            else:
                chunk = conn.recv(size)
            if not chunk:
                return None, fds
            buffer += chunk
        return json.loads(buffer[HEADER.size:]), fds
    except BaseException:  # a timeout or a malformed message: the descriptors that came with it are not kept open
        for fd in fds:
            os.close(fd)
        raise


def say(line: str) -> None:
    print(f"amprepro.plan.cellserver: {line}", file=sys.stderr, flush=True)


def run_cell(train_args: list[str], env: dict | None = None, entry: str = "train") -> int | None:
    """Run amprepro.train.train (or another of ENTRIES) with train_args in a child of the server: its exit code, or
    None when this cell must start a fresh interpreter (no server, or one that is not this job's Python and settings;
    the reason is printed)."""
    env = dict(os.environ if env is None else env)
    path = env.get(ENV)
    if not path:
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
    except OSError as exc:
        say(f"no cell server at {path} ({exc}); starting a fresh interpreter")
        return None
    cwd = os.getcwd()
    # a cell that locks its GPU itself (amprepro.gpuslots --defer) gets the lock file's descriptor too
    claim = [int(env[CLAIM_ENV])] if env.get(CLAIM_ENV, "").isdigit() else []
    send_message(conn, {"argv": train_args, "env": env, "cwd": cwd, "interpreter": interpreter(cwd),
                        "entry": entry}, [0, 1, 2, *claim])
    reply, _ = receive_message(conn)
    if reply is None or "refused" in reply:
        say(f"{reply['refused'] if reply else 'the server closed the connection'}; starting a fresh interpreter")
        return None
    pid = reply["pid"]
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # Snakemake stopping the job stops the cell
        signal.signal(signum, lambda number, frame: os.kill(pid, number))
    done, _ = receive_message(conn)
    if done is None:
        say(f"the cell server ended while cell process {pid} ran (the cell was stopped with it)")
        return 1
    return done["exit"]


# ---- the server -------------------------------------------------------------------------------------------------


def preload() -> list[str]:
    """Import what the cells import. A module that fails to import is dropped again, so that a cell importing it gets
    the same error a fresh interpreter would give."""
    loaded = []
    for name in PRELOAD:
        before = set(sys.modules)
        try:
            __import__(name)
            loaded.append(name)
        except Exception:
            for added in set(sys.modules) - before:
                del sys.modules[added]
    if "amprepro.train.train" in loaded:
        warm_meta_device()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        raise SystemExit("a preloaded module started CUDA: a forked cell could not use the GPU")
    return loaded


def warm_meta_device() -> None:
    """The meta device's first operations cost about 0.9 s of lazy set-up, which every cell that reads its initial
    weights from the cache would pay again (amprepro.train.initcache.warm): paid here once, before the forks."""
    try:  # by name, as PRELOAD imports: this module's code digest stays its own (the --run jobs digest it)
        importlib.import_module("amprepro.train.initcache").warm()
    except Exception as exc:  # a cell then pays the set-up itself
        print(f"amprepro.plan.cellserver: the meta device was not warmed ({type(exc).__name__}: {exc})",
              file=sys.stderr)


@dataclass(frozen=True)
class Server:
    interpreter: dict  # its prefix and sys.path
    env: dict  # its environment before the imports
    import_env: dict  # what the imports added to os.environ
    loaded: list[str]
    apex: str | None = None  # where an apex the preload imported came from (stray_apex), or None


def stray_apex(modules: dict) -> str | None:
    """Where an apex imported by the preload came from, or None. timm's layers/fast_norm.py tries `from
    apex.normalization.fused_layer_norm import ...` as it is imported: where any `apex` is on the server's path (a
    container that ships one, the unrelated PyPI package `apex`), that module stays in sys.modules even when the
    import fails, and a forked child's `import apex` would get it instead of the verified site dir's."""
    module = modules.get("apex")
    if module is None and not any(name.startswith("apex.") for name in modules):
        return None
    return getattr(module, "__file__", None) or "an apex package"


def uses_apex(request: dict) -> bool:
    """An apex check (apex_probe) or a job given the apex record (`--apex`: the cells and searches that use apex)."""
    return request.get("entry") == "apex_probe" or "--apex" in request.get("argv", [])


def refusal(request: dict, server: Server) -> str | None:
    mine = server.interpreter
    if request.get("entry", "train") not in ENTRIES:
        return f"the server runs only {', '.join(ENTRIES)}, not {request.get('entry')!r}"
    if request["interpreter"] != mine:
        return (f"the cell's Python ({request['interpreter']['prefix']}) or sys.path is not the server's "
                f"({mine['prefix']})")
    if server.apex and uses_apex(request):
        return (f"a job that uses apex does not fork from a server whose imports loaded an apex ({server.apex}; "
                "timm tries to), which would shadow the verified one")
    threads = thread_count(request["env"])
    if isinstance(threads, str):
        return threads
    if threads is not None and "threadpoolctl" not in server.loaded:
        return "threadpoolctl is not importable, so the job's thread settings could not be applied"
    # What the server's own imports set is in every forked child's environment (a forked plan's probes send it back)
    theirs = import_settings({k: v for k, v in request["env"].items() if server.import_env.get(k) != v})
    ours = import_settings(server.env)
    if theirs != ours:
        differing = sorted(set(theirs.items()) ^ set(ours.items()))
        return f"the cell's import-time settings differ from the server's: {sorted({k for k, _ in differing})}"
    return None


def become_cell(request: dict, fds: list[int], server_pid: int, server: Server) -> int:
    """In the forked child: the job's stdio, directory and environment, then amprepro.train.train (or the request's
    other entry of ENTRIES); its exit code."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # the server gone: no cell left running on its own
    if os.getppid() != server_pid:
        return 1
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(signum, signal.SIG_DFL)
    stdio, claim = fds[:3], fds[3:]
    for target, fd in enumerate(stdio):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update({**server.import_env, **request["env"]})
    os.environ.pop(CLAIM_ENV, None)  # the job's number names its descriptor in the job, not here
    if claim:  # the GPU's lock file, passed with the request: the cell locks it (amprepro.gpuslots.claim_deferred)
        os.environ[CLAIM_ENV] = str(claim[0])
    threads = thread_count(request["env"])
    if threads is not None:
        import torch
        from threadpoolctl import threadpool_limits

        torch.set_num_threads(threads)
        # For the rest of the process, as a fresh one sizes them from those variables (OpenBLAS caps at the CPUs)
        threadpool_limits(limits={"openmp": threads, "blas": min(threads, os.cpu_count() or threads)})
    os.environ[ORIGIN_ENV] = (f"forked from amprepro.plan.cellserver pid {server_pid} (threads "
                              f"{threads or 'as the server'}; preloaded: {', '.join(server.loaded)})")
    module = importlib.import_module(ENTRIES[request.get("entry", "train")])
    sys.argv = [module.__file__, *request["argv"]]
    try:
        code = module.main(request["argv"])  # as `raise SystemExit(main())` would: memplan's main returns its code
        return code if isinstance(code, int) and not isinstance(code, bool) else 0
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
        return 1


def fork_cell(conn: socket.socket, listener: socket.socket, clients: dict, server: Server) -> int | None:
    conn.settimeout(30)
    request, fds = receive_message(conn, want_fds=4)  # stdin, stdout, stderr and, with --defer, the GPU's lock file
    conn.settimeout(None)
    try:  # the server keeps none of the job's descriptors, whatever happens: a GPU lock file it held would stay locked
        if request is None or len(fds) not in (3, 4):
            return None
        why = refusal(request, server)
        if not why and CLAIM_ENV in (request.get("env") or {}) and len(fds) != 4:
            why = "the job's GPU lock file did not come with its request (amprepro.gpuslots --defer)"
        if why:
            send_message(conn, {"refused": why})
            return None
        sys.stdout.flush()
        sys.stderr.flush()
        server_pid = os.getpid()
        pid = os.fork()
        if pid == 0:
            listener.close()
            for other in clients:
                other.close()
            conn.close()
            code = 1
            try:
                code = become_cell(request, fds, server_pid, server)
            except BaseException:  # before its entry ran (the job's directory, threads, the entry's import): say why
                traceback.print_exc()
            finally:
                for stream in (sys.stdout, sys.stderr):
                    try:
                        stream.flush()
                    except Exception:
                        pass
                os._exit(code)
        send_message(conn, {"pid": pid})
        return pid
    finally:
        for fd in fds:
            os.close(fd)


def reap(clients: dict) -> None:
    """Send each ended cell's exit code (128 + N when killed by signal N, as a shell says) to its client."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        code = os.waitstatus_to_exitcode(status)
        for conn, child in list(clients.items()):
            if child == pid:
                try:
                    send_message(conn, {"exit": 128 - code if code < 0 else code})
                except OSError:
                    pass
                conn.close()
                del clients[conn]


def serve(path: str) -> None:
    parent, mine, before = os.getppid(), interpreter(os.getcwd()), dict(os.environ)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)  # before the imports: early cells wait in the backlog instead of starting afresh
    listener.listen(64)
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # torch.cuda.is_available() without starting CUDA
    loaded = preload()
    # What the imports themselves put into os.environ (torch: KMP_*, TORCHINDUCTOR_CACHE_DIR): a fresh interpreter
    # would have it too, so the cells get it under their own environment.
    server = Server(mine, before, {key: value for key, value in os.environ.items()
                                   if key not in before and key != "PYTORCH_NVML_BASED_CUDA_CHECK"}, loaded,
                    stray_apex(sys.modules))
    say(f"ready: {len(loaded)} modules preloaded ({', '.join(loaded)})"
        + (f"; they loaded an apex ({server.apex}): the jobs that use apex start fresh" if server.apex else ""))
    clients: dict[socket.socket, int] = {}
    try:
        while os.getppid() == parent:  # the launcher gone (even by SIGKILL): stop
            readable, _, _ = select.select([listener, *clients], [], [], 0.05)
            for ready in readable:
                if ready is listener:
                    conn, _ = listener.accept()
                    try:
                        pid = fork_cell(conn, listener, clients, server)
                    except (OSError, ValueError, KeyError, TypeError) as exc:  # one bad request; the cells run on
                        say(f"a request could not be served ({exc!r}); its job starts a fresh interpreter")
                        pid = None
                    if pid is None:
                        conn.close()
                    else:
                        clients[conn] = pid
                elif not ready.recv(1):  # the client ended first (its job was killed): end its cell too
                    kill(clients[ready])
            reap(clients)
    finally:
        for pid in clients.values():
            kill(pid)


def remove_socket(path: str) -> None:
    """The socket, and start's private folder that held only it: gone whoever ends the server (the launcher's stop,
    or the launcher's death: PR_SET_PDEATHSIG)."""
    folder = os.path.dirname(path)
    targets = [(os.unlink, path)] + ([(os.rmdir, folder)] if os.path.basename(folder).startswith(SOCKET_PREFIX) else [])
    for remove, target in targets:
        try:
            remove(target)
        except OSError:  # gone already, or a folder that holds more than the socket
            pass


def kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# ---- the launcher's side: start and stop the server for one Snakemake run -----------------------------------------


def socket_prefix() -> str:
    """start's folder name up to mkdtemp's random part: SOCKET_PREFIX, then this host's name. A temporary directory
    shared by several hosts (NFS) then holds each host's folders apart: a Unix socket answers only on its own host,
    so runlock's sweep must never judge another host's folder by it."""
    host = re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname())[:16] or "host"  # a socket's path: 107 bytes
    return f"{SOCKET_PREFIX}{host}-"


def socket_folders(tmp: str) -> list[str]:
    """The folders start made in tmp on this host (any user's: runlock's sweep checks the owner); not those of a host
    whose name begins with this one's and a "-"."""
    prefix = socket_prefix()
    return [os.path.join(tmp, name) for name in os.listdir(tmp)
            if name.startswith(prefix) and _RANDOM_PART.fullmatch(name[len(prefix):])]


def start(env: dict, cwd: str) -> tuple[subprocess.Popen, str] | None:
    """The server for one run, with env[ENV] to give the jobs; None when AMPREPRO_FRESH_CELLS=1 asks for none."""
    if env.get("AMPREPRO_FRESH_CELLS") == "1":
        return None
    path = os.path.join(tempfile.mkdtemp(prefix=socket_prefix()), "socket")  # a 0700 folder: only this user
    process = subprocess.Popen([sys.executable, "-m", "amprepro.plan.cellserver", "--socket", path], env=env,
                               cwd=cwd, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not os.path.exists(path) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return process, path


def stop(process: subprocess.Popen, path: str) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    shutil.rmtree(os.path.dirname(path), ignore_errors=True)


def run_entry(entry: str, argv: list[str], env: dict | None = None):
    """Run ENTRIES[entry] with argv in a child of the server where there is one, else in a fresh interpreter (this
    process becomes it); never returns. The jobs that only need one process start this way: a largest-batch search
    (amprepro.plan.launcher --entry), sanity, peak and plan (`--run`, which imports nothing of amprepro's, so their
    code digests are their own)."""
    code = run_cell(argv, env, entry)
    if code is not None:
        sys.exit(code)
    os.execvp(sys.executable, [sys.executable, "-m", ENTRIES[entry], *argv])


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--run"]:
        if len(argv) < 3 or argv[1] not in ENTRIES or argv[2] != "--":
            raise SystemExit(f"amprepro.plan.cellserver --run ENTRY -- ARGS: ENTRY is one of {', '.join(ENTRIES)}")
        run_entry(argv[1], argv[3:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--socket", required=True, help="Unix socket path (its folder should be private: 0700)")
    args = parser.parse_args(argv)
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda number, frame: sys.exit(0))
    try:
        serve(args.socket)
    finally:  # also when the launcher dies during the preload
        remove_socket(args.socket)


if __name__ == "__main__":
    main()

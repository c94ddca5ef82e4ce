"""amprepro.plan.cellserver in this process, with the system calls it makes (fork, waitpid, dup2, kill, prctl) answered
by fakes: what a request carries, each refusal's text, what a forked cell sets up before its entry runs and which exit
code it gives, the server loop, the reaping, start and stop (docs/mutation.md: test_cellserver.py runs the real
server in subprocesses, which mutmut cannot see; these tests are what kills the module's mutants)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import types

import pytest

from amprepro.plan import cellserver as cs


class FakeOs:
    """cellserver's `os`: the real module but for the calls a test answers itself."""

    def __init__(self, **overrides):
        self.__dict__.update(overrides)
        self.calls = []

    def __getattr__(self, name):
        return getattr(os, name)


def wait_for(condition, seconds=5.0):
    """Until condition() holds; a test failure after `seconds` (a broken server must fail the test, not hang it)."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "waited in vain"
        time.sleep(0.01)


@pytest.fixture
def signals():
    """Whatever handlers a test installs are put back."""
    saved = {n: signal.getsignal(n) for n in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD)}
    yield
    for number, handler in saved.items():
        signal.signal(number, handler)


# ---- the settings a request is judged by -------------------------------------------------------------------------


def test_import_settings_are_the_import_time_variables_but_the_thread_counts():
    env = {"TORCH_HOME": "1", "PYTORCH_CUDA_ALLOC_CONF": "2", "OMP_SCHEDULE": "3", "KMP_AFFINITY": "4",
           "MKL_DEBUG": "5", "OPENBLAS_VERBOSE": "6", "GOTOBLAS_X": "7", "LD_PRELOAD": "8", "LD_LIBRARY_PATH": "9",
           "PYTHONHASHSEED": "10", "PYTHONWARNINGS": "11", "CUDA_MODULE_LOADING": "12", "OMP_NUM_THREADS": "2",
           "MKL_NUM_THREADS": "2", "HOME": "/h", "CUDA_VISIBLE_DEVICES": "0", "PYTHONPATH": "x"}
    assert cs.import_settings(env) == {k: v for k, v in env.items() if k not in (
        "OMP_NUM_THREADS", "MKL_NUM_THREADS", "HOME", "CUDA_VISIBLE_DEVICES", "PYTHONPATH")}


@pytest.mark.parametrize(("env", "count"), [
    ({}, None), ({"HOME": "4"}, None), ({"OMP_NUM_THREADS": "4"}, 4), ({"NUMEXPR_NUM_THREADS": "1"}, 1),
    ({var: "3" for var in cs.THREAD_VARS}, 3),
])
def test_thread_count_is_the_one_whole_number_the_job_sets(env, count):
    assert cs.thread_count(env) == count


@pytest.mark.parametrize(("env", "shown"), [
    ({"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "3"}, "['2', '3']"), ({"OMP_NUM_THREADS": "0"}, "['0']"),
    ({"OMP_NUM_THREADS": "two"}, "['two']"), ({"OMP_NUM_THREADS": "-1"}, "['-1']"),
    ({"OMP_NUM_THREADS": ""}, "['']"),
])
def test_thread_counts_that_are_not_one_whole_number_are_said(env, shown):
    assert cs.thread_count(env) == f"the job's thread settings are not one whole number: {shown}"


def test_interpreter_is_the_real_prefix_and_path_without_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "real").mkdir()
    (tmp_path / "cwd").mkdir()
    os.symlink("real", tmp_path / "alias")
    monkeypatch.setattr(sys, "path", ["", str(tmp_path / "cwd"), str(tmp_path / "alias"), str(tmp_path / "real"),
                                      "/usr/lib/x"])
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "alias"))
    assert cs.interpreter(str(tmp_path / "cwd")) == {"prefix": str(tmp_path / "real"),
                                                     "path": [str(tmp_path / "real"), "/usr/lib/x"]}


def test_a_request_is_refused_for_each_reason_with_its_text():
    server = cs.Server({"prefix": "/p", "path": ["/a"]}, {"TORCH_X": "1", "HOME": "/h"}, {}, ["threadpoolctl"])
    good = {"interpreter": {"prefix": "/p", "path": ["/a"]}, "env": {"TORCH_X": "1", "HOME": "/other"}}
    assert cs.refusal(good, server) is None
    assert cs.refusal({**good, "entry": "batchsearch"}, server) is None
    assert cs.refusal({**good, "entry": "evil"}, server) == (
        "the server runs only train, batchsearch, notrun, sanity, peak, plan, apex_probe, not 'evil'")
    assert cs.refusal({**good, "interpreter": {"prefix": "/q", "path": ["/a"]}}, server) == (
        "the cell's Python (/q) or sys.path is not the server's (/p)")
    assert cs.refusal({**good, "interpreter": {"prefix": "/p", "path": []}}, server) == (
        "the cell's Python (/p) or sys.path is not the server's (/p)")
    assert cs.refusal({**good, "env": {"TORCH_X": "1", "OMP_NUM_THREADS": "x"}}, server) == (
        "the job's thread settings are not one whole number: ['x']")
    assert cs.refusal({**good, "env": {"TORCH_X": "1", "OMP_NUM_THREADS": "2"}}, server) is None
    no_pool = cs.Server(server.interpreter, server.env, {}, ["torch"])
    assert cs.refusal({**good, "env": {"TORCH_X": "1", "OMP_NUM_THREADS": "2"}}, no_pool) == (
        "threadpoolctl is not importable, so the job's thread settings could not be applied")
    assert cs.refusal(good, no_pool) is None
    assert cs.refusal({**good, "env": {"TORCH_X": "2", "KMP_Y": "1"}}, server) == (
        "the cell's import-time settings differ from the server's: ['KMP_Y', 'TORCH_X']")
    assert cs.refusal({**good, "env": {}}, server) == (
        "the cell's import-time settings differ from the server's: ['TORCH_X']")
    # What the server's imports set is in every forked child's environment: a forked plan's probe sends it back
    imported = cs.Server(server.interpreter, server.env, {"TORCHINDUCTOR_CACHE_DIR": "/t", "KMP_DUPLICATE_LIB_OK": "1"},
                         ["threadpoolctl"])
    child = {**good, "env": {**good["env"], "TORCHINDUCTOR_CACHE_DIR": "/t", "KMP_DUPLICATE_LIB_OK": "1"}}
    assert cs.refusal(child, imported) is None
    assert cs.refusal({**child, "env": {**child["env"], "TORCHINDUCTOR_CACHE_DIR": "/mine"}}, imported) == (
        "the cell's import-time settings differ from the server's: ['TORCHINDUCTOR_CACHE_DIR']")


def test_an_apex_the_preload_imported_sends_every_job_that_uses_apex_to_a_fresh_interpreter(tmp_path):
    """timm's fast_norm tries `import apex...` as the server preloads it: an apex found on the server's path (a
    container's, PyPI's unrelated `apex`) stays in sys.modules, and a forked child's `import apex` would get it
    instead of the verified site dir's. The apex checks and the cells given the apex record then start fresh."""
    stray = types.ModuleType("apex")
    stray.__file__ = str(tmp_path / "apex" / "__init__.py")
    assert cs.stray_apex({"torch": types.ModuleType("torch")}) is None
    assert cs.stray_apex({"apex": stray, "torch": types.ModuleType("torch")}) == stray.__file__
    assert cs.stray_apex({"apex.normalization": types.ModuleType("apex.normalization")}) == "an apex package"
    clean = cs.Server({"prefix": "/p", "path": []}, {}, {}, [])
    shadowed = cs.Server({"prefix": "/p", "path": []}, {}, {}, [], stray.__file__)
    probe = {"interpreter": {"prefix": "/p", "path": []}, "env": {}, "entry": "apex_probe", "argv": ["site", "imports"]}
    apex_cell = {**probe, "entry": "train", "argv": ["--spec", "{}", "--apex", "results/apex/runs.json"]}
    other_cell = {**probe, "entry": "train", "argv": ["--spec", "{}"]}
    for request in (probe, apex_cell):
        assert cs.refusal(request, clean) is None
        assert cs.refusal(request, shadowed) == (
            f"a job that uses apex does not fork from a server whose imports loaded an apex ({stray.__file__}; timm "
            "tries to), which would shadow the verified one")
    assert cs.refusal(other_cell, shadowed) is None


# ---- messages --------------------------------------------------------------------------------------------------


def test_two_messages_sent_back_to_back_are_read_one_at_a_time():
    """The pid and the exit code can both be in the socket before the client reads: each call takes its own."""
    left, right = socket.socketpair()
    right.settimeout(5)
    try:
        cs.send_message(left, {"pid": 42})
        cs.send_message(left, {"exit": 3})
        assert cs.receive_message(right) == ({"pid": 42}, [])
        assert cs.receive_message(right) == ({"exit": 3}, [])
    finally:
        left.close()
        right.close()


def test_a_message_goes_with_its_length_and_descriptors():
    left, right = socket.socketpair()
    right.settimeout(5)
    read_end, write_end = os.pipe()
    try:
        cs.send_message(left, {"a": [1, "x"]}, [write_end])
        message, fds = cs.receive_message(right, want_fds=1)
        assert message == {"a": [1, "x"]}
        assert len(fds) == 1
        os.write(fds[0], b"through the passed fd")
        os.close(fds[0])
        assert os.read(read_end, 100) == b"through the passed fd"
        big = {"text": "y" * (3 << 20)}  # more than one recv
        sender = threading.Thread(target=cs.send_message, args=(left, big))
        sender.start()
        assert cs.receive_message(right) == (big, [])
        sender.join()
        cs.send_message(left, {}, [])
        assert cs.receive_message(right) == ({}, [])
        cs.send_message(left, {"b": 1}, [write_end])  # descriptors nobody asked for are not taken
        assert cs.receive_message(right) == ({"b": 1}, [])
        left.sendall(cs.HEADER.pack(10) + b'{"a"')  # cut short: the peer closes
        left.close()
        assert cs.receive_message(right) == (None, [])
    finally:
        for fd in (read_end, write_end):
            os.close(fd)
        right.close()


def test_receive_message_of_a_closed_peer_is_none():
    left, right = socket.socketpair()
    left.close()
    assert cs.receive_message(right) == (None, [])
    assert cs.receive_message(right, want_fds=3) == (None, [])
    right.close()


def test_say_writes_one_line_to_stderr(capsys):
    cs.say("hello")
    assert capsys.readouterr().err == "amprepro.plan.cellserver: hello\n"


# ---- the client ------------------------------------------------------------------------------------------------


def serve_once(path, replies, seen):
    """A server for one connection: records the request and its descriptors, sends the replies, closes."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)

    def run():
        conn, _ = listener.accept()
        request, fds = cs.receive_message(conn, want_fds=3)
        seen.append((request, [(os.fstat(fd).st_dev, os.fstat(fd).st_ino) for fd in fds]))
        for fd in fds:
            os.close(fd)
        for reply in replies:
            cs.send_message(conn, reply)
            # one reply at a time, as the real server's are (the pid at the fork, the exit code when the cell has
            # ended): receive_message reads what the socket holds, and two replies read at once are not one JSON
            time.sleep(0.2)
        conn.close()
        listener.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_run_cell_without_a_server_announced_or_reachable_starts_afresh(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(cs.ENV, raising=False)
    assert cs.run_cell(["--x"]) is None
    assert cs.run_cell(["--x"], {cs.ENV: ""}) is None
    assert capsys.readouterr().err == ""
    path = str(tmp_path / "none")
    assert cs.run_cell(["--x"], {cs.ENV: path}) is None
    assert capsys.readouterr().err == (
        f"amprepro.plan.cellserver: no cell server at {path} ([Errno 2] No such file or directory); starting a fresh "
        "interpreter\n")


def test_run_cell_sends_the_job_and_returns_the_cells_exit_code(tmp_path, monkeypatch, signals):
    path, seen = str(tmp_path / "s"), []
    thread = serve_once(path, [{"pid": 4321}, {"exit": 7}], seen)
    monkeypatch.setenv(cs.ENV, path)
    monkeypatch.chdir(tmp_path)
    env = dict(os.environ)
    assert cs.run_cell(["--spec", "x"], entry="batchsearch") == 7
    thread.join()
    assert seen == [({"argv": ["--spec", "x"], "env": env, "cwd": str(tmp_path),
                      "interpreter": cs.interpreter(str(tmp_path)), "entry": "batchsearch"},
                     [(os.fstat(fd).st_dev, os.fstat(fd).st_ino) for fd in (0, 1, 2)])]
    killed = []
    monkeypatch.setattr(cs.os, "kill", lambda pid, number: killed.append((pid, number)))
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # the job stopped: the cell is stopped
        signal.getsignal(number)(number, None)
    assert killed == [(4321, signal.SIGINT), (4321, signal.SIGTERM), (4321, signal.SIGHUP)]


def test_run_cell_takes_the_env_it_is_given_and_train_by_default(tmp_path, signals):
    path, seen = str(tmp_path / "s"), []
    thread = serve_once(path, [{"pid": 1}, {"exit": 0}], seen)
    assert cs.run_cell([], {cs.ENV: path, "A": "b"}) == 0
    thread.join()
    assert seen[0][0]["env"] == {cs.ENV: path, "A": "b"}
    assert seen[0][0]["entry"] == "train"


@pytest.mark.parametrize(("replies", "result", "said"), [
    ([{"refused": "not today"}], None, "not today; starting a fresh interpreter"),
    ([], None, "the server closed the connection; starting a fresh interpreter"),
    ([{"pid": 99}], 1, "the cell server ended while cell process 99 ran (the cell was stopped with it)"),
])
def test_run_cell_when_the_server_refuses_or_ends(tmp_path, capsys, signals, replies, result, said):
    path = str(tmp_path / "s")
    thread = serve_once(path, replies, [])
    assert cs.run_cell([], {cs.ENV: path}) == result
    thread.join()
    assert capsys.readouterr().err == f"amprepro.plan.cellserver: {said}\n"


# ---- preloading --------------------------------------------------------------------------------------------------


def test_preload_keeps_what_imports_and_drops_every_module_a_failed_import_added(tmp_path, monkeypatch):
    (tmp_path / "cs_helper_mod.py").write_text("X = 1\n")
    (tmp_path / "cs_broken_mod.py").write_text("import cs_helper_mod\nraise RuntimeError('broken')\n")
    (tmp_path / "cs_good_mod.py").write_text("Y = 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(cs, "PRELOAD", ["cs_broken_mod", "cs_good_mod", "json", "cs_missing_mod"])
    try:
        assert cs.preload() == ["cs_good_mod", "json"]
        assert "cs_good_mod" in sys.modules
        assert "cs_broken_mod" not in sys.modules
        assert "cs_helper_mod" not in sys.modules
    finally:
        for name in ("cs_good_mod", "cs_helper_mod", "cs_broken_mod"):
            sys.modules.pop(name, None)


def test_preload_refuses_to_serve_when_an_import_started_cuda(monkeypatch):
    monkeypatch.setattr(cs, "PRELOAD", [])
    cuda = types.SimpleNamespace(is_initialized=lambda: True)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    with pytest.raises(SystemExit) as stopped:
        cs.preload()
    assert stopped.value.code == "a preloaded module started CUDA: a forked cell could not use the GPU"
    cuda.is_initialized = lambda: False
    assert cs.preload() == []


def test_preload_without_torch_is_fine(monkeypatch):
    monkeypatch.setattr(cs, "PRELOAD", [])
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert cs.preload() == []


# ---- the forked cell -------------------------------------------------------------------------------------------


@pytest.fixture
def cell(tmp_path, monkeypatch, signals):
    """become_cell's world: fake os calls, prctl, an entry module written here; returns what they saw."""
    seen = types.SimpleNamespace(prctl=[], dup2=[], closed=[], chdir=[], environ={"OLD": "1"}, entry=[])
    fake = FakeOs(getppid=lambda: 100, dup2=lambda fd, target: seen.dup2.append((fd, target)),
                  close=seen.closed.append, chdir=seen.chdir.append, environ=seen.environ,
                  cpu_count=lambda: 2)
    monkeypatch.setattr(cs, "os", fake)

    class Libc:
        def __init__(self, name, use_errno=False):
            seen.libc = (name, use_errno)

        def prctl(self, *args):
            seen.prctl.append(args)

    monkeypatch.setattr(cs.ctypes, "CDLL", Libc)
    code = (
        "import sys\ncalls = []\nbehaviour = ['return']\n"
        "def main(argv):\n"
        "    calls.append((list(argv), list(sys.argv)))\n"
        "    what = behaviour[0]\n"
        "    if what == 'return': return None\n"
        "    if what == 'code': return 5\n"
        "    if what == 'error': raise ValueError('boom')\n"
        "    raise SystemExit(what if what != 'none' else None)\n")
    (tmp_path / "cs_entry_mod.py").write_text(code)
    (tmp_path / "cs_other_mod.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(cs, "ENTRIES", {"train": "cs_entry_mod", "other": "cs_other_mod"})
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    import cs_entry_mod
    import cs_other_mod
    seen.module, seen.other = cs_entry_mod, cs_other_mod
    seen.server = cs.Server({}, {}, {"KMP_INIT": "1", "OLD": "from import"}, ["torch", "numpy"])
    yield seen
    sys.modules.pop("cs_entry_mod", None)
    sys.modules.pop("cs_other_mod", None)


def test_a_forked_cell_takes_the_jobs_files_folder_and_environment(cell, tmp_path):
    request = {"argv": ["--a", "1"], "env": {"JOB": "x", "OLD": "job"}, "cwd": str(tmp_path)}
    assert cs.become_cell(request, [7, 8, 9], 100, cell.server) == 0
    assert cell.libc == (None, True)
    assert cell.prctl == [(cs.PR_SET_PDEATHSIG, signal.SIGKILL)]
    assert cell.dup2 == [(7, 0), (8, 1), (9, 2)]
    assert cell.closed == [7, 8, 9]
    assert cell.chdir == [str(tmp_path)]
    assert cell.environ == {"KMP_INIT": "1", "OLD": "job", "JOB": "x", cs.ORIGIN_ENV: (
        "forked from amprepro.plan.cellserver pid 100 (threads as the server; preloaded: torch, numpy)")}
    module = cell.module
    assert module.calls == [(["--a", "1"], [module.__file__, "--a", "1"])]
    assert cell.other.calls == []
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
        assert signal.getsignal(number) == signal.SIG_DFL


@pytest.mark.parametrize(("behaviour", "code"), [("return", 0), ("code", 5), (3, 3), (0, 0), ("none", 0),
                                                 ("text", 1), ("error", 1)])
def test_a_forked_cell_gives_its_entrys_exit_code(cell, tmp_path, capsys, behaviour, code):
    cell.other.behaviour[0] = behaviour
    request = {"argv": ["o"], "env": {}, "cwd": str(tmp_path), "entry": "other"}
    assert cs.become_cell(request, [], 100, cell.server) == code
    assert (cell.module.calls, cell.other.calls) == ([], [(["o"], [cell.other.__file__, "o"])])
    err = capsys.readouterr().err
    assert ("ValueError: boom" in err) == (behaviour == "error")
    assert ("Traceback" in err) == (behaviour == "error")


def test_a_forked_cell_whose_server_is_gone_ends_at_once(cell, tmp_path):
    assert cs.become_cell({"argv": [], "env": {}, "cwd": str(tmp_path)}, [7], 99, cell.server) == 1
    assert cell.prctl == [(cs.PR_SET_PDEATHSIG, signal.SIGKILL)]
    assert (cell.dup2, cell.chdir, cell.module.calls) == ([], [], [])


def test_a_forked_cell_applies_the_jobs_thread_count(cell, tmp_path, monkeypatch):
    applied = []
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(set_num_threads=lambda n: applied.append(n)))
    monkeypatch.setitem(sys.modules, "threadpoolctl", types.SimpleNamespace(
        threadpool_limits=lambda limits: applied.append(limits)))
    request = {"argv": [], "env": {"OMP_NUM_THREADS": "3"}, "cwd": str(tmp_path)}
    assert cs.become_cell(request, [], 100, cell.server) == 0
    assert applied == [3, {"openmp": 3, "blas": 2}]  # BLAS at most the CPUs
    assert cell.environ[cs.ORIGIN_ENV] == (
        "forked from amprepro.plan.cellserver pid 100 (threads 3; preloaded: torch, numpy)")
    cs.os.cpu_count = lambda: None
    applied.clear()
    assert cs.become_cell({**request, "env": {"OMP_NUM_THREADS": "1"}}, [], 100, cell.server) == 0
    assert applied == [1, {"openmp": 1, "blas": 1}]


# ---- the server's side of one request ----------------------------------------------------------------------------


class Exited(Exception):
    pass


def request_pair(request, nfds=3):
    """The server's end of a connection that has the request (and nfds descriptors) waiting on it."""
    client, conn = socket.socketpair()
    fds = [os.open(os.devnull, os.O_RDONLY) for _ in range(nfds)]
    if request is None:
        client.close()
    else:
        cs.send_message(client, request, fds)
    for fd in fds:
        os.close(fd)
    return client, conn


GOOD = {"argv": ["--x"], "env": {}, "cwd": "/", "interpreter": {"prefix": "/p", "path": []}}
SERVER = cs.Server({"prefix": "/p", "path": []}, {}, {}, [])


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_fork_cell_forks_and_tells_the_client_the_pid(monkeypatch):
    monkeypatch.setattr(cs, "os", FakeOs(fork=lambda: 4242))
    client, conn = request_pair(GOOD)
    before = open_fds()
    assert cs.fork_cell(conn, None, {}, SERVER) == 4242
    assert open_fds() == before  # the job's three descriptors came and went: the server keeps none
    assert cs.receive_message(client) == ({"pid": 4242}, [])
    assert conn.gettimeout() is None


def test_fork_cell_refuses_and_says_why(monkeypatch):
    monkeypatch.setattr(cs, "os", FakeOs(fork=lambda: pytest.fail("forked")))
    client, conn = request_pair({**GOOD, "entry": "nope"})
    before = open_fds()
    assert cs.fork_cell(conn, None, {}, SERVER) is None
    assert open_fds() == before
    assert cs.receive_message(client) == (
        {"refused": "the server runs only train, batchsearch, notrun, sanity, peak, plan, apex_probe, not 'nope'"}, [])


@pytest.mark.parametrize("nfds", [0, 2])
def test_fork_cell_without_the_three_descriptors_serves_nothing(monkeypatch, nfds):
    monkeypatch.setattr(cs, "os", FakeOs(fork=lambda: pytest.fail("forked")))
    client, conn = request_pair(GOOD, nfds)
    before = open_fds()
    assert cs.fork_cell(conn, None, {}, SERVER) is None
    assert open_fds() == before
    client.close()
    assert cs.receive_message(conn) == (None, [])  # nothing was sent back


def test_fork_cell_of_a_closed_connection_serves_nothing(monkeypatch):
    monkeypatch.setattr(cs, "os", FakeOs(fork=lambda: pytest.fail("forked")))
    _, conn = request_pair(None)
    assert cs.fork_cell(conn, None, {}, SERVER) is None


def test_the_forked_child_closes_the_servers_sockets_and_exits_with_the_cells_code(monkeypatch):
    exits = []

    def exit_(code):
        exits.append(code)
        raise Exited

    monkeypatch.setattr(cs, "os", FakeOs(fork=lambda: 0, _exit=exit_, getpid=lambda: 100))
    ran = []
    monkeypatch.setattr(cs, "become_cell", lambda request, fds, pid, server: ran.append((request, len(fds), pid,
                                                                                       server)) or 6)
    listener, other = socket.socket(socket.AF_UNIX), socket.socket(socket.AF_UNIX)
    _, conn = request_pair(GOOD)
    with pytest.raises(Exited):
        cs.fork_cell(conn, listener, {other: 5}, SERVER)
    assert exits == [6]
    assert ran == [(GOOD, 3, 100, SERVER)]
    assert listener.fileno() == other.fileno() == conn.fileno() == -1  # closed in the child


def test_the_forked_child_exits_1_when_the_cell_cannot_start(monkeypatch, capsys):
    exits = []

    def exit_(code):
        exits.append(code)
        raise Exited

    def broken(*args):
        raise RuntimeError("no")

    monkeypatch.setattr(cs, "os", FakeOs(fork=lambda: 0, _exit=exit_))
    monkeypatch.setattr(cs, "become_cell", broken)
    _, conn = request_pair(GOOD)
    with pytest.raises(Exited):
        cs.fork_cell(conn, socket.socket(socket.AF_UNIX), {}, SERVER)
    assert exits == [1]
    assert "RuntimeError: no" in capsys.readouterr().err  # the job's log says why


# ---- reaping, killing --------------------------------------------------------------------------------------------


def test_reap_sends_each_ended_cells_exit_code_to_its_client(monkeypatch):
    ended = [(11, 3 << 8), (12, signal.SIGKILL), (13, 0), (15, 0), (0, 0)]
    monkeypatch.setattr(cs, "os", FakeOs(waitpid=lambda pid, options: (pid, options) == (-1, os.WNOHANG)
                                         and ended.pop(0)))
    pairs = {pid: socket.socketpair() for pid in (11, 12, 13, 14, 15)}
    for client, _ in pairs.values():
        client.settimeout(5)
    clients = {conn: pid for pid, (_, conn) in pairs.items()}
    pairs[13][0].close()  # that client is gone: its code cannot be sent, the others still are
    cs.reap(clients)
    assert cs.receive_message(pairs[11][0]) == ({"exit": 3}, [])
    assert cs.receive_message(pairs[12][0]) == ({"exit": 128 + signal.SIGKILL}, [])
    assert cs.receive_message(pairs[15][0]) == ({"exit": 0}, [])
    assert list(clients.values()) == [14]
    assert pairs[11][1].fileno() == pairs[13][1].fileno() == -1
    assert ended == []


def test_reap_stops_when_there_is_no_child(monkeypatch):
    def no_child(*args):
        raise ChildProcessError

    monkeypatch.setattr(cs, "os", FakeOs(waitpid=no_child))
    clients = {"c": 1}
    cs.reap(clients)
    assert clients == {"c": 1}


def test_kill_sends_sigkill_and_ignores_a_process_already_gone(monkeypatch):
    sent = []

    def kill(pid, number):
        sent.append((pid, number))
        if pid == 2:
            raise ProcessLookupError

    monkeypatch.setattr(cs, "os", FakeOs(kill=kill))
    cs.kill(1)
    cs.kill(2)
    assert sent == [(1, signal.SIGKILL), (2, signal.SIGKILL)]


# ---- the server loop ---------------------------------------------------------------------------------------------


def test_serve_preloads_serves_ends_the_cell_of_a_client_gone_and_stops_with_its_parent(tmp_path, monkeypatch,
                                                                                          capsys):
    stop = threading.Event()
    monkeypatch.setattr(cs, "os", FakeOs(getppid=lambda: 2 if stop.is_set() else 1))
    monkeypatch.delenv("PYTORCH_NVML_BASED_CUDA_CHECK", raising=False)
    monkeypatch.delenv("TORCH_ADDED", raising=False)

    def preload():
        os.environ["TORCH_ADDED"] = "yes"
        return ["a", "b"]

    forked, killed, reaped, served_by = [], [], [], []

    def fork_cell(conn, listener, clients, server):
        request, _ = cs.receive_message(conn)
        forked.append((request, server))
        served_by.append((listener.getsockname(), sorted(clients.values())))
        if request.get("fail"):
            raise KeyError("argv")
        return None if request.get("none") else 500 + len(forked)

    monkeypatch.setattr(cs, "preload", preload)
    monkeypatch.setattr(cs, "fork_cell", fork_cell)
    monkeypatch.setattr(cs, "kill", killed.append)
    def reap(clients):
        reaped.append(dict(clients))
        for conn, pid in list(clients.items()):
            if pid in killed:  # as the real reap does once the killed cell has ended
                conn.close()
                del clients[conn]

    monkeypatch.setattr(cs, "reap", reap)
    monkeypatch.chdir(tmp_path)
    env_before = dict(os.environ)
    path = str(tmp_path / "sock")
    server = threading.Thread(target=cs.serve, args=(path,), daemon=True)
    server.start()
    try:
        wait_for(lambda: os.path.exists(path))
        first = socket.socket(socket.AF_UNIX)
        first.connect(path)
        cs.send_message(first, {"n": 1})
        wait_for(lambda: len(forked) >= 1)
        for extra in ({"fail": True}, {"none": True}):
            client = socket.socket(socket.AF_UNIX)
            client.settimeout(5)
            client.connect(path)
            cs.send_message(client, extra)
            assert client.recv(10) == b""  # that connection closed by the server
        second = socket.socket(socket.AF_UNIX)
        second.connect(path)
        cs.send_message(second, {"n": 2})
        wait_for(lambda: len(forked) >= 4)
        first.close()  # its job was killed: the server kills its cell
        wait_for(lambda: killed)
        assert killed == [501]
    finally:
        stop.set()
        server.join(10)
    assert not server.is_alive()
    assert killed == [501, 504]  # the cells still running when the server stops
    assert os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] == "1"
    first_request, served = forked[0]
    assert first_request == {"n": 1}
    assert served_by == [(path, []), (path, [501]), (path, [501]), (path, [501])]
    assert served == cs.Server(cs.interpreter(str(tmp_path)), env_before, {"TORCH_ADDED": "yes"}, ["a", "b"])
    assert reaped  # after every pass of the loop
    err = capsys.readouterr().err
    assert "amprepro.plan.cellserver: ready: 2 modules preloaded (a, b)\n" in err
    assert ("amprepro.plan.cellserver: a request could not be served (KeyError('argv')); its job starts a fresh "
            "interpreter\n") in err
    second.close()


def test_serve_keeps_a_cuda_check_setting_the_job_gave(tmp_path, monkeypatch):
    monkeypatch.setattr(cs, "os", FakeOs(getppid=iter([1, 2, 2, 2]).__next__))
    monkeypatch.setenv("PYTORCH_NVML_BASED_CUDA_CHECK", "0")
    monkeypatch.setattr(cs, "preload", lambda: [])
    cs.serve(str(tmp_path / "sock"))
    assert os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] == "0"


# ---- start, stop, main -------------------------------------------------------------------------------------------


class FakeProcess:
    def __init__(self, args, env, cwd, stdin, exits=None, makes_socket=True):
        self.args, self.env, self.cwd, self.stdin, self.exits = args, env, cwd, stdin, exits
        self.calls = []
        if makes_socket:
            open(args[-1], "w").close()

    def poll(self):
        return self.exits

    def terminate(self):
        self.calls.append("terminate")

    def kill(self):
        self.calls.append("kill")

    def wait(self, timeout=None):
        self.calls.append(("wait", timeout))
        if timeout is not None and getattr(self, "hangs", False):
            raise subprocess.TimeoutExpired("server", timeout)


def test_start_runs_the_server_on_a_socket_in_a_private_folder(monkeypatch, tmp_path):
    monkeypatch.setattr(cs, "time", Clock())
    monkeypatch.setattr(cs.subprocess, "Popen", FakeProcess)
    process, path = cs.start({"A": "1"}, str(tmp_path))
    assert process.args == [sys.executable, "-m", "amprepro.plan.cellserver", "--socket", path]
    assert (process.env, process.cwd, process.stdin) == ({"A": "1"}, str(tmp_path), subprocess.DEVNULL)
    folder = os.path.dirname(path)
    assert os.path.basename(path) == "socket"
    assert os.path.basename(folder).startswith("amprepro-cells-")
    assert os.stat(folder).st_mode & 0o777 == 0o700
    cs.stop(process, path)
    assert process.calls == ["terminate", ("wait", 10)]
    assert not os.path.exists(folder)


def test_start_does_not_wait_for_a_server_that_ended(monkeypatch, tmp_path):
    clock = Clock()
    monkeypatch.setattr(cs, "time", clock)
    monkeypatch.setattr(cs.subprocess, "Popen", lambda *a, **k: FakeProcess(*a, **k, exits=1, makes_socket=False))
    process, path = cs.start({}, str(tmp_path))
    assert clock.sleeps == []
    assert not os.path.exists(path)
    cs.stop(process, path)


def test_start_with_fresh_cells_asked_for_starts_nothing(monkeypatch):
    monkeypatch.setattr(cs, "time", Clock())
    monkeypatch.setattr(cs.subprocess, "Popen", lambda *a, **k: pytest.fail("started"))
    assert cs.start({"AMPREPRO_FRESH_CELLS": "1"}, "/") is None
    monkeypatch.setattr(cs.subprocess, "Popen", FakeProcess)
    process, path = cs.start({"AMPREPRO_FRESH_CELLS": "0"}, "/")
    cs.stop(process, path)


def test_stop_of_a_server_whose_folder_is_gone_is_quiet(tmp_path):
    process = FakeProcess(["x", str(tmp_path / "s")], {}, "/", None)
    cs.stop(process, str(tmp_path / "gone" / "socket"))
    assert process.calls == ["terminate", ("wait", 10)]


def test_stop_kills_a_server_that_does_not_end(tmp_path):
    process = FakeProcess(["x", str(tmp_path / "s")], {}, "/", None)
    process.hangs = True
    (tmp_path / "keep").mkdir()
    cs.stop(process, str(tmp_path / "keep" / "s"))
    assert process.calls == ["terminate", ("wait", 10), "kill", ("wait", None)]
    assert not (tmp_path / "keep").exists()


def test_main_serves_the_socket_and_ends_on_sigterm(monkeypatch, signals):
    served, prctl = [], []
    monkeypatch.setattr(cs, "serve", served.append)
    monkeypatch.setattr(cs.ctypes, "CDLL", lambda name: types.SimpleNamespace(prctl=lambda *a: prctl.append(a)))
    cs.main(["--socket", "/tmp/x"])
    assert served == ["/tmp/x"]
    assert prctl == [(cs.PR_SET_PDEATHSIG, signal.SIGTERM)]
    with pytest.raises(SystemExit) as ended:
        signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)
    assert ended.value.code == 0


def test_main_needs_the_socket(capsys):
    with pytest.raises(SystemExit) as ended:
        cs.main([])
    assert ended.value.code == 2
    assert "the following arguments are required: --socket" in capsys.readouterr().err


def test_main_help_is_the_modules_docstring(capsys):
    with pytest.raises(SystemExit):
        cs.main(["--help"])
    out = capsys.readouterr().out
    assert cs.__doc__.splitlines()[0] in out
    assert " ".join(out.split()).endswith("--socket SOCKET Unix socket path (its folder should be private: 0700)")


def test_the_protocol_is_json_after_a_four_byte_length():
    left, right = socket.socketpair()
    cs.send_message(left, {"k": "v"})
    data = right.recv(100)
    assert data == len(json.dumps({"k": "v"})).to_bytes(4, "big") + b'{"k": "v"}'
    left.close()
    right.close()


class Clock:
    """cellserver's `time`: monotonic seconds that pass only by its sleeps."""

    def __init__(self):
        self.now, self.sleeps = 1000.0, []

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += 1 / 32  # exact in binary: the 30 s deadline is reached exactly, after 960 sleeps


def test_start_waits_for_the_socket_in_steps_of_50_ms_for_at_most_30_s(monkeypatch, tmp_path):
    clock = Clock()
    monkeypatch.setattr(cs, "time", clock)
    monkeypatch.setattr(cs.subprocess, "Popen", lambda *a, **k: FakeProcess(*a, **k, makes_socket=False))
    process, path = cs.start({}, str(tmp_path))
    assert not os.path.exists(path)
    assert clock.sleeps == [0.05] * 960  # until the deadline, not a check more
    cs.stop(process, path)
    clock.sleeps.clear()
    monkeypatch.setattr(cs.subprocess, "Popen", FakeProcess)
    process, path = cs.start({}, str(tmp_path))
    assert clock.sleeps == []  # the socket is there: no wait
    cs.stop(process, path)


class RecordingSocket(socket.socket):
    def settimeout(self, value):
        self.timeouts = [*getattr(self, "timeouts", []), value]
        super().settimeout(value)


def test_fork_cell_gives_a_request_30_s_then_none(monkeypatch):
    monkeypatch.setattr(cs, "os", FakeOs(fork=lambda: 7))
    _, conn = request_pair(GOOD)
    conn = RecordingSocket(fileno=conn.detach())
    assert cs.fork_cell(conn, None, {}, SERVER) == 7
    assert conn.timeouts == [30, None]


def test_fork_cell_takes_three_descriptors_of_a_client_that_sends_more(monkeypatch):
    monkeypatch.setattr(cs, "os", FakeOs(fork=lambda: 8))
    client, conn = request_pair(GOOD, nfds=4)
    assert cs.fork_cell(conn, None, {}, SERVER) == 8
    assert cs.receive_message(client) == ({"pid": 8}, [])

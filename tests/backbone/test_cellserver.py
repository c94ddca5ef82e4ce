"""amprepro.plan.cellserver: a cell forked from the preloaded server is its own process with the job's output files,
directory and environment, gives the numbers a fresh interpreter gives, passes its exit code on, and never outlives
its job or the server; a job the server cannot serve faithfully starts a fresh interpreter."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from amprepro.plan import cellserver
from workflow_testing import REPO

PYTHONPATH = str(REPO / "workflow")


def cell_spec(steps: int) -> str:
    return json.dumps({"model": "cnn", "precision": "fp32", "seed": 3,
                       "model_config": {"arch": "small_cnn", "data": "digits", "batch_size": 32},
                       "train": {"steps": steps, "warmup_steps": 2, "lr": 0.002, "optimizer": "adamw",
                                 "weight_decay": 0.0, "deterministic": False}})


def launcher(steps: int, out: Path, name: str) -> list[str]:
    """The train rule's command after gpuslots (a one-process cell on the CPU)."""
    return [sys.executable, "-m", "amprepro.plan.launcher", "--per-node", "1", "--device", "cpu", "--",
            "--spec", cell_spec(steps), "--metrics", str(out / f"{name}.json"), "--steps", str(out / f"{name}.csv")]


@pytest.fixture
def env(monkeypatch) -> dict:
    monkeypatch.delenv(cellserver.ENV, raising=False)
    monkeypatch.delenv("AMPREPRO_FRESH_CELLS", raising=False)
    return {**os.environ, "PYTHONPATH": PYTHONPATH}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One server for this module's cells, as one run's cells share one (a server imports torch and the model
    libraries: seconds of a 2-core machine for each test otherwise). The tests that end a server start their own."""
    env = {k: v for k, v in os.environ.items()  # thread counts of the caller's shell would size its pools
           if k not in (cellserver.ENV, "AMPREPRO_FRESH_CELLS", *cellserver.THREAD_VARS)}
    started = cellserver.start({**env, "PYTHONPATH": PYTHONPATH}, str(tmp_path_factory.mktemp("cellserver")))
    assert started is not None
    yield started
    assert started[0].poll() is None, "a test ended the shared server"
    cellserver.stop(*started)
    assert not Path(started[1]).parent.exists()


def losses(path: Path) -> list[str]:
    return [row["loss"] for row in csv.DictReader(path.open())]


def test_a_forked_cell_writes_what_a_fresh_interpreter_writes(env, server, tmp_path):
    job_env = {**env, cellserver.ENV: server[1]}
    log = tmp_path / "job.log"
    with log.open("w") as output:
        forked = subprocess.run(launcher(12, tmp_path, "forked"), env=job_env, cwd=tmp_path, stdout=output,
                                stderr=subprocess.STDOUT, timeout=300)
    assert forked.returncode == 0, log.read_text()[-3000:]
    fresh = subprocess.run(launcher(12, tmp_path, "fresh"), env=env, cwd=tmp_path, capture_output=True, text=True,
                           timeout=300)
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    assert losses(tmp_path / "forked.csv") == losses(tmp_path / "fresh.csv")  # same data order, same numbers
    metrics = json.loads((tmp_path / "forked.json").read_text())
    assert metrics["process"].startswith(f"forked from amprepro.plan.cellserver pid {server[0].pid}")
    assert "torch" in metrics["process"]
    assert json.loads((tmp_path / "fresh.json").read_text())["process"] == "a fresh interpreter"
    assert "cnn/fp32/seed3: ok" in log.read_text()  # the cell's stdout went to the job's own log
    assert "starting a fresh interpreter" not in log.read_text()


def test_the_exit_code_and_the_traceback_reach_the_job(env, server, tmp_path):
    broken = launcher(5, tmp_path, "broken")
    broken[broken.index("--spec") + 1] = json.dumps({"model": "cnn"})  # no precision: train.py raises KeyError
    done = subprocess.run(broken, env={**env, cellserver.ENV: server[1]}, cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 1
    assert "KeyError: 'precision'" in done.stderr and "Traceback" in done.stderr
    assert "starting a fresh interpreter" not in done.stderr
    assert not (tmp_path / "broken.json").exists()


# One thread: OpenBLAS caps its pool at the CPUs, so on CI's 2 cores a larger count would look like the default.
SNAKEMAKE_THREADS = {name: "1" for name in ("OMP_NUM_THREADS", "GOTO_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                              "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")}


def test_the_thread_counts_snakemake_sets_for_each_job_are_applied_in_the_cell(env, server, tmp_path):
    """Snakemake sets OMP_NUM_THREADS & co. to each job's threads; a fresh interpreter sizes its pools from them."""
    done = subprocess.run(launcher(4, tmp_path, "threads"),
                          env={**env, cellserver.ENV: server[1], **SNAKEMAKE_THREADS}, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "starting a fresh interpreter" not in done.stderr
    forked = json.loads((tmp_path / "threads.json").read_text())
    assert "(threads 1;" in forked["process"]
    fresh = subprocess.run(launcher(4, tmp_path, "fresh3"), env={**env, **SNAKEMAKE_THREADS}, cwd=tmp_path,
                           capture_output=True, text=True, timeout=300)
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    pools = json.loads((tmp_path / "fresh3.json").read_text())["host_threads"]
    assert any(pool.startswith("blas:") and pool.endswith("=1") for pool in pools["pools"]), pools
    if (os.cpu_count() or 1) > 1:  # and without the settings, a forked cell has the server's own, larger pool
        unset = {k: v for k, v in env.items() if k not in cellserver.THREAD_VARS}
        plain = subprocess.run(launcher(4, tmp_path, "plain"), env={**unset, cellserver.ENV: server[1]}, cwd=tmp_path,
                               capture_output=True, text=True, timeout=300)
        assert plain.returncode == 0, plain.stderr[-3000:]
        plain_pools = json.loads((tmp_path / "plain.json").read_text())["host_threads"]["pools"]
        assert any(pool.startswith("blas:") and not pool.endswith("=1") for pool in plain_pools), plain_pools
    assert forked["host_threads"] == pools  # every pool sized as a fresh interpreter sizes it


@pytest.mark.parametrize("setting", [{"TORCH_SHOW_CPP_STACKTRACES": "1"}, {"PYTORCH_JIT": "0"},
                                     {**SNAKEMAKE_THREADS, "MKL_NUM_THREADS": "2"}])
def test_a_job_with_other_import_time_settings_starts_a_fresh_interpreter(env, server, tmp_path, setting):
    done = subprocess.run(launcher(4, tmp_path, "other"), env={**env, cellserver.ENV: server[1], **setting},
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert ("import-time settings differ from the server's" in done.stderr
            or "thread settings are not one whole number" in done.stderr), done.stderr[-3000:]
    assert json.loads((tmp_path / "other.json").read_text())["process"] == "a fresh interpreter"


def test_no_server_or_a_dead_one_means_a_fresh_interpreter(env, tmp_path):
    assert cellserver.run_cell(["--help"], env) is None
    done = subprocess.run(launcher(4, tmp_path, "nosrv"), env={**env, cellserver.ENV: str(tmp_path / "gone")},
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "no cell server at" in done.stderr, done.stderr[-3000:]
    assert cellserver.start({**env, "AMPREPRO_FRESH_CELLS": "1"}, str(tmp_path)) is None


def pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


def forked_cell_of(server_pid: int, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    parent = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
                except (OSError, ValueError):
                    continue
                if parent == server_pid and pid_alive(int(entry.name)):
                    return int(entry.name)
        time.sleep(0.1)
    raise AssertionError("no cell was forked")


def wait_gone(pid: int, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_a_killed_job_takes_its_cell_with_it(env, server, tmp_path):
    job = subprocess.Popen(launcher(100_000, tmp_path, "long"), env={**env, cellserver.ENV: server[1]},
                           cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cell = forked_cell_of(server[0].pid)
    job.send_signal(signal.SIGKILL)  # as Snakemake's process group dies: nothing can forward a signal
    job.wait()
    assert wait_gone(cell), "the forked cell outlived its killed job"
    assert server[0].poll() is None  # the server goes on for the next cells


def test_a_stopped_job_stops_its_cell_and_says_how(env, server, tmp_path):
    job = subprocess.Popen(launcher(100_000, tmp_path, "stopped"), env={**env, cellserver.ENV: server[1]},
                           cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cell = forked_cell_of(server[0].pid)
    job.send_signal(signal.SIGTERM)  # Snakemake stopping a job: forwarded to the cell
    assert job.wait(timeout=30) == 128 + signal.SIGTERM
    assert wait_gone(cell)


def test_the_cells_end_with_the_server(env, tmp_path):
    process, path = cellserver.start(env, str(tmp_path))
    job = subprocess.Popen(launcher(100_000, tmp_path, "orphan"), env={**env, cellserver.ENV: path}, cwd=tmp_path,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    cell = forked_cell_of(process.pid)
    process.kill()  # the launcher's run killed with SIGKILL: the server dies with it (its own death signal)
    process.wait()
    assert wait_gone(cell), "a forked cell outlived the server"
    assert job.wait(timeout=30) == 1
    assert "the cell server ended while cell process" in job.stderr.read()
    cellserver.stop(process, path)


def test_a_malformed_request_leaves_the_server_and_its_cells_running(env, server, tmp_path):
    import socket

    job = subprocess.Popen(launcher(100_000, tmp_path, "busy"), env={**env, cellserver.ENV: server[1]},
                           cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cell = forked_cell_of(server[0].pid)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as bad:
        bad.connect(server[1])
        bad.sendall(cellserver.HEADER.pack(5) + b"{nope")
        assert bad.recv(100) == b""  # closed, no answer
    time.sleep(0.5)
    assert server[0].poll() is None and pid_alive(cell)
    job.kill()
    job.wait()
    assert wait_gone(cell)


@pytest.mark.parametrize("message", [b"{nope", json.dumps({"argv": [], "env": {}, "cwd": "/"}).encode()])
def test_a_request_the_server_cannot_serve_leaves_it_none_of_the_jobs_descriptors(server, tmp_path, message):
    """A malformed request, or one whose check raises (no interpreter given), with a staged cell's GPU lock file among
    its descriptors: the server must keep no copy, or a lock later taken through that open file would outlive the
    job and hold every GPU job after it."""
    import fcntl
    import socket

    from amprepro import gpuslots

    lock = tmp_path / "gpu0.lock"
    fd = gpuslots.open_lock(lock)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as bad:
        bad.connect(server[1])
        socket.send_fds(bad, [cellserver.HEADER.pack(len(message)) + message], [0, 1, 2, fd])
        assert bad.recv(100) == b""  # closed, no answer
    assert server[0].poll() is None
    fcntl.flock(fd, fcntl.LOCK_EX)  # the job's cell, in a fresh interpreter, locks the same open file
    os.close(fd)  # and ends
    other = gpuslots.open_lock(lock)
    try:
        assert gpuslots.lock_nb(other, fcntl.LOCK_EX), "the server kept the job's GPU lock file open"
    finally:
        os.close(other)


def test_a_largest_batch_search_forks_from_the_server_too_and_only_known_entries_run(env, server, tmp_path):
    cell = tmp_path / "cell.json"
    cell.write_text(json.dumps({"status": "ok"}))
    out = tmp_path / "search.json"
    command = [sys.executable, "-m", "amprepro.plan.launcher", "--per-node", "1", "--nodes", "1", "--device", "cuda",
               "--entry", "batchsearch", "--", "--spec", cell_spec(2), "--cell", str(cell), "--out", str(out)]
    done = subprocess.run(command, env={**env, cellserver.ENV: server[1]}, cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "starting a fresh interpreter" not in done.stderr
    record = json.loads(out.read_text())  # this machine has no GPU: the search says so instead of guessing
    assert record["status"] == "skipped" and "no CUDA GPU" in record["reason"]
    refused = cellserver.refusal({"entry": "os.system", "interpreter": {}, "env": {}},
                                 cellserver.Server({}, {}, {}, []))
    assert refused.startswith("the server runs only train, batchsearch, notrun")


def test_the_apex_checks_fork_from_the_server_and_start_fresh_without_one(env, server, tmp_path):
    """amprepro.env.apexbuild.verify's probes (one per opt level, as the apex and apex_shell rules run them): forked
    from the server where the job has one, a fresh interpreter where not, the same checks either way. A stand-in
    site dir: an apex package and one extension module (the GPU checks are tests/gpu's)."""
    from amprepro.env.apexbuild.verify import run_groups

    site = tmp_path / "site"
    (site / "apex").mkdir(parents=True)
    (site / "apex" / "__init__.py").write_text("")
    (site / "fused_ext.py").write_text("")
    for job_env, process in (({**env, cellserver.ENV: server[1]}, "forked from amprepro.plan.cellserver pid "),
                             (env, "a fresh interpreter")):
        checks, gpu = run_groups([["imports"], ["absent"]], site, ["fused_ext"], job_env, absent=["amp_C"])
        imports, absent = checks["imports"], checks["absent"]  # one probe each, side by side
        assert imports["ok"] is True and imports["apex_file"] == str(site / "apex" / "__init__.py"), imports
        assert imports["extensions"]["fused_ext"]["importable"] is True and gpu is None
        assert absent["ok"] is True and absent["extensions"]["amp_C"]["importable"] is False, absent
        assert imports["process"].startswith(process) and absent["process"].startswith(process), checks


def test_a_cell_short_of_gpus_is_written_as_skipped_by_a_forked_child(env, server, tmp_path):
    """The launcher's not-started record (a 2-GPU cell that sees none) comes from a child of the server, with no fresh
    import of torch, and says the same as one written without a server."""
    (tmp_path / "apex.json").write_text(json.dumps({"status": "skipped", "reason": "test"}))
    records = {}
    for how, extra in (("forked", {cellserver.ENV: server[1]}), ("fresh", {})):
        out = tmp_path / how
        command = [sys.executable, "-m", "amprepro.plan.launcher", "--per-node", "2", "--device", "cuda", "--",
                   "--spec", cell_spec(2), "--apex", str(tmp_path / "apex.json"),
                   "--metrics", str(out / "metrics.json"), "--steps", str(out / "steps.csv")]
        done = subprocess.run(command, env={**env, "CUDA_VISIBLE_DEVICES": "", **extra}, cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "starting a fresh interpreter" not in done.stderr
        records[how] = json.loads((out / "metrics.json").read_text())
    forked, fresh = records["forked"], records["fresh"]
    assert (forked["status"], forked["skip_cause"], forked["skip_needs"]) == ("skipped", "machine", "2 GPUs")
    assert forked["reason"] == fresh["reason"] == (
        "this cell asks for 2 GPU(s) per node; this job sees 0 (CUDA_VISIBLE_DEVICES=)")
    assert "forked from amprepro.plan.cellserver" in json.dumps(forked) and "forked from" not in json.dumps(fresh)


def test_a_one_process_job_runs_its_entry_without_a_server_and_refuses_an_unknown_one(tmp_path):
    """`python -m amprepro.plan.cellserver --run ENTRY -- ARGS` (sanity, peak, plan): with no server announced, the
    entry runs in this process's fresh interpreter; an entry the server does not run is refused, naming them."""
    env = {k: v for k, v in os.environ.items() if k != cellserver.ENV} | {"PYTHONPATH": PYTHONPATH}
    out = tmp_path / "peak.json"
    done = subprocess.run([sys.executable, "-m", "amprepro.plan.cellserver", "--run", "peak", "--", "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text())["status"] in ("ok", "skipped")
    refused = subprocess.run([sys.executable, "-m", "amprepro.plan.cellserver", "--run", "evil", "--", "x"],
                             env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "ENTRY is one of train, batchsearch, notrun, sanity, peak, plan" in \
        refused.stderr


def test_the_server_removes_its_socket_folder_when_the_launcher_dies(env, tmp_path, request):
    """A launcher killed with SIGKILL (even while the server still imports): the server, ended by its death signal,
    leaves no socket or folder in the temporary directory."""
    tmp = Path(tempfile.mkdtemp(prefix="cs-", dir="/tmp"))  # short: a Unix socket's path holds at most 107 bytes
    request.addfinalizer(lambda: shutil.rmtree(tmp, ignore_errors=True))
    script = ("import sys; from amprepro.plan import cellserver; "
              "process, path = cellserver.start(dict(__import__('os').environ), sys.argv[1]); "
              "print(path, process.pid, flush=True); __import__('time').sleep(600)")
    launcher_process = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE,
                                        text=True, env={**env, "PYTHONPATH": PYTHONPATH, "TMPDIR": str(tmp)})
    path, pid = launcher_process.stdout.readline().split()
    assert Path(path).parent.parent == tmp and Path(path).exists()
    launcher_process.kill()
    launcher_process.wait()
    assert wait_gone(int(pid)), "the server outlived its launcher"
    assert list(tmp.iterdir()) == [], "the server left its socket folder"


@pytest.mark.parametrize("forked", [True, False])
def test_a_staged_cell_gets_its_gpus_lock_file_and_waits_for_it_after_its_build(env, server, tmp_path, forked):
    """Issue 40: a train job started with gpuslots --defer where make run stages cells. Its cell, forked from the
    server (which gets the lock file's descriptor with the job's stdio) or a fresh interpreter (which inherits it),
    builds its model, then waits for the job that holds the GPU, and trains as a cell that had it free does."""
    from amprepro import gpuslots

    locks = tmp_path / "locks"
    job_env = {**env, "AMPREPRO_GPU_LOCKS": str(locks), "AMPREPRO_GPU_COUNT": "1", gpuslots.STAGE_ENV: "1",
               **({cellserver.ENV: server[1]} if forked else {})}
    locks.mkdir()
    holder = gpuslots.open_lock(locks / "gpu0.lock")
    assert gpuslots.lock_nb(holder, gpuslots.fcntl.LOCK_EX)  # the cell before it, still training
    job = subprocess.Popen([sys.executable, "-m", "amprepro.gpuslots", "--gpus", "1", "--defer", "--",
                            *launcher(6, tmp_path, "staged")], env=job_env, cwd=tmp_path, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    said = []
    for line in job.stdout:  # the cell built its model and now waits for the GPU
        said.append(line)
        if "waiting for GPU 0 (the cell before this one)" in line:
            break
    time.sleep(1)
    os.close(holder)  # the cell before ends
    out = "".join(said) + job.communicate(timeout=300)[0]
    assert job.returncode == 0, out[-3000:]
    assert "waiting for GPU 0 (the cell before this one)" in out and "starting a fresh interpreter" not in out
    metrics = json.loads((tmp_path / "staged.json").read_text())
    phases = metrics["phase_seconds"]
    assert "staged_build" in phases and phases["gpu_wait"] >= 1.0, phases
    assert metrics["process"].startswith("forked") == forked
    plain = subprocess.run(launcher(6, tmp_path, "plain"), env=env, cwd=tmp_path, capture_output=True, text=True,
                           timeout=300)
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert losses(tmp_path / "staged.csv") == losses(tmp_path / "plain.csv")

"""amprepro.env.launch, what `make run` and `make verify` start: the command line it builds, the live-run refusal, the
removal of a dead run's lock, and real SIGKILLs of `make run` at every stage followed by a plain `make run`."""

from __future__ import annotations

import csv
import io
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from base64 import urlsafe_b64encode
from pathlib import Path

import pytest
from snakemake.cli import get_argument_parser

from amprepro import gpuslots
from amprepro.env import launch, launchargs, runlock
from amprepro.plan import resources
from workflow_testing import HOLD_SOURCE, REPO, SNAKEMAKE, copy_workflow, hold_env, job_env

# Its output is there while the job still runs: killed then, the output is incomplete for Snakemake.
SLEEPING_SNAKEFILE = textwrap.dedent("""\
    rule slow:
        output: "slow.txt"
        shell: "echo started > {output} && sleep $(cat pause) && echo done > {output}"
""")
VENV = Path(sys.executable).parent.parent
LAUNCHER_ENV = ("CORES", "SNAKEMAKE_ARGS", "AMPREPRO_GPU_COUNT", "AMPREPRO_GPU_LISTING", "AMPREPRO_STAGE_CELLS",
                "CUDA_VISIBLE_DEVICES", "MAKEFLAGS", "MFLAGS", "MAKELEVEL")


@pytest.fixture
def env(monkeypatch, tmp_path) -> dict:
    """os.environ without launcher settings, with an nvidia-smi on PATH that lists no GPU (as on a CPU box)."""
    for name in LAUNCHER_ENV:
        monkeypatch.delenv(name, raising=False)
    fake_nvidia_smi(tmp_path / "bin", gpus=0)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    return dict(os.environ)


def fake_nvidia_smi(folder: Path, gpus: int) -> Path:
    """An nvidia-smi in `folder` that lists `gpus` H200s (none: it fails, as on a CPU box) and counts its calls: one
    line each in the file returned."""
    folder.mkdir(parents=True, exist_ok=True)
    calls = folder / "calls"
    lines = "".join(f"echo 'GPU {i}: NVIDIA H200 (UUID: GPU-{i:08d})'\n" for i in range(gpus))
    script = folder / "nvidia-smi"
    script.write_text(f"#!/bin/sh\necho called >> '{calls}'\n"
                      + (lines if gpus else "echo 'NVIDIA-SMI has failed' >&2\nexit 9\n"))
    script.chmod(0o755)
    return calls


def parsed(command: list[str]):
    """The command as Snakemake itself reads it."""
    assert command[:3] == [sys.executable, "-m", "snakemake"]
    return get_argument_parser().parse_args(command[3:])


# ---- the command line ------------------------------------------------------------------------------------------


def test_cores_default_to_every_usable_core_and_incomplete_outputs_rerun(env):
    command, said = launchargs.snakemake_command([], env)
    args = parsed(command)
    assert args.cores == len(os.sched_getaffinity(0))
    assert args.rerun_incomplete
    assert f"{args.cores} cores (all usable)" in said and "no GPU" in said
    assert args.resources == {}


@pytest.mark.parametrize("cores", ["8", "all"])
def test_cores_setting_is_used(env, cores):
    command, _ = launchargs.snakemake_command(["verify"], {**env, "CORES": cores})
    args = parsed(command)
    assert str(args.cores) == cores or (cores == "all" and args.cores == len(os.sched_getaffinity(0)))
    assert args.targets == ["verify"]


@pytest.mark.parametrize("cores", ["0", "-1", "8; rm -rf ~", "four"])
def test_a_bad_cores_setting_is_refused_with_the_fix(env, cores):
    with pytest.raises(launchargs.SettingError,
                       match=r"CORES=.* is not a whole number above 0 or 'all'; e\.g\. make run"):
        launchargs.snakemake_command([], {**env, "CORES": cores})


def test_gpus_nvidia_smi_lists_become_the_gpu_resource(env, tmp_path):
    fake_nvidia_smi(tmp_path / "bin", gpus=2)
    command, said = launchargs.snakemake_command([], env)
    assert parsed(command).resources["gpu"].value == 2
    assert "2 GPU(s) (nvidia-smi -L)" in said


@pytest.mark.parametrize("args, listed", [("", True), ("--use-conda", True), ("--executor slurm", False),
                                          ("--workflow-profile profiles/slurm", False), ("--sdm apptainer", False)])
def test_the_gpu_listing_goes_to_jobs_that_see_this_hosts_gpus_only(env, tmp_path, args, listed):
    """make run's one nvidia-smi -L reaches jobs that run here (a conda env's too); jobs an executor, a profile or a
    container runs may see other GPUs: they get no listing, not even an inherited one, and list their own."""
    fake_nvidia_smi(tmp_path / "bin", gpus=2)
    stale = gpuslots.listing_for_jobs((["stale"], "an earlier run's"))
    given = launch.with_gpu_listing({**env, "AMPREPRO_GPU_LISTING": stale}, shlex.split(args))
    if listed:
        assert gpuslots.cached_listing(given) == (["NVIDIA H200"] * 2, "nvidia-smi lists 2 GPU(s): NVIDIA H200")
    else:
        assert "AMPREPRO_GPU_LISTING" not in given
    assert {k: v for k, v in given.items() if k != "AMPREPRO_GPU_LISTING"} == env


def test_amprepro_gpu_count_wins_over_nvidia_smi(env, tmp_path, monkeypatch):
    fake_nvidia_smi(tmp_path / "bin", gpus=2)
    monkeypatch.setenv("AMPREPRO_GPU_COUNT", "1")
    monkeypatch.setenv("AMPREPRO_STAGE_CELLS", "0")
    command, said = launchargs.snakemake_command([], dict(os.environ))
    assert parsed(command).resources["gpu"].value == 1
    assert "1 GPU(s) (AMPREPRO_GPU_COUNT)" in said
    with pytest.raises(launchargs.SettingError, match="AMPREPRO_GPU_COUNT='two' is not a whole number"):
        launchargs.snakemake_command([], {**env, "AMPREPRO_GPU_COUNT": "two"})


def test_the_users_gpu_resource_is_kept_and_other_resources_get_the_gpus(env, tmp_path):
    fake_nvidia_smi(tmp_path / "bin", gpus=2)
    command, said = launchargs.snakemake_command([], {**env, "SNAKEMAKE_ARGS": "--resources gpu=1 mem_mb=9000"})
    assert {name: r.value for name, r in parsed(command).resources.items()} == {"gpu": 1, "mem_mb": 9000,
                                                                                "gpu_share": 8}
    assert "GPUs as SNAKEMAKE_ARGS sets" in said
    # Snakemake keeps only the last --resources: the GPUs must join the user's, not come as a second one.
    command, _ = launchargs.snakemake_command([], {**env, "SNAKEMAKE_ARGS": "--resources mem_mb=9000 -n"})
    assert {name: r.value for name, r in parsed(command).resources.items()} == {"gpu": 2, "gpu_share": 16,
                                                                                "mem_mb": 9000}
    assert command.count("--resources") == 1
    with pytest.raises(launchargs.SettingError, match="with a space"):
        launchargs.snakemake_command([], {**env, "SNAKEMAKE_ARGS": "--resources=mem_mb=9000"})


def test_cells_that_share_a_gpu_get_k_slots_per_gpu(env, tmp_path):
    """gpu_share: CELLS_PER_SHARED_GPU per GPU (a timed cell takes a GPU's worth, a shared one 1), beside gpu."""
    fake_nvidia_smi(tmp_path / "bin", gpus=2)
    command, _ = launchargs.snakemake_command([], env)
    resources = {name: r.value for name, r in parsed(command).resources.items()}
    assert resources == {"gpu": 2, "gpu_share": 2 * launchargs.CELLS_PER_SHARED_GPU} and command.count(
        "--resources") == 1
    command, _ = launchargs.snakemake_command([], {**env, "SNAKEMAKE_ARGS": "--resources gpu_share=4"})
    assert {name: r.value for name, r in parsed(command).resources.items()} == {"gpu": 2, "gpu_share": 4}
    command, _ = launchargs.snakemake_command([], {**env, "SNAKEMAKE_ARGS": "--resources gpu=1 gpu_share=3"})
    assert {name: r.value for name, r in parsed(command).resources.items()} == {"gpu": 1, "gpu_share": 3}


def test_a_target_after_the_gpu_resource_stays_a_target(env, tmp_path):
    fake_nvidia_smi(tmp_path / "bin", gpus=1)
    given = {**env, "CORES": "16", "SNAKEMAKE_ARGS": "results/summary/summary.json"}
    command, _ = launchargs.snakemake_command([], given)
    args = parsed(command)
    assert args.targets == ["results/summary/summary.json"] and args.resources["gpu"].value == 2  # one cell staged


def test_user_cores_and_profiles_are_left_alone(env):
    command, said = launchargs.snakemake_command([], {**env, "CORES": "8", "SNAKEMAKE_ARGS": "--cores 3"})
    assert parsed(command).cores == 3 and "cores as SNAKEMAKE_ARGS sets" in said
    command, said = launchargs.snakemake_command([], {**env, "SNAKEMAKE_ARGS": "--workflow-profile profiles/slurm"})
    assert "--cores" not in command and "--resources" not in command and "profile" in said


def test_snakemake_args_are_split_into_words_never_run_by_a_shell(env):
    words = launchargs.snakemake_command([], {**env, "SNAKEMAKE_ARGS": "--config 'title=a b' $(touch pwned) ;"})[0]
    assert words[-5:] == ["--config", "title=a b", "$(touch", "pwned)", ";"]
    with pytest.raises(launchargs.SettingError, match="SNAKEMAKE_ARGS cannot be split"):
        launchargs.snakemake_command([], {**env, "SNAKEMAKE_ARGS": "--config 'title=a b"})


def test_the_directory_checked_is_the_one_snakemake_works_in(env, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert launchargs.workdir_of(env) == tmp_path
    assert launchargs.workdir_of({**env, "SNAKEMAKE_ARGS": "-n --directory elsewhere"}) == tmp_path / "elsewhere"
    assert launchargs.workdir_of({**env, "SNAKEMAKE_ARGS": "-d /srv/run -n"}) == Path("/srv/run")


def test_a_bad_setting_stops_before_anything_is_touched(env, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert launch.main([], {**env, "CORES": "lots"}) == launch.BAD_SETTING
    assert "CORES='lots'" in capsys.readouterr().err
    assert not (tmp_path / ".snakemake").exists()


@pytest.mark.parametrize("argv, pipeline", [
    (["/w/.venv/bin/python", "/w/.venv/bin/snakemake", "--cores", "2"], True),
    (["/w/.venv/bin/snakemake", "--cores", "2"], True),
    (["/w/.venv/bin/python", "-m", "snakemake", "--cores", "2"], True),
    (["/usr/bin/bash", "-c", "set -euo pipefail;  PYTHONPATH=workflow python -m amprepro.train.train --spec x"], True),
    (["python", "-u", "-m", "amprepro.train.train", "--spec", "x"], True),
    (["python", "-m", "amprepro.env.launch"], True),
    (["vim", "workflow/amprepro/train/train.py"], False),
    (["less", ".snakemake/log/x.snakemake.log"], False),
    (["python", "-m", "pytest", "-q", "tests/backbone/test_launch.py"], False),
    (["tail", "-f", "results/logs/runs/cnn/fp32/seed0.log"], False),
])
def test_what_counts_as_a_process_of_a_run(argv, pipeline):
    assert runlock.is_pipeline_command(argv) is pipeline


# ---- live runs and dead runs -----------------------------------------------------------------------------------


def wait_for(predicate, timeout: float, what: str, poll: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(poll)


def start_sleeping_snakemake(workdir: Path) -> subprocess.Popen:
    (workdir / "Snakefile").write_text(SLEEPING_SNAKEFILE)
    (workdir / "pause").write_text("30")
    process = subprocess.Popen([*SNAKEMAKE, "--cores", "1"], cwd=workdir, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True, env=job_env())
    # the job's first line written, not only its output file opened: `echo started > slow.txt` creates the file
    # before it writes, and a kill in between left it empty (once, on a loaded 2-core machine); and Snakemake's
    # incomplete marker written, which can come after the job's shell has started (once, at f326ccf's CI: killed
    # before it, the run left a complete-looking output and nothing to re-run)
    incomplete = workdir / ".snakemake" / "incomplete"
    wait_for(lambda: runlock.snakemake_locks(workdir) and (workdir / "slow.txt").exists()
             and (workdir / "slow.txt").read_text() == "started\n"
             and incomplete.is_dir() and any(incomplete.iterdir()), 60, "the sleeping job to start")
    return process


def kill_group(process: subprocess.Popen) -> None:
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    wait_for(lambda: not group_members(process.pid), 30, "every process of the killed group to end")


def sleeping(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0] == b"sleep"
    except OSError:
        return False


def group_members(pgid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
        except (OSError, NotADirectoryError):
            continue
        fields = stat.rpartition(")")[2].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def test_a_live_launcher_is_named_and_its_lock_kept(env, tmp_path, monkeypatch, capsys):
    """A real process holding the run lock (its command line does not look like a pipeline process at all)."""
    monkeypatch.chdir(tmp_path)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from amprepro.env.runlock import RunLock;"
         " assert RunLock(Path.cwd()).acquire(); print('held', flush=True); time.sleep(120)"],
        cwd=tmp_path, stdout=subprocess.PIPE, text=True, env={**job_env(), "PYTHONPATH": str(REPO / "workflow")})
    try:
        assert holder.stdout.readline().strip() == "held"
        lock = tmp_path / ".snakemake/locks/0.output.lock"
        lock.parent.mkdir(parents=True)
        lock.write_text("slow.txt")
        assert launch.main(["-n"], env) == launch.ANOTHER_RUN_ACTIVE
        err = capsys.readouterr().err
        assert f"another run is active in {tmp_path}: pid {holder.pid} (" in err and "Nothing was changed" in err
        assert lock.exists()
    finally:
        holder.kill()
        holder.wait()


def test_a_live_snakemake_in_the_directory_is_named_and_its_lock_kept(env, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    running = start_sleeping_snakemake(tmp_path)
    try:
        locks = runlock.snakemake_locks(tmp_path)
        assert launch.main([], env) == launch.ANOTHER_RUN_ACTIVE
        err = capsys.readouterr().err
        assert f"pid {running.pid} (" in err and "snakemake --cores 1" in err
        assert runlock.snakemake_locks(tmp_path) == locks
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        assert runlock.pipeline_processes(elsewhere) == []  # a run in another directory is no concern of this one
    finally:
        kill_group(running)


def test_the_lock_of_a_killed_run_is_removed_and_its_job_rerun(env, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    kill_group(start_sleeping_snakemake(tmp_path))
    plain = subprocess.run([*SNAKEMAKE, "--cores", "1"], cwd=tmp_path, capture_output=True, text=True,
                           env=job_env())
    assert plain.returncode != 0 and "IncompleteFilesException" in plain.stderr  # what a plain `snakemake` says
    assert runlock.snakemake_locks(tmp_path)  # and behind that, the dead run's lock
    assert (tmp_path / "slow.txt").read_text() == "started\n"
    (tmp_path / "pause").write_text("0")
    # a shell rule, no cell: a cell server would import torch & co. (more CPU than the rest of this test) for nothing
    assert launch.main([], {**env, "CORES": "1", "AMPREPRO_FRESH_CELLS": "1"}) == 0
    err = capsys.readouterr().err
    assert "removed the lock of an earlier run that is no longer alive" in err
    assert "re-running 1 output(s) it left incomplete" in err
    assert (tmp_path / "slow.txt").read_text() == "done\n"
    assert not runlock.snakemake_locks(tmp_path)


@pytest.mark.parametrize("words, form", [
    (["runs.seeds=abc"], "--config 'runs={seeds: abc}'"),
    (["preset=smoke", "runs.train.lr=1e-3"], "--config 'runs={train: {lr: 1e-3}}'"),
    (["--config=runs.seeds=[0, 1]"], "--config 'runs={seeds: [0, 1]}'"),
])
def test_the_dotted_config_form_is_refused_before_snakemake_with_the_form_that_works(env, words, form, capsys):
    """Issue 41: `--config runs.seeds=abc`, the form people try first, ended in Snakemake's parser's traceback."""
    from snakemake.cli import parse_config

    args = shlex.join(words) if words[0].startswith("--") else shlex.join(["--config", *words])
    assert launch.main([], {**env, "SNAKEMAKE_ARGS": args}) == launch.BAD_SETTING
    err = capsys.readouterr().err
    assert "Snakemake's --config sets top-level keys only" in err and f"Write a nested value as YAML: {form}" in err
    assert "Traceback" not in err
    nested = shlex.split(form)[1]
    key = nested.partition("=")[0]
    assert isinstance(parse_config([nested])[key], dict)  # the form given is one Snakemake reads


def test_a_config_word_without_a_value_is_refused_and_the_nested_form_passes(env):
    with pytest.raises(launchargs.SettingError, match="a config value is NAME=VALUE, e.g. --config preset=smoke"):
        launchargs.check_config_values(["--config", "preset"])
    launchargs.check_config_values(["--config", "preset=smoke", "runs={seeds: [0, 1]}", "--cores", "2"])
    launchargs.check_config_values(["--configfile", "x.yaml"])  # no --config at all


def test_ctrl_c_says_it_was_interrupted_and_the_next_run_continues(env, tmp_path):
    """Ctrl-C in a terminal reaches the launcher and Snakemake (one process group); the last word is the launcher's."""
    (tmp_path / "Snakefile").write_text(SLEEPING_SNAKEFILE)
    (tmp_path / "pause").write_text("600")  # long: on a starved CI machine a 30 s job once ended before the Ctrl-C
    run_env = {**env, "CORES": "1", "AMPREPRO_FRESH_CELLS": "1", "PYTHONPATH": str(REPO / "workflow")}
    launcher = subprocess.Popen([sys.executable, "-m", "amprepro.env.launch"], cwd=tmp_path, env=run_env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        # the job's `sleep` itself, not only the job's first line: the Ctrl-C lands while the job sleeps
        wait_for(lambda: any(sleeping(pid) for pid in group_members(launcher.pid)), 120, "the job's sleep to start")
        os.killpg(launcher.pid, signal.SIGINT)
        _, err = launcher.communicate(timeout=60)
    finally:
        if launcher.poll() is None:
            kill_group(launcher)
    assert launcher.returncode == launch.INTERRUPTED, err
    said = [line for line in err.splitlines() if line.startswith("amprepro:")]
    assert said[-1] == "amprepro: interrupted; `make run` continues where it stopped (finished cells are kept)"
    assert err.rstrip().endswith(said[-1])  # after Snakemake's own lines, the last one
    # issue 41: what Snakemake says once interrupted (a KeyboardInterrupt traceback, an "Error in rule" block for each
    # job it stopped) is not passed on: the one line says it
    assert "Traceback" not in err and "KeyboardInterrupt" not in err and "Error in rule" not in err, err[-3000:]
    assert "rule slow:" in err  # what it said before the Ctrl-C came through
    (tmp_path / "pause").write_text("0")
    again = subprocess.run([sys.executable, "-m", "amprepro.env.launch"], cwd=tmp_path, env=run_env,
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "slow.txt").read_text() == "done\n"


# ---- `make run` itself, killed for real -------------------------------------------------------------------------

SMOKE = "--config preset=smoke"
RESULT_FILES = ["results/environment/environment.json", "results/apex/apex.json", "results/sanity/sanity.json",
                "results/peak/peak.json", "results/summary/summary.json", "results/summary/summary.csv",
                "results/report/report.html"]


def make_command(target: str, snakemake_args: str) -> list[str]:
    """`make <target> SNAKEMAKE_ARGS=...` as a user types it, with this test's venv (-o: never rebuild it)."""
    return ["make", "--no-print-directory", "-o", f"{VENV}/.amprepro-installed", target, f"VENV={VENV}",
            f"SNAKEMAKE_ARGS={snakemake_args}"]


def make_env(**settings: str) -> dict:
    env = {name: value for name, value in job_env().items() if name not in LAUNCHER_ENV}
    return {**env, **settings}


def make(workdir: Path, target: str, snakemake_args: str, timeout: int = 300, **settings: str):
    return subprocess.run(make_command(target, snakemake_args), cwd=workdir, capture_output=True, text=True,
                          timeout=timeout, env=make_env(**settings))


def start_make_run(workdir: Path, snakemake_args: str, output: Path, **settings: str) -> subprocess.Popen:
    """`make run` in its own process group, as a terminal would start it, so it can be killed whole."""
    with output.open("w") as sink:
        return subprocess.Popen(make_command("run", snakemake_args), cwd=workdir, stdout=sink,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                env=make_env(**{"CORES": "2", **settings}))


def command_line(pid: int) -> str:
    return " ".join(runlock.command_of(pid))


def result_files(workdir: Path) -> dict[str, int]:
    """mtime_ns of every result file there is (cells included)."""
    paths = [workdir / name for name in RESULT_FILES]
    paths += sorted((workdir / "results/runs").glob("*/*/*/metrics.json"))
    paths += sorted((workdir / "results/runs").glob("*/*/*/steps.csv"))
    return {str(path.relative_to(workdir)): path.stat().st_mtime_ns for path in paths if path.exists()}


def incomplete_marker(workdir: Path, name: str) -> Path:
    """Snakemake's mark of an output whose job has started and not ended."""
    return workdir / ".snakemake/incomplete" / urlsafe_b64encode(name.encode()).decode()


def recorded_complete(workdir: Path, name: str) -> bool:
    """The file is there and Snakemake has recorded its job as ended. A job killed after writing its outputs but
    before Snakemake saw it end is incomplete for Snakemake, and rightly run again."""
    return (workdir / name).exists() and not incomplete_marker(workdir, name).exists()


def assert_whole(workdir: Path, names) -> None:
    """No result file is cut short: JSON parses, every CSV row is as wide as its header, the HTML is closed."""
    for name in names:
        text = (workdir / name).read_text()
        if name.endswith(".json"):
            json.loads(text)
        elif name.endswith(".csv"):
            header, *rows = list(csv.reader(io.StringIO(text)))
            assert text.endswith("\n") and all(len(row) == len(header) for row in rows), name
        else:
            assert text.rstrip().endswith("</html>"), name


def cells_started(workdir: Path) -> tuple[list[str], list[str]]:
    """(cells finished, cells whose job has started but not finished), as results/runs/<model>/<precision>/<seed>."""
    finished, running = [], []
    for log in (workdir / "results/logs/runs").glob("*/*/*.log"):
        cell = f"results/runs/{log.relative_to(workdir / 'results/logs/runs').with_suffix('')}"
        (finished if recorded_complete(workdir, f"{cell}/metrics.json") else running).append(cell)
    return finished, running


def cell_log(workdir: Path, cell: str) -> Path:
    return workdir / "results/logs" / f"{cell.removeprefix('results/')}.log"


@pytest.fixture(scope="module")
def make_workdir(tmp_path_factory) -> Path:
    return copy_workflow(tmp_path_factory.mktemp("launch") / "amprepro")


@pytest.mark.e2e
def test_make_run_uses_every_core_for_the_apex_build_and_no_shell_for_snakemake_args(make_workdir):
    cores = len(os.sched_getaffinity(0))
    dry = make(make_workdir, "run", f"-n -p {SMOKE}")
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert f"amprepro: {cores} cores (all usable)" in dry.stderr
    # no GPU: the apex compile (rule apex_build) gets every core; on a GPU box it leaves one cell's 8 free
    assert f"--out results/apex/build.json --jobs {cores} " in dry.stdout
    verify = make(make_workdir, "verify", f"-n {SMOKE}")
    assert verify.returncode == 0 and "\nverify " in verify.stdout, verify.stderr[-3000:]
    injected = make(make_workdir, "run", "--version $(touch pwned) ; touch pwned2")
    assert injected.returncode == 0, injected.stderr[-3000:]
    assert not (make_workdir / "pwned").exists() and not (make_workdir / "pwned2").exists()


@pytest.mark.e2e
def test_make_run_on_one_gpu_stages_the_timed_cells_and_leaves_the_apex_build_its_share(make_workdir, tmp_path):
    """The Snakefile's side of staging (a dry run of the paper preset as `make run` starts it on a 16-core machine
    with one GPU): Snakemake counts 24 cores and two GPU jobs, the apex build still gets the 7 threads it gets
    without staging (16 - one cell's 8 - 1), and the train jobs ask gpuslots to --defer."""
    fake_nvidia_smi(tmp_path / "bin", gpus=1)
    path = f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"
    dry = make(make_workdir, "run", "-n -p --config preset=paper", CORES="16", PATH=path)
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert "amprepro: 24 cores (CORES, and 8 for the cell that waits for the GPU)" in dry.stderr
    assert "--resources gpu=2 gpu_share=16" in dry.stderr
    assert "--out results/apex/build.json --jobs 7 " in dry.stdout
    assert "--gpus 1 --defer -- python -m amprepro.plan.launcher --per-node 1" in dry.stdout
    unstaged = make(make_workdir, "run", "-n -p --config preset=paper", CORES="16", PATH=path,
                    AMPREPRO_STAGE_CELLS="0")
    assert unstaged.returncode == 0, unstaged.stderr[-3000:]
    assert "amprepro: 16 cores (CORES)" in unstaged.stderr and "--resources gpu=1 gpu_share=8" in unstaged.stderr
    assert "--out results/apex/build.json --jobs 7 " in unstaged.stdout


@pytest.mark.e2e
def test_make_run_finishes_after_sigkill_at_every_stage_keeping_what_was_done(tmp_path):
    """Kill the whole `make run` process group (a crash, a power cut) while each stage runs, one after another in
    the same directory; every following plain `make run` removes the dead run's lock and goes on."""
    workdir = copy_workflow(tmp_path / "amprepro")
    # the smoke preset in three of its precisions: 6 cells (4 of them run on the CPU), enough for every kill point
    (workdir / "three.yaml").write_text("preset: smoke\nruns: {precisions: [fp32, tf32, amp_bf16]}\n")
    smoke = "--configfile config/config.yaml three.yaml"

    def some_cells_done_one_running() -> bool:
        finished, running = cells_started(workdir)
        return len(finished) >= 2 and bool(running)

    # A stage with an output is held as its job's python starts (HOLD_SOURCE, by its module's name; every job's
    # PYTHONPATH begins with this copy's workflow/), so the kill always lands while it runs.
    (workdir / "workflow" / "sitecustomize.py").write_text(HOLD_SOURCE)
    held = tmp_path / "held"
    kill_points = [("environment", "amprepro.env.environment", "results/environment/environment.json"),
                   ("apex build", "amprepro.env.apex_stage", "results/apex/build.json"),
                   ("a train cell", None, None),
                   ("summary", "amprepro.analysis.summary", "results/summary/summary.json"),
                   ("report", "amprepro.report.render", "results/report/report.html")]
    kept, cells_before_kill = {}, {}
    for attempt, (stage, module, output) in enumerate(kill_points):
        output_file = tmp_path / f"attempt{attempt}.log"
        held.unlink(missing_ok=True)
        started = held.exists if module else some_cells_done_one_running
        run = start_make_run(workdir, smoke, output_file,
                             **(hold_env(module, held) if module else {}))
        wait_for(lambda started=started, run=run: started() or run.poll() is not None, 240, f"{stage} to start")
        assert run.poll() is None, f"the run ended before {stage} started:\n{output_file.read_text()[-3000:]}"
        kill_group(run)
        log = output_file.read_text()
        if attempt:
            assert "removed the lock of an earlier run that is no longer alive" in log, log[-3000:]
        if output:
            assert incomplete_marker(workdir, output).exists(), f"{stage} had ended before the kill"
        else:
            finished, running = cells_started(workdir)
            assert running, "every cell had ended before the kill"
            cells_before_kill = {cell: cell_log(workdir, cell).stat().st_mtime_ns for cell in finished}
        assert_whole(workdir, result_files(workdir))
        for name, mtime in result_files(workdir).items():
            if recorded_complete(workdir, name):
                kept.setdefault(name, mtime)

    final = subprocess.run(make_command("run", smoke), cwd=workdir, capture_output=True, text=True, timeout=300,
                           env=make_env(CORES="2"))
    assert final.returncode == 0, final.stderr[-3000:]
    assert "removed the lock of an earlier run that is no longer alive" in final.stderr
    now = result_files(workdir)
    assert {name: now.get(name) for name in kept} == kept, "a result finished before a kill was written again"
    assert cells_before_kill and all(cell_log(workdir, cell).stat().st_mtime_ns == mtime  # nor was its job run again
                                     for cell, mtime in cells_before_kill.items())
    assert len([name for name in now if name.endswith("metrics.json")]) == 6
    ran = [json.loads((workdir / name).read_text()) for name in now if name.endswith("metrics.json")]
    ran = [metrics["process"] for metrics in ran if metrics["status"] == "ok"]
    assert len(ran) >= 4 and all(process.startswith("forked from amprepro.plan.cellserver pid ") and "threads 1;"
                                 in process for process in ran), ran  # Snakemake's OMP_NUM_THREADS=1, applied
    assert_whole(workdir, now)
    assert set(RESULT_FILES) <= set(now)
    assert not runlock.snakemake_locks(workdir) and not runlock.incomplete_markers(workdir)


@pytest.fixture(scope="module")
def killed_cell_workdir(tmp_path_factory) -> Path:
    """One workflow copy for the two tests below, which kill Snakemake while the same cell trains and then run it again:
    the second finds environment, sanity and both memory plans (long and short) done by the first, and spends its
    time on its own point, the cell. Each still works if it runs alone."""
    workdir = copy_workflow(tmp_path_factory.mktemp("killed-cell") / "amprepro")
    (workdir / "long.yaml").write_text("preset: smoke\nruns:\n  train:\n    steps: 200000\n")
    return workdir


@pytest.mark.e2e
def test_a_job_that_outlives_its_killed_snakemake_keeps_the_lock_until_it_ends(killed_cell_workdir, tmp_path):
    """A cell in a fresh interpreter (AMPREPRO_FRESH_CELLS=1) is the job's own process: it outlives Snakemake."""
    workdir = killed_cell_workdir
    cell = "results/runs/cnn/fp32/seed0/metrics.json"
    train_log = workdir / "results/logs/runs/cnn/fp32/seed0.log"
    train_log.unlink(missing_ok=True)  # the other test's run of the cell left one: wait for this run's own
    run = start_make_run(workdir, f"{cell} --configfile config/config.yaml long.yaml", tmp_path / "first.log",
                         AMPREPRO_FRESH_CELLS="1")
    try:
        wait_for(lambda: train_log.exists() and "step    20" in train_log.read_text(), 240, "the cell to train")
        members = group_members(run.pid)
        snakemake_pids = [pid for pid in members if "-m snakemake" in command_line(pid)]
        job_pids = [pid for pid in members if command_line(pid).startswith(f"{VENV}/bin/python -m amprepro.train.train")
                    or command_line(pid).startswith("python -m amprepro.train.train")]
        assert len(snakemake_pids) == 1 and job_pids, [command_line(pid) for pid in members]
        os.kill(snakemake_pids[0], signal.SIGKILL)  # Snakemake only: its job lives on
        assert run.wait(timeout=60) != 0
        assert Path(f"/proc/{job_pids[0]}").exists()
        locks = runlock.snakemake_locks(workdir)
        assert locks

        refused = make(workdir, "run", f"{cell} {SMOKE}", timeout=120, CORES="2")
        assert refused.returncode != 0 and "Error 75" in refused.stderr, refused.stderr[-3000:]
        assert "another run is active in" in refused.stderr and f"pid {job_pids[0]} (" in refused.stderr
        assert runlock.snakemake_locks(workdir) == locks and not (workdir / cell).exists()
    finally:
        kill_group(run)  # the job left behind is still in the first run's process group

    # Its job gone, the next `make run` goes on (without long.yaml, so that the cell does not train for minutes).
    resumed = make(workdir, "run", f"{cell} {SMOKE}", timeout=240, CORES="2")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "removed the lock of an earlier run that is no longer alive" in resumed.stderr
    assert json.loads((workdir / cell).read_text())["status"] in ("ok", "skipped")


@pytest.mark.parametrize("args", ["--configfile {file}", "--configfile={file}", "--configfiles good.yaml {file} -n"])
def test_a_configfile_that_snakemake_would_misread_stops_make_run_first(env, tmp_path, monkeypatch, args):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "good.yaml").write_text("preset: smoke\n")
    (tmp_path / "tpl.yaml").write_text("__use_yte__: true\npreset: smoke\n")
    env["SNAKEMAKE_ARGS"] = args.format(file="tpl.yaml")
    with pytest.raises(launchargs.SettingError, match="tpl.yaml: sets __use_yte__"):
        launchargs.check_config_files(launchargs.user_args(env))
    env["SNAKEMAKE_ARGS"] = args.format(file="good.yaml")
    launchargs.check_config_files(launchargs.user_args(env))


@pytest.mark.e2e
def test_a_forked_cell_ends_with_its_killed_snakemake_and_the_next_run_goes_on(killed_cell_workdir, tmp_path):
    """A cell forked from make run's cell server ends when Snakemake is killed: the launcher then stops the server,
    and the cell dies with it (no GPU job left running on its own). The next `make run` goes on."""
    workdir = killed_cell_workdir
    cell = "results/runs/cnn/fp32/seed0/metrics.json"
    train_log = workdir / "results/logs/runs/cnn/fp32/seed0.log"
    train_log.unlink(missing_ok=True)  # the other test's run of the cell left one: wait for this run's own
    run = start_make_run(workdir, f"{cell} --configfile config/config.yaml long.yaml", tmp_path / "first.log")
    try:
        wait_for(lambda: train_log.exists() and "step    20" in train_log.read_text(), 240, "the cell to train")
        members = group_members(run.pid)
        snakemake_pids = [pid for pid in members if "-m snakemake" in command_line(pid)]
        forked = [pid for pid in members if "-m amprepro.plan.cellserver" in command_line(pid)]  # server, cells
        servers = [pid for pid in forked if runlock.parent_of(pid) not in forked]
        assert len(snakemake_pids) == 1 and len(servers) == 1, [command_line(pid) for pid in members]
        cells = [pid for pid in forked if runlock.parent_of(pid) == servers[0]]
        assert cells, [command_line(pid) for pid in members]
        os.kill(snakemake_pids[0], signal.SIGKILL)
        assert run.wait(timeout=60) != 0
        wait_for(lambda: not any(Path(f"/proc/{pid}").exists() and pid in group_members(run.pid)
                                 for pid in [*cells, *servers]), 30, "the server and its cell to end")
    finally:
        kill_group(run)
    assert not (workdir / cell).exists()
    resumed = make(workdir, "run", f"{cell} {SMOKE}", timeout=240, CORES="2")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "removed the lock of an earlier run that is no longer alive" in resumed.stderr
    assert json.loads((workdir / cell).read_text())["status"] == "ok"


@pytest.mark.parametrize(("args", "served"), [("", True), ("--config preset=smoke", True),
                                              ("--config preset=smoke -n", False), ("--dry-run", False),
                                              ("--version", False),
                                              ("--use-conda", False), ("--sdm conda", False), ("--sdm=conda", False),
                                              ("--executor slurm", False), ("--workflow-profile profiles/slurm", False),
                                              ("--use-apptainer", False)])
def test_the_cell_server_starts_only_for_jobs_in_this_python(args, served):
    assert launchargs.serves_cells(launchargs.user_args({"SNAKEMAKE_ARGS": args})) is served
    assert launchargs.serves_cells(launchargs.user_args({"SNAKEMAKE_ARGS": args}), ["all"]) is served
    assert launchargs.serves_cells(launchargs.user_args({"SNAKEMAKE_ARGS": args}), ["verify"]) is False  # the gate
    assert launchargs.serves_cells(launchargs.user_args({"SNAKEMAKE_ARGS": args}), ["verify", "all"]) is served


@pytest.fixture
def short_tmp():
    """A folder under /tmp: pytest's tmp_path can be too long for a Unix socket's path (107 bytes)."""
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="amp-sw-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_socket_folders_of_killed_servers_are_swept_and_live_ones_kept(short_tmp):
    import socket

    from amprepro.plan import cellserver

    tmp_path = short_tmp

    def folder(name: str, listen: bool | None) -> tuple[Path, socket.socket | None]:
        made = tmp_path / name
        made.mkdir()
        if listen is None:
            return made, None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(made / "socket"))
        if listen:
            sock.listen(1)
            return made, sock
        sock.close()  # the file a server killed with SIGKILL leaves: connections refused
        return made, None

    here = cellserver.socket_prefix()  # amprepro-cells-<this host>-, then mkdtemp's random part
    dead, _ = folder(f"{here}dead1", listen=False)
    never, _ = folder(f"{here}never_2", listen=None)  # died before it bound its socket
    live, server = folder(f"{here}live", listen=True)
    other, _ = folder("someone-elses-dead", listen=False)
    # A temporary directory shared with other hosts (NFS): their live servers' sockets refuse connections from here.
    elsewhere, _ = folder(f"{cellserver.SOCKET_PREFIX}otherhost-abc123", listen=False)
    longer, _ = folder(f"{here}b-abc123", listen=False)  # the host named like this one plus "-b"
    (tmp_path / f"{here}file").write_text("not a folder")
    try:
        assert runlock.sweep_server_folders(str(tmp_path)) == 0  # all younger than a minute: a server may be starting
        assert runlock.sweep_server_folders(str(tmp_path), min_age_s=0) == 2
    finally:
        server.close()
    assert not dead.exists() and not never.exists()
    assert live.exists() and other.exists() and (tmp_path / f"{here}file").exists()
    assert elsewhere.exists() and longer.exists()


def test_socket_folder_names_hold_a_safe_host_name(monkeypatch):
    import socket

    from amprepro.plan import cellserver

    monkeypatch.setattr(socket, "gethostname", lambda: "node/07 $(rm)" + "x" * 80)
    prefix = cellserver.socket_prefix()
    assert prefix.startswith(f"{cellserver.SOCKET_PREFIX}node_07__") and prefix.endswith("-")
    assert len(prefix) == len(cellserver.SOCKET_PREFIX) + 16 + 1 and "/" not in prefix and "$" not in prefix


# ---- staging: the next timed cell builds its model while one trains (issue 40) ------------------------------------


def test_on_one_gpu_the_waiting_cell_is_counted_in_cores_and_gpu(env, tmp_path):
    """One GPU here, cores and GPUs the launcher's: Snakemake may start a second timed job (it builds its model, then
    waits for the GPU in amprepro.gpuslots.claim_deferred), so `gpu` counts two and the cores the waiting cell's
    CPUS_PER_GPU on top; gpu_share follows the two."""
    fake_nvidia_smi(tmp_path / "bin", gpus=1)
    env = {**env, "CORES": "16"}  # the fewest with which the apex build runs beside the cells
    assert launchargs.stages_cells(env, [])
    command, said = launchargs.snakemake_command([], env)
    args = parsed(command)
    assert args.cores == 16 + resources.CPUS_PER_GPU
    assert {name: r.value for name, r in args.resources.items()} == {
        "gpu": 2, "gpu_share": 2 * resources.CELLS_PER_SHARED_GPU}
    assert "the next timed cell builds its model while one trains" in said
    assert f"and {resources.CPUS_PER_GPU} for the cell that waits for the GPU" in said
    assert launchargs.stages_cells({**env, "SNAKEMAKE_ARGS": "--config gpu=auto"}, ["--config", "gpu=auto"])


@pytest.mark.parametrize("cores", ["15", "8", "2"])
def test_no_staging_where_the_apex_build_takes_every_core(env, tmp_path, cores):
    """On fewer than 16 cores the apex build runs alone, on every core Snakemake counts: a waiting cell's cores
    counted on top would let a timed cell run beside it."""
    fake_nvidia_smi(tmp_path / "bin", gpus=1)
    given = {**env, "CORES": cores}
    assert resources.apex_build_threads(int(cores), 1) == int(cores)
    assert not launchargs.stages_cells(given, [])
    command, _ = launchargs.snakemake_command([], given)
    assert parsed(command).cores == int(cores) and parsed(command).resources["gpu"].value == 1


@pytest.mark.parametrize("setting, gpus", [({"AMPREPRO_STAGE_CELLS": "0"}, 1),
                                           ({"SNAKEMAKE_ARGS": "--cores 6"}, 1),
                                           ({"SNAKEMAKE_ARGS": "--resources gpu=1"}, 1),
                                           ({"SNAKEMAKE_ARGS": "--resources gpu_share=3"}, 1),
                                           ({"SNAKEMAKE_ARGS": "--executor slurm"}, 1),
                                           ({"CUDA_VISIBLE_DEVICES": "0"}, 1),  # no locks then: Snakemake's gpu=1
                                           ({"SNAKEMAKE_ARGS": "--config gpu=false"}, 1),
                                           ({"SNAKEMAKE_ARGS": "--config gpu=true"}, 1),
                                           ({}, 2), ({}, 0)])
def test_no_staging_where_the_user_sets_the_sizes_or_there_is_not_one_gpu(env, tmp_path, setting, gpus):
    fake_nvidia_smi(tmp_path / "bin", gpus=gpus)
    given = {**env, "CORES": "16", **setting}  # 16 cores would stage on one GPU (the test above)
    assert not launchargs.stages_cells(given, launchargs.user_args(given))
    command, said = launchargs.snakemake_command([], given)
    assert "while one trains" not in said and "waits for the GPU" not in said
    if gpus == 2 and not setting:
        assert parsed(command).resources["gpu"].value == 2 and parsed(command).cores == 16


def test_a_bad_stage_setting_is_refused_with_the_fix(env, tmp_path):
    fake_nvidia_smi(tmp_path / "bin", gpus=1)
    with pytest.raises(launchargs.SettingError, match=r"AMPREPRO_STAGE_CELLS='yes please': set it to 0 to start"):
        launchargs.snakemake_command([], {**env, "CORES": "16", "AMPREPRO_STAGE_CELLS": "yes please"})


def test_the_launcher_tells_the_jobs_whether_it_stages(env, tmp_path, monkeypatch):
    """launch.main puts its decision in the jobs' environment, where the Snakefile and gpuslots --defer read it."""
    seen = {}
    monkeypatch.setattr(launch, "run_snakemake", lambda command, lock, job_env: seen.update(job_env) or 0)
    monkeypatch.setattr(launch.cellserver, "start", lambda env, cwd: None)
    for gpus, word in ((1, "1"), (2, "0")):
        fake_nvidia_smi(tmp_path / "bin", gpus=gpus)
        seen.clear()
        assert launch.main(["-n"], {**env, "CORES": "16", "SNAKEMAKE_ARGS": f"--directory {tmp_path}"}) == 0
        assert seen[gpuslots.STAGE_ENV] == word

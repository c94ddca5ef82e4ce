"""GPU jobs of one machine get distinct GPUs, wait when all are taken, and free them when they end or are killed."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from amprepro import gpuslots

REPO = Path(__file__).resolve().parents[2]
SHOW = [sys.executable, "-c", "import os; print(os.environ.get('CUDA_VISIBLE_DEVICES'))"]


def env_for(tmp_path, count):
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", gpuslots.LISTING_ENV)}
    return {**env, "PYTHONPATH": str(REPO / "workflow"), "AMPREPRO_GPU_LOCKS": str(tmp_path / "locks"),
            "AMPREPRO_GPU_COUNT": str(count)}


def slots(gpus, command, env, **kwargs):
    return subprocess.Popen([sys.executable, "-m", "amprepro.gpuslots", "--gpus", str(gpus), "--", *command],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def hold(env, gpus=1, seconds=30):
    """A job that prints its GPUs, then keeps them for a while."""
    script = f"import os, time; print(os.environ['CUDA_VISIBLE_DEVICES'], flush=True); time.sleep({seconds:d})"
    job = slots(gpus, [sys.executable, "-c", script], env)
    return job, job.stdout.readline().strip()


def test_concurrent_jobs_get_distinct_gpus_and_a_third_waits(tmp_path):
    env = env_for(tmp_path, 2)
    first, first_gpu = hold(env)
    second, second_gpu = hold(env)
    assert {first_gpu, second_gpu} == {"0", "1"}
    third = slots(1, SHOW, env)
    time.sleep(1.5)
    assert third.poll() is None, "a third job must wait while both GPUs are in use"
    first.kill()  # a killed job frees its GPU: the lock dies with the process
    out, err = third.communicate(timeout=20)
    assert out.strip() == first_gpu and "waiting for 1 of 2 GPUs" in err
    # the waiting job names who holds each GPU, so that a job left over from a killed run can be found
    assert f"GPU {first_gpu} held by pid {first.pid} (" in err and f"GPU {second_gpu} held by pid {second.pid}" in err
    assert "time.sleep(30)" in err
    second.kill()


def test_a_two_gpu_job_gets_both(tmp_path):
    job, gpus = hold(env_for(tmp_path, 2), gpus=2, seconds=0)
    job.wait(timeout=20)
    assert gpus == "0,1"


def test_asking_for_more_gpus_than_exist_gives_all_there_are(tmp_path):
    job, gpus = hold(env_for(tmp_path, 1), gpus=2, seconds=0)
    job.wait(timeout=20)
    assert gpus == "0"


def test_gpus_chosen_by_a_scheduler_are_kept(tmp_path):
    env = {**env_for(tmp_path, 4), "CUDA_VISIBLE_DEVICES": "3"}
    out, _ = slots(1, SHOW, env).communicate(timeout=20)
    assert out.strip() == "3"


@pytest.mark.parametrize("gpus, count", [(0, 2), (1, 0)])
def test_no_gpu_wanted_or_none_there_runs_the_command_unchanged(tmp_path, gpus, count):
    out, _ = slots(gpus, SHOW, env_for(tmp_path, count)).communicate(timeout=20)
    assert out.strip() == "None"


def test_the_command_exit_status_is_the_jobs(tmp_path):
    job = slots(1, [sys.executable, "-c", "raise SystemExit(3)"], env_for(tmp_path, 1))
    job.communicate(timeout=20)
    assert job.returncode == 3


def test_try_claim_holds_nothing_when_too_few_are_free(tmp_path):
    held = gpuslots.try_claim(1, 2, tmp_path)
    assert gpuslots.try_claim(2, 2, tmp_path) is None
    again = gpuslots.try_claim(1, 2, tmp_path)  # the other GPU is still free: the failed claim released it
    assert again is not None and again[0][0] != held[0][0]


# a train job may lock its GPU itself (--defer; gpuslots decides whether it does: test_a_deferred_*)
GPU_JOBS = ["--gpus 2 --defer -- python -m amprepro.plan.launcher --per-node 2 --nodes 1 --device cuda --",
            "--gpus 1 --defer -- python -m amprepro.plan.launcher --per-node 1 --nodes 1 --device cuda --",
            "--gpus 1 -- python -m amprepro.env.apex_stage",
            "--gpus 1 -- python -m amprepro.plan.launcher --per-node 1 --nodes 1 --device cuda --entry batchsearch --"]


@pytest.mark.parametrize("gpu, expected", [
    # nvidia-smi lists GPUs here: the digits cells, whose speed no claim judges, share it
    # (amprepro.plan.resources.shares_gpu); a timed cell takes a GPU and a whole GPU's gpu_share, a shared cell one
    # the apex shell's check (untimed) takes a slot beside them; the full build's check a whole GPU
    ("auto", [*GPU_JOBS, "gpu=1, gpu_share=8, gres=", "gpu=0, gpu_share=1, gres=",
              "--gpus 0 --shared 8 --defer -- python -m amprepro.plan.launcher --per-node 1 --nodes 1 --device cuda --",
              "--gpus 0 --shared 8 -- python -m amprepro.env.apex_stage --shell",
              "--gpus 1 -- python -m amprepro.env.apex_stage --built"]),
    # gpu: true, jobs sent to GPU nodes from a machine without one (Slurm): gpuslots' locks share nothing there
    ("true", [*GPU_JOBS, "gpu=1, gpu_share=0, gres=", "--gpus 1 -- python -m amprepro.env.apex_stage --shell"]),
    ("false", ["--gpus 0 --defer -- python -m amprepro.plan.launcher --per-node 1 --nodes 1 --device cpu --",
               "--gpus 0 -- python -m amprepro.env.apex_stage", "gpu=0, gpu_share=0, gres="]),
])
def test_rules_run_gpu_jobs_through_gpuslots(tmp_path, gpu, expected):
    from test_launch import fake_nvidia_smi

    from workflow_testing import copy_workflow, job_env, run_snakemake

    workdir = copy_workflow(tmp_path / "wf")
    fake_nvidia_smi(tmp_path / "bin", gpus=2)
    env = job_env()
    env["PATH"] = f"{tmp_path / 'bin'}:{env['PATH']}"
    result = run_snakemake(workdir, ["-n", "-p", "--cores", "4", "--config", f"gpu={gpu}", "preset=paper"], 900, env)
    assert result.returncode == 0, result.stderr[-4000:]
    for command in expected:
        assert command in result.stdout, command
    # the largest-batch search: the paper preset's three (ViT-B/16 in strict FP32, TF32 and apex O1: what
    # vit-apex-o1-bigger-batch reads; 18 before runs.largest_batch.precisions), GPU runs only
    assert result.stdout.count("--entry batchsearch --") == (3 if gpu != "false" else 0)
    assert ("--shared" in result.stdout) == (gpu == "auto"), "only GPUs listed here are shared"


def share(cells, command, env):
    return subprocess.Popen([sys.executable, "-m", "amprepro.gpuslots", "--gpus", "0", "--shared", str(cells),
                             "--", *command], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


SHARED_SCRIPT = ("import os, time; print(os.environ['CUDA_VISIBLE_DEVICES'], os.environ['AMPREPRO_GPU_SHARED'], "
                 "flush=True); time.sleep(30)")


def hold_shared(env, cells=8):
    job = share(cells, [sys.executable, "-c", SHARED_SCRIPT], env)
    return job, job.stdout.readline().split()


def test_shared_cells_run_together_and_a_timed_job_waits_until_they_end(tmp_path):
    env = env_for(tmp_path, 1)
    first, first_said = hold_shared(env)
    second, second_said = hold_shared(env)
    assert first_said == second_said == ["0", "8"], "two shared cells on one GPU, each told it shares among 8"
    timed = slots(1, SHOW, env)
    time.sleep(1.5)
    assert timed.poll() is None, "a timed job must wait while a shared cell holds the GPU"
    first.kill()
    time.sleep(1.5)
    assert timed.poll() is None, "one shared cell still holds the GPU"
    second.kill()  # a killed cell frees its lock: the lock dies with the process
    out, err = timed.communicate(timeout=20)
    assert out.strip() == "0" and "held (shared) by pid" in err


def test_timed_jobs_and_shared_cells_keep_apart_on_several_gpus(tmp_path):
    env = env_for(tmp_path, 2)
    timed, timed_gpu = hold(env)
    first, first_said = hold_shared(env)
    second, second_said = hold_shared(env)
    # a timed job takes the highest free GPU, shared cells pack onto the lowest: they meet as late as possible
    assert (timed_gpu, first_said, second_said) == ("1", ["0", "8"], ["0", "8"])
    waiting = slots(1, SHOW, env)
    time.sleep(1.5)
    assert waiting.poll() is None, "both GPUs are taken: one by a timed job, one by shared cells"
    first.kill()
    second.kill()
    out, _ = waiting.communicate(timeout=20)
    assert out.strip() == "0"
    timed.kill()


def test_no_more_than_k_cells_share_a_gpu(tmp_path):
    env = env_for(tmp_path, 1)
    first, _ = hold_shared(env, cells=2)
    second, _ = hold_shared(env, cells=2)
    third = share(2, SHOW, env)
    time.sleep(1.5)
    assert third.poll() is None, "a third cell must wait when K=2 already share the GPU"
    second.kill()
    out, _ = third.communicate(timeout=20)
    assert out.strip() == "0"
    first.kill()


def test_a_shared_cell_waits_for_a_timed_job(tmp_path):
    env = env_for(tmp_path, 1)
    timed, _ = hold(env)
    shared = share(8, SHOW, env)
    time.sleep(1.5)
    assert shared.poll() is None, "a cell that shares must not run beside a timed job"
    timed.kill()
    out, err = shared.communicate(timeout=20)
    assert out.strip() == "0" and "that no timed job holds" in err


@pytest.mark.parametrize("args, message", [(["--gpus", "1", "--shared", "8"], "give --gpus 0 with it"),
                                           (["--gpus", "0", "--shared", "33"], "not a whole number from 1 to 32"),
                                           (["--gpus", "0", "--shared", "8;x"], "not a whole number from 1 to 32")])
def test_bad_shared_settings_are_refused(tmp_path, args, message):
    job = subprocess.run([sys.executable, "-m", "amprepro.gpuslots", *args, "--", *SHOW],
                         env=env_for(tmp_path, 1), capture_output=True, text=True, timeout=20)
    assert job.returncode == 2 and message in job.stderr


def test_a_shared_cell_with_a_scheduler_gpu_keeps_it_and_says_it_shares(tmp_path):
    env = {**env_for(tmp_path, 4), "CUDA_VISIBLE_DEVICES": "3"}
    script = "import os; print(os.environ.get('CUDA_VISIBLE_DEVICES'), os.environ.get('AMPREPRO_GPU_SHARED'))"
    out, _ = share(8, [sys.executable, "-c", script], env).communicate(timeout=20)
    assert out.split() == ["3", "8"]
    out, _ = share(8, [sys.executable, "-c", script], env_for(tmp_path, 0)).communicate(timeout=20)
    assert out.split() == ["None", "None"], "no GPU to share: the command runs unchanged"


def test_a_runs_gpu_listing_is_used_on_its_host_only(tmp_path, monkeypatch):
    from test_launch import fake_nvidia_smi

    calls = fake_nvidia_smi(tmp_path / "bin", gpus=2)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    listed = gpuslots.list_gpus()
    assert listed == (["NVIDIA H200", "NVIDIA H200"], "nvidia-smi lists 2 GPU(s): NVIDIA H200")
    here = {gpuslots.LISTING_ENV: gpuslots.listing_for_jobs((["NVIDIA H100 80GB HBM3"], "as listed"))}
    assert gpuslots.visible_gpus(here) == (["NVIDIA H100 80GB HBM3"], "as listed")
    assert gpuslots.gpu_count(here) == 1
    assert len(calls.read_text().splitlines()) == 1, "the listing is used without asking nvidia-smi again"
    elsewhere = {gpuslots.LISTING_ENV: here[gpuslots.LISTING_ENV].replace('"host": "', '"host": "not-')}
    for env in (elsewhere, {gpuslots.LISTING_ENV: "{not json"}, {gpuslots.LISTING_ENV: '{"host": 1}'}, {}):
        assert gpuslots.visible_gpus(env) == listed  # another host's listing, or none that reads: ask nvidia-smi
    assert len(calls.read_text().splitlines()) == 5


def test_a_launched_run_asks_nvidia_smi_once_for_itself_and_its_jobs(tmp_path):
    """make run's launcher lists the GPUs once; its jobs (gpuslots, the cells' launcher, the DAG build) read that."""
    from test_launch import fake_nvidia_smi

    calls = fake_nvidia_smi(tmp_path / "bin", gpus=1)
    (tmp_path / "Snakefile").write_text(
        'rule job:\n    output: "listed.txt"\n    resources: gpu=1\n'
        '    shell: "python -m amprepro.gpuslots --gpus 1 -- python -c'
        " 'from amprepro.gpuslots import visible_gpus; print(visible_gpus())' > {output}\"\n")
    env = {**env_for(tmp_path, 1), "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}", "CORES": "1",
           "AMPREPRO_FRESH_CELLS": "1"}
    env.pop("AMPREPRO_GPU_COUNT")
    run = subprocess.run([sys.executable, "-m", "amprepro.env.launch"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    listed = "(['NVIDIA H200'], 'nvidia-smi lists 1 GPU(s): NVIDIA H200')"
    assert (tmp_path / "listed.txt").read_text().strip() == listed
    assert len(calls.read_text().splitlines()) == 1


# ---- --defer: a timed cell locks its GPU itself once its model is built (issue 40) ---------------------------------

DEFERRED = ("import os, sys, time; from amprepro import gpuslots\n"
            "print(os.environ['CUDA_VISIBLE_DEVICES'], gpuslots.claim_pending(), flush=True)\n"
            "if os.fork() == 0:\n"  # the cell: a child of the job, as the cell server's child or the fresh interpreter
            "    waited = gpuslots.claim_deferred(); print('claimed', waited, flush=True)\n"
            "    time.sleep(float(sys.argv[1])); os._exit(0)\n"
            "os.wait(); print('cell ended', flush=True); time.sleep(float(sys.argv[2]))\n")


def deferred(env, cell_seconds, after_seconds):
    return subprocess.Popen([sys.executable, "-m", "amprepro.gpuslots", "--gpus", "1", "--defer", "--", sys.executable,
                             "-c", DEFERRED, str(cell_seconds), str(after_seconds)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def gpu_free(env) -> bool:
    fd = gpuslots.open_lock(Path(env["AMPREPRO_GPU_LOCKS"]) / "gpu0.lock")
    try:
        return gpuslots.lock_nb(fd, gpuslots.fcntl.LOCK_EX)
    finally:
        os.close(fd)


def test_a_deferred_cell_waits_for_the_gpu_only_once_it_asks_and_holds_it_until_the_job_ends(tmp_path):
    """Staged (the launcher's word): the job starts while a timed job holds the one GPU, runs its own work, and waits
    only in claim_deferred; it then holds the lock while its cell runs and after the cell's process is gone, until
    the job's first process (the one gpuslots exec'd, which waits for the cell) ends."""
    env = {**env_for(tmp_path, 1), gpuslots.STAGE_ENV: "1"}
    timed, _ = hold(env, seconds=3)
    job = deferred(env, cell_seconds=1, after_seconds=1.5)
    assert job.stdout.readline().split() == ["0", "True"], "the job starts at once, its GPU named, its lock not taken"
    start = time.monotonic()
    said = job.stdout.readline().split()
    assert said[0] == "claimed" and float(said[1]) > 1.0, "the cell waited for the timed job in claim_deferred"
    timed.wait(timeout=20)
    assert not gpu_free(env), "the cell holds the GPU"
    assert job.stdout.readline().strip() == "cell ended"
    assert not gpu_free(env), "the cell's process is gone, its job is not: the GPU stays locked"
    job.wait(timeout=20)
    assert gpu_free(env), "the job ended: the lock with it"
    assert time.monotonic() - start > 2.0
    assert "waiting for GPU 0 (the cell before this one)" in job.stderr.read()


@pytest.mark.parametrize("count, staged", [(1, False), (2, True)])
def test_defer_claims_at_once_unless_staged_on_one_gpu(tmp_path, count, staged):
    """Not staged, or several GPUs to choose from: --defer claims before the command starts, as without it."""
    env = env_for(tmp_path, count)
    if staged:
        env[gpuslots.STAGE_ENV] = "1"
    job = deferred(env, cell_seconds=0, after_seconds=2)
    gpu, pending = job.stdout.readline().split()
    assert pending == "False"
    fd = gpuslots.open_lock(Path(env["AMPREPRO_GPU_LOCKS"]) / f"gpu{gpu}.lock")
    assert not gpuslots.lock_nb(fd, gpuslots.fcntl.LOCK_EX), "the GPU was claimed before the command ran"
    os.close(fd)
    job.wait(timeout=20)


def test_claim_deferred_names_a_descriptor_that_is_not_a_lock_file(monkeypatch):
    environ = {gpuslots.CLAIM_ENV: "987"}
    with pytest.raises(RuntimeError, match=r"AMPREPRO_GPU_CLAIM_FD='987' is not the open lock file"):
        gpuslots.claim_deferred(environ)
    assert gpuslots.claim_deferred({}) is None


def test_a_claim_descriptor_in_the_environment_is_not_inherited_by_another_job(tmp_path):
    """A job gets only its own descriptor: one in the environment it was started from (a staged cell's job starting
    another command) is dropped."""
    env = {**env_for(tmp_path, 1), gpuslots.CLAIM_ENV: "5"}
    given, fds = gpuslots.environment_for(1, env)
    assert gpuslots.CLAIM_ENV not in given and given["CUDA_VISIBLE_DEVICES"] == "0"
    for fd in fds:
        os.close(fd)

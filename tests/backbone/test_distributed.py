"""DDP through torchrun (gloo on CPU here, NCCL on GPUs) gives the loss of one process with the same global batch."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOLERANCE = 1e-4  # relative, per step: only the reduction order differs


def spec(gpus):
    return {"model": "transformer", "precision": "fp32", "seed": 0,
            "model_config": {"arch": "tiny_transformer", "data": "digits", "batch_size": 64, "gpus": gpus},
            "train": {"steps": 25, "warmup_steps": 2, "lr": 0.002, "optimizer": "adamw"}}


def run_cell(tmp_path: Path, gpus: int) -> tuple[dict, list[float]]:
    apex = tmp_path / "apex.json"
    apex.write_text(json.dumps({"status": "skipped", "reason": "test"}))
    out = tmp_path / f"g{gpus}"
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(gpus)]
    command = (launcher if gpus > 1 else [sys.executable]) + [
        "-m", "amprepro.train.train", "--spec", json.dumps(spec(gpus)), "--apex", str(apex),
        "--metrics", str(out / "metrics.json"), "--steps", str(out / "steps.csv")]
    env = {**os.environ, "PYTHONPATH": str(REPO / "workflow"), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    losses = [float(row["loss"]) for row in csv.DictReader((out / "steps.csv").open())]
    return json.loads((out / "metrics.json").read_text()), losses


@pytest.mark.e2e
def test_two_process_ddp_matches_one_process(tmp_path):
    single, single_losses = run_cell(tmp_path, 1)
    ddp, ddp_losses = run_cell(tmp_path, 2)
    assert ddp["world_size"] == 2 and single["world_size"] == 1
    assert len(ddp_losses) == len(single_losses) == 25
    # Both train on the global batch of 64 and do the same FLOPs per step: DDP counts every rank's share.
    assert ddp["items_per_step"] == single["items_per_step"] == 64
    assert ddp["flops_per_step"] == pytest.approx(single["flops_per_step"], rel=1e-6)
    assert ddp["achieved_tflops"] is not None
    for step, (a, b) in enumerate(zip(single_losses, ddp_losses)):
        assert abs(a - b) <= TOLERANCE * abs(a), f"step {step}: one process {a}, DDP {b}"


def test_the_launcher_skips_a_cell_short_of_gpus_before_any_worker_starts(tmp_path):
    """A 2-GPU cell that sees none (CUDA_VISIBLE_DEVICES empty): skipped with the reason, torchrun never run."""
    (tmp_path / "apex.json").write_text(json.dumps({"status": "skipped", "reason": "test"}))
    shim, called = tmp_path / "bin", tmp_path / "torchrun-called"
    shim.mkdir()
    (shim / "torchrun").write_text(f"#!/bin/sh\ntouch {called}\n")
    (shim / "torchrun").chmod(0o755)
    env = {**os.environ, "PYTHONPATH": str(REPO / "workflow"), "CUDA_VISIBLE_DEVICES": "",
           "PATH": f"{shim}{os.pathsep}{os.environ['PATH']}"}
    out = tmp_path / "cell"
    result = subprocess.run(
        [sys.executable, "-m", "amprepro.plan.launcher", "--per-node", "2", "--device", "cuda", "--",
         "--spec", json.dumps(spec(2)), "--apex", str(tmp_path / "apex.json"),
         "--metrics", str(out / "metrics.json"), "--steps", str(out / "steps.csv")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert (metrics["status"], metrics["skip_cause"], metrics["skip_needs"]) == ("skipped", "machine", "2 GPUs")
    assert metrics["reason"] == "this cell asks for 2 GPU(s) per node; this job sees 0 (CUDA_VISIBLE_DEVICES=)"
    assert metrics["world_size"] == 0 and not called.exists()


def test_shortfall_names_missing_nodes_and_gpus():
    from amprepro.plan.launcher import shortfall

    two = {"NumNodes": "2"}
    assert shortfall(2, 1, "cuda", {}, {}, lambda: 2) is None
    assert shortfall(2, 1, "cpu", {}, {}, lambda: 0) is None  # gloo processes on the CPU need no device
    assert shortfall(4, 2, "cuda", {}, two, lambda: 4) is None
    assert shortfall(1, 2, "cuda", {}, {}, lambda: 1)[0] == "2 nodes"
    assert "a Slurm allocation of 1 node(s)" in shortfall(1, 2, "cpu", {}, {"NumNodes": "1"}, lambda: 0)[1]
    assert shortfall(4, 2, "cuda", {"CUDA_VISIBLE_DEVICES": "0,1"}, two, lambda: 2) == (
        "4 GPUs", "this cell asks for 4 GPU(s) per node; this job sees 2 (CUDA_VISIBLE_DEVICES=0,1)")


@pytest.mark.parametrize("shown, seen", [(None, 2), ("", 0), ("1", 1), ("0,1", 2), ("0,7,1", 1), ("GPU-a,GPU-b", 2),
                                         ("-1", 0)])
def test_the_launcher_counts_the_gpus_a_worker_will_see_without_importing_torch(tmp_path, shown, seen):
    """nvidia-smi's list narrowed by CUDA_VISIBLE_DEVICES as CUDA reads it; no `import torch` (seconds per cell)."""
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-a)'\n"
                                     "echo 'GPU 1: NVIDIA H200 (UUID: GPU-b)'\n")
    (shim / "nvidia-smi").chmod(0o755)
    env = {**os.environ, "PYTHONPATH": str(REPO / "workflow"), "PATH": f"{shim}{os.pathsep}{os.environ['PATH']}"}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if shown is not None:
        env["CUDA_VISIBLE_DEVICES"] = shown
    probe = ("import os, sys; from amprepro.plan.launcher import cuda_devices_visible; "
             "print(cuda_devices_visible(dict(os.environ)), 'torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    assert result.stdout.split() == [str(seen), "False"], result.stderr[-2000:]


def test_torchrun_is_the_jobs_own_never_another_pythons_console_script(tmp_path, monkeypatch):
    """The image's torchrun (#! another python) ran the ranks outside the run's venv; a shim or our own is kept."""
    from amprepro.plan.launcher import torchrun

    monkeypatch.setenv("PATH", str(tmp_path))
    assert torchrun() == [sys.executable, "-m", "torch.distributed.run"]  # none on PATH
    script = tmp_path / "torchrun"
    script.write_text("#!/opt/other/.venv/bin/python\nimport sys\n")
    script.chmod(0o755)
    assert torchrun() == [sys.executable, "-m", "torch.distributed.run"]
    script.write_text(f"#!{sys.executable}\nimport sys\n")
    assert torchrun() == [str(script)]
    script.write_text("#!/usr/bin/env bash\nexec true\n")  # a wrapper (the Slurm test's shim): trusted as is
    assert torchrun() == [str(script)]

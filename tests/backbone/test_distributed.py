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
        "-m", "amprepro.train", "--spec", json.dumps(spec(gpus)), "--apex", str(apex),
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

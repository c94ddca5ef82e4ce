"""DDP on 2 GPUs (NCCL, through the pipeline's launcher and torchrun) gives the loss of 1 GPU with the same global
batch, and counts both GPUs' energy, FLOPs and datasheet peak.

Tolerance: 1e-4 relative per step, strict FP32. Only the order of the gradient reduction differs; batch norm needs
SyncBatchNorm to see the global batch, and the control shows that without it the curves really do differ.
"""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
TOLERANCE = 1e-4
STEPS = 30

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2,
                                 reason=f"needs 2 CUDA GPUs; this machine has {torch.cuda.device_count()}")]


def spec(arch, gpus, sync_batchnorm=False):
    return {"model": arch, "precision": "fp32", "seed": 0,
            "model_config": {"arch": arch, "data": "digits", "batch_size": 64, "gpus": gpus,
                             "sync_batchnorm": sync_batchnorm},
            "train": {"steps": STEPS, "warmup_steps": 2, "lr": 0.002, "optimizer": "adamw", "deterministic": False}}


def losses(tmp_path: Path, arch: str, gpus: int, sync_batchnorm=False) -> tuple[dict, list[float]]:
    apex = tmp_path / "apex.json"
    apex.write_text(json.dumps({"status": "skipped", "reason": "not needed"}))
    out = tmp_path / f"{arch}-{gpus}-{sync_batchnorm}"
    launcher = [sys.executable, "-m", "amprepro.plan.launcher", "--per-node", str(gpus), "--device", "cuda", "--"]
    command = [*launcher, "--spec", json.dumps(spec(arch, gpus, sync_batchnorm)),
               "--apex", str(apex), "--metrics", str(out / "metrics.json"), "--steps", str(out / "steps.csv")]
    env = {**os.environ, "PYTHONPATH": str(REPO / "workflow"), "CUDA_VISIBLE_DEVICES": ",".join(map(str, range(gpus)))}
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["status"] == "ok" and metrics["world_size"] == gpus
    return metrics, [float(row["loss"]) for row in csv.DictReader((out / "steps.csv").open())]


def largest_relative_gap(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b) == STEPS
    return max(abs(x - y) / abs(x) for x, y in zip(a, b))


def test_ddp_transformer_matches_one_gpu(tmp_path):
    single, one = losses(tmp_path, "tiny_transformer", 1)
    metrics, two = losses(tmp_path, "tiny_transformer", 2)
    assert metrics["hardware"]["device"] == "cuda"
    assert metrics["items_per_step"] == single["items_per_step"] == 64
    assert metrics["flops_per_step"] == pytest.approx(single["flops_per_step"], rel=1e-6)
    if single["datasheet_peak_tflops"] is not None:  # a GPU with a datasheet entry: both GPUs' peaks
        assert metrics["datasheet_peak_tflops"] == pytest.approx(2 * single["datasheet_peak_tflops"])
    if single["energy_j_per_item"] is not None:  # NVML: the power drawn while timing is two GPUs', not one's
        def watts(m):
            return m["energy_j_per_item"] * m["items_per_step"] / m["step_time_mean_s"]

        print(f"mean power while timing: 1 GPU {watts(single):.0f} W, 2 GPUs {watts(metrics):.0f} W")
        assert watts(metrics) > 1.4 * watts(single)
    gap = largest_relative_gap(one, two)
    print(f"tiny_transformer: largest relative per-step loss gap, 2 GPUs vs 1: {gap:.2e}")
    assert gap <= TOLERANCE


def test_ddp_cnn_with_sync_batchnorm_matches_one_gpu_and_without_it_does_not(tmp_path):
    _, one = losses(tmp_path, "small_cnn", 1)
    _, synced = losses(tmp_path, "small_cnn", 2, sync_batchnorm=True)
    _, local = losses(tmp_path, "small_cnn", 2, sync_batchnorm=False)
    synced_gap, local_gap = largest_relative_gap(one, synced), largest_relative_gap(one, local)
    print(f"small_cnn: gap with SyncBatchNorm {synced_gap:.2e}, with per-GPU batch norm {local_gap:.2e}")
    assert synced_gap <= TOLERANCE
    assert local_gap > TOLERANCE  # the control: per-GPU statistics do change the curve

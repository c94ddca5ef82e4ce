"""GPU-only checks (skipped, with the reason, where there is no CUDA GPU). Run on the H200 through the device tool."""

import pytest
import torch

from amprepro.train import train

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; this machine has none")]
NO_APEX = {"status": "skipped", "reason": "not needed"}


def spec(arch, data, precision="fp32", deterministic=True, steps=30, **model):
    return {"model": arch, "precision": precision, "seed": 0,
            "model_config": {"arch": arch, "data": data, "batch_size": 64, **model},
            "train": {"steps": steps, "warmup_steps": 5, "lr": 0.002, "optimizer": "adamw",
                      "deterministic": deterministic}}


@pytest.mark.parametrize("arch, data, extra", [("small_cnn", "digits", {}), ("gpt_tiny", "synthetic_tokens",
                                                                             {"seq_len": 128})])
def test_deterministic_fp32_runs_give_identical_loss_curves(arch, data, extra):
    first = [r["loss"] for r in train.run(spec(arch, data, **extra), NO_APEX, 4)[1]]
    second = [r["loss"] for r in train.run(spec(arch, data, **extra), NO_APEX, 4)[1]]
    assert first == second


def test_strict_fp32_really_turns_tf32_off():
    metrics, _ = train.run(spec("small_cnn", "digits", steps=8), NO_APEX, 4)
    assert metrics["tf32"] == {"matmul_allow_tf32": False, "cudnn_allow_tf32": False}


def test_fp16_records_the_loss_scale_every_step():
    metrics, rows = train.run(spec("tiny_transformer", "digits", "amp_fp16", deterministic=False), NO_APEX, 4)
    assert metrics["status"] == "ok"
    assert all(r["loss_scale"] is not None for r in rows)
    assert metrics["loss_scale_initial"] == 65536.0


def test_allocator_peak_memory_and_flops_are_reported():
    metrics, _ = train.run(spec("gpt_tiny", "synthetic_tokens", "amp_bf16", deterministic=False, seq_len=128),
                           NO_APEX, 4)
    assert metrics["peak_allocated_bytes"] > 0 and metrics["peak_reserved_bytes"] >= metrics["peak_allocated_bytes"]
    assert metrics["flops_per_step"] > 0 and metrics["achieved_tflops"] > 0


@pytest.mark.parametrize("precision", ["fp32", "amp_bf16"])
def test_llama_memory_breakdown_splits_the_allocator_peak(precision):
    """Weights, gradients and fused-AdamW state are read from the real allocator around the first step."""
    cell = spec("llama_tiny", "synthetic_tokens", precision, deterministic=False, steps=8, seq_len=64)
    cell["train"]["optimizer"] = "adamw_fused"
    metrics, _ = train.run(cell, NO_APEX, 4)
    weights = metrics["parameters"] * 4
    split = metrics["memory_breakdown_bytes"]
    assert split["weights"] == pytest.approx(weights, rel=0.05)
    assert split["gradients"] == pytest.approx(weights, rel=0.05)
    assert split["optimizer_state"] == pytest.approx(2 * weights, rel=0.05)
    assert split["master_weights"] is None and split["activations_and_workspace"] >= 0
    assert metrics["memory_estimate"]["free_bytes_at_start"] > metrics["memory_estimate"]["total_bytes"]

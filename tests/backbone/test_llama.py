"""The LLaMA-7B-shaped cells: the model on the meta device, the memory estimate, the tiny config trained on the CPU.

No test here materialises the 7B model: it is only ever built on the meta device.
"""

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from amprepro import config
from amprepro.report import summary
from amprepro.train import flops, memory, models, train

NO_APEX = {"status": "skipped", "reason": "no apex source configured"}
VOCAB, DIM, LAYERS, FFN = 32000, 4096, 32, 11008
PARAMETERS_7B = VOCAB * DIM + LAYERS * (4 * DIM**2 + 3 * DIM * FFN + 2 * DIM) + DIM + DIM * VOCAB
MATMUL_7B = LAYERS * (4 * DIM**2 + 3 * DIM * FFN) + DIM * VOCAB  # every Linear; not the embedding, not the norms
# Bytes per parameter of weights + gradients + optimizer state + master weights; of the cast cache per matmul weight.
BYTES_7B = {"fp32": (16, 0), "tf32": (16, 0), "amp_bf16": (16, 2), "amp_fp16": (16, 2), "apex_o1": (16, 2),
            "apex_o2": (2 + 2 + 4 + 4 + 8, 0)}


def tiny_spec(precision="fp32", steps=6, **model):
    return {"model": "llama_tiny", "precision": precision, "seed": 0,
            "model_config": {"arch": "llama_tiny", "data": "synthetic_tokens", "batch_size": 2, "seq_len": 32,
                             "epoch_tokens": 1_000_000_000, **model},
            "train": {"steps": steps, "warmup_steps": 2, "lr": 0.003, "optimizer": "adamw"}}


def test_config_knows_the_llama_archs():
    assert set(config.LLAMA_ARCHS) == set(models.LLAMA_SIZES)


def test_7b_is_built_on_the_meta_device_with_the_llama_parameter_count():
    model = models.build("llama", {"seq_len": 2048})
    assert all(p.is_meta for p in model.parameters())
    assert models.parameter_count(model) == PARAMETERS_7B == 6_738_415_616
    assert model.matmul_parameters() == MATMUL_7B
    assert model.lm_head.weight is not model.tok.weight  # untied, as in LLaMA


@pytest.mark.parametrize("precision", sorted(BYTES_7B))
def test_7b_memory_estimate_is_bytes_per_parameter_plus_activations(precision):
    estimate = memory.estimate_for_cell({"arch": "llama", "data": "synthetic_tokens", "batch_size": 1,
                                         "seq_len": 2048}, precision, torch.device("cpu"))
    per_parameter, cast = BYTES_7B[precision]
    state = (estimate["weights_bytes"] + estimate["gradients_bytes"] + estimate["optimizer_state_bytes"]
             + estimate["master_weights_bytes"])
    assert state == per_parameter * PARAMETERS_7B
    assert estimate["cast_cache_bytes"] == cast * MATMUL_7B
    assert 1 * memory.GIB < estimate["activations_bytes"] < 8 * memory.GIB  # checkpointed: a few GiB, not tens
    assert estimate["total_bytes"] == state + estimate["cast_cache_bytes"] + estimate["activations_bytes"]
    assert estimate["free_bytes_at_start"] is None  # the CPU has no free-memory reading


def test_materialised_model_is_initialised_on_its_device_with_real_rotary_tables():
    model = models.place(models.build("llama_tiny", {"seq_len": 32}), torch.device("cpu"))
    assert not any(p.is_meta for p in model.parameters())
    assert model.tok.weight.std().item() == pytest.approx(0.02, rel=0.1)
    assert torch.equal(model.norm.weight, torch.ones_like(model.norm.weight))
    cos, sin = models.rotary_tables(32, model.dim // model.heads)
    assert torch.equal(model.rope_cos, cos) and torch.equal(model.rope_sin, sin)  # to_empty leaves garbage


def count_step(model, tokens):
    loss = lambda: torch.nn.functional.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten())  # noqa: E731
    with sdpa_kernel(SDPBackend.MATH):  # attention as matmuls, which FlopCounterMode counts on the CPU
        return flops.count_training_flops(lambda: loss().backward())


def test_analytic_flops_match_flop_counter_and_leave_out_the_recompute():
    tokens = torch.randint(0, 256, (2, 32))
    plain = models.place(models.build("llama_tiny", {"seq_len": 32, "activation_checkpointing": False}), "cpu")
    analytic = plain.model_flops_per_token(32) * tokens.numel()
    assert count_step(plain, tokens) == analytic
    checkpointed = models.place(models.build("llama_tiny", {"seq_len": 32}), "cpu")
    assert count_step(checkpointed, tokens) > analytic  # the checkpointed blocks ran their forward twice


@pytest.mark.parametrize("precision", ["fp32", "amp_bf16"])
def test_tiny_llama_trains_on_the_cpu_and_writes_the_new_fields(precision):
    metrics, rows = train.run(tiny_spec(precision), NO_APEX, threads=1)
    assert metrics["status"] == "ok", metrics["reason"]
    assert rows[-1]["loss"] < rows[0]["loss"]
    assert metrics["throughput_unit"] == "tokens/s" and metrics["flops_method"] == "analytic"
    assert metrics["epoch_tokens"] == 1_000_000_000
    assert metrics["epoch_hours_derived"] == pytest.approx(1e9 / metrics["throughput_per_s"] / 3600)
    assert metrics["memory_estimate"]["total_bytes"] > 0
    assert metrics["memory_breakdown_bytes"] == dict.fromkeys(
        ["weights", "gradients", "optimizer_state", "master_weights", "activations_and_workspace"])  # CPU: unmeasured
    row = summary.add_memory([{}], [metrics])[0]
    assert row["mem_estimate_total_bytes"] == metrics["memory_estimate"]["total_bytes"]
    assert row["mem_weights_bytes"] is None


def test_a_cell_whose_estimate_exceeds_free_memory_is_skipped_with_both_numbers(monkeypatch):
    built = []
    monkeypatch.setattr(memory, "free_bytes", lambda device: 100 * 2**20)  # a GPU with 100 MiB free
    monkeypatch.setattr(train, "prepare_model", lambda *a: built.append(a))
    spec = tiny_spec(batch_size=4096)  # tiny weights, ~0.3 GiB of activations
    metrics, rows = train.run(spec, NO_APEX, threads=1)
    assert metrics["status"] == "skipped" and metrics["skip_cause"] == "machine" and rows == []
    estimate = metrics["memory_estimate"]
    assert estimate["free_bytes_at_start"] == 100 * 2**20 < estimate["total_bytes"]
    assert f"estimated need {memory.gib(estimate['total_bytes'])}" in metrics["reason"]
    assert "exceeds the 0.1 GiB free" in metrics["reason"]
    assert built == []  # nothing was allocated


def test_a_cell_that_fits_the_estimate_but_runs_out_of_memory_names_the_estimate(monkeypatch):
    def too_big(model_config, device):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(memory, "free_bytes", lambda device: 2**40)
    monkeypatch.setattr(train, "prepare_model", too_big)
    metrics, _ = train.run(tiny_spec(), NO_APEX, threads=1)
    assert metrics["status"] == "skipped" and metrics["skip_cause"] == "machine"
    assert "Tried to allocate 20.00 GiB" in metrics["reason"]
    assert "estimated need" in metrics["reason"] and "free at start 1024.0 GiB" in metrics["reason"]


def test_breakdown_counts_the_tensors_of_the_first_optimizer_step():
    from amprepro.train import precision

    model = torch.nn.Linear(64, 32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    trainer = precision.Trainer("fp32", model, optimizer, torch.nn.functional.cross_entropy, torch.device("cpu"))
    breakdown = memory.Breakdown(model, trainer.optimizer)
    for _ in range(3):
        trainer.step(torch.randn(8, 64), torch.randint(0, 32, (8,)))
    weights = (64 * 32 + 32) * 4
    result = breakdown.result(peak_allocated=10 * weights)
    assert result["weights"] == weights and result["gradients"] == weights
    assert result["optimizer_state"] == 2 * weights + 2 * 4  # exp_avg, exp_avg_sq, and a step counter per tensor
    assert result["master_weights"] is None
    assert result["activations_and_workspace"] == 10 * weights - result["weights"] - result["gradients"] - result[
        "optimizer_state"]
    disabled = memory.Breakdown(model, optimizer, enabled=False)
    assert disabled.result(10 * weights) == dict.fromkeys(memory.Breakdown.KEYS)


def test_breakdown_counts_apex_o2_master_weights_and_their_gradients():
    """Under O2 the model holds FP16 weights and gradients; the optimizer's stash holds FP32 masters with gradients."""
    model = torch.nn.Linear(10, 10, bias=False).half()
    model.weight.grad = torch.zeros_like(model.weight)
    master = torch.zeros(10, 10, requires_grad=True)
    master.grad = torch.zeros(10, 10)
    optimizer = torch.optim.SGD([master], lr=0.1, momentum=0.9)
    optimizer._amp_stash = type("Stash", (), {"all_fp32_from_fp16_params": [master]})()
    breakdown = memory.Breakdown(model, optimizer)
    optimizer.step()
    result = breakdown.result(peak_allocated=2000)
    assert result["weights"] == 200 and result["master_weights"] == 400
    assert result["gradients"] == 200 + 400 and result["optimizer_state"] == 400  # the momentum buffer
    assert result["activations_and_workspace"] == 2000 - 200 - 400 - 600 - 400

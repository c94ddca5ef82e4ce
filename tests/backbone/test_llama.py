"""The LLaMA-7B-shaped cells: the model on the meta device, the memory estimate, the tiny config trained on the CPU.

No test here materialises the 7B model: it is only ever built on the meta device.
"""

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from amprepro import config, memory
from amprepro.analysis import summary
from amprepro.train import cell, flops, measure, models, train

NO_APEX = {"status": "skipped", "reason": "no apex source configured"}
VOCAB, DIM, LAYERS, FFN = 32000, 4096, 32, 11008
PARAMETERS_7B = VOCAB * DIM + LAYERS * (4 * DIM**2 + 3 * DIM * FFN + 2 * DIM) + DIM + DIM * VOCAB
MATMUL_7B = LAYERS * (4 * DIM**2 + 3 * DIM * FFN) + DIM * VOCAB  # every Linear; not the embedding, not the norms
# Bytes per parameter of weights + gradients + optimizer state + master weights; of the cast cache per matmul weight
# (apex O1's cache is off when checkpointed blocks are recomputed: amprepro.train.precision).
BYTES_7B = {"fp32": (16, 0), "tf32": (16, 0), "amp_bf16": (16, 2), "amp_fp16": (16, 2), "apex_o1": (16, 0),
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
    model_config = {"arch": "llama", "data": "synthetic_tokens", "batch_size": 1, "seq_len": 2048}
    estimate = memory.estimate(model_config, precision, "adamw_fused")
    assert memory.parameters(model_config) == (PARAMETERS_7B, MATMUL_7B)  # the built model's, without building it
    per_parameter, cast = BYTES_7B[precision]
    state = estimate.weights + estimate.gradients + estimate.optimizer_state + estimate.master_weights
    assert state == per_parameter * PARAMETERS_7B
    assert estimate.cast_cache == cast * MATMUL_7B
    assert 1 * memory.GIB < estimate.activations < 8 * memory.GIB  # checkpointed: a few GiB, not tens
    step = state + estimate.optimizer_temporaries  # fused AdamW: no temporaries
    forward = state - estimate.gradients + estimate.cast_cache + estimate.activations  # bounds both forward moments
    # apex O2: its zero_grad keeps the FP16 gradients through the forward; the FP32 master ones come after the backward
    later = 4 * PARAMETERS_7B if precision == "apex_o2" else 0
    forward += later // 2
    # micro-batch 1: the backward ends in the embedding's, holding every gradient and its output's gradient
    backward_end = state - later + memory.llama_backward_end_bytes(model_config, precision, 1)
    assert backward_end - state + later == 2048 * DIM * memory.precision_of(precision).residual_bytes
    assert forward < max(step, backward_end)
    assert estimate.total == max(step, backward_end) + memory.WORKSPACE_BYTES


def test_the_memory_models_shapes_are_the_built_models():
    for arch in ("llama_tiny", "gpt_tiny", "small_cnn", "tiny_transformer"):
        model_config = {"arch": arch, "seq_len": 32}
        model = models.place(models.build(arch, model_config), "cpu")
        assert memory.parameters(model_config)[0] == models.parameter_count(model), arch
    for shape in memory.LLAMA_SHAPES:  # the ladder's LLaMA-family shapes, grouped KV heads included
        model = models.build("llama", {"seq_len": 2048, "shape": shape})
        assert memory.parameters({"arch": "llama", "shape": shape}) == (models.parameter_count(model),
                                                                        model.matmul_parameters()), shape


def test_a_grouped_kv_shape_trains_on_the_cpu():
    spec = tiny_spec()
    spec["model_config"]["shape"] = "llama_tiny"
    memory.LLAMA_SHAPES["gqa_test"] = {**memory.LLAMA_SHAPES["llama_tiny"], "kv_heads": 2}
    try:
        spec["model_config"]["shape"] = "gqa_test"
        model = models.build("llama_tiny", spec["model_config"])
        assert model.blocks[0].attn.qkv.out_features == 64 + 2 * 2 * 16
        metrics, rows = train.run(spec, NO_APEX, threads=1)
    finally:
        del memory.LLAMA_SHAPES["gqa_test"]
    assert metrics["status"] == "ok", metrics["reason"]
    assert rows[-1]["loss"] < rows[0]["loss"]


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


def test_a_cell_the_plan_says_cannot_fit_is_skipped_with_both_numbers_and_nothing_built(monkeypatch):
    built = []
    monkeypatch.setattr(cell, "prepare_model", lambda *a: built.append(a))
    plan = {"model": "llama_tiny", "batch_size": 4096, "shape": None, "fits": False, "source": "config",
            "why": "does not fit: llama_tiny/fp32 at batch 4096 estimate 350% of the budget; estimated peak 0.3 GiB "
                   "against 0.1 GiB here; the batch is the config's, kept as written"}
    metrics, rows = train.run(tiny_spec(batch_size=4096), NO_APEX, threads=1, plan=plan)
    assert metrics["status"] == "skipped" and metrics["skip_cause"] == "machine" and rows == []
    assert metrics["skip_needs"] == "more GPU memory"
    assert "estimated peak 0.3 GiB against 0.1 GiB" in metrics["reason"] and "lower its batch_size" in metrics["reason"]
    assert metrics["plan"] == plan and metrics["spec"]["model_config"]["batch_size"] == 4096
    assert metrics["memory_estimate"]["total_bytes"] > 0
    assert built == []  # nothing was allocated


def test_the_plans_batch_and_shape_are_what_the_cell_runs_and_records():
    plan = {"model": "llama_tiny", "batch_size": 1, "shape": None, "fits": True, "why": "1 of the preset's 2"}
    metrics, _ = train.run(tiny_spec(), NO_APEX, threads=1, plan=plan)
    assert metrics["status"] == "ok"
    assert metrics["spec"]["model_config"]["batch_size"] == 1 and metrics["items_per_step"] == 32
    assert metrics["plan"]["why"] == "1 of the preset's 2"


@pytest.mark.parametrize("error", [
    torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB"),
    RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
    RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"),
])
def test_an_allocation_failure_is_memory_not_a_crash_and_names_the_batch_and_estimate(monkeypatch, error):
    def too_big(model_config, device, init_cache=None, built=None):
        raise error

    monkeypatch.setattr(cell, "prepare_model", too_big)
    metrics, _ = train.run(tiny_spec(), NO_APEX, threads=1)
    assert metrics["status"] == "skipped" and metrics["skip_cause"] == "machine", metrics["reason"]
    assert metrics["skip_needs"] == "more GPU memory"
    assert str(error).split(".")[0][:30] in metrics["reason"]
    assert "at batch size 2" in metrics["reason"] and "estimated peak" in metrics["reason"]


def test_any_other_runtime_error_is_still_a_failure(monkeypatch):
    def broken(model_config, device):
        raise RuntimeError("CUBLAS_STATUS_EXECUTION_FAILED")

    monkeypatch.setattr(cell, "prepare_model", broken)
    metrics, _ = train.run(tiny_spec(), NO_APEX, threads=1)
    assert metrics["status"] == "failed"


def test_breakdown_counts_the_tensors_of_the_first_optimizer_step():
    from amprepro.train import precision

    model = torch.nn.Linear(64, 32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    trainer = precision.Trainer("fp32", model, optimizer, torch.nn.functional.cross_entropy, torch.device("cpu"))
    breakdown = measure.Breakdown(model, trainer.optimizer)
    for _ in range(3):
        trainer.step(torch.randn(8, 64), torch.randint(0, 32, (8,)))
    weights = (64 * 32 + 32) * 4
    result = breakdown.result(peak_allocated=10 * weights)
    assert result["weights"] == weights and result["gradients"] == weights
    assert result["optimizer_state"] == 2 * weights + 2 * 4  # exp_avg, exp_avg_sq, and a step counter per tensor
    assert result["master_weights"] is None
    assert result["activations_and_workspace"] == 10 * weights - result["weights"] - result["gradients"] - result[
        "optimizer_state"]
    disabled = measure.Breakdown(model, optimizer, enabled=False)
    assert disabled.result(10 * weights) == dict.fromkeys(measure.Breakdown.KEYS)


def test_breakdown_counts_apex_o2_master_weights_and_their_gradients():
    """Under O2 the model holds FP16 weights and gradients; the optimizer's stash holds FP32 masters with gradients."""
    model = torch.nn.Linear(10, 10, bias=False).half()
    model.weight.grad = torch.zeros_like(model.weight)
    master = torch.zeros(10, 10, requires_grad=True)
    master.grad = torch.zeros(10, 10)
    optimizer = torch.optim.SGD([master], lr=0.1, momentum=0.9)
    optimizer._amp_stash = type("Stash", (), {"all_fp32_from_fp16_params": [master]})()
    breakdown = measure.Breakdown(model, optimizer)
    optimizer.step()
    result = breakdown.result(peak_allocated=2000)
    assert result["weights"] == 200 and result["master_weights"] == 400
    assert result["gradients"] == 200 + 400 and result["optimizer_state"] == 400  # the momentum buffer
    assert result["activations_and_workspace"] == 2000 - 200 - 400 - 600 - 400

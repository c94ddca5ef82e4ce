"""The memory estimate (amprepro.memory) and the memory plan (amprepro.plan.memplan) part by part, in process and
without a GPU: each formula against a count made here from the architecture or the module's docstring, each margin
at its edge, each text whole. Written for the mutation run of both modules (docs/mutation.md); all of it well under a
second."""

from __future__ import annotations

import json
import re
from typing import ClassVar

import pytest

from amprepro import memory, precisions
from amprepro.cellspec import CellSpec
from amprepro.memory import Lora, Sharding
from amprepro.memory.activations import _bytes
from amprepro.memory.llama import _llama_dtypes
from amprepro.plan import memplan

GIB = memory.GIB


# ----------------------------------------------------------------------------------------------------------------------
# Small helpers and texts


def test_within_headroom_is_at_most_headroom_of_the_budget_and_true_without_either():
    budget = 1000 * GIB
    edge = int(memory.HEADROOM * budget)
    assert memory.within_headroom(edge, budget) and not memory.within_headroom(edge + 1, budget)
    assert memory.within_headroom(None, budget) and memory.within_headroom(10**18, None)
    assert memory.within_headroom(None, None)


def test_gib_has_one_decimal_and_unknown_for_none():
    assert memory.gib(None) == "unknown"
    assert memory.gib(3 * GIB // 2) == "1.5 GiB" and memory.gib(0) == "0.0 GiB" and memory.gib(2.26 * GIB) == "2.3 GiB"


def parts_estimate(**change) -> memory.Estimate:
    values = dict(weights=1 * GIB, gradients=2 * GIB, optimizer_state=3 * GIB, master_weights=4 * GIB,
                  cast_cache=5 * GIB, activations=6 * GIB, workspace=7 * GIB, optimizer_temporaries=8 * GIB,
                  total=9 * GIB, peak_moment="optimizer step")
    return memory.Estimate(**{**values, **change})


def test_a_record_names_every_part_in_bytes_and_the_text_reads_it():
    e = parts_estimate()
    record = e.as_record()
    assert record == {"weights_bytes": GIB, "gradients_bytes": 2 * GIB, "optimizer_state_bytes": 3 * GIB,
                      "master_weights_bytes": 4 * GIB, "cast_cache_bytes": 5 * GIB, "activations_bytes": 6 * GIB,
                      "workspace_bytes": 7 * GIB, "optimizer_temporaries_bytes": 8 * GIB, "total_bytes": 9 * GIB,
                      "peak_moment": "optimizer step"}
    text = ("estimated peak 9.0 GiB at the optimizer step (weights 1.0 GiB, gradients 2.0 GiB, optimizer state 3.0 "
            "GiB, master weights 4.0 GiB, cast cache 5.0 GiB, activations 6.0 GiB, workspace 7.0 GiB)")
    assert memory.describe(e) == memory.describe_record(record) == text


def test_sharding_and_lora_are_checked_and_said_in_words():
    assert Sharding().text() == "one GPU" and Sharding(1, 3).text() == "one GPU"
    assert Sharding(4, 0).text() == "DDP over 4 GPUs"
    assert Sharding(4, 1).text() == "ZeRO-1 over 4 GPUs" and Sharding(8, 2).text() == "ZeRO-2 over 8 GPUs"
    assert Sharding(8, 3).text() == "FSDP (ZeRO-3) over 8 GPUs"
    for ranks, stage in ((0, 0), (2, -1), (2, 4)):
        with pytest.raises(ValueError) as raised:
            Sharding(ranks, stage)
        assert str(raised.value) == (f"sharding over {ranks} ranks at ZeRO stage {stage}: ranks must be >= 1 and the "
                                     "stage 0, 1, 2 or 3")
    assert Lora().text() == "LoRA r=16 on every linear, frozen FP32 base"
    assert Lora(1, "bf16", ("qkv", "down")).text() == "LoRA r=1 on qkv+down, frozen bf16 base"
    assert Lora(8, "fp32", ("gate_up", "out", "qkv", "down")).text() == "LoRA r=8 on every linear, frozen FP32 base"
    for kwargs in ({"rank": 0}, {"base": "fp16"}, {"targets": ("qkv", "lm_head")}):
        with pytest.raises(ValueError) as raised:
            Lora(**kwargs)
        lora = {"rank": 16, "base": "fp32", "targets": memory.LORA_TARGETS} | kwargs
        assert str(raised.value) == (f"LoRA rank {lora['rank']}, base {lora['base']!r}, targets {lora['targets']}: "
                                     "rank must be >= 1, the base fp32 or bf16, the targets among qkv, out, gate_up, "
                                     "down")


def test_the_memory_models_own_precision_and_the_registrys():
    assert memory.precision_of("bf16_weights") is memory.BF16_WEIGHTS
    assert memory.precision_of("amp_bf16") is precisions.get("amp_bf16")
    with pytest.raises(KeyError):
        memory.precision_of("fp64")


def test_each_rank_trains_its_share_of_the_batch():
    assert memory.cell_batch({"batch_size": 256}) == 256 and memory.cell_batch({"batch_size": 256, "gpus": 2}) == 128
    assert type(memory.cell_batch({"batch_size": 256, "gpus": 2})) is int


def test_shapes_vit_tokens_and_kv_width():
    assert memory.llama_shape({"arch": "llama"}) is memory.LLAMA_SHAPES["llama"]
    assert memory.llama_shape({"arch": "llama", "shape": "smollm_135m"}) is memory.LLAMA_SHAPES["smollm_135m"]
    assert memory.llama_shape({"arch": "llama_tiny", "shape": None}) is memory.LLAMA_SHAPES["llama_tiny"]
    assert memory.vit_tokens({}) == 14 * 14 + 1 and memory.vit_tokens({"image_size": 384}) == 24 * 24 + 1
    assert memory.kv_dim(memory.LLAMA_SHAPES["tinyllama_1b"]) == 4 * 2048 // 32
    assert memory.kv_dim(memory.LLAMA_SHAPES["llama"]) == 4096
    assert type(memory.kv_dim(memory.LLAMA_SHAPES["tinyllama_1b"])) is int and type(memory.vit_tokens({})) is int


# ----------------------------------------------------------------------------------------------------------------------
# Parameters: counted here from each architecture


def resnet50_count() -> tuple[int, int, int]:
    """(parameters, conv and linear weights, BatchNorm channels) of torchvision's ResNet-50 (v1.5), layer by layer."""
    convs, bn = 3 * 64 * 7 * 7, 64
    channels = 64
    for width, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for i in range(blocks):
            convs += channels * width + width * width * 9 + width * 4 * width
            bn += width + width + 4 * width
            if i == 0:
                convs += channels * 4 * width
                bn += 4 * width
            channels = 4 * width
    fc = channels * 1000
    return convs + 2 * bn + fc + 1000, convs + fc, bn


def vit_b_16_count(image_size: int = 224) -> tuple[int, int]:
    """(parameters, matmul weights) of torchvision's vit_b_16 at this image size."""
    d, layers, tokens = 768, 12, (image_size // 16) ** 2 + 1
    block = 2 * d + (3 * d * d + 3 * d) + (d * d + d) + 2 * d + (d * 4 * d + 4 * d) + (4 * d * d + d)
    patch = 3 * 16 * 16 * d
    total = patch + d + d + tokens * d + layers * block + 2 * d + d * 1000 + 1000
    return total, patch + layers * 12 * d * d + d * 1000


def test_resnet50_and_vit_parameters_are_their_layers():
    total, weights, bn = resnet50_count()
    assert total == 25_557_032  # torchvision's published count
    assert memory.parameters({"arch": "resnet50"}) == (total, weights) and memory.RESNET50["bn_channels"] == bn
    assert vit_b_16_count()[0] == 86_567_656  # torchvision's published count
    for arch in ("vit_b_16", "vit_base_patch16_224"):
        assert memory.parameters({"arch": arch}) == vit_b_16_count()
        assert memory.parameters({"arch": arch, "image_size": 384}) == vit_b_16_count(384)
    with pytest.raises(ValueError, match="no memory model for arch 'alexnet'"):
        memory.parameters({"arch": "alexnet"})


def matmul_weights(model) -> int:
    """What a cast cache copies: every Linear's and Conv2d's weight (a tied one once per module), attention's
    in_proj."""
    import torch

    total = 0
    for module in model.modules():
        if isinstance(module, (torch.nn.Linear, torch.nn.Conv2d)):
            total += module.weight.numel()
        if isinstance(module, torch.nn.MultiheadAttention):
            total += module.in_proj_weight.numel()
    return total


def test_gpt_and_the_digits_models_parameters_are_the_built_models():
    import torch

    from amprepro.train import models

    for arch, seq_len in (("gpt", 256), ("gpt_tiny", 64), ("gpt_bytes", 32)):
        with torch.device("meta"):
            model = models.build(arch, {"seq_len": seq_len})
        assert memory.parameters({"arch": arch, "seq_len": seq_len}) == (models.parameter_count(model),
                                                                         matmul_weights(model)), arch
    with torch.device("meta"):
        gpt = models.build("gpt", {})
    assert memory.parameters({"arch": "gpt"})[0] == models.parameter_count(gpt)  # seq_len 1024 by default
    cnn = models.build("small_cnn", {})
    assert memory.parameters({"arch": "small_cnn"}) == (models.parameter_count(cnn), matmul_weights(cnn))
    tiny = models.build("tiny_transformer", {})
    # the cast cache of the encoder's matmuls (the 8 -> 64 embedding and the head are left out: under 1 KiB)
    assert memory.parameters({"arch": "tiny_transformer"}) == (models.parameter_count(tiny),
                                                               matmul_weights(tiny.encoder))


# ----------------------------------------------------------------------------------------------------------------------
# Activations: counted here from the docstring's list of saved tensors


def test_the_bytes_of_each_precisions_matmul_inputs_residual_and_gelu():
    assert _bytes("fp32") == (4, 4, 4) and _bytes("amp_bf16") == (2, 4, 2)
    assert _bytes("apex_o1") == (2, 4, 4)  # apex O1 runs GELU in FP32
    assert _bytes("apex_o2") == (2, 2, 2) and _bytes("bf16_weights") == (2, 2, 2)
    d = 768
    # LayerNorm inputs 2 r d, the linears' and SDPA's 11 c d, GELU's input 4 g d
    assert memory.transformer_block_bytes_per_token(d, "fp32") == (8 + 44 + 16) * d
    assert memory.transformer_block_bytes_per_token(d, "amp_bf16") == (8 + 22 + 8) * d
    assert memory.transformer_block_bytes_per_token(d, "apex_o1") == (8 + 22 + 16) * d
    assert memory.transformer_block_bytes_per_token(d, "apex_o2") == (4 + 22 + 8) * d


def resnet50_saved(size: int, c: int) -> tuple[int, int]:
    """(saved, first gradient) bytes per image: each conv's output and each ReLU's, max pooling's output and int64
    indices, the downsample convs' outputs, the 16-bit copy of the image; the first conv's output gradient."""
    stem = 64 * (size // 2) ** 2
    elements = stem + stem  # conv1 output (bn1's input), relu output (max pooling's input)
    h = size // 4
    elements += 64 * h * h  # max pooling's output
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            out = h // stride if i == 0 else h
            elements += width * h * h * 2  # conv1's output, its ReLU's
            elements += width * out * out * 2  # conv2's (strided), its ReLU's
            elements += 4 * width * out * out * 2  # conv3's, the ReLU after the residual add
            if i == 0:
                elements += 4 * width * out * out  # the downsample conv's output
            h = out
    copy = 3 * size * size * c if c == 2 else 0
    return elements * c + 8 * 64 * (size // 4) ** 2 + copy, stem * c


@pytest.mark.parametrize("precision, c", [("fp32", 4), ("amp_bf16", 2)])
@pytest.mark.parametrize("size", [224, 160])
def test_resnet50_activations_are_its_saved_tensors_and_the_input(precision, c, size):
    assert memory.resnet50_bytes_per_item(size, precision) == resnet50_saved(size, c)
    assert [type(n) for n in memory.resnet50_bytes_per_item(size, precision)] == [int, int]
    saved, first = resnet50_saved(size, c)
    config = {"arch": "resnet50", "image_size": size} if size != 224 else {"arch": "resnet50"}
    assert memory.activation_bytes(config, precision, 3) == 3 * (saved + first + 3 * size * size * 4)


@pytest.mark.parametrize("precision", ["fp32", "amp_bf16", "apex_o1"])
def test_vit_and_gpt_activations_are_their_blocks_and_heads(precision):
    c, r, g = _bytes(precision)
    d = 768
    for arch in ("vit_b_16", "vit_base_patch16_224"):
        for size in (224, 384):
            tokens = (size // 16) ** 2 + 1
            config = {"arch": arch} if size == 224 else {"arch": arch, "image_size": size}
            per_item = 12 * tokens * (2 * r + 11 * c + 4 * g) * d + 2 * 4 * tokens * d + 3 * size * size * (
                4 + (c if c == 2 else 0))
            assert memory.activation_bytes(config, precision, 5) == 5 * per_item, (arch, size)
    for arch, layers, d, vocab in (("gpt", 12, 768, 50304), ("gpt_tiny", 2, 128, 512)):
        for seq_len in (1024, 100):
            config = {"arch": arch} if seq_len == 1024 else {"arch": arch, "seq_len": seq_len}
            per_token = layers * (2 * r + 11 * c + 4 * g) * d + 12 * vocab + 2 * 4 * d + 8
            assert memory.activation_bytes(config, precision, 3) == 3 * seq_len * per_token, (arch, seq_len)


def test_digits_and_llama_activations():
    for arch in ("small_cnn", "tiny_transformer"):
        assert memory.activation_bytes({"arch": arch}, "fp32", 64) == 64 * 64 * 64 * 16
    shape = memory.LLAMA_SHAPES["openllama_3b"]
    config = {"arch": "llama", "shape": "openllama_3b", "seq_len": 512, "activation_checkpointing": False}
    assert memory.activation_bytes(config, "amp_bf16", 2) == memory.llama_activation_bytes(shape, 2, 512, "amp_bf16",
                                                                                          False)
    assert memory.activation_bytes({"arch": "llama"}, "fp32", 1) == memory.llama_activation_bytes(
        memory.LLAMA_SHAPES["llama"], 1, 2048, "fp32", True)
    with pytest.raises(ValueError, match="no memory model for arch 'alexnet'"):
        memory.activation_bytes({"arch": "alexnet"}, "fp32", 1)


# ----------------------------------------------------------------------------------------------------------------------
# The estimate of a non-LLaMA cell, moment by moment


RESNET = {"arch": "resnet50", "data": "synthetic_images", "batch_size": 64}


@pytest.mark.parametrize("precision", ["fp32", "amp_bf16", "apex_o1", "apex_o2"])
@pytest.mark.parametrize("optimizer", ["adamw", "adamw_fused"])
@pytest.mark.parametrize("batch", [1, 64])
def test_a_resnet_estimate_is_its_parts_at_the_largest_moment(precision, optimizer, batch):
    params, matmul = memory.parameters(RESNET)
    p = precisions.get(precision)
    w, g, o, m, cast_per_weight = p.bytes_per_parameter
    w, g, o, m, cast = w * params, g * params, o * params, m * params, cast_per_weight * matmul
    temporaries = 0 if optimizer == "adamw_fused" else o // 2
    activations = memory.activation_bytes(RESNET, precision, batch)
    o1, o2 = precision == "apex_o1", precision == "apex_o2"
    kept = cast if o1 else 0  # apex O1's cast cache lives until scale_loss exits after the backward
    moments = {"forward end": w + m + o + (2 * params if o2 else 0) + cast + activations,
               "backward end": w + m + g - (4 * params if o2 else 0) + o + kept,
               "optimizer step": w + m + g + o + kept + temporaries}
    e = memory.estimate({**RESNET, "batch_size": batch}, precision, optimizer)
    assert (e.weights, e.gradients, e.optimizer_state, e.master_weights, e.cast_cache) == (w, g, o, m, cast)
    assert (e.activations, e.optimizer_temporaries, e.workspace) == (activations, temporaries, memory.WORKSPACE_BYTES)
    peak = max(moments, key=moments.get)
    assert (e.peak_moment, e.total) == (peak, moments[peak] + memory.WORKSPACE_BYTES)
    assert e.at_step == {"weights": w, "gradients": g, "optimizer_state": o, "master_weights": m}
    assert memory.estimate(RESNET, precision, optimizer, batch=batch) == e
    assert all(type(v) is int for k, v in e.as_record().items() if k.endswith("_bytes"))


def test_the_peak_moves_from_the_step_to_the_forward_as_the_batch_grows():
    assert memory.estimate({**RESNET, "batch_size": 1}, "fp32", "adamw").peak_moment == "optimizer step"
    assert memory.estimate(RESNET, "fp32", "adamw").peak_moment == "forward end"
    # 2 GPUs: each rank's share of the batch
    assert memory.estimate({**RESNET, "gpus": 2}, "fp32", "adamw") == memory.estimate(RESNET, "fp32", "adamw", 32)


def test_apex_o1_without_its_cast_cache_holds_no_casts():
    on, off = (memory.estimate(RESNET, "apex_o1", "adamw", apex_cast_cache=flag) for flag in (True, False))
    assert on == memory.estimate(RESNET, "apex_o1", "adamw")  # kept by default (no checkpointed recompute)
    matmul = memory.parameters(RESNET)[1]
    assert on.cast_cache == 2 * matmul and off.cast_cache == 0
    assert on.total - off.total == 2 * matmul  # in the forward's moment, the peak
    small = {**RESNET, "batch_size": 1}
    step_on, step_off = (memory.estimate(small, "apex_o1", "adamw", apex_cast_cache=f) for f in (True, False))
    assert step_on.peak_moment == step_off.peak_moment == "optimizer step"
    assert step_on.total - step_off.total == 2 * matmul  # the kept cache at the step too


def test_what_the_estimate_refuses_is_named():
    with pytest.raises(ValueError) as raised:
        memory.estimate(RESNET, "fp32", "adamw", lora=Lora())
    assert str(raised.value) == "sharding and LoRA are modelled for the LLaMA shapes only, not 'resnet50'"
    with pytest.raises(ValueError, match="LLaMA shapes only"):
        memory.estimate(RESNET, "fp32", "adamw", sharding=Sharding(2, 1))
    with pytest.raises(ValueError) as raised:
        memory.llama_estimate("llama", "apex_o2", lora=Lora())
    assert str(raised.value) == "LoRA is modelled under torch.amp or none, not apex_o2 (amp_bf16 or fp32)"
    with pytest.raises(ValueError) as raised:
        memory.llama_estimate("llama", "apex_o1", sharding=Sharding(8, 3))
    assert str(raised.value) == "ZeRO-3 is modelled with FSDP's MixedPrecision (amp_bf16), not apex O1's cast cache"
    memory.llama_estimate("llama", "apex_o1", sharding=Sharding(8, 2))  # ZeRO-2 is
    with pytest.raises(ValueError) as raised:
        memory.llama_estimate("llama13b", "fp32")
    assert str(raised.value) == f"unknown LLaMA shape 'llama13b': one of {', '.join(memory.LLAMA_SHAPES)}"


def test_llama_estimate_is_estimate_of_the_config_it_builds():
    for shape, precision, batch, seq_len, ckpt, optimizer in (("openllama_3b", "amp_bf16", 2, 512, False, "adamw"),
                                                               ("smollm_135m", "fp32", 3, 256, True, "adamw_fused")):
        config = {"arch": "llama", "shape": shape, "data": "synthetic_tokens", "batch_size": batch,
                  "seq_len": seq_len, "activation_checkpointing": ckpt}
        assert memory.llama_estimate(shape, precision, batch, seq_len, ckpt, optimizer) == memory.estimate(
            config, precision, optimizer)
    assert memory.llama_estimate("llama", "amp_bf16").optimizer_temporaries == 0  # fused AdamW by default


# ----------------------------------------------------------------------------------------------------------------------
# The memory plan (amprepro.plan.memplan) on fake estimates: each cell's estimate is set by the test


BUDGET = 100 * GIB


def spec(model="m", precision="fp32", batch=64, arch="resnet50", **extra) -> CellSpec:
    data = "synthetic_tokens" if arch.startswith(("gpt", "llama")) else "synthetic_images"
    return CellSpec.of({"model": model, "precision": precision, "seed": 0,
                        "model_config": {"arch": arch, "data": data, "batch_size": batch, **extra},
                        "train": {"steps": 30, "warmup_steps": 10, "lr": 1e-4, "optimizer": "adamw"}})


@pytest.fixture
def fake_estimates(monkeypatch):
    """{(precision, batch): total bytes}, or {(precision, batch, shape): ...} for a LLaMA shape; a cell not listed is
    estimated at its batch x 1 GiB."""
    totals: dict = {}

    def estimate(model_config, precision, optimizer, *args, **kwargs):
        batch = memory.cell_batch(model_config)
        key = (precision, batch, model_config.get("shape"))
        total = totals.get(key, totals.get((precision, batch), batch * GIB))
        return parts_estimate(total=total, peak_moment="forward end")

    monkeypatch.setattr(memplan.memory, "estimate", estimate)
    return totals


def judged(planner, precision, total, fake_estimates, **extra):
    fake_estimates[(precision, 8)] = total
    return planner.judge(spec(precision=precision, batch=8, **extra))


def test_judge_at_each_margins_edge(fake_estimates):
    planner = memplan.Planner(BUDGET, probe=lambda s: {})
    at = lambda precision, share: judged(planner, precision, int(share * BUDGET), fake_estimates)  # noqa: E731
    j = at("fp32", 0.85)
    assert (j["decision"], j["how"]) == ("fits", "estimate 85% of the budget (<= 85%)")
    assert j["ratio"] == int(0.85 * BUDGET) / BUDGET and j["model"] == "m" and j["precision"] == "fp32"
    assert j["batch_size"] == 8 and j["estimate"] == parts_estimate(total=int(0.85 * BUDGET),
                                                                     peak_moment="forward end").as_record()
    j = at("fp32", 0.8501)
    assert (j["decision"], j["how"]) == ("probe", "estimate 85% of the budget: close, probed")
    assert at("fp32", 1.02)["decision"] == "probe"
    j = at("fp32", 1.0201)
    assert (j["decision"], j["how"]) == ("does not fit", "estimate 102% of the budget (> 102%)")
    j = judged(memplan.Planner(BUDGET), "fp32", int(0.9 * BUDGET), fake_estimates)  # no probe here
    assert (j["decision"], j["how"]) == ("does not fit", "estimate 90% of the budget and no probe here")
    j = judged(memplan.Planner(50), "fp32", 51, fake_estimates)  # exactly PROBE_UP_TO: a close call, no probe here
    assert (j["ratio"], j["how"]) == (memplan.PROBE_UP_TO, "estimate 102% of the budget and no probe here")
    j = at("apex_o1", 0.95)
    assert (j["decision"], j["how"]) == ("fits", "estimate 95% of the budget (<= 95%; apex cells are not probed: apex "
                                         "is built beside the plan)")
    j = at("apex_o2", 0.9501)
    assert (j["decision"], j["how"]) == ("does not fit", "estimate 95% of the budget (> 95%, the most an unprobed "
                                         "apex cell may take)")
    assert at("apex_o1", 0.85)["how"] == "estimate 85% of the budget (<= 85%)"
    j = judged(memplan.Planner(None), "fp32", 10**18, fake_estimates)
    assert (j["ratio"], j["decision"], j["how"]) == (None, "fits", "no GPU memory limit here")
    # a data-parallel cell is judged at its rank's share
    fake_estimates[("fp32", 4)] = 7
    assert memplan.Planner(BUDGET).judge(spec(batch=8, gpus=2))["batch_size"] == 4


def clock(monkeypatch, *times):
    ticks = iter(times)
    monkeypatch.setattr(memplan.time, "monotonic", lambda: next(ticks))


def test_a_probe_is_recorded_whole_and_decides_by_the_headroom(monkeypatch):
    calls = []

    def probe(s):
        calls.append(s)
        return {"status": "ok", "peak_allocated_bytes": int(memory.HEADROOM * BUDGET), "peak_reserved_bytes": 99 * GIB}

    planner = memplan.Planner(BUDGET, probe)
    s = spec(batch=16, arch="llama", shape="smollm_135m")
    j = {"batch_size": 16, "how": "close", "estimate": {"total_bytes": 123}}
    group: list = []
    clock(monkeypatch, 10.0, 12.5)
    assert planner.run_probe(s, j, group) is True and calls == [s]
    rounded = memplan.Planner(BUDGET, probe)
    clock(monkeypatch, 0.0, 1.23456)
    rounded.run_probe(s, dict(j, how=""), [])
    assert rounded.probes[0]["seconds"] == 1.23 and rounded.probe_time == 1.23456
    record = {"model": "m", "precision": "fp32", "batch_size": 16, "shape": "smollm_135m", "status": "ok",
              "peak_allocated_bytes": int(memory.HEADROOM * BUDGET), "peak_reserved_bytes": 99 * GIB, "reason": "",
              "estimate_bytes": 123, "seconds": 2.5}
    assert j == {"batch_size": 16, "how": "close: ran, peak 95.0 GiB", "estimate": {"total_bytes": 123},
                 "probe": record, "decision": "fits"}
    assert planner.probes == group == [record] and planner.probe_time == 2.5
    # one byte over the headroom: ran, but no fit
    over = memplan.Planner(BUDGET, lambda s: {"status": "ok", "peak_allocated_bytes": int(0.95 * BUDGET) + 1})
    j = {"batch_size": 16, "how": "close", "estimate": {"total_bytes": 1}}
    clock(monkeypatch, 0.0, 1.0)
    assert over.run_probe(s, j, []) is False
    assert j["decision"] == "does not fit"
    assert j["how"] == "close: ran, but its peak 95.0 GiB is over 95% of the budget (no headroom)"
    # a probe that did not run: its status and the start of its reason
    failed = memplan.Planner(BUDGET, lambda s: {"status": "skipped", "reason": "x" * 200})
    j = {"batch_size": 16, "how": "close", "estimate": {"total_bytes": 1}}
    clock(monkeypatch, 0.0, 1.0)
    assert failed.run_probe(s, j, []) is False and j["how"] == "close: skipped (" + "x" * 120 + ")"
    assert j["probe"]["reason"] == "x" * 200 and j["probe"]["peak_allocated_bytes"] is None
    silent = memplan.Planner(BUDGET, lambda s: {"status": "failed", "reason": None})
    j = {"batch_size": 16, "how": "close", "estimate": {"total_bytes": 1}}
    clock(monkeypatch, 0.0, 1.0)
    assert silent.run_probe(s, j, []) is False and j["how"] == "close: failed ()"
    nothing = memplan.Planner(BUDGET, lambda s: {})  # no status at all: not a run
    j = {"batch_size": 16, "how": "close", "estimate": {"total_bytes": 1}}
    clock(monkeypatch, 0.0, 1.0)
    assert nothing.run_probe(s, j, []) is False and j["probe"]["status"] is None and j["probe"]["reason"] == ""


def test_the_probe_budget_in_probes_and_in_seconds(monkeypatch):
    calls = []
    ok = {"status": "ok", "peak_allocated_bytes": GIB}
    planner = memplan.Planner(BUDGET, lambda s: calls.append(s) or ok, probe_seconds=5)
    j = {"batch_size": 8, "how": "close", "estimate": {"total_bytes": 1}}
    assert planner.run_probe(spec(), j, [{}] * memplan.MAX_PROBES_PER_GROUP) is False and calls == []
    assert j == {"batch_size": 8, "how": "close; probe budget spent (taken as not fitting)",
                 "estimate": {"total_bytes": 1}, "decision": "does not fit"}
    clock(monkeypatch, 0.0, 4.99)
    assert planner.run_probe(spec(), dict(j, how="close"), [{}] * (memplan.MAX_PROBES_PER_GROUP - 1))
    clock(monkeypatch, 0.0, 1.0)
    assert planner.run_probe(spec(), dict(j, how="close"), [])  # 4.99 s spent: under the 5
    assert len(calls) == 2 and planner.probe_time == 5.99
    assert planner.run_probe(spec(), dict(j, how="close"), []) is False and len(calls) == 2  # 5.99 s: spent
    assert memplan.Planner(BUDGET, lambda s: ok).probe_seconds == memplan.PROBE_SECONDS == 40
    exact = memplan.Planner(BUDGET, lambda s: calls.append(s) or ok, probe_seconds=5)
    exact.probe_time = 5.0
    assert exact.run_probe(spec(), dict(j, how="close"), []) is False and len(calls) == 2


def test_the_worst_close_cell_is_probed_and_decides_for_the_others(fake_estimates):
    probed = []
    planner = memplan.Planner(BUDGET, lambda s: probed.append(s.precision) or {"status": "ok",
                                                                                "peak_allocated_bytes": GIB})
    fake_estimates.update({("fp32", 8): int(0.90 * BUDGET), ("tf32", 8): int(0.95 * BUDGET),
                           ("amp_bf16", 8): int(0.5 * BUDGET), ("amp_fp16", 8): int(0.86 * BUDGET)})
    specs = [spec(precision=p, batch=8) for p in ("fp32", "tf32", "amp_bf16", "amp_fp16")]
    group: list = []
    ok, cells = planner.fits(specs, group)
    assert ok and probed == ["tf32"] and len(group) == 1
    by = {c["precision"]: c for c in cells}
    assert by["tf32"]["decision"] == "fits" and by["amp_bf16"]["how"] == "estimate 50% of the budget (<= 85%)"
    assert by["fp32"]["decision"] == by["amp_fp16"]["decision"] == "fits"
    assert by["fp32"]["how"] == "estimate 90% of the budget: close, probed; decided by the probe of tf32"
    assert by["amp_fp16"]["how"] == "estimate 86% of the budget: close, probed; decided by the probe of tf32"
    # the probed cell is the one of that precision and model, not the first of the precision
    two = [spec(model="a", precision="fp32", batch=8), spec(model="b", precision="fp32", batch=4)]
    fake_estimates[("fp32", 8)], fake_estimates[("fp32", 4)] = int(0.9 * BUDGET), int(0.95 * BUDGET)
    seen = []
    memplan.Planner(BUDGET, lambda s: seen.append(s) or {"status": "ok"}).fits(two, [])
    assert seen == [two[1]]
    # one cell that does not fit: no probe at all
    fake_estimates[("amp_bf16", 8)] = int(1.5 * BUDGET)
    probed.clear()
    ok, cells = planner.fits(specs, [])
    assert not ok and probed == [] and [c["decision"] for c in cells].count("probe") == 3
    assert planner.fits([spec(precision="amp_fp16", batch=1)], []) == (True, [planner.judge(spec("m", "amp_fp16", 1))])


def test_a_failed_probe_says_so_on_every_cell_it_decided(fake_estimates):
    planner = memplan.Planner(BUDGET, lambda s: {"status": "ok", "peak_allocated_bytes": BUDGET})
    fake_estimates.update({("fp32", 8): int(0.90 * BUDGET), ("tf32", 8): int(0.95 * BUDGET)})
    ok, cells = planner.fits([spec(precision="fp32", batch=8), spec(precision="tf32", batch=8)], [])
    assert not ok and [c["decision"] for c in cells] == ["does not fit", "does not fit"]


def test_group_keys_ladders_and_shapes():
    key = lambda **c: json.loads(memplan.group_key(spec(**c)))  # noqa: E731
    assert key() == ["resnet50", "synthetic_images", 224, None, True, 64, 1, None]
    assert key(image_size=160, gpus=2, batch=32) == ["resnet50", "synthetic_images", 160, None, True, 32, 2, None]
    assert key(arch="llama") == ["llama", "synthetic_tokens", None, 2048, True, 64, 1, None]
    assert key(arch="gpt") == ["gpt", "synthetic_tokens", None, 1024, True, 64, 1, None]
    assert key(arch="llama", seq_len=512, activation_checkpointing=False, shape="smollm_135m") == [
        "llama", "synthetic_tokens", None, 512, False, 64, 1, "smollm_135m"]
    digits = CellSpec.of({"model": "cnn", "precision": "fp32", "model_config": {"arch": "small_cnn", "data": "digits",
                                                                                  "batch_size": 64}})
    assert json.loads(memplan.group_key(digits)) == ["small_cnn", "digits", None, None, True, 64, 1, None]
    assert memplan.ladder(32) == [32, 24, 16, 8, 7, 6, 5, 4, 3, 2, 1]
    assert memplan.ladder(8) == [8, 7, 6, 5, 4, 3, 2, 1] and memplan.ladder(16) == [16, 8, 7, 6, 5, 4, 3, 2, 1]
    assert memplan.ladder(3) == [3, 2, 1] and memplan.ladder(1) == [1]
    ladder = [key for key, _, _ in memory.LLAMA_LADDER]
    assert memplan.shapes_to_try(spec(arch="llama"), "preset") == ladder
    assert memplan.shapes_to_try(spec(arch="llama"), "config") == [None]
    assert memplan.shapes_to_try(spec(arch="llama", shape="smollm_135m"), "preset") == ["smollm_135m"]
    assert memplan.shapes_to_try(spec(arch="llama_tiny"), "preset") == [None]
    assert memplan.shapes_to_try(spec(), "preset") == [None]


def test_a_group_steps_down_the_ladder_and_says_where_it_stopped(fake_estimates):
    planner = memplan.Planner(BUDGET)
    specs = [spec(precision="fp32", batch=32), spec(precision="amp_bf16", batch=32)]
    for batch in memplan.ladder(32):
        fake_estimates[("fp32", batch)] = batch * 4 * GIB
        fake_estimates[("amp_bf16", batch)] = batch * 2 * GIB
    d = planner.plan_group(specs, "preset")
    assert (d["batch_size"], d["preset_batch_size"], d["fits"], d["shape"], d["shape_name"]) == (16, 32, True, None,
                                                                                                  None)
    assert d["why"] == "16 of the preset's 32: the largest at which m/strict FP32 fits in 100.0 GiB"
    assert [(t["batch_size"], t["fits"]) for t in d["tried"]] == [(32, False), (24, False), (16, True)]
    assert d["source"] == "preset" and all(t["shape"] is None for t in d["tried"])
    assert [c["precision"] for c in d["tried"][0]["cells"]] == ["fp32", "amp_bf16"]
    # the config's batch: tried alone, kept when it does not fit
    d = planner.plan_group(specs, "config")
    assert (d["batch_size"], d["fits"], len(d["tried"]), d["source"]) == (32, False, 1, "config")
    e = parts_estimate(total=128 * GIB, peak_moment="forward end").as_record()
    assert d["why"] == ("does not fit: m/fp32 at batch 32 estimate 128% of the budget (> 102%); "
                        f"{memory.describe_record(e)} against 100.0 GiB here; the batch is the config's, kept as "
                        "written")
    small = [spec(precision="fp32", batch=8), spec(precision="amp_bf16", batch=8)]
    for batch in memplan.ladder(8):
        fake_estimates[("fp32", batch)] = fake_estimates[("amp_bf16", batch)] = 200 * GIB
    fake_estimates[("fp32", 1)] = 300 * GIB
    d = planner.plan_group(small, "preset")
    assert (d["batch_size"], d["fits"], len(d["tried"])) == (8, False, 8)
    assert d["why"].startswith("does not fit: m/fp32 at batch 8 estimate 300% of the budget (> 102%); ")
    assert d["why"].endswith(" against 100.0 GiB here; no batch of the ladder fits")
    fake_estimates[("fp32", 8)] = fake_estimates[("amp_bf16", 8)] = GIB
    d = planner.plan_group(small, "config")
    assert d["why"] == "the config's batch 8: every precision fits in 100.0 GiB" and d["fits"]
    d = planner.plan_group(small, "preset")
    assert d["why"] == "the preset's batch 8: every precision fits" and len(d["tried"]) == 1
    d = memplan.Planner(None).plan_group(small, "preset")
    assert d["why"] == "the preset's batch 8: no GPU here, nothing to fit"
    d = memplan.Planner(None).plan_group(small, "config")
    assert d["why"] == "the config's batch 8: no GPU here, nothing to fit"


def test_the_7b_model_steps_down_the_shapes_at_the_presets_batch(fake_estimates):
    specs = [spec("llama7b", p, 2, arch="llama") for p in ("fp32", "amp_bf16")]
    for p in ("fp32", "amp_bf16"):
        for shape in ("llama", None, "openllama_3b", "tinyllama_1b"):
            fake_estimates[(p, 2, shape)] = 200 * GIB
        fake_estimates[(p, 1)] = GIB  # a smaller batch would fit: never tried
    d = memplan.Planner(BUDGET).plan_group(specs, "preset")
    assert [(t["shape"], t["batch_size"]) for t in d["tried"]] == [(None, 2), ("openllama_3b", 2),
                                                                   ("tinyllama_1b", 2), ("smollm_360m", 2)]
    assert (d["shape"], d["shape_name"], d["batch_size"], d["fits"]) == ("smollm_360m", "SmolLM-360M", 2, True)
    params = memory.llama_parameters(memory.LLAMA_SHAPES["smollm_360m"])[0]
    assert d["why"] == (f"SmolLM-360M shape ({params / 1e9:.2f} B parameters), the largest LLaMA-family shape of the "
                        "ladder whose every precision fits in 100.0 GiB")
    fake_estimates[("fp32", 2, None)] = fake_estimates[("amp_bf16", 2, None)] = GIB
    d = memplan.Planner(BUDGET).plan_group(specs, "preset")
    assert (d["shape"], d["shape_name"], d["why"]) == (None, None, "the preset's batch 2: every precision fits")
    for shape in ("smollm_360m", "smollm_135m"):
        fake_estimates[("fp32", 2, shape)] = fake_estimates[("amp_bf16", 2, shape)] = 200 * GIB
    fake_estimates[("fp32", 2, None)] = 200 * GIB
    d = memplan.Planner(BUDGET).plan_group(specs, "preset")
    assert (d["fits"], d["shape"], d["batch_size"], len(d["tried"])) == (False, None, 2, 5)
    # a shape the config set is kept, and the plan says nothing about a shape; it is kept when nothing fits too
    fixed = [spec("small", p, 2, arch="llama", shape="smollm_135m") for p in ("fp32", "amp_bf16")]
    for p in ("fp32", "amp_bf16"):
        for batch in (2, 1):
            fake_estimates[(p, batch, "smollm_135m")] = 200 * GIB
    d = memplan.Planner(BUDGET).plan_group(fixed, "preset")
    assert (d["fits"], d["shape"], d["shape_name"], d["batch_size"], len(d["tried"])) == (
        False, "smollm_135m", "SmolLM-135M", 2, 2)
    d = memplan.Planner(None).plan_group(fixed, "preset")
    assert (d["shape"], d["shape_name"], d["why"]) == ("smollm_135m", "SmolLM-135M",
                                                        "the preset's batch 2: no GPU here, nothing to fit")


class FakeProperties:
    name = "NVIDIA H200"


def fake_cuda(monkeypatch, free, total):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "init", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: FakeProperties() if i == 0 else None)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i=None: (free, total) if i == 0 else (0, 0))


def test_the_card_on_the_cpu_and_on_a_gpu_with_and_without_a_cap(monkeypatch):
    assert memplan.card("cpu", 12.0) == {"device": "cpu", "budget_bytes": None, "allocator_limit_bytes": None,
                                         "cap_gib": 12.0, "note": "no GPU: the presets' batches are kept"}
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert memplan.card("cuda", 12.0) == {"device": "cpu", "budget_bytes": None, "allocator_limit_bytes": None,
                                          "cap_gib": 12.0, "note": "GPU jobs, but torch sees no CUDA device in the "
                                          "plan's job: the presets' batches are kept"}
    total, free = 140 * GIB, 139 * GIB
    fake_cuda(monkeypatch, free, total)
    base = {"device": "cuda", "gpu": "NVIDIA H200", "total_bytes": total, "free_bytes": free, "in_use_bytes": GIB}
    assert memplan.card("cuda", None) == {**base, "cap_gib": None, "allocator_limit_bytes": None,
                                          "budget_bytes": free}
    assert memplan.card("cuda", 140) == {**base, "cap_gib": 140, "allocator_limit_bytes": None, "budget_bytes": free,
                                         "note": "gpu_memory_limit_gib 140 is not below this card's 140.0 GiB: no "
                                                 "cap applied"}
    assert memplan.card("cuda", 12.5) == {**base, "cap_gib": 12.5, "allocator_limit_bytes": int(11.5 * GIB),
                                          "budget_bytes": int(11.5 * GIB), "note": "emulating a 12.5 GiB card: 12.5 "
                                          "GiB less the 1.0 GiB already in use (the CUDA context)"}
    fake_cuda(monkeypatch, 5 * GIB, total)  # another process holds most of the card: the free memory bounds it
    capped = memplan.card("cuda", 139.5)
    assert capped["allocator_limit_bytes"] == int(4.5 * GIB) and capped["budget_bytes"] == int(4.5 * GIB)
    assert memplan.card("cuda", 100)["budget_bytes"] == 0 == memplan.card("cuda", 100)["allocator_limit_bytes"]
    fake_cuda(monkeypatch, 139 * GIB, total)
    assert memplan.card("cuda", 139.5)["budget_bytes"] == int(138.5 * GIB)  # the cap less what is in use


def test_the_plan_groups_the_models_and_each_model_gets_its_view(fake_estimates, monkeypatch):
    cells = [{"spec": spec("r", p, 32).as_dict(), "batch_source": "preset"} for p in ("fp32", "amp_bf16")]
    cells += [{"spec": spec("r_cl", p, 32, channels_last=True).as_dict()} for p in ("fp32",)]
    cells += [{"spec": spec("own", p, 32, image_size=224).as_dict(), "batch_source": "config"} for p in ("fp32",)]
    for batch in memplan.ladder(32):
        fake_estimates[("fp32", batch)] = batch * 5 * GIB  # 24: 120 %, 16: 80 %
        fake_estimates[("amp_bf16", batch)] = batch * 2 * GIB
    machine = {"device": "cuda", "budget_bytes": BUDGET, "allocator_limit_bytes": BUDGET, "cap_gib": 100}
    probed = []
    plan = memplan.make_plan(cells, machine, lambda s: probed.append(s) or {"status": "ok",
                                                                            "peak_allocated_bytes": GIB})
    assert [g["models"] for g in plan["groups"]] == [["r", "r_cl"], ["own"]]
    assert [(g["batch_size"], g["source"], g["fits"]) for g in plan["groups"]] == [(16, "preset", True),
                                                                                  (32, "config", False)]
    assert plan["machine"] is machine and plan["probes"] == [] and probed == []
    assert plan["margins"] == {"fit": 0.85, "probe_up_to": 1.02, "apex_unprobed": 0.95, "probe_headroom": 0.95}
    assert plan["models"]["r_cl"] == memplan.view("r_cl", plan["groups"][0], machine)
    assert plan["models"]["own"] == {"model": "own", "batch_size": 32, "preset_batch_size": 32, "shape": None,
                                     "shape_name": None, "fits": False, "why": plan["groups"][1]["why"],
                                     "source": "config", "cap_gib": 100, "allocator_limit_bytes": BUDGET}
    assert set(plan["models"]) == {"r", "r_cl", "own"} and plan["probe_seconds"] == 0
    # probes run on a GPU only: the same close call on a CPU machine with a budget is not probed
    fake_estimates[("fp32", 16)] = int(0.9 * BUDGET)
    plan = memplan.make_plan(cells[:1], machine, lambda s: probed.append(s) or {"status": "ok",
                                                                                "peak_allocated_bytes": GIB})
    assert len(probed) == 1 and plan["models"]["r"]["batch_size"] == 16 and len(plan["probes"]) == 1
    clock(monkeypatch, 0.0, 3.0, 5.25, 7.5)
    plan = memplan.make_plan(cells[:1], {**machine, "device": "cpu"}, lambda s: probed.append(s) or {})
    assert len(probed) == 1 and plan["models"]["r"]["batch_size"] == 8 and plan["probes"] == []
    assert plan["seconds"] == 3.0 and plan["probe_seconds"] == 0
    clock(monkeypatch, 1.0, 2.0, 4.5, 6.0)  # make_plan's start, the probe's start and end, make_plan's end
    plan = memplan.make_plan(cells[:1], machine, lambda s: {"status": "ok", "peak_allocated_bytes": GIB})
    assert plan["probe_seconds"] == 2.5 and plan["seconds"] == 5.0 and plan["probes"][0]["seconds"] == 2.5
    clock(monkeypatch, 1.0, 2.0, 3.23456, 7.65432)
    plan = memplan.make_plan(cells[:1], machine, lambda s: {"status": "ok", "peak_allocated_bytes": GIB})
    assert plan["probe_seconds"] == 1.23 and plan["seconds"] == 6.65


def test_the_command_line_writes_the_plan_and_one_view_per_model(tmp_path, capsys, monkeypatch):
    cells = [{"spec": spec("r", p, 32).as_dict()} for p in ("fp32", "amp_bf16")]
    cells += [{"spec": spec("t", "fp32", 4, arch="llama", shape="smollm_135m").as_dict(), "batch_source": "config"}]
    out = tmp_path / "plan" / "plan.json"
    (tmp_path / "plan" / "probes" / "old").mkdir(parents=True)  # an earlier plan's probes: removed
    assert memplan.main(["--cells", json.dumps(cells), "--device", "cpu", "--limit-gib", "12", "--out", str(out),
                         "--views", str(tmp_path / "views")]) == 0
    plan = json.loads(out.read_text())
    assert plan["machine"] == memplan.card("cpu", 12.0) and plan["seconds_total"] >= plan["seconds"]
    for model in ("r", "t"):
        assert json.loads((tmp_path / "views" / f"{model}.json").read_text()) == plan["models"][model]
    assert not (tmp_path / "plan" / "probes").exists()
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "plan: r: batch 32: the preset's batch 32: no GPU here, nothing to fit"
    assert printed[1] == "plan: t: batch 4, shape SmolLM-135M: the config's batch 4: no GPU here, nothing to fit"
    assert printed[2] == f"plan: 0 probe(s), 0.0 s; {plan['seconds_total']} s in all"
    assert len(printed) == 3
    for missing in ("--cells", "--device", "--out", "--views"):
        argv = {"--cells": "[]", "--device": "cpu", "--out": str(out), "--views": str(tmp_path)}
        del argv[missing]
        with pytest.raises(SystemExit) as exited:
            memplan.main([x for kv in argv.items() for x in kv])
        assert exited.value.code == 2 and f"the following arguments are required: {missing}" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        memplan.main(["--cells", "[]", "--device", "tpu", "--out", str(out), "--views", str(tmp_path)])
    assert "invalid choice: 'tpu'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        memplan.main(["--help"])
    assert exited.value.code == 0
    help_text = capsys.readouterr().out
    assert " ".join(help_text.split()).count(memplan.__doc__.split("\n")[0]) == 1
    assert "Writes plan.json" not in " ".join(help_text.split())  # the docstring's first line only
    assert re.search(r"--cells CELLS\s+JSON list of \{spec, batch_source\}\n", help_text), help_text
    assert re.search(r"--threads THREADS\s+each probe's threads \(the job's\)\n", help_text), help_text
    assert re.search(r"--views VIEWS\s+folder for one <model>.json per model\n", help_text), help_text
    assert "--device {cuda,cpu}" in help_text


class FakeProber:
    made: ClassVar[list] = []

    def __init__(self, folder, machine, threads=1):
        self.made.append((folder, machine, threads))

    def run(self, spec):
        return {"status": "ok", "peak_allocated_bytes": GIB}


def test_the_command_line_on_a_gpu_plans_against_its_card_and_probes_with_the_jobs_threads(tmp_path, capsys,
                                                                                          monkeypatch):
    from amprepro.plan import probe

    fake_cuda(monkeypatch, 139 * GIB, 140 * GIB)
    monkeypatch.setattr(probe, "Prober", FakeProber)
    ticks = iter(1 + x * 1.23456 for x in range(100))
    monkeypatch.setattr(memplan.time, "monotonic", lambda: next(ticks))
    FakeProber.made = []
    cells = [{"spec": spec(m, "fp32", 8).as_dict()} for m in ("a", "b")]
    out = tmp_path / "plan.json"
    # no --limit-gib here: the cap's arithmetic is card()'s (above), and --limit-gib read as text would make it build
    # a string of 12.5 GiB (the CPU run above fails on the text at once)
    argv = ["--cells", json.dumps(cells), "--device", "cuda", "--out", str(out), "--views", str(tmp_path / "views")]
    assert memplan.main(argv) == 0
    plan = json.loads(out.read_text())
    assert plan["machine"] == {"device": "cuda", "gpu": "NVIDIA H200", "total_bytes": 140 * GIB,
                               "free_bytes": 139 * GIB, "in_use_bytes": GIB, "cap_gib": None,
                               "allocator_limit_bytes": None, "budget_bytes": 139 * GIB}
    assert FakeProber.made == [(tmp_path / "probes", plan["machine"], 1)]  # one thread unless told
    assert plan["seconds_total"] == round(3 * 1.23456, 2) and plan["seconds"] == round(1.23456, 2)
    assert capsys.readouterr().out.splitlines()[0].startswith("plan: a, b: batch 8: ")
    assert memplan.main([*argv, "--threads", "3"]) == 0 and FakeProber.made[-1][2] == 3


# ----------------------------------------------------------------------------------------------------------------------
# The LLaMA parts, counted from the module's docstring


def test_each_precisions_llama_dtypes():
    # (matmul bytes, residual bytes, an adapter input's bytes, autocast, FP32 weights cast at each use)
    assert _llama_dtypes("fp32") == (4, 4, 4, False, False)
    assert _llama_dtypes("amp_bf16") == (2, 4, 2, True, True)
    assert _llama_dtypes("apex_o1") == (2, 4, 2, True, True)  # apex O1's patched functions autocast
    assert _llama_dtypes("apex_o2") == (2, 2, 4, False, False)
    assert _llama_dtypes("bf16_weights") == (2, 2, 4, False, False)
    assert _llama_dtypes("fp32", Lora(base="bf16")) == (2, 2, 4, False, False)
    assert _llama_dtypes("amp_bf16", Lora(base="bf16")) == (2, 2, 2, True, False)
    assert _llama_dtypes("amp_bf16", Lora(base="fp32")) == (2, 4, 2, True, True)


@pytest.mark.parametrize("precision, lora, seq_len", [("fp32", None, 2048), ("amp_bf16", None, 1024),
                                                      ("amp_bf16", None, 4096), ("apex_o2", None, 2048),
                                                      ("fp32", Lora(), 2048), ("amp_bf16", Lora(base="bf16"), 512)])
def test_the_llama_heads_kept_tensors_loss_and_first_gradients(precision, lora, seq_len):
    shape = memory.LLAMA_SHAPES["llama"]
    d, v, batch = shape["dim"], shape["vocab_size"], 2
    tokens = batch * seq_len
    c, r, _, autocast, _ = _llama_dtypes(precision, lora)
    norm_input = 4 * d if r == 4 else 2 * 4 * d  # the FP32 residual, or two FP32 copies of a 16-bit one
    kept = tokens * norm_input
    if lora is None:  # the normalised input (FP32 or r bytes) and the LM head's input
        kept += tokens * ((4 if r == 4 else r) * d + c * d)
    loss = tokens * v * 4 + tokens * v * 4 + (tokens * v * c if c == 2 else 0)  # FP32 copy, log-softmax, 16-bit
    first = 12 * tokens * v
    if lora is None:
        candidates = [first, tokens * v * c + v * d * c + tokens * d * c]
        if autocast:
            candidates.append(v * d * (c + 4))
        first = max(candidates)
    assert memory.llama_head_bytes(shape, batch, seq_len, precision, lora) == (kept, loss, first)


def test_which_of_the_heads_first_gradients_is_the_largest():
    shape = memory.LLAMA_SHAPES["llama"]
    d, v = shape["dim"], shape["vocab_size"]
    # 1 x 1024 tokens under AMP: the LM head's FP32 weight gradient beside its bf16 cast
    assert memory.llama_head_bytes(shape, 1, 1024, "amp_bf16")[2] == v * d * 6 > 12 * 1024 * v
    # strict FP32, 2048 tokens: the weight gradient and the logits' gradient it is computed from
    assert memory.llama_head_bytes(shape, 1, 2048, "fp32")[2] == 4 * (2048 * v + v * d + 2048 * d) > 12 * 2048 * v
    # many tokens: log-softmax's output, its gradient and its input's gradient
    assert memory.llama_head_bytes(shape, 4, 2048, "fp32")[2] == 12 * 4 * 2048 * v


@pytest.mark.parametrize("name, precision, lora", [("llama", "fp32", None), ("llama", "amp_bf16", None),
                                                   ("llama", "apex_o2", None), ("tinyllama_1b", "fp32", None),
                                                   ("tinyllama_1b", "amp_bf16", None), ("tinyllama_1b", "tf32", None),
                                                   ("openllama_3b", "apex_o1", None), ("llama", "fp32", Lora()),
                                                   ("smollm_360m", "amp_bf16", Lora(4, "bf16"))])
def test_a_llama_blocks_inputs_saved_tensors_and_extras(name, precision, lora):
    shape = memory.LLAMA_SHAPES[name]
    batch, seq_len = 3, 256
    c, r, _, autocast, _ = _llama_dtypes(precision, lora)
    tokens = batch * seq_len
    inputs = shape["layers"] * tokens * shape["dim"] * r
    saved = tokens * sum(memory.llama_block_terms(shape, precision, lora).values())
    head_dim = shape["dim"] // shape["heads"]
    rope = 2 * 2 * seq_len * head_dim * c if autocast and r == 4 else 0  # cos and sin, for q and for k
    grouped = shape.get("kv_heads", shape["heads"]) < shape["heads"]
    scores = 3 * 4 * batch * shape["heads"] * seq_len * seq_len if c == 4 and grouped else 0
    assert memory.llama_block_bytes(shape, batch, seq_len, precision, lora) == (inputs, saved, rope + scores)
    assert (rope > 0) == (precision in ("amp_bf16", "apex_o1") and (lora is None or lora.base == "fp32"))
    on = memory.llama_activation_bytes(shape, batch, seq_len, precision, True, lora)
    off = memory.llama_activation_bytes(shape, batch, seq_len, precision, False, lora)
    kept, _, first = memory.llama_head_bytes(shape, batch, seq_len, precision, lora)
    assert (on, off) == (inputs + kept + first, shape["layers"] * (saved + rope + scores) + kept + first)
    assert memory.llama_activation_bytes(shape, batch, seq_len, precision, lora=lora) == on  # checkpointed by default


def test_the_llama_parameters_linears_units_and_adapters():
    shape = memory.LLAMA_SHAPES["tinyllama_1b"]
    d, f, v, n, kv = 2048, 5632, 32000, 22, 256
    linears = {"qkv": (d, d + 2 * kv), "out": (d, d), "gate_up": (d, 2 * f), "down": (f, d)}
    assert memory.llama_linear_shapes(shape) == linears
    block = d * (d + 2 * kv) + d * d + d * 2 * f + f * d
    assert memory.llama_parameters(shape) == (n * (block + 2 * d) + 2 * v * d + d, n * block + v * d)
    assert memory.llama_unit_parameters(shape) == v * d  # the embedding's (and the LM head's) unit is the largest
    big = memory.LLAMA_SHAPES["llama"]
    big_block = sum(i * o for i, o in memory.llama_linear_shapes(big).values()) + 2 * big["dim"]
    assert memory.llama_unit_parameters(big) == big_block > big["vocab_size"] * big["dim"]  # LLaMA-7B's: a block
    assert memory.lora_parameters(shape, Lora(8, targets=("qkv", "down"))) == n * 8 * (d + d + 2 * kv + f + d)


def test_llama_7b_blocks_terms_by_name():
    """LLaMA-7B's block, tensor by tensor, per token (h 4096, ffn 11008; no grouped KV heads, head size 128)."""
    h, f = 4096, 11008
    shape = memory.LLAMA_SHAPES["llama"]
    assert memory.llama_block_terms(shape, "fp32") == {
        "RMSNorm inputs": 2 * 4 * h, "RMSNorm's normalised input": 2 * 4 * h, "qkv and gate_up inputs": 2 * 4 * h,
        "q, k and v": 4 * 3 * h, "rotated q and k": 4 * 2 * h, "attention output": 4 * h, "gate_up output": 4 * 2 * f,
        "SiLU output": 4 * f, "product (down's input)": 4 * f}
    assert memory.llama_block_terms(shape, "apex_o2") == {  # a 16-bit residual: two FP32 copies per norm
        "RMSNorm inputs": 2 * 2 * 4 * h, "RMSNorm's normalised input": 2 * 2 * h, "qkv and gate_up inputs": 2 * 2 * h,
        "q, k and v": 2 * 3 * h, "rotated q and k": 2 * 2 * h, "attention output": 2 * h, "gate_up output": 2 * 2 * f,
        "SiLU output": 2 * f, "product (down's input)": 2 * f}
    # LoRA over an FP32 base under AMP: frozen norms keep no normalised input; each adapter's A its own bf16 input copy
    assert memory.llama_block_terms(shape, "amp_bf16", Lora(8, "fp32")) == {
        "RMSNorm inputs": 2 * 4 * h, "qkv and gate_up inputs": 2 * 2 * h, "q, k and v": 2 * 3 * h,
        "rotated q and k": 2 * 2 * h, "attention output": 2 * h, "out projection's input copy": 2 * h,
        "gate_up output": 2 * 2 * f, "SiLU output": 2 * f, "product (down's input)": 2 * f,
        "adapters' rank-r outputs": 4 * 8 * 2}
    # LoRA over a bf16 base without autocast: bf16 matmuls, but each adapter's A keeps an FP32 copy of its input
    terms = memory.llama_block_terms(shape, "fp32", Lora(8, "bf16"))
    assert terms["qkv and gate_up inputs"] == 2 * 4 * h and terms["product (down's input)"] == 4 * f
    assert terms["out projection's input copy"] == 4 * h and terms["q, k and v"] == 2 * 3 * h
    assert terms["RMSNorm inputs"] == 2 * 2 * 4 * h and "RMSNorm's normalised input" not in terms
    # LoRA in FP32: the adapters' inputs in FP32, no copy for the out projection
    terms = memory.llama_block_terms(shape, "fp32", Lora(4, "fp32", ("qkv",)))
    assert terms["qkv and gate_up inputs"] == 2 * 4 * h and "out projection's input copy" not in terms
    assert terms["adapters' rank-r outputs"] == 1 * 4 * 4 and terms["product (down's input)"] == 4 * f


def test_grouped_kv_and_padded_heads_terms():
    tiny = memory.LLAMA_SHAPES["tinyllama_1b"]  # 32 heads of 64, 4 KV heads: k and v 256 wide
    h, f, kv = 2048, 5632, 256
    terms = memory.llama_block_terms(tiny, "amp_bf16")
    assert (terms["q, k and v"], terms["rotated q and k"]) == (2 * (h + 2 * kv), 2 * (h + kv))
    smol = memory.LLAMA_SHAPES["smollm_360m"]  # 15 heads of 64, 5 KV heads
    assert memory.llama_block_terms(smol, "fp32")["q, k and v"] == 4 * (960 + 2 * 5 * 64)
    three = memory.LLAMA_SHAPES["openllama_3b"]  # 32 heads of 100: flash attention pads them to 104
    terms = memory.llama_block_terms(three, "amp_bf16")
    assert terms["flash attention's padded q, k, v and output"] == 2 * 104 * 2 * (32 + 32)
    assert terms["out projection's input copy"] == 2 * 3200
    assert not {"q, k and v", "rotated q and k", "attention output"} & set(terms)
    padded_gqa = {"vocab_size": 256, "layers": 2, "heads": 6, "kv_heads": 2, "dim": 60, "ffn_dim": 160}  # heads of 10
    assert memory.llama_block_terms(padded_gqa, "amp_bf16")["flash attention's padded q, k, v and output"] == (
        2 * 16 * 2 * (6 + 2))
    del f


def test_korthikantis_count_term_by_term_by_name():
    h, f, a, s = 4096, 11008, 32, 2048
    assert memory.korthikanti_terms(memory.LLAMA_SHAPES["llama"], s) == {
        "korthikanti (34 h + 5 a s)": 34 * h + 5 * a * s, "no dropout masks": -2 * h,
        "no s^2 scores (SDPA)": -5 * a * s,
        "SwiGLU for the 4h GELU MLP": 8 * f - 16 * h, "grouped KV heads": 0, "RoPE's rotated q and k": 4 * h,
        "RMSNorm's FP32 inputs and normalised inputs": 16 * h - 4 * h, "flash attention's head padding": 0}
    three = memory.korthikanti_terms(memory.LLAMA_SHAPES["openllama_3b"], 1024)
    h3 = 3200
    padded = 2 * 104 * 2 * 64 + 2 * h3
    assert three["flash attention's head padding"] == padded - (2 * 3 * h3 + 2 * 2 * h3 + 2 * h3)
    tiny = memory.korthikanti_terms(memory.LLAMA_SHAPES["tinyllama_1b"], 1024)
    assert tiny["grouped KV heads"] == 2 * (2048 + 2 * 256) - 6 * 2048 and tiny["RoPE's rotated q and k"] == 2 * (
        2048 + 256)
    assert memory.korthikanti_layer_bytes(memory.LLAMA_SHAPES["smollm_135m"], 3, 100) == (100 * 3 * 576 * 34
                                                                                          + 5 * 9 * 100 * 100 * 3)


# ----------------------------------------------------------------------------------------------------------------------
# The LLaMA estimate over a grid of regimes, moment by moment, by the module docstring's rules


def backward_end_by_hand(shape, seq_len, precision, batch, lora, sharding, cast_kept):
    c, r, _, _, casts = _llama_dtypes(precision, lora)
    _, saved, extra = memory.llama_block_bytes(shape, batch, seq_len, precision, lora)
    tokens, d, f = batch * seq_len, shape["dim"], shape["ffn_dim"]
    block = sum(i * o for i, o in memory.llama_linear_shapes(shape).values())
    # the first block's backward: its saved tensors, its 16-bit weight casts (not under FSDP, not when apex O1's
    # cache holds them), the incoming gradient and the MLP's widest gradient ...
    working = saved + extra + tokens * (d * r + 2 * f * c)
    if casts and not cast_kept and sharding.stage < 3:
        working += 2 * block
    # ... less the gradients not allocated yet: its own and the embedding's (apex O2: only its FP16 ones)
    if lora:
        pending = 4 * memory.lora_parameters(shape, lora) // shape["layers"]
    else:
        grad = {"fp32": 4, "tf32": 4, "amp_bf16": 4, "apex_o1": 4, "apex_o2": 2, "bf16_weights": 2}[precision]
        pending = grad * (block + 2 * d + shape["vocab_size"] * d)
    if sharding.stage >= 2:
        pending //= sharding.ranks
    embedding = 0 if lora else tokens * d * r  # the embedding's backward: its output's gradient
    return max(embedding, working - pending)


def moments_by_hand(name, precision, batch, seq_len, ckpt, optimizer, sharding, lora):
    shape = memory.LLAMA_SHAPES[name]
    params, matmul = memory.llama_parameters(shape)
    v, d = shape["vocab_size"], shape["dim"]
    p = memory.precision_of(precision)
    o1, o2 = p.apex_opt_level == "O1", p.apex_opt_level == "O2"
    casts = _llama_dtypes(precision, lora)[4]
    casts = casts and sharding.stage < 3
    head_cast = 2 * v * d if casts else 0
    if lora:
        trainable = memory.lora_parameters(shape, lora)
        w = (4 if lora.base == "fp32" else 2) * params + 4 * trainable
        g, o, m = 4 * trainable, 8 * trainable, 0
        cast = 2 * trainable if p.autocast_dtype else 0
        if casts:
            cast += head_cast if ckpt else 2 * matmul
    else:
        trainable = params
        w, g, o, m, per_matmul = p.bytes_per_parameter
        w, g, o, m, cast = w * params, g * params, o * params, m * params, per_matmul * matmul
    kept_cache = o1 and not ckpt  # apex O1's cast cache is off when checkpointed blocks are recomputed
    cast_kept = cast if kept_cache else 0
    if o1 and not kept_cache:
        cast = 0
    grads_kept = 2 * trainable if o2 else 0
    masters_later = 4 * trainable if o2 else 0
    temporaries = 0 if optimizer == "adamw_fused" else p.bytes_per_parameter[2] // 2 * trainable
    n, stage = sharding.ranks, sharding.stage
    unit = memory.llama_unit_parameters(shape) if stage >= 2 else 0
    unit_grad = gathered = 0
    if stage >= 1:
        o, m, temporaries = o // n, m // n, temporaries // n
    if stage >= 2:
        g, grads_kept, masters_later = g // n, grads_kept // n, masters_later // n
        unit_grad = unit * p.compute_bytes  # one unit's unsharded gradient before its reduce-scatter
    if stage == 3:
        w, cast = w // n, 0
        gathered = 2 * unit * p.compute_bytes
    states = w + gathered + m + o + grads_kept
    inputs, saved, extra = memory.llama_block_bytes(shape, batch, seq_len, precision, lora)
    kept, loss, first = memory.llama_head_bytes(shape, batch, seq_len, precision, lora)
    kept += inputs if ckpt else shape["layers"] * (saved + extra)
    # without checkpointing every cast is saved (apex O1's kept cache: all of them); with it, the LM head's only
    cast_saved = cast if not ckpt or cast_kept else head_cast if o1 else min(cast, head_cast)
    end = backward_end_by_hand(shape, seq_len, precision, batch, lora, sharding, bool(cast_kept))
    moments = {"forward end": states + cast + kept + loss,
               "backward start": states - grads_kept + cast_saved + kept + first,
               "backward end": w + gathered + m + g - masters_later + unit_grad + o + cast_kept + end,
               "optimizer step": w + m + g + o + cast_kept + temporaries}
    parts = {"weights": w + gathered, "gradients": g + unit_grad, "optimizer_state": o, "master_weights": m,
             "cast_cache": cast, "activations": kept + first, "optimizer_temporaries": temporaries}
    return moments, parts, {"weights": w, "gradients": g, "optimizer_state": o, "master_weights": m}


def regimes_grid():
    for name in ("llama", "openllama_3b", "smollm_135m", "llama_tiny"):
        for precision in ("fp32", "amp_bf16", "apex_o1", "apex_o2", "bf16_weights"):
            for sharding in (Sharding(), Sharding(8, 0), Sharding(8, 1), Sharding(8, 2), Sharding(4, 3)):
                if sharding.stage == 3 and precision == "apex_o1":
                    continue
                for lora in (None, Lora(16, "fp32"), Lora(8, "bf16")):
                    if lora and precision not in ("fp32", "amp_bf16"):
                        continue
                    for ckpt in (True, False):
                        for batch, seq_len in ((1, 2048), (8, 1024), (2, 8)):
                            yield name, precision, batch, seq_len, ckpt, sharding, lora


def test_every_llama_regimes_estimate_is_the_largest_of_its_four_moments():
    peaks = set()
    for name, precision, batch, seq_len, ckpt, sharding, lora in regimes_grid():
        optimizer = "adamw" if batch == 8 else "adamw_fused"
        moments, parts, at_step = moments_by_hand(name, precision, batch, seq_len, ckpt, optimizer, sharding, lora)
        e = memory.llama_estimate(name, precision, batch, seq_len, ckpt, optimizer, sharding, lora)
        where = (name, precision, batch, ckpt, sharding, lora)
        peak = max(moments, key=moments.get)
        assert (e.peak_moment, e.total) == (peak, moments[peak] + memory.WORKSPACE_BYTES), where
        assert {k: getattr(e, k) for k in parts} == parts and e.at_step == at_step, where
        # bytes are whole numbers: plan.json and metrics.json carry them as integers
        assert all(type(v) is int for k, v in e.as_record().items() if k.endswith("_bytes")), (where, e)
        peaks.add((peak, precision))
        config = {"arch": "llama", "shape": name, "seq_len": seq_len, "activation_checkpointing": ckpt}
        for kept in (True, False):
            end = memory.llama_backward_end_bytes(config, precision, batch, lora, sharding, kept)
            assert type(end) is int and end == backward_end_by_hand(memory.LLAMA_SHAPES[name], seq_len, precision,
                                                                    batch, lora, sharding, kept), where
        one = {**config, "seq_len": 1}  # one token: under LoRA the block's backward is smaller than its pending
        assert memory.llama_backward_end_bytes(one, precision, 1, lora, sharding) == backward_end_by_hand(
            memory.LLAMA_SHAPES[name], 1, precision, 1, lora, sharding, False), where
    assert {moment for moment, _ in peaks} == {"forward end", "backward start", "backward end", "optimizer step"}
    assert ("backward end", "apex_o2") in peaks and ("backward end", "apex_o1") in peaks


def test_a_llama_config_without_a_sequence_length_has_2048_tokens():
    for precision in ("fp32", "amp_bf16"):
        config = {"arch": "llama", "data": "synthetic_tokens", "batch_size": 1}
        assert memory.estimate(config, precision, "adamw_fused") == memory.llama_estimate("llama", precision)
        assert memory.estimate({**config, "seq_len": 1024}, precision, "adamw_fused") == memory.llama_estimate(
            "llama", precision, seq_len=1024)


def test_the_backward_end_defaults_and_other_models():
    assert memory.llama_backward_end_bytes({"arch": "resnet50"}, "fp32", 64) == 0
    config = {"arch": "llama", "shape": "smollm_135m", "activation_checkpointing": True}
    assert memory.llama_backward_end_bytes(config, "amp_bf16", 8) == backward_end_by_hand(
        memory.LLAMA_SHAPES["smollm_135m"], 2048, "amp_bf16", 8, None, Sharding(), False)
    assert memory.llama_backward_end_bytes({"arch": "llama_tiny", "seq_len": 64}, "fp32", 2) == backward_end_by_hand(
        memory.LLAMA_SHAPES["llama_tiny"], 64, "fp32", 2, None, Sharding(), False)


def test_a_probe_of_a_forked_plan_does_not_say_it_was_forked_itself(tmp_path, monkeypatch):
    """The plan forked from the cell server has AMPREPRO_CELL_PROCESS set; a probe that starts afresh must not carry it
    into its record (amprepro.train.record reads it as the probe's own origin)."""
    from amprepro.plan import cellserver, probe

    sent = []
    monkeypatch.setenv(cellserver.ORIGIN_ENV, "forked from amprepro.plan.cellserver pid 1")
    monkeypatch.setenv("AMPREPRO_KEEP_ME", "1")
    monkeypatch.setattr(cellserver, "run_cell", lambda args, env: sent.append(env) or 0)
    assert probe.run_cell(["--x"], tmp_path / "probe.log") == 0
    assert cellserver.ORIGIN_ENV not in sent[0] and sent[0]["AMPREPRO_KEEP_ME"] == "1"

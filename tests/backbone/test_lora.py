"""LoRA fine-tuning (amprepro.train.lora) on the CPU: the adapters as peft builds them, the frozen base in FP32 or bf16,
forward and backward of the tiny LLaMA, a loss that falls over a few steps on real text, the memory estimate read from
the model setting, the config's checks and the plan's grouping. No 7B model is materialised: only on the meta device."""

from __future__ import annotations

import json
import math

import pytest
import torch

from amprepro import config as cfg
from amprepro import memory
from amprepro.cellspec import CellSpec
from amprepro.plan import memplan
from amprepro.train import lora, models, train

NO_APEX = {"status": "skipped", "reason": "no apex source configured"}
# llama_tiny (2 layers, width 64, ffn 172) at rank 4: 2 x 4 x (in + out) of qkv, out, gate_up, down
ADAPTER = 2 * 4 * ((64 + 192) + (64 + 64) + (64 + 344) + (172 + 64))


def tiny(base="fp32", **setting):
    torch.manual_seed(0)
    model = models.place(models.build("llama_tiny", {"seq_len": 32}), torch.device("cpu"))
    return lora.apply(model, lora.setting({"lora": {"rank": 4, "alpha": 8, "base": base, **setting}}))


def text_spec(precision="fp32", base="fp32", steps=12):
    return {"model": "lora_tiny", "precision": precision, "seed": 0,
            "model_config": {"arch": "llama_tiny", "data": "python_stdlib", "batch_size": 4, "seq_len": 64,
                             "eval_every": steps, "eval_windows": 4, "lora": {"rank": 4, "alpha": 8, "base": base}},
            "train": {"steps": steps, "warmup_steps": 2, "lr": 0.01, "optimizer": "adamw"}}


def test_the_adapters_are_peft_s_fp32_a_and_zero_b_on_a_frozen_base():
    model = tiny()
    wrapped = lora.adapters(model)
    assert len(wrapped) == 4 * model.layers  # qkv, out, gate_up, down of every block
    for adapter in wrapped:
        assert not adapter.base.weight.requires_grad
        assert adapter.lora_A.weight.dtype == adapter.lora_B.weight.dtype == torch.float32
        assert adapter.lora_A.weight.requires_grad and adapter.lora_B.weight.requires_grad
        assert torch.count_nonzero(adapter.lora_B.weight) == 0 and torch.count_nonzero(adapter.lora_A.weight) > 0
        assert adapter.scaling == 2.0
    assert not model.tok.weight.requires_grad and not model.lm_head.weight.requires_grad
    assert not model.norm.weight.requires_grad
    shape = memory.LLAMA_SHAPES["llama_tiny"]
    # the trainable count is the memory model's: r x (in + out) per targeted linear of every block
    counted = memory.lora_parameters(shape, memory.Lora(rank=4))
    assert sum(p.numel() for p in lora.trainable(model)) == counted == ADAPTER


def test_fewer_targets_wrap_only_those_linears():
    model = tiny(targets=["qkv", "down"])
    block = model.blocks[0]
    assert isinstance(block.attn.qkv, lora.LoraLinear) and isinstance(block.ffn.down, lora.LoraLinear)
    assert isinstance(block.attn.out, torch.nn.Linear) and isinstance(block.ffn.gate_up, torch.nn.Linear)
    shape = memory.LLAMA_SHAPES["llama_tiny"]
    assert sum(p.numel() for p in lora.trainable(model)) == memory.lora_parameters(
        shape, memory.Lora(rank=4, targets=("qkv", "down")))


def test_the_adapted_model_starts_as_its_base_and_its_gradients_reach_the_adapters_only():
    torch.manual_seed(0)
    base = models.place(models.build("llama_tiny", {"seq_len": 32}), torch.device("cpu"))
    x = torch.randint(0, 256, (2, 32))
    with torch.no_grad():
        before = base(x)
    adapted = lora.apply(base, lora.setting({"lora": {"rank": 4}}))
    out = adapted(x)
    assert torch.equal(out, before)  # B = 0: the update is exactly zero
    train.cross_entropy(out, x).backward()
    grads = {name for name, p in adapted.named_parameters() if p.grad is not None}
    assert grads == {name for name, p in adapted.named_parameters() if p.requires_grad}
    assert all("lora_" in name for name in grads)
    # B = 0 gives A a zero gradient at the first step; B's is not zero
    assert all(adapted.get_parameter(n).grad.abs().sum() == 0 for n in grads if "lora_A" in n)
    assert all(adapted.get_parameter(n).grad.abs().sum() > 0 for n in grads if "lora_B" in n)


def test_a_bf16_base_under_autocast_keeps_fp32_adapters_and_a_bf16_residual():
    model = tiny("bf16")
    assert {p.dtype for p in model.parameters() if not p.requires_grad} == {torch.bfloat16}
    assert {p.dtype for p in lora.trainable(model)} == {torch.float32}
    x = torch.randint(0, 256, (2, 32))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(x)
    assert logits.dtype == torch.bfloat16
    train.cross_entropy(logits, x).backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in lora.trainable(model))


@pytest.mark.parametrize("precision, base", [("fp32", "fp32"), ("amp_bf16", "bf16")])
def test_a_lora_cell_on_stdlib_text_trains_and_its_loss_falls(precision, base):
    metrics, rows = train.run(text_spec(precision, base), NO_APEX, 1)
    assert metrics["status"] == "ok", metrics.get("reason")
    assert metrics["lora_base"] == base and metrics["lora_rank"] == 4 and metrics["lora_targets"] == \
        "qkv+out+gate_up+down"
    assert metrics["trainable_parameters"] == ADAPTER
    assert metrics["parameters"] == memory.llama_parameters(memory.LLAMA_SHAPES["llama_tiny"])[0] + ADAPTER
    assert metrics["frozen_parameter_dtypes"] == ["torch.bfloat16" if base == "bf16" else "torch.float32"]
    assert metrics["initial_loss"] == rows[0]["loss"]
    assert metrics["heldout_loss_initial"] == metrics["heldout_curve"][0]["loss"]
    assert math.isfinite(metrics["heldout_loss_final"])
    # the loss falls: held-out after 12 steps 4.8 % below before the first (ln 256 = 5.55 at the start; 5.28-5.29
    # at the end, fp32 and bf16 alike). The tiny model's frozen random LM head, 64 wide, is what its adapters have to
    # steer, so it flattens near 5.29 (20 and 30 steps measured); the ladder's shapes start at ln 32000 and fall further
    assert metrics["heldout_loss_final"] < 0.96 * metrics["heldout_loss_initial"]
    assert metrics["flops_method"] == "analytic (LoRA: amprepro.train.lora)"


def test_the_lora_flops_count_frozen_weights_four_times_and_adapters_six():
    model = tiny()
    adapter = ADAPTER
    frozen = model.matmul_parameters() - adapter
    assert frozen == memory.llama_parameters(memory.LLAMA_SHAPES["llama_tiny"])[1]
    assert lora.flops_per_token(model, 32) == 4 * frozen + 6 * adapter + 12 * model.layers * model.dim * 32


def test_the_estimate_reads_the_lora_setting():
    model_config = {"arch": "llama", "shape": "openllama_3b", "data": "python_stdlib", "batch_size": 1, "seq_len": 512,
                    "activation_checkpointing": True, "lora": {"rank": 16, "alpha": 32, "base": "bf16"}}
    from_setting = memory.estimate(model_config, "amp_bf16", "adamw_fused")
    assert from_setting == memory.llama_estimate("openllama_3b", "amp_bf16", 1, 512, True,
                                                 lora=memory.Lora(rank=16, base="bf16"))
    assert memory.lora_of(model_config) == memory.Lora(16, "bf16")
    assert memory.lora_of({"lora": {}}) == memory.Lora(16, "fp32", memory.LORA_TARGETS)
    assert memory.lora_of({"arch": "llama"}) is None
    # the frozen bf16 base: 2 bytes per parameter, plus FP32 adapters with their gradients and AdamW state
    trainable = memory.lora_parameters(memory.LLAMA_SHAPES["openllama_3b"], memory.Lora(16))
    total = memory.llama_parameters(memory.LLAMA_SHAPES["openllama_3b"])[0]
    assert from_setting.weights == 2 * total + 4 * trainable
    assert from_setting.gradients == 4 * trainable and from_setting.optimizer_state == 8 * trainable


def test_the_plan_puts_a_lora_model_in_a_group_of_its_own():
    def spec(**extra):
        return CellSpec.of({"model": "m", "precision": "fp32", "model_config": {
            "arch": "llama", "shape": "tinyllama_1b", "data": "python_stdlib", "batch_size": 1, "seq_len": 512,
            **extra}, "train": {"optimizer": "adamw_fused"}})

    plain, fp32, bf16 = spec(), spec(lora={"base": "fp32"}), spec(lora={"base": "bf16"})
    assert len({memplan.group_key(s) for s in (plain, fp32, bf16)}) == 3
    assert json.loads(memplan.group_key(fp32))[-1] == {"base": "fp32"}
    assert json.loads(memplan.group_key(plain)) == ["llama", "python_stdlib", None, None, True, 1, 1, "tinyllama_1b"]


def test_lora_on_an_arch_the_registry_does_not_give_it_is_refused():
    with pytest.raises(cfg.ConfigError) as error:
        cfg.check_model_settings("m", {"arch": "gpt_bytes", "data": "python_stdlib", "lora": {}})
    assert str(error.value) == ("Config error at runs.models.m.lora: arch gpt_bytes does not use it (only arch llama, "
                                "llama_tiny). Fix: remove the key.")


@pytest.mark.parametrize("settings, precisions, message", [
    ({"arch": "llama", "data": "python_stdlib", "lora": {"base": "bf16"}}, ["fp32", "amp_bf16"],
     "Config error at runs.models.m.precisions: a LoRA model with a frozen bf16 base trains under amp_bf16 only, not "
     "fp32. Fix: set the model's precisions to [amp_bf16] or fewer, or use lora.base fp32."),
    ({"arch": "llama", "data": "python_stdlib", "lora": {}, "precisions": ["fp32", "apex_o1", "fp8_rowwise"]}, [],
     "Config error at runs.models.m.precisions: a LoRA model with a frozen fp32 base trains under fp32, tf32, "
     "amp_fp16, amp_bf16 only, not apex_o1, fp8_rowwise. Fix: set the model's precisions to [fp32, tf32, amp_fp16, "
     "amp_bf16] or fewer."),
])
def test_a_lora_setting_where_it_cannot_train_is_refused(settings, precisions, message):
    with pytest.raises(cfg.ConfigError) as error:
        cfg.check_lora("m", settings, precisions)
    assert str(error.value) == message


def test_the_lora_preset_resolves_and_a_bad_lora_key_is_named():
    from pathlib import Path

    presets = Path(__file__).resolve().parents[2] / "config" / "presets"
    runs, _ = cfg.resolve_runs(cfg.validate_config({"preset": "lora"}), presets, [], "no GPU")
    assert [c["model"] for c in cfg.cells(runs)] == ["lora_amp_7b", "lora_amp_3b", "lora_fp32_7b", "lora_fp32_3b",
                                                     "lora_fp32_1b"]
    with pytest.raises(cfg.ConfigError) as error:
        cfg.resolve_runs(cfg.validate_config({"preset": "lora", "runs": {"models": {"lora_amp_3b": {
            "lora": {"rank": 16, "alpha": 32, "base": "fp16"}}}}}), presets, [], "no GPU")
    assert "runs.models.lora_amp_3b.lora.base" in str(error.value)


def test_a_cell_materialises_a_bf16_base_in_bf16_without_an_fp32_copy(monkeypatch):
    seen = []
    place = models.place

    def placed(model, device):
        seen.append({p.dtype for p in model.parameters()})  # what is materialised
        return place(model, device)

    monkeypatch.setattr(models, "place", placed)
    config = text_spec("amp_bf16", "bf16")["model_config"]
    model, _ = train.prepare_model(config, torch.device("cpu"))
    assert seen == [{torch.bfloat16}]
    assert model.rope_cos.dtype == torch.bfloat16 and lora.adapters(model)
    assert {p.dtype for p in lora.trainable(model)} == {torch.float32}
    train.prepare_model(text_spec()["model_config"], torch.device("cpu"))
    assert seen[-1] == {torch.float32}

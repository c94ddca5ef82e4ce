"""The AMP risk points' models on the CPU (forward and backward, sizes as amprepro.memory counts them), the overflow
each one is about and the remedies' settings (risky_layer_fp32, grad_scaler_init_scale), the risk preset's matrix and
the config's refusals of a remedy where it would do nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from amprepro import config as cfg
from amprepro import memory
from amprepro.train import models, precision, train

REPO = Path(__file__).resolve().parents[2]
PRESETS = REPO / "config" / "presets"
BASE = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
NO_APEX = {"status": "skipped", "reason": "no apex source configured"}


@pytest.mark.parametrize("arch, config", [("lstm_bytes", {}), ("gumbel_bytes", {"gumbel_tau": 1e-3}),
                                          ("lstm_bytes", {"risky_layer_fp32": True}),
                                          ("gumbel_bytes", {"gumbel_tau": 1e-3, "risky_layer_fp32": True})])
def test_each_risk_model_runs_forward_and_backward_on_the_cpu(arch, config):
    torch.manual_seed(0)
    model = models.build(arch, {"data": "python_stdlib", **config})
    x = torch.randint(0, 256, (2, 24))
    logits = model(x)
    assert logits.shape == (2, 24, 256) and torch.isfinite(logits).all()
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), x.reshape(-1))
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert sum(int(g.abs().sum() > 0) for g in grads) == len(grads)  # every parameter learns
    counted = memory.parameters({"arch": arch, "data": "python_stdlib"})
    assert counted == {"lstm_bytes": (806_144, 786_432), "gumbel_bytes": (640_256, 589_824)}[arch]
    assert models.parameter_count(model) == counted[0]
    matmul = sum(m.weight.numel() for m in model.modules() if isinstance(m, (torch.nn.Linear, torch.nn.Conv1d)))
    assert matmul + sum(p.numel() for n, p in model.named_parameters() if n.startswith("lstm.weight")) == counted[1]


def test_a_tiny_gumbel_temperature_overflows_fp16_and_the_fp32_sampler_does_not():
    """Logits of 100 at tau 1e-3: (logits + g) / tau is about 1e5, inf in fp16 (max 65504), so the softmax row is NaN;
    bf16 (FP32's exponent range), FP32 and the sampler outside autocast (the remedy) stay finite."""
    x = torch.randint(0, 256, (2, 16))
    finite = {}
    for remedy in (False, True):
        torch.manual_seed(0)
        model = models.build("gumbel_bytes", {"gumbel_tau": 1e-3, "risky_layer_fp32": remedy})
        with torch.no_grad():
            model.to_codes.bias.fill_(100.0)
        for dtype in (torch.float16, torch.bfloat16, None):
            with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
                finite[(remedy, str(dtype))] = bool(torch.isfinite(model(x)).all())
    assert finite == {(False, "torch.float16"): False, (False, "torch.bfloat16"): True, (False, "None"): True,
                      (True, "torch.float16"): True, (True, "torch.bfloat16"): True, (True, "None"): True}


def test_the_remedy_runs_the_risky_layer_in_float32_and_the_rest_in_the_autocast_dtype():
    seen = {}
    x = torch.randint(0, 256, (2, 16))
    for remedy in (False, True):
        lstm = models.build("lstm_bytes", {"risky_layer_fp32": remedy})
        lstm.lstm.register_forward_hook(lambda m, i, o, r=remedy: seen.__setitem__(("lstm", r), o[0].dtype))
        gpt = models.build("gpt_bytes", {"seq_len": 16, "naive_norm_eps": 1e-8, "risky_layer_fp32": remedy})
        norm = gpt.blocks[0].ln1
        norm.register_forward_hook(lambda m, i, o, r=remedy: seen.__setitem__(("norm", r), o.dtype))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert lstm(x).dtype == torch.bfloat16  # the head still runs in bf16
            gpt(x)
        assert isinstance(norm, models.HalfEpsNorm) and norm.fp32 is remedy
    assert seen == {("lstm", False): torch.bfloat16, ("lstm", True): torch.float32,
                    ("norm", False): torch.bfloat16, ("norm", True): torch.float32}


def test_the_grad_scaler_starts_at_the_configured_scale():
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    cpu = torch.device("cpu")
    assert precision.Trainer("amp_fp16", model, optimizer, None, cpu).scaler.get_scale() == 65536.0
    trainer = precision.Trainer("amp_fp16", model, optimizer, None, cpu, scaler_init_scale=16384)
    assert trainer.scaler.get_scale() == 16384.0
    assert precision.Trainer("fp32", model, optimizer, None, cpu, scaler_init_scale=16384).scaler is None


def risk_spec(model, precision_name="fp32", steps=6):
    preset = yaml.safe_load((PRESETS / "risk.yaml").read_text())
    settings = {k: v for k, v in preset["models"][model].items() if k not in ("precisions", "train")}
    settings.update(batch_size=2, seq_len=32, eval_every=3, eval_windows=4)
    return {"model": model, "precision": precision_name, "seed": 0, "model_config": settings,
            "train": {**preset["train"], **preset["models"][model].get("train", {}), "steps": steps,
                      "warmup_steps": 1}}


@pytest.mark.parametrize("model, precision_name", [("risk_lstm", "fp32"), ("risk_gumbel", "amp_bf16"),
                                                   ("risk_gumbel_autocast_off", "fp32")])
def test_a_risk_cell_trains_on_the_stdlib_text_and_records_its_held_out_curve(model, precision_name):
    metrics, rows = train.run(risk_spec(model, precision_name), NO_APEX, threads=1)
    assert metrics["status"] == "ok", metrics.get("reason")
    assert len(rows) == 6 and [p["step"] for p in metrics["heldout_curve"]] == [0, 3, 6]
    assert metrics["data_record"]["kind"] == "python_stdlib" and metrics["nonfinite_steps"] == 0


def test_an_fp16_remedy_cell_is_skipped_on_the_cpu_with_the_reason():
    metrics, rows = train.run(risk_spec("risk_lstm_init_scale", "amp_fp16"), NO_APEX, threads=1)
    assert metrics["status"] == "skipped" and rows == []
    assert metrics["reason"] == "fp16 AMP with GradScaler is the CUDA recipe the articles measure; no CUDA GPU here"


def resolve(runs: dict, preset="risk"):
    config = cfg.validate_config(cfg.deep_merge(BASE, {"preset": preset, "runs": runs}))
    return cfg.resolve_runs(config, PRESETS, [], "no nvidia-smi on PATH")[0]


def test_the_risk_preset_is_three_risks_in_four_precisions_and_six_remedies_over_four_seeds():
    runs = resolve({})
    cells = cfg.cells(runs)
    assert len(cells) == 72
    per_model = {m: sorted({c["precision"] for c in cells if c["model"] == m}) for m in runs["models"]}
    for risk in ("risk_lstm", "risk_gumbel", "risk_halfnorm"):
        assert per_model[risk] == ["amp_bf16", "amp_fp16", "apex_o1", "fp32"]
        for remedy in ("autocast_off", "init_scale"):
            assert per_model[f"{risk}_{remedy}"] == ["amp_fp16"]
            # the remedy model is the risk model with one setting changed
            changed = {k for k in set(runs["models"][risk]) | set(runs["models"][f"{risk}_{remedy}"])
                       if runs["models"][risk].get(k) != runs["models"][f"{risk}_{remedy}"].get(k)}
            assert changed == {"precisions", "risky_layer_fp32" if remedy == "autocast_off" else "train"}
    spec = cfg.cell_spec_dict(runs, "risk_gumbel_init_scale", "amp_fp16", 3)
    assert spec["train"]["grad_scaler_init_scale"] == 16384 and spec["model_config"]["gumbel_tau"] == 0.001


LSTM = {"arch": "lstm_bytes", "data": "python_stdlib", "batch_size": 4}


@pytest.mark.parametrize("model, message", [
    ({"arch": "small_cnn", "data": "digits", "batch_size": 4, "risky_layer_fp32": True},
     "Config error at runs.models.m.risky_layer_fp32: arch small_cnn has no risky layer to take out of autocast (only "
     "lstm_bytes, gumbel_bytes, or an arch with naive_norm_eps set: gpt, gpt_tiny, gpt_bytes). Fix: remove the key."),
    ({"arch": "gpt_bytes", "data": "python_stdlib", "batch_size": 4, "risky_layer_fp32": True},
     "Config error at runs.models.m.risky_layer_fp32: arch gpt_bytes has no risky layer to take out of autocast (only "
     "lstm_bytes, gumbel_bytes, or an arch with naive_norm_eps set: gpt, gpt_tiny, gpt_bytes). Fix: remove the key."),
    ({**LSTM, "risky_layer_fp32": True, "precisions": ["amp_fp16", "apex_o1"]},
     "Config error at runs.models.m.risky_layer_fp32: precision apex_o1 casts through apex, which a disabled "
     "torch.autocast region does not stop, so the setting would do nothing there. Fix: give this model precisions "
     "without apex (e.g. precisions: [amp_fp16])."),
    ({**LSTM, "precisions": ["fp32", "amp_fp16"], "train": {"grad_scaler_init_scale": 16384}},
     "Config error at runs.models.m.train.grad_scaler_init_scale: precision fp32 has no GradScaler, so the setting "
     "would be ignored there. Fix: set it only on a model whose precisions all use one (precisions: [amp_fp16]), in "
     "that model's train: section."),
    ({**LSTM, "gumbel_tau": 0.5},
     "Config error at runs.models.m.gumbel_tau: arch lstm_bytes does not use it (only arch gumbel_bytes). Fix: "
     "remove the key."),
])
def test_a_remedy_or_risk_setting_where_it_would_do_nothing_is_refused(model, message):
    runs = {"models": {"m": model}, "precisions": ["fp32", "amp_fp16", "apex_o1"]}
    assert refused_text(runs) == message


def refused_text(runs: dict) -> str:
    with pytest.raises(cfg.ConfigError) as error:
        resolve(runs)  # the risk preset's models pass, then m is refused
    return str(error.value)

"""Issue 38's environment claims (amprepro.analysis.envclaims), by exact output on synthetic summaries: the apex shell
against strict FP32, TF32 and the full build; the largest memory and speed gaps between cells that differ only in
environment settings; and both read "not measurable here", with the reason, on the CPU smoke fixture."""

from __future__ import annotations

import copy

import pytest
from report_helpers import CLAIMS, SMOKE

from amprepro.analysis import claimfile, claims, envclaims

GIB = 2**30
TRAIN = {"optimizer": "adamw", "steps": 30, "warmup_steps": 10, "lr": 0.0001}
VIT = {"arch": "vit_b_16", "data": "synthetic_images", "batch_size": 128, "image_size": 224}


def spec(config=None, **train):
    return {"model_config": {**VIT, **(config or {})}, "train": {**TRAIN, **train}}


SPECS = {
    "vit_b_16": spec(),
    "vit_b_16_apex_shell": spec({"apex_build": "shell", "precisions": ["apex_o1", "apex_o2"]}),
    "vit_b_16_apex_shell_fused_adam": spec({"apex_build": "shell", "precisions": ["amp_fp16"]},
                                           optimizer="apex_fused_adam"),
    "vit_b_16_compile": spec({"compile": True, "precisions": ["amp_bf16"]}, steps=60, warmup_steps=20),
    "vit_b_16_torch_fused_adamw": spec({"precisions": ["amp_bf16"]}, optimizer="adamw_fused"),
    "vit_b_16_sgd": spec({"precisions": ["amp_bf16"]}, optimizer="sgd"),  # another algorithm: never a pair
}


def cell(model, precision, throughput=None, gib=None, status="ok", reason="", seed=0, batch=128):
    return {"model": model, "precision": precision, "seed": seed, "status": status, "reason": reason,
            "throughput_per_s": throughput, "peak_allocated_bytes": gib and gib * GIB, "batch_size": batch}


CELLS = [
    cell("vit_b_16", "fp32", 1000, 10), cell("vit_b_16", "tf32", 2500, 10), cell("vit_b_16", "apex_o1", 3000, 7),
    cell("vit_b_16", "apex_o2", 3300, 6), cell("vit_b_16", "amp_bf16", 3200, 6.5),
    cell("vit_b_16_apex_shell", "apex_o1", 2900, 7.2), cell("vit_b_16_apex_shell", "apex_o2", 2600, 6.3),
    cell("vit_b_16_apex_shell_fused_adam", "amp_fp16", status="skipped",
         reason="apex FusedAdam cannot run in the apex shell (built without --cpp_ext/--cuda_ext): apex says "
                "RuntimeError: apex.optimizers.FusedAdam requires cuda extensions"),
    cell("vit_b_16_compile", "amp_bf16", 4000, 5), cell("vit_b_16_torch_fused_adamw", "amp_bf16", 3300, 6.4),
    cell("vit_b_16_sgd", "amp_bf16", 9000, 1),
]


def summary(cells, gpu="NVIDIA H200", preset="paper"):
    return {"cells": cells, "preset": {"preset": preset}, "versions": {"gpu": gpu}}


def repository_claim(claim_id: str) -> dict:
    claim = copy.deepcopy(next(c for c in claimfile.load_claims(CLAIMS) if c["id"] == claim_id))
    if not claim["baseline"]:  # as written (an environment claim has none), so that it can be validated again
        del claim["baseline"]
    return claim


def test_which_cells_differ_only_in_environment_settings():
    diff = lambda a, b: envclaims.environment_difference(a, b, SPECS)  # noqa: E731
    assert diff(("vit_b_16", "fp32"), ("vit_b_16", "tf32")) == "TF32 on vs off"
    assert diff(("vit_b_16", "apex_o1"), ("vit_b_16_apex_shell", "apex_o1")) == "the apex shell vs the full build"
    # steps and warm-up are how long a cell is measured, not its environment
    assert diff(("vit_b_16", "amp_bf16"), ("vit_b_16_compile", "amp_bf16")) == "torch.compile vs eager"
    assert diff(("vit_b_16_compile", "amp_bf16"), ("vit_b_16_torch_fused_adamw", "amp_bf16")) == (
        "torch.compile vs eager and optimizer adamw vs adamw_fused")
    assert diff(("vit_b_16", "amp_bf16"), ("vit_b_16", "amp_fp16")) is None  # another precision
    assert diff(("vit_b_16", "amp_bf16"), ("vit_b_16_sgd", "amp_bf16")) is None  # another optimizer algorithm
    assert diff(("vit_b_16", "fp32"), ("vit_b_16", "fp32")) is None
    assert diff(("vit_b_16", "fp32"), ("absent", "fp32")) is None


def test_the_shell_against_strict_fp32_tf32_and_the_full_build():
    result = claims.evaluate_claim(repository_claim("apex-shell-no-speedup"), summary(CELLS), specs=SPECS)
    assert (result["verdict"], result["verdict_text"]) == ("falls_short", "falls short vs strict FP32 and TF32")
    assert result["matched_models"] == ["vit_b_16_apex_shell", "vit_b_16_apex_shell_fused_adam"]
    not_run = ("not run in the shell: vit_b_16_apex_shell_fused_adam/amp_fp16 skipped: apex FusedAdam cannot run in "
               "the apex shell (built without --cpp_ext/--cuda_ext): apex says RuntimeError: "
               "apex.optimizers.FusedAdam requires cuda extensions")
    assert result["measured_text"] == (
        "vs strict FP32: vit_b_16_apex_shell/apex_o1 2.90×, memory −28.0 % vs vit_b_16/fp32; against the full build's "
        "vit_b_16/apex_o1: 0.97× its speed, memory +2.9 %, vit_b_16_apex_shell/apex_o2 2.60×, memory −37.0 % vs "
        "vit_b_16/fp32; against the full build's vit_b_16/apex_o2: 0.79× its speed, memory +5.0 %; vs TF32: "
        "vit_b_16_apex_shell/apex_o1 1.16×, memory −28.0 % vs vit_b_16/tf32; against the full build's "
        "vit_b_16/apex_o1: 0.97× its speed, memory +2.9 %, vit_b_16_apex_shell/apex_o2 1.04×, memory −37.0 % vs "
        f"vit_b_16/tf32; against the full build's vit_b_16/apex_o2: 0.79× its speed, memory +5.0 %; {not_run}")
    tf32 = result["by_baseline"]["tf32"]["models"]
    assert {name: r["verdict"] for name, r in tf32.items()} == {
        "vit_b_16_apex_shell/apex_o1": "falls_short", "vit_b_16_apex_shell/apex_o2": "holds"}
    assert tf32["vit_b_16_apex_shell/apex_o2"]["vs_full"] == pytest.approx(
        {"speed_ratio": 2600 / 3300, "memory_change": 6.3 / 6 - 1})
    assert result["reason"].endswith(f" | {not_run}")


def test_a_shell_that_gives_no_speedup_holds_and_a_missing_baseline_is_named():
    slow = [c for c in CELLS if c["model"] != "vit_b_16_apex_shell"] + [
        cell("vit_b_16_apex_shell", "apex_o1", 1020, 9), cell("vit_b_16_apex_shell", "apex_o2", 990, 9)]
    result = claims.evaluate_claim(repository_claim("apex-shell-no-speedup"), summary(
        [c for c in slow if c["precision"] != "tf32"]), specs=SPECS)
    assert (result["verdict"], result["verdict_text"]) == ("holds", "holds vs strict FP32")
    assert result["by_baseline"]["tf32"] == {
        "verdict": "not_measurable", "reason": "vit_b_16_apex_shell/apex_o1: vit_b_16/tf32 did not run; "
                                               "vit_b_16_apex_shell/apex_o2: vit_b_16/tf32 did not run",
        "models": result["by_baseline"]["tf32"]["models"]}


def test_the_environment_names_the_setting_of_the_largest_gaps():
    result = claims.evaluate_claim(repository_claim("environment-decides"), summary(CELLS), specs=SPECS)
    assert (result["verdict"], result["verdict_text"]) == ("falls_short", "falls short")
    assert result["claimed_text"] == ("memory at least 40 % (accepted from 36 %); speed at least 2.00× (accepted "
                                      "from 1.80×)")
    assert result["measured_text"] == (
        "vit_b_16: memory differs by up to 30.0 % (torch.compile vs eager: vit_b_16/amp_bf16 over "
        "vit_b_16_compile/amp_bf16), speed by up to 2.50× (TF32 on vs off: vit_b_16/tf32 over vit_b_16/fp32); 6 pairs")
    assert result["reason"] == f"{result['measured_text']} (memory falls short, speed holds)"
    arch = result["by_baseline"]["environment pairs"]["models"]["vit_b_16"]
    assert arch["memory"] == {"value": pytest.approx(0.3), "setting": "torch.compile vs eager"}
    assert arch["speed"] == {"value": pytest.approx(2.5), "setting": "TF32 on vs off"}


def test_the_environment_holds_with_both_gaps_and_counts_only_gpu_cells_of_one_batch():
    big = [*CELLS, cell("vit_b_16_compile", "amp_bf16", 4000, 4, seed=1),
           cell("vit_b_16", "amp_bf16", 3000, 6, seed=1)]
    result = claims.evaluate_claim(repository_claim("environment-decides"), summary(big), specs=SPECS)
    assert result["verdict"] == "holds" and "memory differs by up to 50.0 % (torch.compile vs eager" in result[
        "measured_text"]
    other_batch = [c if c["model"] != "vit_b_16_compile" else {**c, "batch_size": 64} for c in CELLS]
    result = claims.evaluate_claim(repository_claim("environment-decides"), summary(other_batch), specs=SPECS)
    assert "vit_b_16_compile" not in result["measured_text"]
    on_cpu = [{**c, "peak_allocated_bytes": None, "peak_rss_bytes": GIB} for c in CELLS]
    result = claims.evaluate_claim(repository_claim("environment-decides"), summary(on_cpu, gpu=None), specs=SPECS)
    assert (result["verdict"], result["reason"]) == ("not_measurable", (
        "vit_b_16: no two cells that differ only in environment settings ran ok on a GPU (paper preset on CPU; "
        "cells here: 11)"))


def test_on_the_cpu_smoke_preset_the_new_claims_are_not_measurable_with_the_reason():
    import json

    data = json.loads((SMOKE / "summary" / "summary.json").read_text())
    results = {r["id"]: r for r in claims.evaluate_run(CLAIMS, data, None, SMOKE / "runs")}
    here = "smoke preset on CPU (models here: cnn, transformer)"
    assert {claim_id: (results[claim_id]["verdict_text"], results[claim_id]["reason"]) for claim_id in (
        "apex-shell-no-speedup", "apex-o2-faster-than-o1", "environment-decides")} == {
        "apex-shell-no-speedup": ("not measurable here", "no ViT-B/16 and ResNet-50 apex shell (apex_build: shell) "
                                                         f"cell ran (vit_b_16/resnet50): {here}"),
        "apex-o2-faster-than-o1": ("not measurable here", "no ResNet-50, ViT-B/16, GPT-2 124M and LLaMA cell ran "
                                                          f"(resnet50/vit_b_16/gpt124m/llama): {here}"),
        "environment-decides": ("not measurable here",
                                f"no ViT-B/16 and ResNet-50 cell ran (vit_b_16/resnet50): {here}"),
    }


def test_the_o2_claim_is_an_ordinary_speedup_against_o1_per_model():
    o2 = repository_claim("apex-o2-faster-than-o1")
    cells = [cell("vit_b_16", "apex_o1", 3000, 7), cell("vit_b_16", "apex_o2", 3300, 6),
             {**cell("resnet50", "apex_o1", 2000, 9)}, cell("resnet50", "apex_o2", 1900, 8)]
    sanity = {"checks": [{"name": "Tensor Cores", "status": "pass", "detail": "9.0"}]}
    result = claims.evaluate_claim(o2, summary(cells), sanity, {"vit_b_16": "vit_b_16", "resnet50": "resnet50"})
    assert result["verdict"] == "falls_short"
    assert result["reason"] == ("vs apex O1: holds for vit_b_16; falls short for resnet50 (of 2 models): vit_b_16: "
                                "1.10× (1 seed); resnet50: 0.95× (1 seed), below the claimed band")


def test_a_judge_claim_is_validated():
    base = repository_claim("environment-decides")
    del base["judge"]["memory"]
    with pytest.raises(claimfile.ClaimsError, match=r"judge.memory: an environment claim needs its memory band"):
        claimfile.validate({"claims": [base]})
    shell = repository_claim("apex-shell-no-speedup")
    shell["metric"] = "memory_reduction"
    with pytest.raises(claimfile.ClaimsError, match=r"an apex_shell claim is a speedup against its baselines"):
        claimfile.validate({"claims": [shell]})
    plain = repository_claim("apex-o2-faster-than-o1")
    del plain["variant"]
    with pytest.raises(claimfile.ClaimsError, match=r"'variant' is a required property"):
        claimfile.validate({"claims": [plain]})


def test_a_model_on_the_apex_shell_stands_for_no_architecture(tmp_path):
    """Ordinary apex claims (O1's speed, O2 against O1) judge a working build: the shell's models match no arch."""
    import json

    for model, config in {"resnet50": {"arch": "resnet50"},
                          "resnet50_apex_shell": {"arch": "resnet50", "apex_build": "shell"},
                          "resnet50_full": {"arch": "resnet50", "apex_build": "full"}}.items():
        cell = tmp_path / model / "apex_o1" / "seed0"
        cell.mkdir(parents=True)
        (cell / "metrics.json").write_text(json.dumps({"spec": {"model_config": config}}))
    archs = claims.model_archs(tmp_path)
    assert archs == {"resnet50": "resnet50", "resnet50_full": "resnet50"}
    assert claims.matching_models(["resnet50"], [*sorted(archs), "resnet50_apex_shell"], archs) == [
        "resnet50", "resnet50_full"]

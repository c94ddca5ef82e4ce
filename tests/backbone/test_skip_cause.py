"""A skipped cell says whether the machine is why (verify: not comparable here) or something else (verify: a
failure)."""

from types import SimpleNamespace

import pytest
import torch

from amprepro.train import cellsupport, models, train

NO_APEX = {"status": "skipped", "reason": "no apex source configured"}
CUDA = SimpleNamespace(type="cuda")  # the checks below read only the device type (and the counts they are given)


def spec(precision="fp32", arch="small_cnn", optimizer="adamw", **model):
    return {"model": "m", "precision": precision, "seed": 0,
            "model_config": {"arch": arch, "data": "digits", "batch_size": 8, **model},
            "train": {"steps": 4, "warmup_steps": 1, "lr": 0.01, "optimizer": optimizer}}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU skip records")
def test_a_cpu_skip_is_the_machine_and_names_what_is_missing():
    metrics, _ = train.run(spec("tf32"), NO_APEX, threads=1)
    assert (metrics["status"], metrics["skip_cause"], metrics["skip_needs"]) == ("skipped", "machine", "a CUDA GPU")


def test_apex_variants_without_apex_are_the_machine_and_compile_with_apex_is_unsupported():
    assert cellsupport.skip_cause(spec(fused_layer_norm=True), torch.device("cpu"), NO_APEX)[0] == "machine"
    assert cellsupport.variant_unsupported({"fused_layer_norm": True}, "amp_bf16", CUDA, NO_APEX)[:2] == (
        "machine", "a built apex")
    assert cellsupport.variant_unsupported({"compile": True}, "apex_o1", CUDA, NO_APEX)[0] == "unsupported"
    assert cellsupport.skip_cause(spec(optimizer="apex_fused_adam"), torch.device("cpu"), NO_APEX)[0] == "machine"


def test_a_missing_package_is_not_the_machine(monkeypatch):
    monkeypatch.setattr(models, "unavailable_reason", lambda arch: f"{arch} comes from torchvision; install it")
    cause, _, reason = cellsupport.skip_cause(spec(), torch.device("cpu"), NO_APEX)
    assert cause == "software" and "install" in reason
    metrics, _ = train.run(spec(), NO_APEX, threads=1)
    assert metrics["skip_cause"] == "software"


def test_the_summary_carries_the_skip_cause(tmp_path):
    import json

    from amprepro.report import summary

    path = tmp_path / "metrics.json"
    path.write_text(json.dumps({"model": "m", "precision": "tf32", "seed": 0, "status": "skipped", "reason": "no GPU",
                                "skip_cause": "machine", "skip_needs": "a CUDA GPU"}))
    (row,) = summary.summarize([str(path)], {}, {}, {})["cells"]
    assert (row["skip_cause"], row["skip_needs"]) == ("machine", "a CUDA GPU")
    assert {"skip_cause", "skip_needs"} <= set(summary.COLUMNS)

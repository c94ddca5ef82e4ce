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

    from amprepro.analysis import summary

    path = tmp_path / "metrics.json"
    path.write_text(json.dumps({"model": "m", "precision": "tf32", "seed": 0, "status": "skipped", "reason": "no GPU",
                                "skip_cause": "machine", "skip_needs": "a CUDA GPU"}))
    (row,) = summary.summarize([str(path)], {}, {}, {})["cells"]
    assert (row["skip_cause"], row["skip_needs"]) == ("machine", "a CUDA GPU")
    assert {"skip_cause", "skip_needs"} <= set(summary.COLUMNS)


# apex 25.05's own lines for a build without extensions (apex/optimizers/fused_adam.py, multi_tensor_apply.py and
# apex/normalization/fused_layer_norm.py), abridged: what the shell's cells meet.
FAKE_SHELL = {
    "apex/__init__.py": "",
    "apex/optimizers/__init__.py": (
        "class FusedAdam:\n"
        "    def __init__(self, params, **kwargs):\n"
        "        try:\n"
        "            import amp_C  # noqa: F401\n"
        "        except ImportError:\n"
        "            raise RuntimeError('apex.optimizers.FusedAdam requires cuda extensions')\n"),
    "apex/normalization/__init__.py": (
        "import importlib\n"
        "class FusedLayerNorm:\n"
        "    def __init__(self, shape, **kwargs):\n"
        "        importlib.import_module('fused_layer_norm_cuda')\n"),
}
SHELL = {"status": "built", "shell": True, "has_amp": True, "commit": "c" * 40, "site_dir": "results/apex/site/k"}


@pytest.fixture
def fake_shell(tmp_path, monkeypatch):
    for name, text in FAKE_SHELL.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in list(__import__("sys").modules) if m == "apex" or m.startswith("apex.")]:
        monkeypatch.delitem(__import__("sys").modules, name)


def test_the_shells_fused_modules_skip_with_apexs_own_error(fake_shell):
    adam = spec("amp_fp16", optimizer="apex_fused_adam", apex_build="shell")
    assert cellsupport.skip_cause(adam, CUDA, SHELL) == (
        "unsupported", "apex's CUDA extensions", "apex FusedAdam cannot run in the apex shell (built without "
        "--cpp_ext/--cuda_ext): apex says RuntimeError: apex.optimizers.FusedAdam requires cuda extensions")
    norm = spec("fp32", fused_layer_norm=True, apex_build="shell")
    assert cellsupport.skip_cause(norm, CUDA, SHELL) == (
        "unsupported", "apex's CUDA extensions", "apex FusedLayerNorm cannot run in the apex shell (built without "
        "--cpp_ext/--cuda_ext): apex says ModuleNotFoundError: No module named 'fused_layer_norm_cuda'")


def test_a_shell_never_stands_in_for_the_full_build_nor_the_other_way_round():
    cause, needs, reason = cellsupport.skip_cause(spec("apex_o1"), CUDA, SHELL)
    assert (cause, needs) == ("software", "the apex build its model asks for")
    assert reason == ("this cell asks for the full apex build (apex_build: full) but was given the shell one; run it "
                      "through Snakemake, or pass --apex results/apex/runs.json")
    full = {**SHELL, "shell": False}
    assert "asks for the shell apex build" in cellsupport.skip_cause(spec("apex_o2", apex_build="shell"), CUDA,
                                                                     full)[2]

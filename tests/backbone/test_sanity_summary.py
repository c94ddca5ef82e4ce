import json
import sys

import pytest
import torch

from amprepro.analysis import summary
from amprepro.env import sanity


def test_checks_on_this_machine_each_have_a_status_and_reason():
    results = sanity.run_checks(apex_required=False, expect_gpu=False)
    names = {r["name"] for r in results}
    assert {"torch version", "cuda.is_available", "nvcc vs torch CUDA", "autocast cpu bfloat16",
            "Jupyter kernel python3"} <= names
    assert not any("apex" in name for name in names)  # apex is verified by its own job (env.apexbuild.verify)
    assert all(r["status"] in ("pass", "fail", "skip") and r["detail"] for r in results)
    assert all(r["fix"] for r in results if r["status"] == "fail")


@pytest.mark.skipif(torch.cuda.is_available(), reason="simulates a GPU box whose torch sees no GPU")
def test_required_failure_stops_with_the_fix(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        sanity.main(["--apex-required", "False", "--expect-gpu", "True", "--out", str(tmp_path / "s.json")])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert "required sanity check failed: cuda.is_available" in err and "Fix: " in err
    assert not (tmp_path / "s.json").exists()


def test_the_failed_checks_that_did_not_stop_the_run_are_said_with_their_fix(tmp_path):
    record = tmp_path / "sanity.json"
    record.write_text(json.dumps({"checks": [
        sanity.check("torch version", "pass", "torch 2.13.0", required=True),
        sanity.check("torchvision loads against torch 2.13.0+cpu", "fail", "torchvision does not load", "reinstall it"),
        sanity.check("GPU name", "skip", "no CUDA GPU"),
        sanity.check("timm loads against torch 2.13.0+cpu", "fail", "timm does not load", "")]}))
    lines = sanity.unmet_lines(record)
    assert lines == [
        'amprepro: WARNING: the stack\'s check "torchvision loads against torch 2.13.0+cpu" failed: torchvision does '
        "not load. It is not required for this run, which went on. Fix: reinstall it",
        'amprepro: WARNING: the stack\'s check "timm loads against torch 2.13.0+cpu" failed: timm does not load. It is '
        "not required for this run, which went on. Fix: see results/logs/sanity.log"]
    record.write_text(json.dumps({"checks": [sanity.check("torch version", "pass", "torch 2.13.0", required=True)]}))
    assert sanity.unmet_lines(record) == []
    record.write_text("{broken")
    assert sanity.unmet_lines(record) == [] and sanity.unmet_lines(tmp_path / "missing.json") == []


def test_nvcc_mismatch_is_diagnosed(tmp_path, monkeypatch):
    fake = tmp_path / "nvcc"
    fake.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 11.8, V11.8.89'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    monkeypatch.setenv("AMPREPRO_NVCC", "system")  # by default a mismatch takes the pip route (test_apex_cudakit)
    monkeypatch.delenv("CUDA_HOME", raising=False)

    class FakeTorch:
        class version:
            cuda = "13.0"

    version, headers = sanity.toolkit_checks(FakeTorch, apex_required=True)
    assert version["status"] == "fail" and "nvcc 11.8" in version["detail"] and "13.0" in version["fix"]
    assert "requirements-cuda13.0.txt" in version["fix"]
    assert headers["status"] == "fail" and "cuda_runtime.h missing" in headers["detail"]


def metric(model, precision, throughput, memory, status="ok"):
    return {"model": model, "precision": precision, "seed": 0, "status": status, "throughput_per_s": throughput,
            "peak_allocated_bytes": memory}


def test_speedups_against_both_baselines():
    rows = summary.add_relative([metric("vit", "fp32", 400, 100), metric("vit", "tf32", 1200, 100),
                                 metric("vit", "amp_fp16", 2400, 60), metric("vit", "apex_o1", None, None, "skipped")])
    fp16 = rows[2]
    assert fp16["speedup_vs_fp32"] == pytest.approx(6.0)
    assert fp16["speedup_vs_tf32"] == pytest.approx(2.0)
    assert fp16["memory_ratio_vs_fp32"] == pytest.approx(0.6)
    assert rows[3]["speedup_vs_fp32"] is None


def cell_metrics(tmp_path, **software) -> str:
    record = {"model": "cnn", "precision": "fp32", "seed": 0, "status": "ok", "throughput_per_s": 10.0,
              "software": {"python": "3.11.7", "prefix": "/work/.venv", "torch": "2.13.0+cpu", "cuda": None,
                           **software}}
    path = tmp_path / "metrics.json"
    path.write_text(__import__("json").dumps(record))
    return str(path)


ENVIRONMENT = {"python": {"version": "3.11.7"}, "torch": {"version": "2.13.0+cpu", "cuda": None},
               "isolation": {"mode": "current", "prefix": "/work/.venv"}}


def test_summary_accepts_a_record_of_the_cells_interpreter(tmp_path):
    made = summary.summarize([cell_metrics(tmp_path)], ENVIRONMENT, {}, {"preset": "smoke"})
    assert made["versions"]["torch"] == "2.13.0+cpu"


@pytest.mark.parametrize("record, named", [
    ({**ENVIRONMENT, "torch": {"importable": False, "error": "No module named 'torch'"},
      "isolation": {"mode": "current", "prefix": "/usr"}}, "describes python 3.11.7 at /usr, torch None"),
    ({**ENVIRONMENT, "isolation": {"mode": "current", "prefix": "/elsewhere"}}, "at /elsewhere"),
    ({**ENVIRONMENT, "torch": {"version": "2.13.0+cu130", "cuda": "13.0"}}, "torch 2.13.0+cu130, CUDA 13.0"),
])
def test_summary_stops_on_a_record_of_another_interpreter_naming_both(tmp_path, record, named):
    with pytest.raises(summary.EnvironmentMismatch) as stopped:
        summary.summarize([cell_metrics(tmp_path)], record, {}, {"preset": "smoke"}, env_path="env.json")
    message = str(stopped.value)
    assert f"env.json {named}" in message or named in message
    assert "cell cnn/fp32/seed0 ran in python 3.11.7 at /work/.venv, torch 2.13.0+cpu, CUDA None" in message
    assert "Fix: run `make run` again" in message


def test_jobpython_names_a_python_on_path_that_is_not_snakemakes(tmp_path):
    import sys

    from amprepro.env import jobpython

    here = jobpython.job_python(str(__import__("pathlib").Path(sys.executable).parent))
    assert jobpython.warning(here, sys.prefix) is None
    other = {"executable": "/usr/bin/python", "prefix": "/usr", "version": "3.11.2", "torch": False}
    said = jobpython.warning(other, "/work/.venv")
    assert "/usr/bin/python (Python 3.11.2, prefix /usr, has no torch)" in said and "(/work/.venv)" in said
    assert "source .venv/bin/activate" in said and "make run" in said
    assert "there is none on PATH" in jobpython.warning(jobpython.job_python(str(tmp_path)), "/work/.venv")
    assert jobpython.parameter(here) != jobpython.parameter(other)  # a change of interpreter re-runs environment


def test_the_grad_scaler_check_passes_without_importing_dynamo():
    # sanity runs before every cell: a torch.optim optimizer would import torch._dynamo (4-8 s on 2 cores) for a
    # check of GradScaler's scale and unscale alone
    import subprocess
    import sys

    code = ("import sys, torch; from amprepro.env import sanity; r = sanity.grad_scaler_check(torch); "
            "print(r['status'], 'torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.split() == ["pass", "False"], out.stdout + out.stderr


def fake_library(root, name: str, body: str):
    (root / name).mkdir()
    (root / name / "__init__.py").write_text(body)


@pytest.fixture
def libraries(tmp_path, monkeypatch):
    """A folder first on sys.path for stand-ins of torchvision and timm, each imported afresh."""
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("torchvision", "timm"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return tmp_path


def test_a_torchvision_built_for_another_torch_fails_with_the_fix(libraries):
    """Issue 41: a CPU torch beside the CUDA torchvision from PyPI: `import torchvision` raises as its operators
    register. Required when a model of the run is built from it (resnet50), flagged but not blocking otherwise."""
    fake_library(libraries, "torchvision",
                 'raise RuntimeError("operator torchvision::nms does not exist")\n')
    result = sanity.library_check(torch, "torchvision", needed=True)
    assert result["status"] == "fail" and result["required"]
    assert result["detail"] == ("torchvision does not load against this torch (RuntimeError: operator "
                                "torchvision::nms does not exist)")
    assert "torchvision release built for this torch" in result["fix"] and "torchvision==0.28.0" in result["fix"]
    assert sanity.library_check(torch, "torchvision", needed=False)["required"] is False
    assert sanity.libraries_for(["small_cnn", "resnet50", "vit_base_patch16_224"]) == ("timm", "torchvision")
    assert sanity.libraries_for(["small_cnn", "tiny_transformer"]) == ()


def test_a_torchvision_whose_operator_runs_passes_and_a_library_not_installed_is_skipped_unless_needed(libraries,
                                                                                                    monkeypatch):
    fake_library(libraries, "torchvision", "__version__ = '0.28.0'\nfrom . import ops\n")
    (libraries / "torchvision" / "ops.py").write_text(
        "import torch\n\ndef nms(boxes, scores, threshold):\n    return torch.tensor([0])\n")
    passed = sanity.library_check(torch, "torchvision", needed=True)
    assert passed["status"] == "pass" and passed["detail"] == "torchvision 0.28.0 imports and its nms operator runs"
    (libraries / "torchvision" / "ops.py").write_text(  # loads, but its operator answers wrongly
        "import torch\n\ndef nms(boxes, scores, threshold):\n    return torch.tensor([0, 1])\n")
    monkeypatch.delitem(sys.modules, "torchvision")
    monkeypatch.delitem(sys.modules, "torchvision.ops")
    wrong = sanity.library_check(torch, "torchvision", needed=True)
    assert wrong["status"] == "fail" and "nms kept [0, 1] of two equal boxes" in wrong["detail"]
    monkeypatch.setitem(sys.modules, "timm", None)  # as if not installed: ModuleNotFoundError, name "timm"
    skipped = sanity.library_check(torch, "timm", needed=False)
    missing = sanity.library_check(torch, "timm", needed=True)
    assert skipped["status"] == "skip" and skipped["detail"] == "timm is not installed; no model of this run needs it"
    assert missing["status"] == "fail" and missing["required"] and "timm==1.0.26" in missing["fix"]


def test_each_group_of_checks_is_timed_for_the_log(capsys, tmp_path):
    seconds = {}
    sanity.run_checks(apex_required=False, expect_gpu=False, seconds=seconds)
    assert list(seconds)[:5] == ["torch import", "torch", "toolkit", "autocast", "GradScaler"]
    assert list(seconds)[-1] == "Jupyter kernel" and all(s >= 0 for s in seconds.values())
    sanity.main(["--apex-required", "False", "--expect-gpu", "False", "--out", str(tmp_path / "s.json")])
    assert "sanity: seconds: torch import " in capsys.readouterr().err
    assert "seconds" not in (tmp_path / "s.json").read_text()

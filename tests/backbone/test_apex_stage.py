import json
import subprocess
import sys

import pytest

from amprepro.env import apex_stage, apexbuild

SOURCE = {"url": None, "ref": "25.05", "commit": "379937e1", "path": "vendor/apex-25.05", "tarball": None,
          "sha256": None}


def settings(required):
    return {"required": required, "source": SOURCE, "cuda_arch_list": None, "cache_dir": None, "build_jobs": None}


def test_optional_apex_without_a_source_is_skipped_with_that_reason():
    record = apex_stage.decide({**settings(False), "source": {}})
    assert record["status"] == "skipped" and "no apex source is configured" in record["reason"]


def test_required_apex_is_always_attempted():
    assert apex_stage.decide(settings(True)) is None


@pytest.fixture
def failing_build(monkeypatch):
    def fail(*args, **kwargs):
        raise apexbuild.ApexError("nvcc not found. Fix: install the CUDA toolkit")

    monkeypatch.setattr(apex_stage, "cuda_build_possible", lambda: (True, "pretend CUDA torch"))
    monkeypatch.setattr(apexbuild, "build_only", fail)
    monkeypatch.setattr(apexbuild, "build_and_verify", fail)


def test_optional_apex_that_fails_to_build_is_skipped_not_fatal(failing_build, tmp_path):
    out = tmp_path / "apex.json"
    apex_stage.main(["--settings", json.dumps(settings(False)), "--out", str(out)])
    record = json.loads(out.read_text())
    assert record["status"] == "skipped" and "nvcc not found" in record["reason"]


def test_required_apex_that_fails_to_build_stops_with_the_message(failing_build, tmp_path, capsys):
    out = tmp_path / "apex.json"
    with pytest.raises(SystemExit):
        apex_stage.main(["--settings", json.dumps(settings(True)), "--out", str(out)])
    assert "ERROR (apex): nvcc not found" in capsys.readouterr().err
    assert not out.exists()


def test_the_verify_step_takes_the_build_steps_verdict(monkeypatch, tmp_path):
    """apex (--built) does not build again what apex_build (--build-only) skipped or failed: it writes that record."""
    monkeypatch.setattr(apex_stage, "cuda_build_possible", lambda: (True, "pretend CUDA torch"))
    monkeypatch.setattr(apexbuild, "build_only", lambda *a, **k: (_ for _ in ()).throw(apexbuild.ApexError("no nvcc")))
    monkeypatch.setattr(apexbuild, "build_and_verify", lambda *a, **k: pytest.fail("verified a build that failed"))
    build, final = tmp_path / "build.json", tmp_path / "apex.json"
    apex_stage.main(["--build-only", "--settings", json.dumps(settings(False)), "--out", str(build)])
    apex_stage.main(["--built", str(build), "--settings", json.dumps(settings(False)), "--out", str(final)])
    assert json.loads(final.read_text()) == json.loads(build.read_text())
    assert json.loads(final.read_text())["status"] == "skipped" and "no nvcc" in json.loads(final.read_text())["reason"]


def test_the_verify_step_verifies_what_the_build_step_built(monkeypatch, tmp_path):
    monkeypatch.setattr(apex_stage, "cuda_build_possible", lambda: (True, "pretend CUDA torch"))
    built = {"status": "built", "key": "k1", "cache": "miss (built)", "seconds": 12.5}
    monkeypatch.setattr(apexbuild, "build_only", lambda *a, **k: built)
    seen = {}

    def verify(settings, jobs, results_dir, built=None, shell=False):
        seen["built"] = built
        return {"status": "built", "reason": "verified"}

    monkeypatch.setattr(apexbuild, "build_and_verify", verify)
    build, final = tmp_path / "build.json", tmp_path / "apex.json"
    apex_stage.main(["--build-only", "--settings", json.dumps(settings(True)), "--out", str(build), "--jobs", "8"])
    apex_stage.main(["--built", str(build), "--settings", json.dumps(settings(True)), "--out", str(final)])
    assert seen["built"] == built and json.loads(final.read_text())["reason"] == "verified"


def test_a_skipped_apex_needs_none_of_the_build_modules(tmp_path):
    """A CPU conda env has no `packaging` (a build requirement): deciding to skip must not import apexbuild."""
    out = tmp_path / "build.json"
    argv = ["--build-only", "--settings", json.dumps({**settings(False), "source": {}}), "--out", str(out)]
    code = ("import sys; sys.modules['amprepro.env.apexbuild'] = None; from amprepro.env import apex_stage; "
            f"apex_stage.main({argv!r})")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(out.read_text())["status"] == "skipped"

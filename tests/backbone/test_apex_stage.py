import json

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

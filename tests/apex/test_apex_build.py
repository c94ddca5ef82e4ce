"""The real build path on fake_apex: one compile per session, then cache hits, the lock, failures, the rule command."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import zipfile

import pytest
from apex_fakes import REPO, Echo, settings_for

from amprepro.env import apexbuild
from amprepro.env.apexbuild import ApexError
from amprepro.env.apexbuild.source import file_sha256
from amprepro.env.apexbuild.store import Store, is_complete

EXTENSIONS = ["apex_C", "apex_version_C"]


def test_first_build_is_a_miss_with_a_complete_manifest(built):
    record, manifest = built.record, built.record["manifest"]
    assert record["status"] == "built" and record["cache"]["status"] == "miss (built)"
    assert record["commit"] == manifest["apex"]["commit"] == built.commit
    assert manifest["key"] == built.key and manifest["key_inputs"]["apex_commit"] == built.commit
    assert manifest["flags"] == ["--cpp_ext"] and manifest["cuda"] is None and manifest["arch_list"] is None
    assert manifest["extensions_promised"] == manifest["extensions_built"] == EXTENSIONS
    assert manifest["torch"]["version"] and manifest["python"]["soabi"]
    assert manifest["build_seconds"] > 0 and manifest["patches"] == []
    entry = built.cache / built.key
    assert file_sha256(entry / manifest["wheel"]["file"]) == manifest["wheel"]["sha256"]
    assert is_complete(entry) and is_complete(built.results / "build" / built.key)


def test_flags_reach_setup_py_through_config_settings(built):
    log = (built.cache / built.key / "build.log").read_text()
    assert "'--cpp_ext', '--parallel', '2']" in log  # printed by fake_apex's setup.py
    assert "--config-settings=--build-option=--cpp_ext --parallel 2" in log
    assert built.record["manifest"]["build"]["env"]["MAX_JOBS"] == "1"


def test_progress_names_each_extension(built):
    for ext in EXTENSIONS:
        assert any(f"compiling {ext} (" in line for line in built.echo.lines)
        assert any(f"linked {ext} (" in line for line in built.echo.lines)


def test_installed_into_a_site_dir_and_verified_in_a_fresh_interpreter(built):
    site = built.results / "site" / built.key
    assert built.record["site_dir"] == str(site)
    verification = built.record["verification"]
    assert verification["ok"] and verification["checks"]["apex_C"]["ok"]
    assert verification["checks"]["imports"]["apex_file"].startswith(str(site.resolve()))
    assert built.record["extensions"] == {ext: {"built": True, "importable": True, "error": None} for ext in EXTENSIONS}
    code = (f"import sys; sys.path.insert(0, {str(site)!r}); import torch, apex_C; "
            "print(apex_C.flatten([torch.ones(3)]))")
    assert "tensor([1., 1., 1.])" in subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout


def test_rerun_is_a_hit_in_seconds(built):
    start = time.monotonic()
    record = apexbuild.build_and_verify(built.settings, jobs=2, results_dir=built.results, echo=Echo())
    assert record["cache"]["status"] == "hit (results)" and record["manifest"] == built.record["manifest"]
    # a rebuild of the fake apex takes over a minute here; a hit under make test's load took 10.7 s (2026-12-01)
    assert time.monotonic() - start < 30


def test_a_second_workflow_reuses_the_shared_cache(built, tmp_path):
    record = apexbuild.build_and_verify(built.settings, jobs=2, results_dir=tmp_path / "results", echo=Echo())
    assert record["cache"]["status"] == "hit (shared cache)" and record["verification"]["ok"]
    assert is_complete(tmp_path / "results" / "build" / built.key)
    assert not (tmp_path / "results" / "logs").exists()  # nothing was compiled


def test_a_waiting_builder_reuses_what_the_lock_holder_published(built, tmp_path):
    cache = tmp_path / "cache"
    store = Store(tmp_path / "unused", cache)
    settings = {**built.settings, "cache_dir": str(cache)}
    command = [sys.executable, "-m", "amprepro.env.apexbuild", "build", "--jobs", "2",
               "--settings", json.dumps(settings),
               "--results-dir", str(tmp_path / "results")]
    with store.lock(built.key):
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   env={**os.environ, "PYTHONPATH": str(REPO / "workflow")})
        waited = _wait_for_line(process, "waiting for it", timeout=60)
        staged = store.staging(built.key)  # publish the way a builder does: complete copy, then rename
        shutil.rmtree(staged)
        shutil.copytree(built.cache / built.key, staged)
        store.publish(staged, built.key)
    out, _ = process.communicate(timeout=120)
    assert waited and process.returncode == 0, out
    assert "hit (built by a concurrent process" in out
    assert not (tmp_path / "results" / "logs").exists()
    assert sorted(p.name for p in cache.iterdir()) == [".locks", built.key]


def test_a_python_only_build_is_refused_and_not_cached(built, tmp_path):
    env = {**os.environ, "FAKE_APEX_DROP_FLAGS": "1"}
    settings = {**built.settings, "cache_dir": str(tmp_path / "cache")}
    with pytest.raises(ApexError, match="Python-only build: --cpp_ext asked for 2 compiled extensions"):
        apexbuild.build_and_verify(settings, jobs=2, results_dir=tmp_path / "results", env=env, echo=Echo())
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [".locks"]  # no entry, no leftovers
    assert (tmp_path / "results" / "logs" / f"build-{built.key}.log").is_file()


def test_a_broken_installed_extension_fails_verification(built, tmp_path):
    results = tmp_path / "results"
    apexbuild.build_and_verify(built.settings, jobs=2, results_dir=results, echo=Echo())
    [library] = (results / "site" / built.key).glob("apex_C.*.so")
    library.write_bytes(b"not a shared library")
    with pytest.raises(ApexError, match="failed verification: not importable: .*apex_C"):
        apexbuild.build_and_verify(built.settings, jobs=2, results_dir=results, echo=Echo())


def test_a_damaged_cache_entry_is_not_used(built, tmp_path):
    entry = tmp_path / "shared" / built.key
    shutil.copytree(built.cache / built.key, entry)
    wheel = next(entry.glob("*.whl"))
    with zipfile.ZipFile(wheel, "a") as archive:
        archive.writestr("extra.txt", "tampered")
    assert not is_complete(entry)
    assert Store(tmp_path / "local", tmp_path / "shared").find(built.key) is None


def test_the_rule_command_writes_apex_json(built, tmp_path):
    """`python -m amprepro.env.apex_stage ...` exactly as workflow/rules/apex.smk runs it, from the workflow dir."""
    settings = json.dumps(settings_for(built.repo, built.commit, cache_dir=built.cache))
    done = subprocess.run([sys.executable, "-m", "amprepro.env.apex_stage", "--settings", settings,
                           "--out", "results/apex/apex.json", "--jobs", "2"], cwd=tmp_path, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(REPO / "workflow")})
    assert done.returncode == 0, done.stderr
    record = json.loads((tmp_path / "results" / "apex" / "apex.json").read_text())
    assert record["status"] == "built" and record["site_dir"] == f"results/apex/site/{built.key}"
    assert (tmp_path / record["site_dir"]).is_dir()


def test_the_rule_command_reports_a_refusal(built, tmp_path):
    settings = json.dumps(settings_for(built.repo, "0123456789abcdef"))
    done = subprocess.run([sys.executable, "-m", "amprepro.env.apex_stage", "--settings", settings,
                           "--out", "results/apex/apex.json"], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO / "workflow")})
    assert done.returncode == 1 and "ERROR (apex):" in done.stderr and "refusing to build" in done.stderr
    assert not (tmp_path / "results" / "apex" / "apex.json").exists()


def _wait_for_line(process, text: str, timeout: float) -> bool:
    found = threading.Event()
    lines: list[str] = []

    def read():
        for line in process.stdout:
            lines.append(line)
            if text in line:
                found.set()
                return

    threading.Thread(target=read, daemon=True).start()
    return found.wait(timeout)

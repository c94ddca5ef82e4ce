"""The empty shell (issue 38): the pinned fake_apex built without its flags, cached and recorded as a shell, and
refused where the full build is asked for. No compile: a shell has no extension, so these tests take seconds."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from apex_fakes import REPO, Echo, settings_for

from amprepro.env import apexbuild
from amprepro.env.apexbuild import ApexError, pipeline, toolchain
from amprepro.env.apexbuild.source import resolve
from amprepro.env.apexbuild.store import cache_key

MISSING = {"apex_C": "ModuleNotFoundError: No module named 'apex_C'",
           "apex_version_C": "ModuleNotFoundError: No module named 'apex_version_C'"}


@pytest.fixture(scope="module")
def shell(fake_repo, tmp_path_factory):
    repo, commit = fake_repo
    settings = settings_for(repo, commit)
    echo = Echo()
    results = tmp_path_factory.mktemp("shell") / "results"
    record = apexbuild.build_and_verify(settings, jobs=2, results_dir=results, echo=echo, shell=True)
    return settings, record, results, echo


def test_the_shell_is_built_cached_and_recorded_as_a_shell(shell):
    _, record, results, _ = shell
    manifest = record["manifest"]
    assert record["status"] == "built" and record["shell"] is True
    assert record["missing_extensions"] == MISSING  # each with the import error apex's code would meet
    assert manifest["flags"] == [] and manifest["shell"] is True
    assert manifest["extensions_promised"] == manifest["extensions_built"] == []
    assert record["extensions"] == {} and record["verification"]["ok"]
    assert record["verification"]["checks"]["absent"]["ok"] is True
    assert record["reason"].startswith("an empty shell, built without --cpp_ext/--cuda_ext (Python only; 2 "
                                       "extensions missing: apex_C, apex_version_C): apex fixture (")
    # setup.py got no build option at all: what `pip install .` without flags does
    log = (results / "build" / record["cache"]["key"] / "build.log").read_text()
    assert "fake_apex setup.py received: ['bdist_wheel'" in log and "--build-option" not in log
    assert record["site_dir"] == str(results / "site" / record["cache"]["key"])
    code = f"import sys; sys.path.insert(0, {record['site_dir']!r}); import apex; print(apex.__file__)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.startswith(record["site_dir"])


def test_a_second_shell_build_is_a_cache_hit(shell):
    settings, record, results, _ = shell
    again = apexbuild.build_and_verify(settings, jobs=2, results_dir=results, echo=Echo(), shell=True)
    assert again["cache"]["status"] == "hit (results)" and again["cache"]["key"] == record["cache"]["key"]


def full_key(settings: dict, results) -> str:
    source = resolve(settings["source"], git_cache=results / "build" / ".git-sources")
    setup = pipeline.read_setup(source)
    tools = toolchain.survey(setup.needs_cuda(setup.core_flags()), dict(os.environ), None, Echo())
    return cache_key(pipeline.key_inputs(source, tools, setup.core_flags()))


def test_the_shell_has_its_own_key_and_the_full_build_refuses_a_shell_entry(shell, request):
    settings, record, results, _ = shell
    key = full_key(settings, results)
    assert key != record["cache"]["key"]  # the flags are in the key: a shell never serves a full build
    shutil.copytree(results / "build" / record["cache"]["key"], results / "build" / key)  # as if copied by hand
    request.addfinalizer(lambda: shutil.rmtree(results / "build" / key))
    with pytest.raises(ApexError, match=r"built with flags none \(an empty shell: no compiled extension\), but the "
                                        r"full build \(--cpp_ext\) was asked for. Fix: delete"):
        apexbuild.build_and_verify(settings, jobs=2, results_dir=results, echo=Echo())


def test_a_shell_whose_extensions_import_fails_verification(shell, tmp_path):
    """A 'shell' that has an extension is not one: the absent check names it."""
    _, record, _, _ = shell
    site = Path(record["site_dir"])
    (tmp_path / "impostor").mkdir()
    (tmp_path / "impostor" / "apex_C.py").write_text("")
    from amprepro.env.apexbuild.verify import require_ok, verify

    result = verify(site, [], [], False, "sha", "gpu", {**os.environ, "PYTHONPATH": str(tmp_path / "impostor")},
                    absent=["apex_C"])
    with pytest.raises(ApexError, match=r"a shell was asked for, but these extensions import: \['apex_C'\]"):
        require_ok(result, site)


def test_the_rule_commands_write_the_shell_records(fake_repo, tmp_path):
    """apex_shell_build and apex_shell (workflow/rules/apex.smk) as the rules run them, from the workflow dir."""
    repo, commit = fake_repo
    settings = json.dumps(settings_for(repo, commit))
    env = {**os.environ, "PYTHONPATH": str(REPO / "workflow")}
    base = [sys.executable, "-m", "amprepro.env.apex_stage", "--shell", "--settings", settings, "--jobs", "1"]
    done = subprocess.run([*base, "--build-only", "--out", "results/apex/shell-build.json"], cwd=tmp_path,
                          capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    build = json.loads((tmp_path / "results/apex/shell-build.json").read_text())
    assert build["status"] == "built" and build["shell"] is True and build["cache"] == "miss (built)"
    done = subprocess.run([*base, "--built", "results/apex/shell-build.json", "--out", "results/apex/shell.json"],
                          cwd=tmp_path, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    record = json.loads((tmp_path / "results/apex/shell.json").read_text())
    assert record["shell"] is True and record["missing_extensions"] == MISSING
    assert record["site_dir"] == f"results/apex/site/{build['key']}"
    assert record["cache"]["status"].startswith("miss (built) by the apex_build job in ")
    done = subprocess.run([sys.executable, "-m", "amprepro.runinputs", "apex", "--record", "results/apex/shell.json",
                           "--out", "results/apex/shell-runs.json"], cwd=tmp_path, capture_output=True, text=True,
                          env=env)
    assert done.returncode == 0, done.stderr
    view = json.loads((tmp_path / "results/apex/shell-runs.json").read_text())
    assert view["shell"] is True and view["missing_extensions"] == MISSING and view["status"] == "built"


def test_a_shell_of_a_setup_py_that_runs_nvcc_needs_one_and_says_so(tmp_path, bare_env):
    """apex 25.05's setup.py runs `nvcc -V` at import: its shell is refused before building where no nvcc is found
    (the message says why), instead of failing inside setup.py with a TypeError."""
    from apex_fakes import FAKE_APEX, git, make_repo

    repo = tmp_path / "src"
    make_repo(FAKE_APEX, repo)
    setup = repo / "setup.py"
    setup.write_text(setup.read_text().replace(
        "ext_modules = []", "ext_modules = []\n_, bare_metal_version = get_cuda_bare_metal_version(CUDA_HOME)"))
    git(repo, "commit", "-qam", "nvcc at import")
    settings = settings_for(repo, git(repo, "rev-parse", "HEAD"))
    with pytest.raises(ApexError, match=r"setup.py runs `nvcc -V` even for a build without --cpp_ext/--cuda_ext "
                                        r"\(get_cuda_bare_metal_version\(CUDA_HOME\) at import\), so the shell needs "
                                        r"an nvcc too: "):
        apexbuild.build_and_verify(settings, jobs=1, results_dir=tmp_path / "results", env=bare_env, echo=Echo(),
                                   shell=True)

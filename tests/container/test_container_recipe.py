"""The container recipe without building it (that is `make container-test`, minutes): every file it copies or runs
exists and is not excluded from the build context, its config is valid, its apex gate decides right, and the
workflow's jobs get the image under --sdm apptainer."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from amprepro.config import ConfigError, validate_config

REPO = Path(__file__).resolve().parents[2]
CONTAINERFILE = REPO / "container" / "Containerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", CONTAINERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def ignored(path: str) -> bool:
    patterns = [p.strip() for p in (REPO / ".containerignore").read_text().splitlines()
                if p.strip() and not p.startswith("#")]
    return any(fnmatch.fnmatch(path, p) or path.startswith(p.rstrip("/") + "/") for p in patterns)


def test_only_known_instructions_and_one_base():
    known = {"ARG", "FROM", "RUN", "WORKDIR", "COPY", "ENV", "CMD"}
    found = instructions()
    assert {word for word, _ in found} <= known
    assert [args for word, args in found if word == "FROM"] == ["${BASE}"]
    assert found[-1] == ("CMD", '["make", "run"]')


def test_every_copied_file_is_in_the_repository_and_in_the_context():
    copies = [shlex.split(args)[:-1] for word, args in instructions() if word == "COPY"]
    sources = [source for copy in copies for source in copy]
    assert "requirements-cuda13.0.txt" in sources and "." in sources
    for source in sources:
        assert (REPO / source).exists(), source
        assert source == "." or not ignored(source), f"{source} is excluded by .containerignore"
    for needed in ("Snakefile", "Makefile", "workflow", "config", "container/image.yaml", "container/apex_built.py",
                   "requirements-cuda13.0.txt", "profiles/slurm/requirements.txt", "pyproject.toml"):
        assert (REPO / needed).exists() and not ignored(needed), needed
    for excluded in (".venv", "results", ".snakemake", ".git", "container/wheels"):
        assert ignored(excluded), excluded
    assert (REPO / ".dockerignore").read_text() == (REPO / ".containerignore").read_text()


def test_the_wheelhouse_is_mounted_not_copied_and_run_time_has_no_index():
    runs = [args for word, args in instructions() if word == "RUN"]
    assert any(args.startswith("--mount=type=bind,source=container/wheels,target=/tmp/wheels") for args in runs)
    assert (REPO / "container" / "wheels").is_dir()
    envs = " ".join(args for word, args in instructions() if word == "ENV")
    assert "PIP_NO_INDEX=1" in envs and "PATH=/opt/amprepro/.venv/bin:$PATH" in envs
    apex_step = next(args for args in runs if "amprepro.env.launch" in args)
    assert "results/apex/apex.json" in apex_step and "container/apex_built.py" in apex_step
    assert apex_step.rstrip().endswith("rm -rf results .snakemake")


def test_shell_scripts_parse():
    for script in ("container/make_base.sh", "container/test.sh", "tools/gpu/pip_nvcc_run.sh",
                   "tools/gpu/cuda_wheels.sh"):
        assert subprocess.run(["bash", "-n", str(REPO / script)]).returncode == 0, script


def test_the_image_config_is_valid_and_pins_the_default_apex():
    base = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    image = yaml.safe_load((REPO / "container" / "image.yaml").read_text())
    merged = validate_config({**base, "apex": {**base["apex"], **image["apex"]}})
    assert merged["apex"]["cuda_arch_list"] == "9.0" and merged["apex"]["cache_dir"] == "/opt/amprepro/apex-cache"
    assert merged["apex"]["source"]["commit"].startswith(base["apex"]["source"]["commit"])
    assert merged["apex"]["source"]["ref"] == base["apex"]["source"]["ref"]


def test_the_apptainer_definition_uses_the_saved_image():
    text = (REPO / "container" / "amprepro.def").read_text()
    assert "Bootstrap: docker-archive" in text and "From: amprepro.tar" in text
    assert "exec make run" in text and "/opt/amprepro/container/image.yaml" in text


def apex_gate(tmp_path: Path, record: dict, torch_cuda: str | None) -> subprocess.CompletedProcess:
    (tmp_path / "torch").mkdir(exist_ok=True)
    (tmp_path / "torch" / "__init__.py").write_text(
        f"__version__ = '2.13.0+fake'\nclass version:\n    cuda = {torch_cuda!r}\n")
    (tmp_path / "apex.json").write_text(json.dumps(record))
    return subprocess.run([sys.executable, str(REPO / "container" / "apex_built.py"), str(tmp_path / "apex.json")],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(tmp_path)})


def test_apex_gate(tmp_path):
    skipped = {"status": "skipped", "reason": "apex is optional here and its build failed: nvcc ..."}
    failed = apex_gate(tmp_path, skipped, "13.0")
    assert failed.returncode == 1 and "apex was not built although torch 2.13.0+fake has CUDA 13.0" in failed.stderr
    cpu = apex_gate(tmp_path, skipped, None)
    assert cpu.returncode == 0 and "apex not in the image: torch 2.13.0+fake is a CPU build" in cpu.stdout
    built = {"status": "built", "reason": "apex 25.05 miss (built)", "cache": {"entry": "/opt/amprepro/apex-cache/k"},
             "nvcc": {"release": "13.0", "source": "pip", "nvcc": "/opt/amprepro/.venv/amprepro-cuda/x/bin/nvcc"}}
    ok = apex_gate(tmp_path, built, "13.0")
    assert ok.returncode == 0 and "nvcc 13.0 (pip: /opt/amprepro/.venv/amprepro-cuda/x/bin/nvcc)" in ok.stdout


@pytest.mark.parametrize("bad", ["ubuntu; rm -rf /", "docker://$(id)", "image.sif", "http://x/y.sif"])
def test_a_container_image_that_is_no_image_reference_is_refused(bad):
    base = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    with pytest.raises(ConfigError, match="config.container_image"):
        validate_config({**base, "container_image": bad})


def test_every_job_gets_the_image_under_sdm_apptainer(tmp_path):
    """A dry run with a stand-in apptainer on PATH (Snakemake only asks its version): the image is the jobs'."""
    fake = tmp_path / "bin" / "apptainer"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'apptainer version 1.3.4'\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}:{Path(sys.executable).parent}:{os.environ['PATH']}"}
    command = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(tmp_path / "w"),
               "-n", "--cores", "1", "--sdm", "apptainer", "--config", "preset=smoke",
               "container_image=docker://localhost/amprepro:test"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "Singularity image docker://localhost/amprepro:test will be pulled" in done.stdout + done.stderr

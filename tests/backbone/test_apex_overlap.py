"""The cells that use no apex never wait for the apex compile, and on a GPU box the compile takes no GPU and leaves one
cell's CPUs free, so Snakemake runs those cells beside it. Read from Snakemake's own DAG and dry run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from amprepro.plan.resources import CPUS_PER_GPU, apex_build_threads
from amprepro.train.cellsupport import needs_apex
from workflow_testing import copy_workflow, job_env, snakemake


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return copy_workflow(tmp_path_factory.mktemp("overlap") / "amprepro")


def dag(workdir: Path, *args: str) -> tuple[dict[str, str], dict[str, set[str]]]:
    """Each job's label and the jobs it waits for (directly or not), from `snakemake --dag`."""
    dot = snakemake(workdir, "--dag", "--forceall", "--cores", "2", *args).stdout
    labels = {node: label for node, label in re.findall(r'^\s*(\d+)\[label = "([^"]*)"', dot, re.M)}
    parents: dict[str, set[str]] = {node: set() for node in labels}
    for source, target in re.findall(r"^\s*(\d+) -> (\d+)", dot, re.M):
        parents[target].add(source)

    def ancestors(node: str) -> set[str]:
        found, todo = set(), list(parents[node])
        while todo:
            parent = todo.pop()
            if parent not in found:
                found.add(parent)
                todo.extend(parents[parent])
        return found

    return labels, {node: ancestors(node) for node in labels}


def rule_of(label: str) -> str:
    return label.split("\\n")[0]


def test_only_the_cells_that_use_apex_wait_for_it(workdir):
    labels, waits_for = dag(workdir, "--config", "preset=smoke")
    cells = {node: label for node, label in labels.items() if rule_of(label) == "train"}
    assert len(cells) == 12
    for node, label in cells.items():
        precision = re.search(r"precision: (\w+)", label).group(1)
        upstream = {rule_of(labels[parent]) for parent in waits_for[node]}
        assert {"sanity", "environment"} <= upstream, label
        if precision.startswith("apex_"):
            assert {"apex", "apex_build"} <= upstream, label
        else:
            assert not {"apex", "apex_build"} & upstream, f"{label} waits for the apex build"


def test_needs_apex_names_every_apex_variant():
    train = {"optimizer": "adamw"}
    cell = lambda precision, **config: {"precision": precision, "train": train,  # noqa: E731
                                        "model_config": {"arch": "vit_b_16", **config}}
    assert needs_apex(cell("apex_o1")) and needs_apex(cell("apex_o2"))
    assert needs_apex(cell("amp_bf16", fused_layer_norm=True))
    assert needs_apex({**cell("amp_fp16"), "train": {"optimizer": "apex_fused_adam"}})
    assert not needs_apex(cell("amp_bf16")) and not needs_apex(cell("fp32", channels_last=True))


@pytest.mark.parametrize(("cores", "gpus", "expected"), [(16, 1, 7), (32, 2, 15), (16, 2, 16), (12, 1, 12),
                                                         (14, 1, 14), (16, 0, 16), (2, 0, 2)])
def test_the_build_leaves_each_gpu_cell_its_cpus_and_one_core_when_half_the_cores_remain(cores, gpus, expected):
    assert apex_build_threads(cores, gpus) == expected
    if expected < cores:
        assert expected + CPUS_PER_GPU * gpus + 1 <= cores


def test_on_a_gpu_box_the_compile_takes_no_gpu_and_half_the_cores(workdir, tmp_path, monkeypatch):
    from test_launch import fake_nvidia_smi

    fake_nvidia_smi(tmp_path / "bin", gpus=1)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{job_env()['PATH']}")
    dry = snakemake(workdir, "results/apex/apex.json", "results/runs/resnet50/amp_bf16/seed0/metrics.json",
                    "results/apex/shell-build.json", "results/plan/plan.json", "-n", "-p",
                    "--forceall", "--cores", "16", "--resources", "gpu=1").stdout
    jobs = {block.split(":")[0].split()[-1]: block for block in re.split(r"\n(?=(?:rule|checkpoint) )", dry)}
    build, verify = jobs["apex_build"], jobs["apex"]
    assert re.search(r"threads: 7\b", build) and re.search(r"\bgpu=0\b", build), build
    assert re.search(r"\bgpu=1\b", verify), verify
    assert "--out results/apex/build.json --jobs 7" in dry
    assert re.search(r"\bgpu=1\b", jobs["train"]) and re.search(r"threads: 8\b", jobs["train"])

    # The memory plan, the first whole-GPU job before the timed cells, fits beside both builds: it never waits for a
    # core while the shell builds (10 s on a fresh H100 at 99d30cf, when the build took 8 of its 16 cores).
    def threads(job: str) -> int:
        found = re.search(r"threads: (\d+)", jobs[job])
        return int(found.group(1)) if found else 1  # Snakemake prints no threads line for a one-thread job

    assert threads("apex_build") + threads("apex_shell_build") + threads("plan") <= 16, dry


def test_the_shell_cells_wait_for_the_shell_build_and_the_others_never(workdir):
    """Issue 38: a model with apex_build: shell reads results/apex/shell-runs.json, built by apex_shell_build and
    verified by apex_shell; it never waits for the full compile, and no other cell waits for the shell."""
    labels, waits_for = dag(workdir, "--config", "preset=paper")
    cells = {node: label for node, label in labels.items() if rule_of(label) == "train"}
    shell_cells = {node: label for node, label in cells.items() if "_apex_shell" in label}
    assert sorted(re.search(r"model: (\w+)\\npr", label).group(1) + "/" + re.search(r"precision: (\w+)", label).group(1)
                  for label in shell_cells.values()) == [
        "resnet50_apex_shell/apex_o1", "resnet50_apex_shell/apex_o2", "vit_b_16_apex_shell/apex_o1",
        "vit_b_16_apex_shell/apex_o2", "vit_b_16_apex_shell_fused_adam/amp_fp16",
        "vit_b_16_apex_shell_fused_layer_norm/amp_bf16"]
    for node, label in cells.items():
        upstream = {rule_of(labels[parent]) for parent in waits_for[node]}
        if node in shell_cells:
            assert {"apex_shell", "apex_shell_build"} <= upstream and not {"apex", "apex_build"} & upstream, label
        else:
            assert not {"apex_shell", "apex_shell_build"} & upstream, f"{label} waits for the apex shell"


def test_a_cell_reads_the_view_of_its_models_apex_build():
    from amprepro.cellspec import CellSpec

    spec = lambda precision, **config: CellSpec("m", precision, 0, {"arch": "vit_b_16", **config},  # noqa: E731
                                                 {"optimizer": "adamw"})
    assert spec("apex_o1").apex_view == "results/apex/runs.json"
    assert spec("apex_o2", apex_build="shell").apex_view == "results/apex/shell-runs.json"
    assert spec("amp_bf16", apex_build="shell", fused_layer_norm=True).apex_view == "results/apex/shell-runs.json"
    assert spec("amp_bf16", apex_build="shell").apex_view is None  # uses no apex: waits for neither build


def test_the_build_rules_get_the_extensions_the_cells_use(workdir, tmp_path, monkeypatch):
    """apex_build and apex get the run matrix's extension set (amprepro.apexexts) in --settings; the shell none."""
    from test_launch import fake_nvidia_smi

    fake_nvidia_smi(tmp_path / "bin", gpus=1)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{job_env()['PATH']}")
    dry = snakemake(workdir, "results/apex/apex.json", "results/apex/shell.json", "-n", "-p", "--forceall",
                    "--cores", "16", "--resources", "gpu=1").stdout
    commands = [line for line in dry.splitlines() if "amprepro.env.apex_stage" in line]
    full = [line for line in commands if "--shell" not in line]
    shell = [line for line in commands if "--shell" in line]
    assert len(full) == 2 and len(shell) == 2, commands
    for line in full:  # the paper preset (a GPU is visible): apex O1/O2 with FusedAdam, and FusedLayerNorm
        assert '"extensions": ["amp_C", "fused_layer_norm_cuda"]' in line, line
    for line in shell:
        assert '"extensions"' not in line, line

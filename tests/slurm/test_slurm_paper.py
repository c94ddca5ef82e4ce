"""The paper preset's DAG through `--workflow-profile profiles/slurm` on the local test cluster, with the jobs on
(fake) GPU nodes: every job's GPUs, nodes, CPUs, memory and time limit in Slurm's own records are what its cell asks
for (amprepro.plan.resources), and summary and report come out. Every model of the preset runs, in one precision
(amp_bf16, the one every model has): what a job asks Slurm for depends on its model and training settings, never on
the precision, so the other 37 cells would add 2-core minutes and no check.

The test cluster's GPUs are gres entries without CUDA behind them (tools/slurm/start.sh). So every cell is written
as skipped by its launcher (torch sees no CUDA device among the ones Slurm gave it) before any worker starts, which
keeps this run short. One thing is changed for that: `sanity` would rightly stop a run whose GPU jobs have no CUDA
(its required check cuda.is_available), so a `python` shim first on PATH runs it with --expect-gpu False, and
notes each time it does. A model with nodes: 2 is added to the preset so that a multi-node GPU request is checked
too (tests/slurm/test_slurm_profile.py runs a two-node cell for real, on the CPU).

Through Slurm go the preset's models of each kind of request (SLURM_MODELS: one GPU, two GPUs of one node, the 7B
cell's time, images and tokens; with the two-node model, 5 cells): in the test's workflow copy the preset holds only
these. Every cell of the whole preset (15) is checked against amprepro.plan.resources in a dry run through the same
profiles: the resources each job would hand the plugin, which the Slurm records of the five show it turns into what
Slurm grants. (Until issue 28 all 15 cells went through Slurm: two Snakemake starts per Slurm job, the costliest part
of the suite on 2 cores, for 10 more cells of kinds already there.)
"""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest
import yaml
from test_slurm_profile import SKIP, VENV_BIN, Run, cancel_jobs_of, env_with, require_slurm

from amprepro.config import resolve_runs, validate_config
from amprepro.plan import resources
from workflow_testing import copy_workflow, snakemake

pytestmark = [pytest.mark.slurm, pytest.mark.e2e, SKIP]  # under CI=true a missing Slurm fails (require_slurm)

REPO = Path(__file__).resolve().parents[2]
PAPER_RUN_TIMEOUT_S = 900
TWO_NODE_MODEL = "transformer_ddp_2nodes"
CONFIG = {
    "preset": "paper",
    "gpu": True,  # a login node without a GPU submitting to GPU nodes (docs/slurm.md)
    "apex": {"required": False},  # no CUDA toolkit behind the fake GPUs: apex is recorded as not built
    "runs": {"precisions": ["amp_bf16"],
             "models": {TWO_NODE_MODEL: {"arch": "tiny_transformer", "data": "digits", "batch_size": 64,
                                         "gpus": 2, "nodes": 2, "precisions": ["amp_bf16"]}},
             # one model's largest-batch search through Slurm, not the preset's three
             "largest_batch": {"models": ["cnn"], "precisions": ["amp_bf16"]}},
}
SANITY_SHIM = """#!/usr/bin/env bash
# tests/slurm/test_slurm_paper.py: the fake GPUs have no CUDA; sanity would stop the run on cuda.is_available.
args=("$@")
if [[ " $* " == *" -m amprepro.env.sanity "* || " $* " == *" --run sanity "* ]]; then
  echo "sanity shim: --expect-gpu False in Slurm job $SLURM_JOB_ID" >> "{note}"
  for i in "${{!args[@]}}"; do
    [ "${{args[$i]}}" = True ] && [ "${{args[$((i - 1))]}}" = --expect-gpu ] && args[$i]=False
  done
fi
exec "{python}" "${{args[@]}}"
"""
# The preset's models whose cells go through Slurm: a one-GPU image model (and the largest-batch search), a one-GPU
# token model, the 7B cell (the longest time limit), the two-GPU cell; with TWO_NODE_MODEL, every kind of request.
SLURM_MODELS = ["cnn", "gpt124m", "llama7b", "transformer_ddp"]
RESOURCES = re.compile(r"^rule train:\n(?:    .*\n)*?    wildcards: model=(\w+), precision=(\w+), seed=(\d+)\n"
                       r"(?:    .*\n)*?    resources: (.*)$", re.M)
CELL = re.compile(r"^rule_train_wildcards_(\w+)_(fp32|tf32|amp_fp16|amp_bf16|apex_o1|apex_o2)_(\d+)$")


def megabytes(slurm_value: str) -> float:
    """Slurm's memory figure (e.g. 16000M, 62.50G) in MB."""
    number, unit = float(slurm_value[:-1]), slurm_value[-1]
    return number * {"M": 1, "G": 1024, "T": 1024**2}[unit]


def minutes(limit: str) -> int:
    """Slurm's TimeLimit ([D-]HH:MM:SS) in minutes."""
    days, _, clock = limit.rpartition("-")
    hours, mins, secs = map(int, clock.split(":"))
    return (int(days or 0) * 24 + hours) * 60 + mins + (secs > 0)


# Made in tests/slurm/conftest.py's slurm_session: submitted first, it runs beside test_slurm_profile.py's smoke runs.
@pytest.fixture(scope="module")
def paper_run(slurm_session):
    return slurm_session.result("paper")


def start_paper_run(tmp_path_factory) -> Run:
    """The paper preset's Slurm run, started (not waited for: finish_paper_run)."""
    require_slurm()
    base = tmp_path_factory.mktemp("slurm-paper")
    workdir = copy_workflow(base / "paper")
    preset = workdir / "config" / "presets" / "paper.yaml"
    models = yaml.safe_load(preset.read_text())["models"]
    assert set(SLURM_MODELS) <= set(models), f"the paper preset lost one of {SLURM_MODELS}"
    preset.write_text("# tests/slurm/test_slurm_paper.py: the paper preset's models that go through Slurm\n"
                      + yaml.safe_dump({**yaml.safe_load(preset.read_text()),
                                        "models": {name: models[name] for name in SLURM_MODELS}}, sort_keys=False))
    (workdir / "paper-on-gpu-nodes.yaml").write_text(yaml.safe_dump(CONFIG))
    shim_dir, note = base / "shim", base / "sanity-shim.txt"
    shim_dir.mkdir()
    (shim_dir / "python").write_text(SANITY_SHIM.format(note=note, python=VENV_BIN / "python"))
    (shim_dir / "python").chmod(0o755)
    args = ["--workflow-profile", "profiles/slurm", "--profile", "profiles/slurm-localtest",
            "--configfile", "paper-on-gpu-nodes.yaml"]
    run = Run(workdir, args, env_with(shim_dir), "slurm-paper")
    run.sanity_note = note
    return run


def finish_paper_run(run: Run) -> Run:
    try:
        run.wait(PAPER_RUN_TIMEOUT_S)
    finally:
        if run.proc.poll() is None:
            os.killpg(run.proc.pid, signal.SIGKILL)
            run.proc.wait()
        cancel_jobs_of(run.workdir)
    note = run.sanity_note
    run.sanity_shim = note.read_text().splitlines() if note.exists() else []
    print(f"paper preset through Slurm: {run.seconds:.0f}s, {len(run.submissions())} Slurm jobs")
    return run


def paper_runs(presets: Path = REPO / "config" / "presets") -> dict:
    runs, _ = resolve_runs(validate_config(CONFIG), presets, ["configured GPU"], "test")
    return runs


def slurm_runs(paper_run) -> dict:
    """The run matrix of the Slurm run: its workflow copy's preset (SLURM_MODELS) and the two-node model."""
    return paper_runs(paper_run.workdir / "config" / "presets")


def wanted(model: dict, train: dict) -> dict:
    """What amprepro.plan.resources says a train job of this model asks for, on GPU nodes (gpu: true)."""
    gpus = resources.gpus_per_node(model, True)
    return {"gpus_per_node": gpus, "nodes": resources.nodes(model), "cpus": resources.CPUS_PER_GPU * gpus *
            resources.nodes(model), "mb": resources.host_mb(model, True),
            "minutes": resources.runtime_minutes(model, train, 1.0)}


@pytest.fixture(scope="module")
def whole_preset_dry_run(tmp_path_factory) -> str:
    """`snakemake -n` of the whole paper preset (and the two-node model) through the same profiles: no job runs."""
    workdir = copy_workflow(tmp_path_factory.mktemp("slurm-paper-dry") / "paper")
    (workdir / "paper-on-gpu-nodes.yaml").write_text(yaml.safe_dump(CONFIG))
    result = snakemake(workdir, "-n", "--workflow-profile", "profiles/slurm", "--profile", "profiles/slurm-localtest",
                       "--configfile", "paper-on-gpu-nodes.yaml", timeout=300)
    return result.stdout


def test_every_cell_of_the_whole_preset_asks_for_what_its_model_needs(whole_preset_dry_run):
    runs = paper_runs()
    planned = {}
    for model_name, precision, _, listed in RESOURCES.findall(whole_preset_dry_run):
        values = dict(item.split("=", 1) for item in listed.split(", "))
        planned[model_name, precision] = values
    assert sorted(planned) == sorted((name, "amp_bf16") for name in runs["models"]) and len(planned) == 16, \
        f"train jobs in the dry run: {sorted(planned)}"
    for (model_name, _), values in planned.items():
        model = runs["models"][model_name]
        need = wanted(model, {**runs["train"], **model.get("train", {})})
        # one node: gpu=N (the plugin's --gpus); more: gres=gpu:N per node (its --gres), gpu=0
        per_node = int(values["gpu"]) or int(values["gres"].removeprefix("gpu:") or 0)
        got = {"gpus_per_node": per_node, "nodes": int(values["nodes"]),
               "cpus": int(values["cpus_per_gpu"]) * per_node * int(values["nodes"]),
               "mb": float(values["mem_mb"]), "minutes": int(values["runtime"])}
        assert got == need, f"{model_name}: the job asks for {got}, its model needs {need} ({values})"


def test_paper_preset_completes_through_slurm_with_summary_and_report(paper_run):
    assert paper_run.returncode == 0, paper_run.output[-5000:]
    summary = json.loads((paper_run.workdir / "results/summary/summary.json").read_text())
    models = slurm_runs(paper_run)["models"]
    assert set(models) == {*SLURM_MODELS, TWO_NODE_MODEL} and {c["model"] for c in summary["cells"]} == set(models)
    assert len(summary["cells"]) == 5 and {c["precision"] for c in summary["cells"]} == {"amp_bf16"}
    searches = summary["largest_batch"]["records"]  # through Slurm too; the fake GPUs' cells did not run, so no search
    assert len(searches) == 1 and all(r["status"] == "skipped" and "did not run at the planned batch" in r["reason"]
                                      for r in searches), searches
    assert (paper_run.workdir / "results/report/report.html").stat().st_size > 0
    # one sanity job (the shim sees `python -m amprepro.gpuslots ... -- python -m amprepro.plan.cellserver --run
    # sanity` and then the one gpuslots runs: both lines name the same Slurm job)
    assert len(set(paper_run.sanity_shim)) == 1, paper_run.sanity_shim


def test_every_train_job_got_what_its_cell_asks_for(paper_run):
    runs, checked = slurm_runs(paper_run), set()
    for jobid, record in paper_run.records().items():
        cell = CELL.match(record["Comment"])
        if not cell:
            continue
        model_name, precision, seed = cell.groups()
        model = runs["models"][model_name]
        train = {**runs["train"], **model.get("train", {})}
        gpus, nodes = resources.gpus_per_node(model, True), resources.nodes(model)
        where = f"job {jobid} ({model_name}/{precision}): {record}"
        assert record["NumNodes"] == str(nodes), where
        if nodes == 1:
            assert record.get("TresPerJob") == f"gres:gpu:{gpus}", where
        else:
            assert record.get("TresPerNode") == f"gres:gpu:{gpus}", where
        assert int(record["NumCPUs"]) == resources.CPUS_PER_GPU * gpus * nodes, where
        assert megabytes(record["MinMemoryNode"]) == resources.host_mb(model, True), where
        assert minutes(record["TimeLimit"]) == resources.runtime_minutes(model, train, 1.0), where
        checked.add((model_name, precision, int(seed)))
    assert len(checked) == 5, f"{len(checked)} train jobs in Slurm's records"


def test_cell_resources_differ_by_cell_as_the_model_needs(paper_run):
    """Anchors that do not come from amprepro.plan.resources: the 7B cells' time, the 2-GPU cell, the 2-node cell."""
    records = paper_run.records().values()
    by_cell = {CELL.match(r["Comment"]).group(1, 2): r for r in records if CELL.match(r["Comment"])}
    assert minutes(by_cell["llama7b", "amp_bf16"]["TimeLimit"]) == 15  # 10 steps of 2048 tokens: 5 min + start-up
    assert minutes(by_cell["cnn", "amp_bf16"]["TimeLimit"]) == 11
    ddp = by_cell["transformer_ddp", "amp_bf16"]
    assert (ddp["TresPerJob"], ddp["NumCPUs"], megabytes(ddp["MinMemoryNode"])) == ("gres:gpu:2", "16", 16000)
    two_nodes = by_cell[TWO_NODE_MODEL, "amp_bf16"]
    assert (two_nodes["NumNodes"], two_nodes["TresPerNode"], two_nodes["NumCPUs"]) == ("2", "gres:gpu:2", "32")


def test_each_cell_saw_the_gpus_slurm_gave_it_and_was_skipped_before_any_worker(paper_run):
    runs = slurm_runs(paper_run)
    for metrics_file in (paper_run.workdir / "results/runs").glob("*/*/seed*/metrics.json"):
        metrics = json.loads(metrics_file.read_text())
        gpus = resources.gpus_per_node(runs["models"][metrics["model"]], True)
        assert metrics["status"] == "skipped" and metrics["world_size"] == 0, metrics
        visible = re.search(r"CUDA_VISIBLE_DEVICES=(\S+)\)", metrics["reason"])
        assert visible and len(visible.group(1).split(",")) == gpus, (metrics_file, metrics["reason"])

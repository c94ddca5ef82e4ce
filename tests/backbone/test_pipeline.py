"""End to end: the smoke preset through Snakemake in a fresh copy, reruns, a killed job, lint, a broken config."""

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from workflow_testing import SNAKEMAKE, copy_workflow, job_env, snakemake

pytestmark = pytest.mark.e2e
SECTIONS = ["Results", "Throughput", "Speedup against both baselines", "Peak memory", "Loss curves: FP32 against AMP",
            "Loss scale", "Sanity checks", "Environment", "Provenance"]


@pytest.fixture(scope="module")
def smoke_run(smoke_preset_run):
    """The session's smoke preset run (tests/conftest.py, shared with tests/report/test_pipeline_report.py)."""
    workdir, seconds, _ = smoke_preset_run
    return workdir, seconds


def job_counts(dry_run_stdout: str) -> dict:
    """The 'Job stats' table of a dry run as {rule: count}."""
    table = dry_run_stdout.split("Job stats:")[1]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M) if m.group(1) != "total"}


def test_smoke_preset_runs_every_cell_and_renders_the_report(smoke_run):
    workdir, seconds = smoke_run
    assert seconds < 300, f"smoke preset took {seconds:.0f} s"
    summary = json.loads((workdir / "results/summary/summary.json").read_text())
    assert summary["preset"]["preset"] == "smoke"
    assert len(summary["cells"]) == 2 * 6
    for cell in summary["cells"]:
        cell_dir = workdir / f"results/runs/{cell['model']}/{cell['precision']}/seed0"
        metrics = json.loads((cell_dir / "metrics.json").read_text())
        assert metrics["status"] in ("ok", "skipped"), metrics
        if metrics["status"] == "skipped":
            assert metrics["reason"]
    ran = {(c["model"], c["precision"]) for c in summary["cells"] if c["status"] == "ok"}
    assert {("cnn", "fp32"), ("cnn", "amp_bf16"), ("transformer", "fp32"), ("transformer", "amp_bf16")} <= ran
    html = (workdir / "results/report/report.html").read_text()
    for section in SECTIONS:
        assert f">{section}<" in html, f"report lacks section {section!r}"
    # throughput, speedup, memory, loss curves (the 7B breakdown has nothing to split on a CPU: one line says why)
    assert html.count("data:image/png;base64,") >= 4
    assert "def " not in html and "import " not in html  # no code cells
    for log in ("environment", "apex_build", "apex", "sanity", "summary", "report"):
        assert (workdir / f"results/logs/{log}.log").exists()
    # Each of the stack's checks that failed without stopping the run is said again as Snakemake ends, with its fix
    # (on this project's machines torchvision's CUDA wheel beside a CPU torch fails two); none where none failed.
    checks = json.loads((workdir / "results/sanity/sanity.json").read_text())["checks"]
    failed = [check["name"] for check in checks if check["status"] == "fail"]
    stderr = (workdir.parent / "run.stderr").read_text()
    said = re.findall(r"^amprepro: WARNING: the stack's check \"(.+?)\" failed: .+ Fix: \S", stderr, re.M)
    assert said == failed, stderr[-3000:]


def test_second_run_does_nothing(smoke_run):
    workdir, _ = smoke_run
    started = time.monotonic()
    result = snakemake(workdir, "--cores", "2", "--config", "preset=smoke")
    assert "Nothing to be done" in result.stdout + result.stderr
    assert time.monotonic() - started < 30


def test_changing_one_model_reruns_only_its_cells(smoke_run, tmp_path):
    # in a copy of the finished run (results, .snakemake's records and their times), which the other tests keep
    workdir = Path(shutil.copytree(smoke_run[0], tmp_path / "amprepro", symlinks=True))
    override = workdir / "override.yaml"
    override.write_text("preset: smoke\nruns:\n  models:\n    cnn:\n      batch_size: 32\n")
    args = ["--cores", "2", "--configfile", "config/config.yaml", str(override)]
    # The memory plan (a checkpoint) is made again for real: Snakemake then judges the cells by their model's view of
    # it, which changed for cnn only (a dry run cannot know that before the plan has run). What the run goes on to do
    # is then Snakemake's own plan of it, a dry run: the six cnn cells, no transformer cell. (Until issue 28 the six
    # cells trained here too; re-run cells train for real in test_launch.py's runs after a kill.)
    transformer = sorted((workdir / "results/runs/transformer").rglob("metrics.json"))
    before = {path: path.stat().st_mtime_ns for path in transformer}
    result = snakemake(workdir, "results/plan/plan.json", *args)  # target first: --configfile takes the words after it
    ran = ran_rules(result.stdout + result.stderr)
    assert "plan" in ran and "train" not in ran, ran
    dry = snakemake(workdir, "-n", *args)
    planned = re.findall(r"^\s+wildcards: model=(\w+), precision=(\w+), seed=(\d+)$", dry.stdout, re.M)
    assert job_counts(dry.stdout).get("train") == 6 and sorted(planned) == sorted(
        ("cnn", precision, "0") for precision in ("fp32", "tf32", "amp_fp16", "amp_bf16", "apex_o1", "apex_o2")), \
        dry.stdout[-3000:]
    assert {path: path.stat().st_mtime_ns for path in transformer} == before


def test_killed_run_leaves_nothing_snakemake_takes_as_complete(tmp_path):
    workdir = copy_workflow(tmp_path / "amprepro")
    target = "results/runs/cnn/fp32/seed0/metrics.json"
    args = [*SNAKEMAKE, "--cores", "1", target, "--config", "preset=smoke"]
    override = workdir / "long.yaml"
    override.write_text("preset: smoke\nruns:\n  train:\n    steps: 200000\n")
    args += ["--configfile", "config/config.yaml", str(override)]
    process = subprocess.Popen(args, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True, env=job_env())
    log = workdir / "results/logs/runs/cnn/fp32/seed0.log"
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline and not (log.exists() and "step    20" in log.read_text()):
            time.sleep(0.5)
    finally:  # also when the test itself is stopped: a 200000-step cell must not outlive it
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    assert log.exists() and "step    20" in log.read_text(), "training never started"
    cell = workdir / "results/runs/cnn/fp32/seed0"
    assert not (cell / "metrics.json").exists() and not (cell / "steps.csv").exists()
    result = snakemake(workdir, "-n", "--cores", "1", target, "--configfile", "config/config.yaml", str(override))
    assert job_counts(result.stdout).get("train") == 1


def test_broken_config_stops_with_the_field_named(workflow_copy):
    result = snakemake(workflow_copy, "-n", "--cores", "1", "--config", "preset=fast", check=False)
    assert result.returncode != 0
    assert "Config error at config.preset: 'fast' is not one of" in result.stdout + result.stderr


def test_lint_is_clean():
    repo = Path(__file__).resolve().parents[2]
    result = subprocess.run([*SNAKEMAKE, "--lint"], cwd=repo, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Lints for" not in result.stdout + result.stderr


def test_rules_are_formatted_with_snakefmt():
    """snakefmt (pinned in requirements-dev.txt, line length from pyproject.toml) would change nothing."""
    import sys

    repo = Path(__file__).resolve().parents[2]
    snakefmt = Path(sys.executable).parent / "snakefmt"
    result = subprocess.run([str(snakefmt), "--check", "--diff", "Snakefile", "workflow/rules"], cwd=repo,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def test_python_is_clean_with_ruff():
    """ruff (pinned in requirements-dev.txt, rules in pyproject.toml) finds nothing in workflow/, tools/ and tests/.
    AMPREPRO_RUFF names another ruff binary (one outside the venv, while the venv predates the pin)."""
    import os
    import sys

    repo = Path(__file__).resolve().parents[2]
    ruff = os.environ.get("AMPREPRO_RUFF") or str(Path(sys.executable).parent / "ruff")
    result = subprocess.run([ruff, "check", "--no-cache", "workflow", "tools", "tests"], cwd=repo,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def ran_rules(log: str) -> list[str]:
    """The rules a real run executed, from Snakemake's log."""
    return sorted(re.findall(r"^(?:local)?(?:rule|checkpoint) (\w+):$", log, re.M))


def test_a_comment_edit_reruns_no_cell_and_a_real_change_reruns_them(smoke_run):
    workdir, _ = smoke_run
    train = workdir / "workflow/amprepro/train/train.py"
    original = train.read_text()
    assert original.startswith('"""')
    try:
        train.write_text(original.replace('"""', '"""Edited docstring. ', 1) + "\n# a comment\n")
        result = snakemake(workdir, "-n", "--cores", "2", "--config", "preset=smoke")
        assert "Nothing to be done" in result.stdout + result.stderr
        train.write_text(original + "\nUNUSED = 1\n")
        result = snakemake(workdir, "-n", "--cores", "2", "--config", "preset=smoke")
        # the memory plan's probes run the cell's code, so the plan is made again too
        assert job_counts(result.stdout) == {"plan": 1, "train": 12, "summary": 1, "report": 1, "verify_compare": 1,
                                             "all": 1}
        assert "Params have changed" in result.stdout
        assert any(f"code of amprepro.{names}: sha256" in result.stdout  # the plan's reason, or the cells'
                   for names in ("plan.memplan, amprepro.plan.probe, amprepro.train.train, amprepro.plan.cellserver",
                                 "train.train, amprepro.plan.launcher"))
    finally:
        train.write_text(original)


def test_apex_and_sanity_run_again_with_the_same_outcome_rerun_no_cell(smoke_run):
    workdir, _ = smoke_run
    cells = sorted((workdir / "results/runs").rglob("*.*"))
    before = {path: path.stat().st_mtime_ns for path in cells}
    result = snakemake(workdir, "--cores", "2", "--config", "preset=smoke", "--forcerun", "apex_build", "sanity")
    # apex_build's record (build.json) changes, so apex runs again: its view for the cells (runs.json) has the same
    # bytes, and so has sanity's (verdicts.json)
    # (`all`, a target that runs no command, may or may not be listed)
    assert [rule for rule in ran_rules(result.stdout + result.stderr) if rule != "all"] == ["apex", "apex_build",
                                                                                            "sanity"]
    assert {path: path.stat().st_mtime_ns for path in cells} == before
    sanity = workdir / "results/sanity/sanity.json"
    original = sanity.read_text()
    try:  # other details, the same verdicts: the report and the comparison read the details again, no cell re-runs
        record = json.loads(original)
        record["checks"][0]["detail"] += " (edited)"
        sanity.write_text(json.dumps(record))
        result = snakemake(workdir, "-n", "--cores", "2", "--config", "preset=smoke")
        assert job_counts(result.stdout) == {"report": 1, "verify_compare": 1, "all": 1}
    finally:
        sanity.write_text(original)


def test_a_run_from_another_python_then_a_normal_run_reports_the_cells_interpreter(smoke_run, tmp_path):
    """The new user's path of issue 22: `snakemake --forcerun environment` from a shell whose `python` is another one
    (no torch) is warned before any job, records that Python and stops at sanity with the fix on the console; the next
    normal run records the cells' interpreter again (the jobs' python is a parameter of `environment`), re-runs no
    cell, and the report shows the cells' torch."""
    import sys
    import venv

    import torch

    workdir, _ = smoke_run
    bare = tmp_path / "bare"
    venv.create(bare, with_pip=False)  # a Python without torch, as the system one is
    env = {**job_env(), "PATH": f"{bare / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    wrong = subprocess.run([*SNAKEMAKE, "--cores", "2", "--config", "preset=smoke", "--forcerun", "environment"],
                           cwd=workdir, env=env, capture_output=True, text=True, timeout=600)
    assert wrong.returncode != 0
    warned = wrong.stderr.find(f"amprepro: WARNING: the jobs run `python`, which on this PATH is {bare}/bin/python")
    assert 0 <= warned < wrong.stderr.index("rule environment:"), wrong.stderr[-3000:]  # before any job
    assert f"not the Python running Snakemake ({sys.prefix})" in wrong.stderr
    assert "the `python` the jobs run has no torch: start the pipeline with `make run`" in wrong.stderr  # sanity's fix
    record = json.loads((workdir / "results/environment/environment.json").read_text())
    assert record["torch"]["importable"] is False and record["isolation"]["prefix"] == str(bare)

    cells = sorted((workdir / "results/runs").rglob("metrics.json"))
    before = {path: path.stat().st_mtime_ns for path in cells}
    right = snakemake(workdir, "--cores", "2", "--config", "preset=smoke")
    ran = ran_rules(right.stdout + right.stderr)
    assert "environment" in ran and "train" not in ran, ran  # summary and report: only if the record's bytes changed
    assert {path: path.stat().st_mtime_ns for path in cells} == before
    cell = json.loads(cells[0].read_text())["software"]
    assert cell["torch"] == torch.__version__ and os.path.realpath(cell["prefix"]) == os.path.realpath(sys.prefix)
    record = json.loads((workdir / "results/environment/environment.json").read_text())
    assert record["torch"]["version"] == cell["torch"] and record["isolation"]["prefix"] == sys.prefix
    summary = json.loads((workdir / "results/summary/summary.json").read_text())
    assert summary["versions"]["torch"] == cell["torch"]
    html = (workdir / "results/report/report.html").read_text()
    assert torch.__version__ in html and str(bare) not in html


def test_report_without_cores_gets_past_the_workflow(workflow_copy):
    """`snakemake --report report.zip` sets no --cores: the workflow must still load (it then needs finished
    results)."""
    result = snakemake(workflow_copy, "--report", "report.zip", check=False)
    output = result.stdout + result.stderr
    assert "total number of cores" not in output and "common.smk" not in output, output[-2000:]
    assert "marked for report but does not exist" in output  # got as far as the report: nothing has run here


def write_stale_apex_records(workdir: Path) -> None:
    """apex records that say "built", naming a build entry and a site dir that are not there (deleted by hand)."""
    for name in ("build.json", "apex.json", "runs.json"):
        path = workdir / "results/apex" / name
        record = json.loads(path.read_text())
        record.update(status="built", entry="results/apex/build/0123abcd", site_dir="results/apex/site/0123abcd")
        path.write_text(json.dumps(record))


# What each kind removes, and the rules the next run must run (at least) to make it again.
DELETIONS = {
    "one cell": (lambda w: shutil.rmtree(w / "results/runs/cnn/fp32"), {"train", "summary", "report"}),
    "the plan": (lambda w: shutil.rmtree(w / "results/plan"), {"plan"}),
    "the sanity record": (lambda w: (w / "results/sanity/sanity.json").unlink(), {"sanity"}),
    "the apex build entry": (write_stale_apex_records, {"apex_build", "apex"}),
}


@pytest.mark.parametrize("kind", sorted(DELETIONS))
def test_a_deleted_output_is_made_again_and_the_report_after_it(smoke_run, tmp_path, kind):
    """Issue 41: Snakemake re-makes a missing file only when a job that needs it runs anyway, so a deleted cell, plan
    or record under a report that was still there stayed deleted ("Nothing to be done") and the report kept the
    numbers of cells that no longer existed. Every output is an input of `rule all` now."""
    workdir = Path(shutil.copytree(smoke_run[0], tmp_path / "amprepro", symlinks=True))
    remove, must_run = DELETIONS[kind]
    before = {path.relative_to(workdir) for path in (workdir / "results").rglob("*") if path.is_file()}
    remove(workdir)
    result = snakemake(workdir, "--cores", "2", "--config", "preset=smoke")
    output = result.stdout + result.stderr
    ran = ran_rules(output)
    assert "Nothing to be done" not in output and must_run <= set(ran), ran
    after = {path.relative_to(workdir) for path in (workdir / "results").rglob("*") if path.is_file()}
    assert before <= after, sorted(map(str, before - after))  # every file is there again
    summary = json.loads((workdir / "results/summary/summary.json").read_text())
    html = (workdir / "results/report/report.html").read_text()
    report_time = (workdir / "results/report/report.html").stat().st_mtime_ns
    for cell in summary["cells"]:  # the report and summary show the cells as they are now on disk
        metrics_path = workdir / f"results/runs/{cell['model']}/{cell['precision']}/seed{cell['seed']}/metrics.json"
        metrics = json.loads(metrics_path.read_text())
        assert cell["status"] == metrics["status"] and cell.get("final_loss") == metrics.get("final_loss"), cell
        assert metrics_path.stat().st_mtime_ns <= report_time
    if kind == "one cell":  # `rm -rf results/runs` takes the same path, for 12 cells (a minute more on 2 cores)
        assert ran.count("train") == 1, ran
    if kind == "the sanity record":
        record = json.loads((workdir / "results/sanity/sanity.json").read_text())
        assert all(check["name"] in html for check in record["checks"])
    if kind == "the apex build entry":
        assert "amprepro: the apex records in" in result.stderr and "results/apex/site/0123abcd" in result.stderr
        for name in ("build.json", "apex.json", "runs.json"):  # made again: on this CPU machine, apex is skipped
            assert json.loads((workdir / "results/apex" / name).read_text())["status"] == "skipped"


def test_a_dry_run_only_says_that_an_apex_record_names_a_build_that_is_gone(smoke_run, tmp_path):
    workdir = Path(shutil.copytree(smoke_run[0], tmp_path / "amprepro", symlinks=True))
    write_stale_apex_records(workdir)
    result = snakemake(workdir, "-n", "--cores", "2", "--config", "preset=smoke")
    assert "A run (not a dry run) removes them" in result.stderr
    assert json.loads((workdir / "results/apex/runs.json").read_text())["status"] == "built"

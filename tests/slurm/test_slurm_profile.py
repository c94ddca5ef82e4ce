"""The smoke preset through a real Slurm: `--workflow-profile profiles/slurm` plus the localhost overrides in
profiles/slurm-localtest gives the same cells and statuses as a local run; a job that fails and a job that hits
its time limit show up as failed rules naming their Slurm log; a rerun completes the rest; and Slurm's own
records (scontrol, the jobcomp log, the slurmctld log) show that every job went through sbatch.

Needs a running Slurm with an idle node that has GPU gres: tools/slurm/start.sh starts one on localhost (CI:
.ci/setup/20-slurm.sh). Without it, every test here is skipped with the reason, except under CI
(CI=true), where each fails with it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workflow_testing import copy_workflow

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
SNAKEMAKE = [sys.executable, "-m", "snakemake"]
# The smoke preset in three of its six precisions (6 cells, not 12; the injected faults below are two of them): what
# is checked here is how jobs go through Slurm, which the other six cells would only repeat, 2-core minutes each.
CELLS_FILE = "slurm-cells.yaml"
CELLS = {"runs": {"precisions": ["fp32", "tf32", "amp_bf16"]}}
CONFIG = ["--config", "preset=smoke"]
SLURM = ["--workflow-profile", "profiles/slurm", "--profile", "profiles/slurm-localtest", *CONFIG]
SLURM_CELLS = [*SLURM, "--configfile", CELLS_FILE]
# A guard against a hang, not a speed target: under `make test` the paper preset's Slurm run (test_slurm_paper.py)
# runs beside these on the same 2 cores, and the smoke runs then took more than 420 s (issue 28).
RUN_TIMEOUT_S = 900
TEST_CLUSTER = "amprepro"  # ClusterName that tools/slurm/start.sh writes

# Fault injection (only in the first Slurm run), through a `python` shim first on PATH: the rules call `python`.
FAILING_CELL = ("cnn", "amp_bf16", 0)  # exits 3 -> Slurm state FAILED
HANGING_CELL = ("transformer", "tf32", 0)  # sleeps; its time limit is cut to 1 min -> Slurm state TIMEOUT
SHIM = """#!/usr/bin/env bash
# tests/slurm fault injection: one train cell fails, one hangs until Slurm's time limit ends it.
# Train jobs only (amprepro.plan.launcher with a --spec): the memory plan runs the launcher too, its --cells listing
# every cell.
case "$*" in
  *amprepro.plan.launcher*--spec*'"model": "{fail_model}"'*'"precision": "{fail_precision}"'*)
    echo "injected failure (tests/slurm)" >&2; exit 3 ;;
  *amprepro.plan.launcher*--spec*'"model": "{hang_model}"'*'"precision": "{hang_precision}"'*)
    echo "injected hang (tests/slurm): cutting the time limit of Slurm job $SLURM_JOB_ID to 1 minute" >&2
    scontrol update JobId="$SLURM_JOB_ID" TimeLimit=1 >&2 || exit 4
    exec sleep 900 ;;
esac
exec "{python}" "$@"
"""


def slurm_config() -> dict[str, str]:
    out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True).stdout
    return dict(re.findall(r"^(\w+)\s+=\s+(.*?)\s*$", out, re.M))


def _slurm_unavailable() -> str | None:
    """Why the Slurm tests cannot run here, or None."""
    hint = "start one with tools/slurm/start.sh (CI does it in .ci/setup/20-slurm.sh)"
    if shutil.which("sbatch") is None:
        return f"no Slurm here: sbatch is not on PATH; {hint}"
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%T|%G"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"Slurm does not answer (sinfo: {exc}); {hint}"
    if out.returncode != 0:
        return f"Slurm does not answer (sinfo: {out.stderr.strip() or out.returncode}); {hint}"
    nodes = [line.split("|") for line in out.stdout.splitlines() if "|" in line]
    usable = [gres for state, gres in nodes if state.rstrip("*~#") in ("idle", "mixed", "allocated", "completing")]
    if not usable:
        return f"Slurm answers but no node is up (sinfo: {out.stdout.strip() or 'no nodes'}); {hint}"
    if not any("gpu" in gres for gres in usable):
        return f"no node with GPU gres (profiles/slurm asks for GPUs); {hint}, which advertises fake ones"
    cluster = slurm_config().get("ClusterName")
    if cluster != TEST_CLUSTER and os.environ.get("AMPREPRO_SLURM_TEST") != "1":
        return (f"the Slurm here is cluster '{cluster}', not the local test cluster '{TEST_CLUSTER}' of "
                "tools/slurm/start.sh: this test submits about 25 GPU jobs; set AMPREPRO_SLURM_TEST=1 to run it there")
    return None


REASON = _slurm_unavailable()
# Under CI (CI=true) a missing Slurm fails these tests instead of skipping them, like tests/report/test_browser.py's
# missing Chromium: CI's .ci/setup/20-slurm.sh starts one, so a skip there would hide a broken setup.
IN_CI = bool(os.environ.get("CI"))
SKIP = pytest.mark.skipif(REASON is not None and not IN_CI, reason=REASON or "")
pytestmark = [pytest.mark.slurm, pytest.mark.e2e, SKIP]


def require_slurm() -> None:
    """First call of each Slurm fixture: outside CI the module is skipped before this when Slurm is missing."""
    if REASON is not None:
        pytest.fail(f"Slurm is missing in CI (CI=true): {REASON}. .ci/setup/20-slurm.sh should have started it.",
                    pytrace=False)


# ----------------------------------------------------------------------------------------------------- helpers
def env_with(*first_on_path: Path) -> dict:
    """The jobs inherit this environment (the plugin submits with --export=ALL): `python` must be the venv's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_"))}
    env.pop("SNAKEMAKE_PROFILE", None)
    env["PATH"] = os.pathsep.join([*map(str, first_on_path), str(VENV_BIN), env.get("PATH", "")])
    return env


class Run:
    """One snakemake invocation, in its own process group so a hang can be killed with everything under it."""

    def __init__(self, workdir: Path, args: list[str], env: dict, name: str, nice: int = 0):
        self.workdir, self.args, self.name = workdir, args, name
        self.log = workdir.parent / f"{name}.log"
        self.t0 = time.monotonic()
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen([*SNAKEMAKE, *args], cwd=workdir, env=env, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True,
                                         preexec_fn=(lambda: os.nice(nice)) if nice else None)
        self.seconds = None
        self._records = None

    def wait(self, timeout: float = RUN_TIMEOUT_S) -> Run:
        try:
            self.proc.wait(timeout=max(1.0, timeout - (time.monotonic() - self.t0)))
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the slurm executor ignores SIGTERM while jobs run
            self.proc.wait()
            cancel_jobs_of(self.workdir)
            pytest.fail(f"{self.name}: snakemake {' '.join(self.args)} still running after {timeout:.0f}s; "
                        f"output tail:\n{self.output[-4000:]}")
        self.seconds = time.monotonic() - self.t0
        self._records = None
        self.records()
        return self

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")

    @property
    def returncode(self) -> int:
        return self.proc.returncode

    def records(self) -> dict[str, dict[str, str]]:
        """Slurm's records of this run's jobs, read once right after the run (they expire after MinJobAge)."""
        if self._records is None:
            self._records = {jobid: scontrol_job(jobid) for jobid in self.submissions()}
        return self._records

    def submissions(self) -> dict[str, Path]:
        """Slurm job id -> Slurm log, as the plugin reports each sbatch it ran."""
        found = re.findall(r"has been submitted with SLURM jobid (\d+) \(log: (\S+?)\)\.?$", self.output, re.M)
        return {jobid: Path(log) for jobid, log in found}

    def run_uuid(self) -> str:
        match = re.search(r"SLURM run ID: (\S+)", self.output)
        assert match, f"{self.name}: no 'SLURM run ID' in the output:\n{self.output[-3000:]}"
        return match.group(1)


def cancel_jobs_of(workdir: Path) -> None:
    out = subprocess.run(["squeue", "-h", "-o", "%i|%Z"], capture_output=True, text=True).stdout
    ids = [i for i, wd in (line.split("|", 1) for line in out.splitlines() if "|" in line) if wd == str(workdir)]
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True)


def scontrol_job(jobid: str) -> dict[str, str]:
    """Slurm's record of one job (kept MinJobAge seconds after it ends), as KEY=value pairs."""
    out = subprocess.run(["scontrol", "-o", "show", "job", jobid], capture_output=True, text=True)
    assert out.returncode == 0, f"scontrol has no record of job {jobid}: {out.stderr.strip()}"
    record = {}
    for token in re.findall(r"(\w[\w/:]*)=(\S*)", out.stdout):
        record.setdefault(token[0], token[1])
    return record


def read_if_readable(path: str | None) -> str | None:
    try:
        return Path(path).read_text(errors="replace") if path else None
    except OSError:
        return None


def cells(workdir: Path) -> dict[tuple, tuple]:
    """(model, precision, seed) -> (status, reason), from the summary the run wrote."""
    summary = json.loads((workdir / "results/summary/summary.json").read_text())
    return {(c["model"], c["precision"], int(c["seed"])): (c["status"], c.get("reason") or "")
            for c in summary["cells"]}


def metrics_path(workdir: Path, cell: tuple) -> Path:
    model, precision, seed = cell
    return workdir / f"results/runs/{model}/{precision}/seed{seed}/metrics.json"


# ----------------------------------------------------------------------------------------------------- the runs
# Made in tests/slurm/conftest.py's slurm_session, beside the paper preset's Slurm run of test_slurm_paper.py.
@pytest.fixture(scope="module")
def runs(slurm_session):
    return slurm_session.result("profile")


def profile_runs(tmp_path_factory) -> dict:
    """Local run (in the background), then Slurm run 1 with the injected faults, then Slurm run 2 (the rerun)."""
    require_slurm()
    if importlib.util.find_spec("snakemake_executor_plugin_slurm") is None:
        pytest.fail("Slurm is running but snakemake-executor-plugin-slurm is not installed in this env: "
                    "pip install -r profiles/slurm/requirements.txt")
    base = tmp_path_factory.mktemp("slurm")
    local_dir = copy_workflow(base / "local")
    slurm_dir = copy_workflow(base / "slurm")
    shim_dir = base / "shim"
    shim_dir.mkdir()
    shim = shim_dir / "python"
    shim.write_text(SHIM.format(fail_model=FAILING_CELL[0], fail_precision=FAILING_CELL[1],
                                hang_model=HANGING_CELL[0], hang_precision=HANGING_CELL[1],
                                python=VENV_BIN / "python"))
    shim.chmod(0o755)

    # The local run only has to give the same cells and statuses: it runs alongside, at the lowest CPU priority,
    # so that it does not slow the Slurm jobs (the plugin's status checks back off while no job finishes).
    for workdir in (local_dir, slurm_dir):
        (workdir / CELLS_FILE).write_text(json.dumps(CELLS))
    started = [local := Run(local_dir, ["--cores", "2", *CONFIG, "--configfile", CELLS_FILE], env_with(), "local",
                            nice=19)]
    try:
        started.append(first := Run(slurm_dir, SLURM_CELLS, env_with(shim_dir), "slurm-1-faults"))
        first.wait()
        after_first = {p.relative_to(slurm_dir) for p in slurm_dir.glob("results/**/*") if p.is_file()}
        started.append(rerun := Run(slurm_dir, SLURM_CELLS, env_with(), "slurm-2-rerun"))
        rerun.wait()
        noop = subprocess.run([*SNAKEMAKE, *SLURM_CELLS, "--dry-run"], cwd=slurm_dir, env=env_with(),
                              capture_output=True, text=True, timeout=120)
        local.wait()
    finally:
        for run in started:
            if run.proc.poll() is None:
                os.killpg(run.proc.pid, signal.SIGKILL)
        cancel_jobs_of(slurm_dir)
    for name, seconds in (("local", local.seconds), ("slurm run 1", first.seconds), ("slurm rerun", rerun.seconds)):
        print(f"{name}: {seconds:.0f}s")
    return {"local": local, "first": first, "rerun": rerun, "noop": noop, "slurm_dir": slurm_dir,
            "local_dir": local_dir, "after_first": after_first}


# ----------------------------------------------------------------------------------------------------- the tests
def test_local_run_completes(runs):
    local = runs["local"]
    assert local.returncode == 0, f"local run failed:\n{local.output[-4000:]}"


def test_failed_and_timed_out_jobs_are_failed_rules_naming_their_slurm_log(runs):
    first, slurm_dir = runs["first"], runs["slurm_dir"]
    out = first.output
    assert first.returncode != 0, "run 1 had two broken cells but exited 0"
    submissions = first.submissions()
    for cell, state in ((FAILING_CELL, "FAILED"), (HANGING_CELL, "TIMEOUT")):
        model, precision, seed = cell
        match = re.search(rf"SLURM-job '(\d+)' failed, SLURM status is: '{state}'", out)
        assert match, f"no failed rule with SLURM status {state} for {cell}:\n{out[-5000:]}"
        jobid = match.group(1)
        log = submissions.get(jobid)
        assert log is not None, f"Slurm job {jobid} ({state}) is not among the submissions {sorted(submissions)}"
        assert log == slurm_dir / ".snakemake/slurm_logs/rule_train" / f"{model}_{precision}_{seed}" / f"{jobid}.log"
        # the failed rule names the Slurm log among its logs, and the log is kept (logs of successful jobs are not)
        assert re.search(rf"Error in rule train:(?:(?!Error in rule).)*?log: [^\n]*{re.escape(str(log))}", out, re.S), \
            f"the error for Slurm job {jobid} does not name {log}"
        assert log.is_file(), f"the Slurm log {log} of the failed job is gone"
        assert first.records()[jobid]["JobState"] == state
    # keep-going (profiles/slurm): after run 1, every cell but the two broken ones has its metrics.json
    after_first = {metrics_path(Path(), cell) for cell in cells(runs["local_dir"])} - runs["after_first"]
    assert after_first == {metrics_path(Path(), FAILING_CELL), metrics_path(Path(), HANGING_CELL)}, \
        f"cells without metrics after run 1: {sorted(map(str, after_first))}"
    assert Path("results/summary/summary.json") not in runs["after_first"], "summary ran despite two missing cells"


def test_rerun_completes_the_rest(runs):
    rerun = runs["rerun"]
    assert rerun.returncode == 0, f"the rerun failed:\n{rerun.output[-5000:]}"
    rules = sorted(record["Comment"] for record in rerun.records().values())
    assert rules == sorted([
        "rule_report", "rule_summary", "rule_verify_compare",
        "rule_train_wildcards_{}_{}_{}".format(*FAILING_CELL),
        "rule_train_wildcards_{}_{}_{}".format(*HANGING_CELL),
    ]), f"the rerun should redo exactly the two broken cells, then summary, report and comparison; it ran {rules}"
    assert (runs["slurm_dir"] / "results/report/report.html").is_file()
    noop = runs["noop"]
    assert noop.returncode == 0 and "Nothing to be done" in noop.stdout + noop.stderr, \
        f"a third run through the profile still has work to do:\n{(noop.stdout + noop.stderr)[-3000:]}"


def test_same_cells_and_statuses_as_local_run(runs):
    assert runs["local"].returncode == 0 and runs["rerun"].returncode == 0
    local, slurm = cells(runs["local_dir"]), cells(runs["slurm_dir"])
    assert len(local) == 6
    assert sorted(slurm) == sorted(local), "the Slurm run has different cells"
    differ = {c: (local[c], slurm[c]) for c in local if local[c] != slurm[c]}
    assert not differ, f"cells whose status or reason differ (local, slurm): {differ}"


def test_every_job_went_through_sbatch(runs):
    """Slurm's own records: scontrol (BatchFlag=1: a batch script, i.e. sbatch), the jobcomp log and the
    slurmctld log hold every job id the plugin reported, with this run's name, directory, rule and Slurm log."""
    slurm_dir = runs["slurm_dir"]
    config = slurm_config()
    jobcomp = read_if_readable(config.get("JobCompLoc")) if config.get("JobCompType") == "jobcomp/filetxt" else None
    ctld_log = read_if_readable(config.get("SlurmctldLogFile"))
    checked = {}
    for run, least in ((runs["first"], 9), (runs["rerun"], 4)):
        submissions, uuid = run.submissions(), run.run_uuid()
        # every job Snakemake started (`rule X:` ... `jobid: N`; local ones print `localrule X:`, and the remote
        # Snakemake in a failed job's log, shown too, numbers its one job 0) was an sbatch submission;
        # run 1: at least environment, apex, sanity and the 6 cells; the rerun: 2 cells, summary, report
        started = set(re.findall(r"^(?:rule|checkpoint) \w+:\n(?:    .*\n)*?    jobid: ([1-9]\d*)$", run.output, re.M))
        assert len(submissions) == len(started) >= least, \
            f"{run.name}: {len(started)} jobs, {len(submissions)} sbatch submissions: {sorted(submissions)}"
        for jobid, log in submissions.items():
            record = run.records()[jobid]
            assert record["BatchFlag"] == "1", f"job {jobid} is not a batch job: {record}"
            assert record["JobName"] == uuid, f"job {jobid} belongs to another run: {record['JobName']} != {uuid}"
            assert record["WorkDir"] == str(slurm_dir)
            assert record["StdOut"] == str(log)
            assert record["Comment"].startswith("rule_")
            if jobcomp is not None:
                assert re.search(rf"^JobId={jobid} .*Name={uuid} .*WorkDir={re.escape(str(slurm_dir))} ",
                                 jobcomp, re.M), f"job {jobid} is not in the jobcomp log {config['JobCompLoc']}"
            if ctld_log is not None:
                assert f"_slurm_rpc_submit_batch_job: JobId={jobid} " in ctld_log, \
                    f"slurmctld never logged the sbatch of job {jobid}"
            checked[jobid] = record
    states = {}
    for record in checked.values():
        states[record["JobState"]] = states.get(record["JobState"], 0) + 1
    print(f"{len(checked)} jobs in Slurm's records: {states}; jobcomp log: {jobcomp is not None}; "
          f"slurmctld log: {ctld_log is not None}")
    assert states.pop("FAILED") == 1 and states.pop("TIMEOUT") == 1 and set(states) == {"COMPLETED"}


def test_cell_resources_reach_slurm(runs):
    """What each job asks for comes from the rules (the profile gives none): the smoke preset on a login node
    without a GPU (gpu: auto) asks for no GPU anywhere, and each train job for its cell's CPUs, memory and time."""
    by_rule = {}
    for run in (runs["first"], runs["rerun"]):
        for record in run.records().values():
            rule = record["Comment"].removeprefix("rule_").split("_wildcards_")[0]
            by_rule.setdefault(rule, []).append(record)
    for rule, records in by_rule.items():
        for record in records:
            assert "gpu" not in record.get("TresPerJob", "") + record.get("TRES", ""), f"{rule} asked for a GPU"
    for train in by_rule["train"]:
        # smoke: 40 steps of 64 digits -> 10 min start-up + under a minute of steps (amprepro.plan.resources)
        assert train["TimeLimit"] in ("00:11:00", "00:01:00"), train  # or cut to 1 min by the shim
        assert (train["NumNodes"], train["NumCPUs"], train["MinMemoryNode"]) == ("1", "1", "4000M"), train


# ----------------------------------------------------------------------------------------------------- two nodes
MULTI_NODE_MODEL = "transformer_2n"
MULTI_NODE = f"""runs:
  models:
    {MULTI_NODE_MODEL}:
      arch: tiny_transformer
      data: digits
      batch_size: 64
      gpus: 2
      nodes: 2
      precisions: [fp32]
      train: {{steps: 30, warmup_steps: 5}}
"""


def slurm_node_names() -> list[str]:
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True).stdout
    return sorted(set(out.split()))


@pytest.fixture(scope="module")
def multi_node_run(slurm_session):
    return slurm_session.result("two_nodes")


def two_node_run(runs: dict) -> Run:
    """After the runs above: a model with nodes: 2, gpus: 2 (CPU here: gloo), as docs/slurm.md says. One Slurm job
    of two nodes; srun starts one torchrun per node; a torchrun shim first on PATH notes where each one ran."""
    if len(slurm_node_names()) < 2:
        (pytest.fail if IN_CI else pytest.skip)(f"the test cluster has one node ({slurm_node_names()}); start it "
                                                "with SLURM_NODES=2 (tools/slurm/start.sh; CI does)")
    slurm_dir = runs["slurm_dir"]
    (slurm_dir / "two-nodes.yaml").write_text(MULTI_NODE)
    shim_dir = slurm_dir.parent / "torchrun-shim"
    shim_dir.mkdir()
    note = slurm_dir.parent / "torchrun-calls.txt"
    (shim_dir / "torchrun").write_text(
        "#!/usr/bin/env bash\n"
        'echo "SLURM_JOB_ID=${SLURM_JOB_ID:-} SLURMD_NODENAME=${SLURMD_NODENAME:-} SLURM_NODEID=${SLURM_NODEID:-}'
        f' ARGS=$*" >> \'{note}\'\n'
        f"exec '{VENV_BIN / 'torchrun'}' \"$@\"\n")
    (shim_dir / "torchrun").chmod(0o755)
    target = f"results/runs/{MULTI_NODE_MODEL}/fp32/seed0/metrics.json"
    run = Run(slurm_dir, [*SLURM, "--configfile", CELLS_FILE, "two-nodes.yaml", "--", target], env_with(shim_dir),
              "slurm-3-two-nodes")
    run.wait()
    run.torchrun_calls = note.read_text().splitlines() if note.exists() else []
    run.metrics = json.loads((slurm_dir / target).read_text()) if (slurm_dir / target).exists() else None
    return run


def test_multi_node_cell_runs_one_torchrun_per_node_of_a_two_node_allocation(multi_node_run):
    run = multi_node_run
    assert run.returncode == 0, run.output[-5000:]
    # the memory plan runs again first (the config gained a model); then only the two-node cell
    submissions = {jobid: log for jobid, log in run.submissions().items() if "/rule_plan/" not in str(log)}
    assert len(submissions) == 1, f"expected only the plan and the two-node cell to run: {sorted(run.submissions())}"
    jobid = next(iter(submissions))
    record = run.records()[jobid]
    assert record["Comment"] == f"rule_train_wildcards_{MULTI_NODE_MODEL}_fp32_0"
    nodes = subprocess.run(["scontrol", "show", "hostnames", record["NodeList"]], capture_output=True,
                           text=True).stdout.split()
    assert record["NumNodes"] == "2" and len(set(nodes)) == 2, f"Slurm's record: {record}"
    # inside the job: srun started one torchrun on each node of the allocation, node ranks 0 and 1
    calls = [dict(re.findall(r"(\w+)=(\S*)", call.split(" ARGS=")[0])) | {"args": call.split(" ARGS=")[1]}
             for call in run.torchrun_calls]
    assert len(calls) == 2, f"torchrun calls: {run.torchrun_calls}"
    assert {c["SLURM_JOB_ID"] for c in calls} == {jobid}
    assert sorted(c["SLURMD_NODENAME"] for c in calls) == sorted(nodes)
    assert sorted(c["SLURM_NODEID"] for c in calls) == ["0", "1"]
    assert all("--nnodes 2" in c["args"] and "--nproc_per_node 2" in c["args"] for c in calls), calls
    # and the cell says so: 4 ranks over the 2 nodes (CPU here, so no GPU was used)
    metrics = run.metrics
    assert (metrics["status"], metrics["world_size"], metrics["nodes"]) == ("ok", 4, 2), metrics.get("reason")
    assert sorted(set(metrics["rank_nodes"])) == sorted(nodes) and metrics["gpus_used"] == 0, metrics

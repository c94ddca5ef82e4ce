"""The scripts a GPU session runs (tools/gpu) work end to end here, on the smoke preset: device time is scarce."""

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from workflow_testing import REPO, copy_workflow


@pytest.mark.e2e
def test_paper_run_script_runs_the_pipeline_and_packs_the_results(tmp_path):
    workdir = copy_workflow(tmp_path / "wf")
    shutil.copytree(REPO / "tools", workdir / "tools")
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PRESET": "smoke",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    # What a device call killed at its time limit leaves: its Snakemake still running here, and its lock.
    leftover = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "-m", "snakemake",
                                 "results/summary/summary.json"], cwd=workdir)
    elsewhere = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "-m", "snakemake",
                                  "results/summary/summary.json"], cwd=tmp_path)
    (workdir / ".snakemake" / "locks").mkdir(parents=True)
    (workdir / ".snakemake" / "locks" / "0.output.lock").write_text(str(workdir / "results/summary/summary.json"))
    try:
        # the smoke preset's fp32 cells only (what this checks is the script around Snakemake, not the 12 cells)
        (workdir / "fp32-only.yaml").write_text("runs: {precisions: [fp32]}\n")
        result = subprocess.run(["bash", "tools/gpu/paper_run.sh", "600", "fp32-only.yaml"], cwd=workdir, env=env,
                                capture_output=True, text=True, timeout=700)
        assert leftover.wait(timeout=5) is not None
        assert elsewhere.poll() is None, "a Snakemake in another directory must be left alone"
    finally:
        for process in (leftover, elsewhere):
            process.kill()
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"left running here: {leftover.pid}" in result.stdout
    assert "snakemake rc=0" in result.stdout, (out / "snakemake.log").read_text()[-3000:]
    with tarfile.open(out / "results.tgz") as packed:
        names = packed.getnames()
    assert "results/summary/summary.json" in names and "results/peak/peak.json" in names
    assert any(name.endswith("cnn/fp32/seed0/metrics.json") for name in names)

    # The next device call: the preset is complete, so session.sh runs the same-call checks and packs them in one file.
    session = subprocess.run(["bash", "tools/gpu/session.sh", "300", "fp32-only.yaml"], cwd=workdir,
                             env={**env, "CHECKS_SECONDS": "0"},
                             capture_output=True, text=True, timeout=400)
    assert "checks done" in session.stdout, session.stdout[-3000:] + session.stderr[-3000:]
    assert not (out / "checks").exists()
    with tarfile.open(out / "checks.tgz") as packed:
        names = packed.getnames()
    assert {"checks/pytest-gpu.log", "checks/apex-noop.log", "checks/apex-rerun.log"} <= set(names)


def test_time_to_verdict_record_from_a_committed_route_log(tmp_path):
    """tools/gpu/time_to_verdict.py on the 443ae11 route's log and apex record (results-reference/perf/443ae11): every
    job kind's seconds as Snakemake stamped them, the apex build's own seconds, the cells' phases, and no timm ratios
    when the lease had none."""
    import gzip
    import json

    perf = REPO / "results-reference/perf/443ae11"
    log = tmp_path / "make-run.log"
    log.write_bytes(gzip.decompress((perf / "make-run-box2.log.gz").read_bytes()))
    (tmp_path / "results/apex").mkdir(parents=True)
    shutil.copy(perf / "apex-build-box2.json", tmp_path / "results/apex/build.json")
    cell = tmp_path / "results/runs/m/fp32/seed0"
    cell.mkdir(parents=True)
    (cell / "metrics.json").write_text(json.dumps({"phase_seconds": {"build": 1.5, "process_start_to_run": None},
                                                   "init_weights": {"source": "cache", "seconds": 0.2}}))
    (cell / "steps.csv").write_text("step,loss,step_time_s\n0,7.0,0.75\n1,6.5,0.25\n2,6.1,\n")
    for name, source, seconds in (("n", "built", 1.5), ("o", "cache", 0.3), ("p", None, None)):
        other = tmp_path / f"results/runs/{name}/fp32/seed0"
        other.mkdir(parents=True)
        (other / "metrics.json").write_text(json.dumps(
            {"init_weights": {"source": source, "seconds": seconds}} if source else {}))
    (tmp_path / "started").write_text("100\n")
    (tmp_path / "verdict").write_text("594\n")
    out = tmp_path / "ttv.json"
    done = subprocess.run([sys.executable, str(REPO / "tools/gpu/time_to_verdict.py"), "--started", "started",
                           "--verdict", "verdict", "--log", str(log), "--results", "results", "--commit", "443ae11",
                           "--out", str(out)], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    record = json.loads(out.read_text())
    assert record["seconds_to_verdict"] == 494.0 and record["apex_build_seconds"] == 80.46
    assert record["job_kinds"]["train"] == {"jobs": 57, "sum_s": 354.0, "max_s": 39.0, "mean_s": 6.21}
    assert record["job_kinds"]["largest_batch"]["jobs"] == 18
    assert record["cell_phases"] == {"build": {"cells": 1, "sum_s": 1.5}}  # a phase /proc could not time is left out
    assert record["init_weights"] == {"built": {"cells": 1, "sum_s": 1.5}, "cache": {"cells": 2, "sum_s": 0.5}}
    assert record["step_seconds"] == {"cells": 1, "sum_s": 1.0}  # warm-up steps count; a step with no time does not
    assert record["timm_ratios"] is None and "no timm comparison" in record["timm_note"]


def test_time_to_verdict_splits_the_route_into_its_critical_path(tmp_path):
    """tools/gpu/time_to_verdict.py on the fresh H100's route at 99d30cf (results-reference/perf/99d30cf-h100, its log
    and results): 18 s before the first cell job (the plan waited for a core), the cells' stretch, the report after
    it, what no Snakemake job covers; and the cells on a GPU of their own, split into their loops and the rest of each
    job, the untimed cells that share the GPU left out (the numbers the issue-40 note gives)."""
    import gzip
    import json
    import tarfile

    perf = REPO / "results-reference/perf/99d30cf-h100"
    (tmp_path / "make-run.log").write_bytes(gzip.decompress((perf / "make-run.log.gz").read_bytes()))
    with tarfile.open(perf / "results.tgz") as packed:
        packed.extractall(tmp_path, filter="data")
    (tmp_path / "started").write_text("100\n")
    (tmp_path / "verdict").write_text("365\n")
    out = tmp_path / "ttv.json"
    done = subprocess.run([sys.executable, str(REPO / "tools/gpu/time_to_verdict.py"), "--started", "started",
                           "--verdict", "verdict", "--log", "make-run.log", "--results", "results",
                           "--commit", "99d30cf", "--out", str(out)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    path = json.loads(out.read_text())["critical_path"]
    committed = json.loads((perf / "time-to-verdict.json").read_text())["critical_path"]
    committed["cells_on_their_own_gpu"].update(waited_for_gpu_s=0.0, staged_build_s=0.0)  # no cell was staged then
    assert path == committed
    assert (path["before_cells_s"], path["cells_s"], path["after_cells_s"], path["outside_snakemake_jobs_s"]) == (
        18.0, 228.0, 10.0, 9.0)
    assert sum(value for key, value in path.items() if key.endswith("_s")) == 265.0
    assert path["serial_gpu_jobs"] == {"train": 45, "largest_batch": 3, "apex": 1}  # 57 cells, 12 on the shared GPU
    assert path["cells_on_their_own_gpu"] == {"jobs": 41, "job_s": 179.0, "loop_s": 126.6, "waited_for_gpu_s": 0.0,
                                              "staged_build_s": 0.0, "outside_loop_s": 52.4}
    # A staged cell (gpuslots --defer): its job also built its model and waited for the GPU while the cell before
    # trained; neither is its start-up after the lock
    staged = tmp_path / "results/runs/vit_b_16/amp_bf16/seed0/metrics.json"
    metrics = json.loads(staged.read_text())
    metrics["phase_seconds"].update(staged_build=0.7, gpu_wait=2.5)
    staged.write_text(json.dumps(metrics))
    done = subprocess.run([sys.executable, str(REPO / "tools/gpu/time_to_verdict.py"), "--started", "started",
                           "--verdict", "verdict", "--log", "make-run.log", "--results", "results",
                           "--commit", "99d30cf", "--out", str(out)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text())["critical_path"]["cells_on_their_own_gpu"] == {
        "jobs": 41, "job_s": 179.0, "loop_s": 126.6, "waited_for_gpu_s": 2.5, "staged_build_s": 0.7,
        "outside_loop_s": 49.2}
    # A route cut before its first cell job: the record is still written, with nothing to split.
    log = (tmp_path / "make-run.log").read_text()
    (tmp_path / "make-run.log").write_text(log[:log.index("localrule apex_build:")])
    done = subprocess.run([sys.executable, str(REPO / "tools/gpu/time_to_verdict.py"), "--started", "started",
                           "--verdict", "verdict", "--log", "make-run.log", "--results", "results",
                           "--commit", "99d30cf", "--out", str(out)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    record = json.loads(out.read_text())
    assert record["critical_path"] == {} and record["job_kinds"]["environment"]["jobs"] == 1


def test_steps_budget_slices_each_cells_own_step_times(tmp_path):
    """tools/gpu/steps_budget.py: a window's median from the cell's steps.csv, its distance from the median the cell
    reported, the seconds the dropped steps took; a model whose throughput the tolerances do not compare counts in no
    window, and a cell that is not ok is left out."""
    import json

    def cell(model, times, status="ok", median=None):
        folder = tmp_path / "runs" / model / "fp32/seed0"
        folder.mkdir(parents=True)
        (folder / "steps.csv").write_text("step,step_time_s\n" + "".join(f"{i},{t}\n" for i, t in enumerate(times)))
        (folder / "metrics.json").write_text(json.dumps({"status": status, "warmup_steps": 10,
                                                         "step_time_median_s": median}))

    # 30 steps: a slow first step, then 1.0 s steps, the last ten 1.2 s (the reported median of steps 10-29: 1.1)
    cell("big", [5.0] + [1.0] * 19 + [1.2] * 10, median=1.1)
    cell("digits", [0.01] * 30, median=0.01)
    cell("broken", [1.0] * 30, status="collapsed", median=1.0)
    (tmp_path / "tolerances.yaml").write_text("overrides:\n  - match: {model: [digits]}\n    metrics:\n"
                                       "      throughput_per_s: null\n")
    out = tmp_path / "budget.json"
    done = subprocess.run([sys.executable, str(REPO / "tools/gpu/steps_budget.py"), str(tmp_path / "runs"),
                           "--band", "0.05", "--tolerances", str(tmp_path / "tolerances.yaml"), "--out", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    record = json.loads(out.read_text())
    assert record["throughput_not_compared"] == ["digits/fp32/seed0"] and record["spent_s"] == 36.0
    windows = record["cells"]["big/fp32/seed0"]["windows"]
    assert windows["3+10"] == {"median_s": 1.0, "rel": -0.0909, "holds": False, "saves_s": 19.0}
    assert windows["5+20"] == {"median_s": 1.0, "rel": -0.0909, "holds": False, "saves_s": 6.0}
    assert "10+20" not in windows  # the cell's own window
    assert record["windows"]["3+10"] == {"cells": 1, "hold": 0, "worst_rel": -0.0909, "saves_s": 19.0}
    assert "3+10: 0 of 1 cells within 5%, worst -9.1%, saves 19.0 s of 36.0 s" in done.stdout
    # steps 9, 10 and 11 over the median of steps 12-29 (1.2): the warm-up's last step, the first two timed ones
    assert record["cells"]["big/fp32/seed0"]["around_warmup"] == {"last_warmup": 0.8333, "first_timed": 0.8333,
                                                                  "second_timed": 0.8333}
    assert record["around_warmup"]["first_timed"] == {"cells": 1, "median": 0.8333, "slow": 0}
    assert "first timed step: 0 of 1 cells more than 5% slower than steady (median 0.833x)" in done.stdout
    (tmp_path / "tol.yaml").write_text("metrics: {throughput_per_s: {rel_floor: 0.08}}\n")  # read as verify would
    refused = subprocess.run([sys.executable, str(REPO / "tools/gpu/steps_budget.py"), str(tmp_path / "runs"),
                              "--tolerances", str(tmp_path / "tol.yaml"), "--out", str(out)],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "reference folder's tolerances.yaml" in refused.stderr


def test_steps_budget_over_a_reference_reads_each_runs_steps_and_its_warmup(tmp_path):
    """--reference: every committed run's steps.csv from its steps.tar.gz, the warm-up from its provenance, the
    median recomputed from the steps; a cell that shared its GPU (summary.csv) or whose speed is not compared is
    listed apart."""
    run = tmp_path / "ref/runs/2026-01-01-aaaaaaaa"
    run.mkdir(parents=True)
    cells = {"big/fp32/0": [5.0] * 8 + [1.0] * 12 + [1.2] * 10, "small/fp32/0": [0.1] * 30,
             "digits/fp32/0": [0.01] * 30}
    (run / "provenance.json").write_text(json.dumps({"specs": {
        key: {"train": {"warmup_steps": 8 if key.startswith("big") else 10}} for key in cells}}))
    (run / "summary.csv").write_text("model,precision,seed,gpu_shared_cells_per_gpu\nbig,fp32,0,\n"
                                     "small,fp32,0,8\ndigits,fp32,0,\n")
    with tarfile.open(run / "steps.tar.gz", "w:gz") as archive:
        for key, times in cells.items():
            model, precision, seed = key.split("/")
            data = ("step,step_time_s\n" + "".join(f"{i},{t}\n" for i, t in enumerate(times))).encode()
            member = tarfile.TarInfo(f"runs/{model}/{precision}/seed{seed}/steps.csv")
            member.size = len(data)
            archive.addfile(member, io.BytesIO(data))
    (tmp_path / "tolerances.yaml").write_text("overrides:\n  - match: {model: [digits]}\n    metrics:\n"
                                       "      throughput_per_s: null\n")
    out = tmp_path / "budget.json"
    done = subprocess.run([sys.executable, str(REPO / "tools/gpu/steps_budget.py"), str(tmp_path / "ref"),
                           "--reference", "--band", "0.08", "--tolerances", str(tmp_path / "tolerances.yaml"),
                           "--out", str(out)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    record = json.loads(out.read_text())
    assert sorted(record["throughput_not_compared"]) == ["2026-01-01-aaaaaaaa/digits/fp32/0",
                                                         "2026-01-01-aaaaaaaa/small/fp32/0"]
    big = record["cells"]["2026-01-01-aaaaaaaa/big/fp32/0"]
    assert (big["warmup"], big["median_s"], big["spent_s"]) == (8, 1.0, 64.0)  # median of steps 8-29
    assert big["windows"]["3+10"] == {"median_s": 3.0, "rel": 2.0, "holds": False, "saves_s": 19.0}
    assert big["windows"]["10+10"] == {"median_s": 1.0, "rel": 0.0, "holds": True, "saves_s": 12.0}
    # steps 7 (warm-up, 5.0 s), 8 and 9 over the median of steps 10-29 (1.1): only the warm-up's last step is slow
    assert big["around_warmup"] == {"last_warmup": 4.5455, "first_timed": 0.9091, "second_timed": 0.9091}
    assert record["around_warmup"]["last_warmup"] == {"cells": 1, "median": 4.5455, "slow": 1}


def test_chain_runs_the_stages_asked_for_in_their_own_session_and_packs_them(tmp_path):
    """tools/gpu/chain.sh on stand-in stage scripts: `start` copies the tree (without results/), runs the stages named
    in STAGES in order in a process session of their own and brings back one tarball per finished stage; a second
    `start` does not start them again; a bad stage name or a box without a chain is refused with the reason."""
    tree = tmp_path / "repo"
    (tree / "tools/gpu").mkdir(parents=True)
    shutil.copy(REPO / "tools/gpu/chain.sh", tree / "tools/gpu/chain.sh")
    (tree / "results").mkdir()
    (tree / "results/keep-out.txt").write_text("not copied")
    stand_in = ('mkdir -p "$OUT" && echo "$0 ${RUN_PRESET:-paper} ${RUN_CAP:-none} $*" > "$OUT/ran.txt" && '
                'ls results > "$OUT/results-seen.txt" 2>&1; mkdir -p results && touch "results/by-$(basename $0)"\n')
    for script in ("time_to_verdict.sh", "full_run.sh", "make_run.sh"):
        (tree / "tools/gpu" / script).write_text(stand_in)
    chain_dir = tmp_path / "chain"
    env = {**os.environ, "OUT": str(tmp_path / "out1"), "AMPREPRO_CHAIN_DIR": str(chain_dir), "COMMIT": "abc1234"}

    def chain(*args, **extra):
        return subprocess.run(["bash", "tools/gpu/chain.sh", *args], cwd=tree, env={**env, **extra},
                              capture_output=True, text=True, timeout=120)

    refused = chain("start", "30", STAGES="ttv report")
    assert refused.returncode == 1 and "STAGES: report is not one of ttv, full, full12, ref, ab" in refused.stdout
    no_old_loop = chain("start", "30", STAGES="ttv ab")  # found before the ttv stage, not after it
    assert no_old_loop.returncode == 1 and "ab needs ab-old/loop.py" in no_old_loop.stdout
    assert chain("wait", "30").stdout.strip() == "no chain on this box: the box is fresh, start it again"
    done = chain("start", "60", STAGES="ttv full12 ref")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "stage done" in done.stdout
    assert [line.split()[1] for line in (chain_dir / "stages.log").read_text().splitlines()] == [
        "ttv", "full12", "ref", "done"]
    with tarfile.open(tmp_path / "out1/full12.tgz") as packed:
        ran = packed.extractfile("full12/ran.txt").read().decode()
        seen = packed.extractfile("full12/results-seen.txt").read().decode()
    assert ran.split()[1:] == ["full", "12", "1700", "verify"]
    assert "keep-out.txt" not in seen and "by-time_to_verdict.sh" in seen  # the tree without results/, then ttv's
    with tarfile.open(tmp_path / "out1/ref.tgz") as packed:  # another route in its own copy, without those results
        ran = packed.extractfile("ref/ran.txt").read().decode()
        seen = packed.extractfile("ref/results-seen.txt").read().decode()
    assert ran.split()[0].endswith("tools/gpu/make_run.sh") and ran.split()[1:] == ["paper", "none", "1150", "verify"]
    assert "No such file" in seen
    assert not (tmp_path / "out1/full.tgz").exists()
    again = chain("start", "30", OUT=str(tmp_path / "out2"), STAGES="full")
    assert "chain started at" not in again.stdout and (tmp_path / "out2/ttv.tgz").exists()


def test_time_to_verdict_names_what_our_cell_runs_that_timm_does_not(tmp_path):
    """The timm ratios of the committed 3015d60 lease (results-reference/perf/3015d60/timm_compare.json), each with
    what our recipe adds: nothing for bf16, a GradScaler for fp16, which waits on the host only without the fused
    optimizer."""
    import json

    perf = REPO / "results-reference/perf/3015d60"
    log = tmp_path / "make-run.log"
    log.write_bytes(gzip_decompress(perf / "make-run.log.gz"))
    (tmp_path / "started").write_text("100\n")
    (tmp_path / "verdict").write_text("501\n")
    out = tmp_path / "ttv.json"
    done = subprocess.run([sys.executable, str(REPO / "tools/gpu/time_to_verdict.py"), "--started", "started",
                           "--verdict", "verdict", "--log", str(log), "--results", "results", "--commit", "3015d60",
                           "--timm", str(perf / "timm_compare.json"), "--out", str(out)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    rows = {(r["model"], r["precision"]): r for r in json.loads(out.read_text())["timm_ratios"]}
    assert {key: row["ratio"] for key, row in rows.items()} == {
        ("vit_timm", "amp_bf16"): 1.0311, ("vit_timm", "amp_fp16"): 0.9366,
        ("vit_timm_fused_adamw", "amp_bf16"): 1.0571, ("vit_timm_fused_adamw", "amp_fp16"): 1.0164}
    assert rows["vit_timm", "amp_bf16"]["recipe_differs"] is None
    assert "reads the inf flag on the host" in rows["vit_timm", "amp_fp16"]["recipe_differs"]
    assert "no host wait" in rows["vit_timm_fused_adamw", "amp_fp16"]["recipe_differs"]
    assert json.loads(out.read_text())["timm_note"] is None
    assert all(row["cell_ratio"] == row["ratio"] and row["compared_as"] == row["precision"] for row in rows.values())
    # Where timm_compare.py also timed our harness on timm's recipe (fp16, no scaler), that is the ratio; the cell's
    # own is cell_ratio.
    both = json.loads((perf / "timm_compare.json").read_text())
    both[1]["same_recipe"] = {"precision": "amp_fp16_unscaled", "amprepro_samples_per_s": 2600.0, "ratio": 1.0123}
    (tmp_path / "both.json").write_text(json.dumps(both))
    done = subprocess.run([sys.executable, str(REPO / "tools/gpu/time_to_verdict.py"), "--started", "started",
                           "--verdict", "verdict", "--log", str(log), "--results", "results", "--commit", "3015d60",
                           "--timm", str(tmp_path / "both.json"), "--out", str(out)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    fp16 = json.loads(out.read_text())["timm_ratios"][1]
    assert (fp16["precision"], fp16["ratio"], fp16["compared_as"], fp16["amprepro_samples_per_s"]) == (
        "amp_fp16", 1.0123, "amp_fp16_unscaled", 2600.0)
    assert (fp16["cell_ratio"], fp16["cell_samples_per_s"]) == (0.9366, round(both[1]["amprepro_samples_per_s"], 2))
    # A same-recipe run that failed: no harness ratio for the cell, and why; the cell's own stays.
    both[1]["same_recipe"] = {"precision": "amp_fp16_unscaled", "error": "amprepro cell failed (1): CUDA error"}
    (tmp_path / "both.json").write_text(json.dumps(both))
    done = subprocess.run([sys.executable, str(REPO / "tools/gpu/time_to_verdict.py"), "--started", "started",
                           "--verdict", "verdict", "--log", str(log), "--results", "results", "--commit", "3015d60",
                           "--timm", str(tmp_path / "both.json"), "--out", str(out)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    fp16 = json.loads(out.read_text())["timm_ratios"][1]
    assert done.returncode == 0 and fp16["ratio"] is None and fp16["amprepro_samples_per_s"] is None
    assert fp16["error"].endswith("CUDA error") and fp16["cell_ratio"] == 0.9366
    # Part of a comparison (the call's budget ended first: time_to_verdict.sh passes the partial file) keeps its note.
    partial = tmp_path / "timm_compare.partial.json"
    partial.write_text(json.dumps(json.loads((perf / "timm_compare.json").read_text())[:3]))
    done = subprocess.run([sys.executable, str(REPO / "tools/gpu/time_to_verdict.py"), "--started", "started",
                           "--verdict", "verdict", "--log", str(log), "--results", "results", "--commit", "3015d60",
                           "--timm", str(partial), "--timm-note", "did not finish", "--out", str(out)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    record = json.loads(out.read_text())
    assert done.returncode == 0 and len(record["timm_ratios"]) == 3 and record["timm_note"] == "did not finish"


def gzip_decompress(path):
    import gzip

    return gzip.decompress(path.read_bytes())


@pytest.mark.parametrize("gate, verdict", [("FAIL", True), ("PASS", True), (None, False)])
def test_a_failed_gate_is_a_verdict_timed_and_recorded(tmp_path, gate, verdict):
    """tools/gpu/time_to_verdict.sh on a stand-in route: a gate that FAILs is a verdict like a PASS (it is timed and
    time-to-verdict.json says FAIL); a route with no gate line (cut short, broken) is not one, and says call again.
    (On a fresh H200 at 4e89e88 the FAIL was taken for no verdict and the timm comparison never ran.)"""
    tree = tmp_path / "repo"
    shutil.copytree(REPO / "tools", tree / "tools")
    gate_line = f"verify: {gate}: 1 of 55 cells out of tolerance" if gate else "make: *** [Makefile:90: run] Error 1"
    (tree / "tools/gpu/make_run.sh").write_text(
        'mkdir -p "$OUT" results/verify && echo "stand-in" > "$OUT/make-run.log"\n'
        'date +%s > "$AMPREPRO_GPU_STATE/amprepro-started-$(echo "$PWD" | md5sum | cut -c1-8)"\n'
        f'echo "{gate_line}" > "$OUT/make-verify.log"\n'
        f"""echo '{{"gate": {{"result": {json.dumps(gate)}}}, "message": "stand-in"}}' > results/verify/verify.json\n"""
        'echo "make verify rc=2; verdict 5 s after the first call\'s start"\n')
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin/python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')  # a link would lose the venv
    (venv / "bin/python").chmod(0o755)
    state = tmp_path / "state"
    state.mkdir()
    env = {**os.environ, "OUT": str(tmp_path / "out"), "COMMIT": "abc1234", "AMPREPRO_VENV": str(venv),
           "AMPREPRO_GPU_STATE": str(state), "PYTHONPATH": str(REPO / "workflow")}
    done = subprocess.run(["bash", "tools/gpu/time_to_verdict.sh", "60"], cwd=tree, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert bool(list(state.glob("amprepro-verdict-epoch-*"))) is verdict
    if verdict:
        record = json.loads((tmp_path / "out/time-to-verdict.json").read_text())
        assert record["gate"] == gate and record["commit"] == "abc1234"
        # another tree measured later on the same box runs its own route, not the first tree's verdict
        shutil.copytree(tree, tmp_path / "repo2")
        again = subprocess.run(["bash", "tools/gpu/time_to_verdict.sh", "60"], cwd=tmp_path / "repo2",
                               env={**env, "OUT": str(tmp_path / "out2")}, capture_output=True, text=True, timeout=120)
        assert again.returncode == 0 and "make verify rc=2" in (tmp_path / "out2/route.out").read_text()
        assert len(list(state.glob("amprepro-verdict-epoch-*"))) == 2
    else:
        assert "no verdict yet: call again" in done.stdout and not (tmp_path / "out/time-to-verdict.json").exists()


def test_timm_compare_times_a_scaled_cell_again_on_timms_recipe_without_the_scaler():
    """tools/gpu/timm_compare.py: timm's benchmark runs no GradScaler, so an fp16 cell's harness comparison is run on
    the same spec with the scaler dropped (and its init-scale setting, which config refuses without a scaler)."""
    import importlib.util

    loaded = importlib.util.spec_from_file_location("timm_compare", REPO / "tools/gpu/timm_compare.py")
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    spec = {"model": "vit_timm", "precision": "amp_fp16", "seed": 0, "model_config": {"arch": "vit_base_patch16_224"},
            "train": {"optimizer": "adamw", "steps": 30, "grad_scaler_init_scale": 16384}}
    same = module.timm_recipe(spec)
    assert same == {**spec, "precision": "amp_fp16_unscaled", "train": {"optimizer": "adamw", "steps": 30}}
    assert spec["precision"] == "amp_fp16" and "grad_scaler_init_scale" in spec["train"]  # the cell's own untouched
    for unchanged in ("amp_bf16", "fp32", "apex_o1"):
        assert module.timm_recipe({**spec, "precision": unchanged}) is None


def test_timm_compare_keeps_a_cells_ratio_when_its_same_recipe_run_fails(tmp_path, monkeypatch):
    """Review of 00b1526: the fp16 cell's own comparison is written before its run on timm's recipe, and a failed
    same-recipe run is recorded with its error instead of ending the comparison of the cells after it."""
    import importlib.util
    import json

    loaded = importlib.util.spec_from_file_location("timm_compare", REPO / "tools/gpu/timm_compare.py")
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    cells = []
    for model, precision in (("vit_timm", "amp_fp16"), ("vit_timm", "amp_bf16")):
        cell = tmp_path / "runs" / model / precision / "seed0"
        cell.mkdir(parents=True)
        spec = {"model": model, "precision": precision, "seed": 0, "model_config": {"arch": "vit_base_patch16_224"},
                "train": {"optimizer": "adamw"}}
        (cell / "metrics.json").write_text(json.dumps({"spec": spec}))
        cells += ["--cell", str(cell)]

    def ours(spec, apex, out):
        if spec["precision"] == "amp_fp16_unscaled":
            raise SystemExit("amprepro cell failed (1):\nCUDA error")
        return 90.0, {"spec": spec}

    monkeypatch.setattr(module, "timm_throughput", lambda benchmark, spec, iters, warmup: (100.0, {}))
    monkeypatch.setattr(module, "our_throughput", ours)
    monkeypatch.setattr(sys, "argv", ["timm_compare.py", "--benchmark", "b.py", *cells, "--apex", "a.json",
                                      "--out", str(tmp_path / "out")])
    module.main()
    rows = json.loads((tmp_path / "out/timm_compare.json").read_text())
    assert [(r["precision"], r["ratio"]) for r in rows] == [("amp_fp16", 0.9), ("amp_bf16", 0.9)]
    failed = {"precision": "amp_fp16_unscaled", "error": "amprepro cell failed (1):\nCUDA error"}
    assert rows[0]["same_recipe"] == failed
    assert "same_recipe" not in rows[1] and not (tmp_path / "out/timm_compare.partial.json").exists()


def test_loop_ab_runs_each_cell_with_both_loops_and_records_a_skipped_one(tmp_path):
    """tools/gpu/loop_ab.py on this CPU: a cell run with an older loop (here this tree's own files, copied) and with
    this tree's, and a cell this machine skips (fp16 AMP needs CUDA) recorded with its reason instead of ending the
    stage."""
    import json

    old = tmp_path / "ab-old"
    old.mkdir()
    for name in ("loop.py", "measure.py"):
        shutil.copy(REPO / "workflow/amprepro/train" / name, old / name)
    cells = []
    for precision in ("fp32", "amp_fp16"):
        cell = tmp_path / "runs/m" / precision / "seed0"
        cell.mkdir(parents=True)
        spec = {"model": "m", "precision": precision, "seed": 0,
                "model_config": {"arch": "small_cnn", "data": "digits", "batch_size": 32},
                "train": {"steps": 5, "warmup_steps": 2, "lr": 0.002, "optimizer": "adamw"}}
        (cell / "metrics.json").write_text(json.dumps({"spec": spec}))
        cells += ["--cell", str(cell)]
    (tmp_path / "apex.json").write_text(json.dumps({"status": "skipped", "reason": "none"}))
    done = subprocess.run([sys.executable, str(REPO / "tools/gpu/loop_ab.py"), "--old", str(old), *cells,
                           "--apex", str(tmp_path / "apex.json"), "--rounds", "1", "--out", str(tmp_path / "ab")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = json.loads((tmp_path / "ab/loop_ab.json").read_text())
    assert [(r["precision"], r["loop"]) for r in rows] == [("fp32", "old"), ("fp32", "new"), ("amp_fp16", "old"),
                                                           ("amp_fp16", "new")]
    assert all(len(r["step_time_s"]) == 5 and r["first_timed_over_steady"] > 0 for r in rows[:2])
    assert rows[2]["error"].startswith("skipped: fp16 AMP with GradScaler is the CUDA recipe")
    assert not (tmp_path / "ab/old-tree").exists()

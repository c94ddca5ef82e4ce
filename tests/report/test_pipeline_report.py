"""End to end on CPU: `make run`'s pipeline gives a report whose summary judges every claim; verify warns and exits 0;
`snakemake --report report.zip` packages the registered outputs."""

from __future__ import annotations

import json
import re
import zipfile

import pytest
import yaml
from report_helpers import CLAIMS, copy_workflow

from workflow_testing import snakemake as run_snakemake

pytestmark = pytest.mark.e2e


def snakemake(workdir, *args, timeout=900):
    return run_snakemake(workdir, *args, check=False, timeout=timeout)


@pytest.fixture(scope="module")
def smoke_run(smoke_preset_run):
    """The copy of the session's smoke preset run taken when it finished (tests/conftest.py)."""
    return smoke_preset_run[2]


def test_report_summary_judges_every_claim(smoke_run):
    html = (smoke_run / "results/report/report.html").read_text()
    top = html[html.index('<section class="glance">'):html.index("</section>")]
    for claim in yaml.safe_load(CLAIMS.read_text())["claims"]:
        if "evidence" in claim:  # judged from a committed file, listed apart (tests/report/test_pythonclaim.py)
            continue
        row = top[top.index(f"<b>{claim['id']}</b>"):]
        row = row[:row.index("</tr>")]
        assert re.search(r"cells \(|Tensor Core|benchmark models", row), row  # what the claim needs
    # a CPU run: one banner and one line for all claims, not the same verdict and reason on every row (issue 22)
    assert top.count("A CPU run.") == 1 and "What needs a CUDA GPU" in top
    assert "none measurable on this run (smoke preset on CPU)" in top and top.count("models here") == 0
    assert "NO REFERENCE" in top and "CPU only" in top
    assert "Ran in the project's venv" not in top or "NOT ISOLATED" not in top


def test_verify_target_warns_and_exits_zero_without_a_reference(smoke_run):
    result = snakemake(smoke_run, "--cores", "1", "verify", "--config", "preset=smoke")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "verify: WARNING: this run has no GPU" in output
    verdict = json.loads((smoke_run / "results/verify/verify.json").read_text())
    assert verdict["status"] == "no_reference" and len(verdict["claims"]) == len(
        yaml.safe_load(CLAIMS.read_text())["claims"])


def test_snakemake_report_zip(smoke_run):
    result = snakemake(smoke_run, "--cores", "1", "--report", "report.zip", "--config", "preset=smoke")
    assert result.returncode == 0, result.stderr[-4000:]
    with zipfile.ZipFile(smoke_run / "report.zip") as archive:
        names = archive.namelist()
        assert "report/report.html" in names
        assert any(name.endswith("/report.html") and "/data/raw/" in name for name in names)


def test_a_bad_claim_stops_the_run_naming_the_field(tmp_path):
    workdir = copy_workflow(tmp_path / "amprepro")
    data = yaml.safe_load((workdir / "config/claims.yaml").read_text())
    data["claims"][1]["tolerance"] = "ten percent"
    (workdir / "config/claims.yaml").write_text(yaml.safe_dump(data, allow_unicode=True))
    result = snakemake(workdir, "-n", "--cores", "1")
    assert result.returncode != 0
    assert "claim field claims[1] (id 'vit-apex-o1-speed').tolerance: 'ten percent' is not of type 'number'" in (
        result.stdout + result.stderr)


def test_offline_judge_makes_the_pipelines_own_summary_and_verdicts_from_the_cell_records(smoke_run, tmp_path):
    """tools/gpu/offline_judge.py (a GPU run's summary made elsewhere from its cell records) runs the rules' commands:
    on the smoke run's records it gives the pipeline's own summary.csv, every claim judged, and a report."""
    import shutil
    import subprocess
    import sys

    from report_helpers import REPO

    parent = tmp_path / "run"
    shutil.copytree(smoke_run / "results", parent / "results", symlinks=True)
    for made in ("summary", "verify", "report"):
        shutil.rmtree(parent / "results" / made, ignore_errors=True)
    done = subprocess.run([sys.executable, str(REPO / "tools/gpu/offline_judge.py"), str(parent), "--gpus", "0",
                           "--preset", "smoke"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "offline_judge: 12 cell records of 12; missing 0; set aside 0 (none)" in done.stdout
    ours = (parent / "results/summary/summary.csv").read_text()
    assert ours == (smoke_run / "results/summary/summary.csv").read_text()
    judged = json.loads((parent / "results/verify/verify.json").read_text())
    claims = yaml.safe_load(CLAIMS.read_text())["claims"]
    assert [c["id"] for c in judged["claims"]] == [c["id"] for c in claims]
    # on the CPU every claim but those judged from committed evidence says what it needs (as the report does)
    assert {c["id"] for c in judged["claims"] if c["verdict"] != "not_measurable"} == {
        c["id"] for c in claims if "evidence" in c}
    assert (parent / "results/report/report.html").stat().st_size > 100_000

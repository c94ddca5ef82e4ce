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

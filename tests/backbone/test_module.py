"""Deployed the way the Snakemake workflow catalog deploys workflows (`snakedeploy deploy-workflow <repo> <dir>`): a
copy of config/ and a workflow/Snakefile holding `module amprepro: snakefile: <repo>/workflow/Snakefile` and
`use rule * from amprepro`, from a local path. The workflow's own files (presets, claims, reference, notebook,
templates, the package) are found in the module's folder, not beside the deploying Snakefile; results go to the
deployment's directory."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from workflow_testing import REPO, copy_workflow, snakemake

pytestmark = pytest.mark.e2e
# Four cells, a few steps each: enough to run every stage of the smoke preset through the module, in seconds.
SHORT = {"preset": "smoke", "runs": {"precisions": ["fp32", "amp_bf16"], "train": {"steps": 12, "warmup_steps": 2}}}


def deploy(repo: Path, dest: Path) -> Path:
    """What snakedeploy 0.17.1 writes for a local repository: config/ copied, a workflow/Snakefile using the module."""
    (dest / "workflow").mkdir(parents=True)
    shutil.copytree(repo / "config", dest / "config")
    (dest / "workflow" / "Snakefile").write_text(
        'configfile: "config/config.yaml"\n\n\n'
        f'module amprepro:\n    snakefile:\n        "{repo / "workflow" / "Snakefile"}"\n'
        "    config:\n        config\n\n\n"
        "use rule * from amprepro\n")
    return dest


def test_the_catalog_file_names_the_entry_and_the_routes():
    catalog = yaml.safe_load((REPO / ".snakemake-workflow-catalog.yml").read_text())
    assert catalog["usage"]["software-stack-deployment"]["conda"] is True
    assert (REPO / "workflow" / "Snakefile").is_file()
    assert "workflow.include(\"workflow/Snakefile\"" in (REPO / "Snakefile").read_text()


def test_a_module_deployment_from_a_local_path_runs_the_smoke_preset(tmp_path):
    repo = copy_workflow(tmp_path / "amprepro")
    deployment = deploy(repo, tmp_path / "deployed")
    (deployment / "short.yaml").write_text(yaml.safe_dump(SHORT))
    dry = snakemake(deployment, "-n", "--cores", "2", "--configfile", "config/config.yaml", "short.yaml")
    assert "Preset file" not in dry.stderr and "train" in dry.stdout
    snakemake(deployment, "--cores", "2", "--configfile", "config/config.yaml", "short.yaml")
    summary = json.loads((deployment / "results/summary/summary.json").read_text())
    assert summary["preset"]["preset"] == "smoke" and len(summary["cells"]) == 4
    assert {c["status"] for c in summary["cells"] if c["precision"] == "fp32"} == {"ok"}
    html = (deployment / "results/report/report.html").read_text()
    assert "A CPU run." in html and "Provenance" in html
    assert not (repo / "results").exists()  # the module's folder holds the workflow, not the results

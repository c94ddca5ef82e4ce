import hashlib
import json
import sys
from pathlib import Path

from snakemake.utils import validate

sys.path.insert(0, str(Path(workflow.basedir) / "workflow"))
from amprepro.codedigest import code_digest  # noqa: E402
from amprepro.distributed import launcher  # noqa: E402
from amprepro.config import (  # noqa: E402
    apex_required,
    cell_spec_json,
    check_apex_source,
    cells,
    resolve_runs,
    validate_config,
    gpus_for_jobs,
)

config.update(validate_config(config))  # first: what YAML users write made exact, or the bad field and the fix
validate(config, "../schemas/config.schema.yaml")  # fills in the schema's defaults

GPUS, GPU_PROBE = gpus_for_jobs(config.get("gpu", "auto"))
RUNS, PRESET = resolve_runs(config, Path(workflow.basedir) / "config" / "presets", GPUS, GPU_PROBE)
PRESET["config_sha256"] = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()
CELLS = cells(RUNS)
APEX_REQUIRED = apex_required(config["apex"]["required"], GPUS)
check_apex_source(config["apex"], APEX_REQUIRED)  # before the apex job clears apex.json
BUILD_THREADS = max(1, workflow.resource_settings.cores or 1)  # None under `snakemake --report`; workflow.cores raises


wildcard_constraints:
    model="[A-Za-z0-9_]+",
    precision="|".join(RUNS["precisions"]),
    seed=r"\d+",


def run_outputs(name):
    """Paths of one output file for every cell of the matrix."""
    return [f"results/runs/{c['model']}/{c['precision']}/seed{c['seed']}/{name}" for c in CELLS]


def gpus_for_cell(wildcards):
    """GPUs the cell's job takes. On this machine (gpu: auto) never more than it has: the cell then runs on the
    GPUs there are and writes itself as skipped with the reason, instead of Snakemake refusing the whole run."""
    if not GPUS:
        return 0
    wanted = RUNS["models"][wildcards.model].get("gpus", 1)
    return min(wanted, len(GPUS)) if config.get("gpu", "auto") == "auto" else wanted


def launcher_for_cell(wildcards):
    """torchrun with one process per GPU the job gets (per requested process on a CPU-only machine: gloo)."""
    return launcher(gpus_for_cell(wildcards) if GPUS else RUNS["models"][wildcards.model].get("gpus", 1))


def spec_for_cell(wildcards):
    return cell_spec_json(RUNS, wildcards.model, wildcards.precision, wildcards.seed)

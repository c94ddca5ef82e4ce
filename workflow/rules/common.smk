import glob
import hashlib
import json
import sys
from pathlib import Path

from snakemake.utils import validate

sys.path.insert(0, str(Path(workflow.basedir) / "workflow"))
from amprepro.distributed import launcher  # noqa: E402
from amprepro.config import (  # noqa: E402
    apex_required,
    cell_spec_json,
    cells,
    resolve_runs,
    validate_config,
    gpus_for_jobs,
)


validate_config(config)  # first: one line naming the bad field and the fix
validate(config, "../schemas/config.schema.yaml")  # fills in the schema's defaults

GPUS, GPU_PROBE = gpus_for_jobs(config.get("gpu", "auto"))
RUNS, PRESET = resolve_runs(config, Path(workflow.basedir) / "config" / "presets", GPUS, GPU_PROBE)
PRESET["config_sha256"] = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()
CELLS = cells(RUNS)
APEX_REQUIRED = apex_required(config["apex"]["required"], GPUS)
PKG = "workflow/amprepro"
BUILD_THREADS = max(1, workflow.cores or 1)  # None under `snakemake --report`


wildcard_constraints:
    model="[A-Za-z0-9_]+",
    precision="|".join(RUNS["precisions"]),
    seed=r"\d+",


def run_outputs(name):
    """Paths of one output file for every cell of the matrix."""
    return [f"results/runs/{c['model']}/{c['precision']}/seed{c['seed']}/{name}" for c in CELLS]


def gpus_for_cell(wildcards):
    return RUNS["models"][wildcards.model].get("gpus", 1) if GPUS else 0


def launcher_for_cell(wildcards):
    return launcher(RUNS["models"][wildcards.model].get("gpus", 1))


def spec_for_cell(wildcards):
    return cell_spec_json(RUNS, wildcards.model, wildcards.precision, wildcards.seed)

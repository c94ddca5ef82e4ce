# Conda envs: which env file each kind of job uses, and a preflight for `snakemake --use-conda`.
# Included right after common.smk (it needs GPUS). Rules take their env from here: `conda: TRAIN_ENV` / `REPORT_ENV`.
import os
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.settings.types import DeploymentMethod

# The training env: the CUDA 12.9 build + nvcc for apex when nvidia-smi lists a GPU, else the CPU build.
TRAIN_ENV = "../../envs/train-gpu.yaml" if GPUS else "../../envs/train.yaml"
REPORT_ENV = "../../envs/report.yaml"

# With --use-conda, stop here with one clear message when conda is missing or too old, or when an env file this run
# needs does not solve (skipped for env files with a pin file or already deployed). AMPREPRO_SKIP_CONDA_CHECK=1 skips
# it. Only the main Snakemake process checks; jobs re-parsing the workflow do not.
if (
    DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method
    and workflow.is_main_process
    and not os.environ.get("AMPREPRO_SKIP_CONDA_CHECK")
):
    from amprepro.env import condacheck

    _rules_dir = WORKFLOW_DIR / "workflow" / "rules"
    try:
        condacheck.preflight(
            [(_rules_dir / env).resolve() for env in (TRAIN_ENV, REPORT_ENV)],
            Path(workflow.deployment_settings.conda_prefix or ".snakemake/conda"),
        )
    except condacheck.CondaProblem as problem:
        raise WorkflowError(str(problem))

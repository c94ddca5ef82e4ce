# amprepro: re-run the mixed-precision training story and see which claims hold.
import sys
from pathlib import Path

from snakemake.utils import min_version

min_version("9.0")

# Where the workflow's own files are: this Snakefile's folder, wherever Snakemake runs (`--directory` may name another
# working directory; results/ and .snakemake/ go there). The rules find the amprepro package and every file of the
# workflow (config, presets, claims, reference, notebook, templates) from here; common.smk says how.
WORKFLOW_DIR = Path(workflow.basedir).resolve()
PACKAGE_PATH = WORKFLOW_DIR / "workflow"  # the folder holding the amprepro package
sys.path.insert(0, str(PACKAGE_PATH))
from amprepro.config import read_config_file, stop_on_config_error  # noqa: E402

# The workflow's default config. Before Snakemake reads it: a broken file stops with its line and column, and
# __use_yte__ (a template that runs Python) is refused. Files given with --configfile are read by Snakemake before this
# line (docs/config.md).
DEFAULT_CONFIG = WORKFLOW_DIR / "config" / "config.yaml"
if DEFAULT_CONFIG.exists():
    with stop_on_config_error():
        read_config_file(DEFAULT_CONFIG)


configfile: DEFAULT_CONFIG


include: "workflow/rules/common.smk"
include: "workflow/rules/conda_check.smk"
include: "workflow/rules/environment.smk"
include: "workflow/rules/apex.smk"
include: "workflow/rules/sanity.smk"
include: "workflow/rules/runs.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/verify.smk"


rule all:
    default_target: True
    input:
        report="results/report/report.html",

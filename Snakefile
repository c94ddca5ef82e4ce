# amprepro: re-run the mixed-precision training story and see which claims hold.
import sys
from pathlib import Path

from snakemake.utils import min_version

min_version("9.0")

sys.path.insert(0, str(Path(workflow.basedir) / "workflow"))
from amprepro.config import read_config_file  # noqa: E402

# Before Snakemake reads it: a broken file stops with its line and column, and __use_yte__ (a template that runs
# Python) is refused. Files given with --configfile are read by Snakemake before this line (docs/config.md).
if Path("config/config.yaml").exists():
    read_config_file("config/config.yaml")


configfile: "config/config.yaml"


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

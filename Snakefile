# amprepro: re-run the mixed-precision training story and see which claims hold.
from snakemake.utils import min_version

min_version("9.0")


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

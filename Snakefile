# amprepro: re-run the mixed-precision training story and see which claims hold.
# The workflow itself is workflow/Snakefile (the entry snakedeploy and the Snakemake workflow catalog use); this file
# keeps `snakemake` in the repository root, and `snakemake -s <repo>/Snakefile`, working as before. It includes the
# entry as Snakemake includes a main Snakefile (its `rule all` stays the default target, which a plain `include:`
# would drop).
workflow.include("workflow/Snakefile", overwrite_default_target=True)

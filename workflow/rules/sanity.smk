# A checkpoint, so that once it has run Snakemake judges the cells again: a cell then re-runs only if the content of
# its inputs changed (checksums), not because sanity ran again with the same outcome (amprepro.runinputs). It checks
# the torch stack and the toolkit apex needs; apex itself is verified by its own job (workflow/rules/apex.smk), so the
# cells that need no apex start without waiting for its compile.
# Not ancient() inputs: Snakemake 9.27 then never checks the cells' own changes (code, settings) in a run where
# sanity or anything above it runs, since update_needrun skips every job below one that must run.
checkpoint sanity:
    """Check the GPU stack the articles rely on (torch, CUDA, cuDNN, autocast, GradScaler, the toolkit apex needs); a
    required check that fails stops the pipeline here."""
    input:
        env="results/environment/environment.json",
    output:
        sanity="results/sanity/sanity.json",
        verdicts="results/sanity/verdicts.json",  # the cells' gate (amprepro.runinputs)
    log:
        "results/logs/sanity.log",
    conda:
        TRAIN_ENV
    resources:
        gpu=1 if GPUS else 0,
        gpu_share=whole_gpu_share,
        cpus_per_gpu=4 if GPUS else 0,
        mem_mb=4000,
        runtime=20,
    params:
        expect_gpu=bool(GPUS),
        apex_required=APEX_REQUIRED,
        archs=ARCHS,  # the load check of torchvision / timm is required when a model is built from them
        code=code_digest("env.sanity", "runinputs", "plan.cellserver"),
    shell:
        # forked from the cell server where make run started one (its imports done once), else a fresh interpreter
        "python -m amprepro.gpuslots --gpus {resources.gpu} --"
        " python -m amprepro.plan.cellserver --run sanity --"
        " --apex-required {params.apex_required} --expect-gpu {params.expect_gpu} --archs {params.archs}"
        " --out {output.sanity} > {log} 2>&1"
        # the failed checks and their fixes on the console, not only in the log
        " || {{ grep -h '^ERROR' {log} >&2 || true; exit 1; }};"
        " python -m amprepro.runinputs sanity --record {output.sanity} --out {output.verdicts}"
        " >> {log} 2>&1"

rule sanity:
    """Check the GPU stack the articles rely on; a required check that fails stops the pipeline here."""
    input:
        env="results/environment/environment.json",
        apex="results/apex/apex.json",
        code=f"{PKG}/sanity.py",
    output:
        sanity="results/sanity/sanity.json",
    params:
        expect_gpu=bool(GPUS),
    log:
        "results/logs/sanity.log",
    resources:
        gpu=1 if GPUS else 0,
        mem_mb=4000,
    conda:
        TRAIN_ENV
    shell:
        "PYTHONPATH=workflow python -m amprepro.gpuslots --gpus {resources.gpu} -- python -m amprepro.sanity"
        " --apex {input.apex} --expect-gpu {params.expect_gpu} --out {output.sanity} > {log} 2>&1"

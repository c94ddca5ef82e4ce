rule apex:
    """Build (or declare absent) NVIDIA Apex from a pinned source; verify every extension it promises."""
    input:
        env="results/environment/environment.json",
        code=[f"{PKG}/apex_stage.py", *sorted(glob.glob(f"{PKG}/apexbuild/*.py"))],
    output:
        apex="results/apex/apex.json",
    params:
        settings=json.dumps({**config["apex"], "required": APEX_REQUIRED}, sort_keys=True),
    log:
        "results/logs/apex.log",
    threads: BUILD_THREADS
    resources:
        gpu=1 if GPUS else 0,
        mem_mb=32000 if GPUS else 2000,  # parallel nvcc jobs take several GB each
    conda:
        TRAIN_ENV
    shell:
        "PYTHONPATH=workflow python -m amprepro.gpuslots --gpus {resources.gpu} -- python -m amprepro.apex_stage"
        " --settings {params.settings:q} --out {output.apex} --jobs {threads} > {log} 2>&1"

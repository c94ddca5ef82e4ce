rule apex:
    """Build (or declare absent) NVIDIA Apex from a pinned source; verify every extension it promises."""
    input:
        env="results/environment/environment.json",
    output:
        apex="results/apex/apex.json",
        runs="results/apex/runs.json",  # what the cells read from apex.json (amprepro.runinputs)
    log:
        "results/logs/apex.log",
    conda:
        TRAIN_ENV
    threads: BUILD_THREADS
    resources:
        gpu=1 if GPUS else 0,
        cpus_per_gpu=BUILD_THREADS if GPUS else 0,  # on the CPU: its threads
        mem_mb=4000 * BUILD_THREADS if GPUS else 2000,  # each parallel nvcc job takes 2-4 GB
        runtime=120,
    params:
        settings=json.dumps({**config["apex"], "required": APEX_REQUIRED}, sort_keys=True),
        code=code_digest("env.apex_stage", "runinputs"),
    shell:
        "python -m amprepro.env.gpuslots --gpus {resources.gpu} -- python -m amprepro.env.apex_stage"
        " --settings {params.settings:q} --out {output.apex} --jobs {threads} > {log} 2>&1"
        " && python -m amprepro.runinputs apex --record {output.apex} --out {output.runs}"
        " >> {log} 2>&1"

rule train:
    """One cell: one model, one precision, one seed, in its own process (apex O1 patches torch globally)."""
    input:
        unpack(train_inputs),
    output:
        metrics="results/runs/{model}/{precision}/seed{seed}/metrics.json",
        steps="results/runs/{model}/{precision}/seed{seed}/steps.csv",
    log:
        "results/logs/runs/{model}/{precision}/seed{seed}.log",
    conda:
        TRAIN_ENV
    threads: threads_for_cell
    resources:
        gpu=gpus_for_train,
        gpu_share=gpu_share_for_cell,  # a cell whose speed no claim judges shares a GPU (plan.resources.shares_gpu)
        gres=per_node_gres,
        nodes=nodes_for_cell,
        tasks=nodes_for_cell,  # CPU jobs: --ntasks (1 task would shrink the allocation to 1 node)
        tasks_per_gpu=0,  # GPU jobs: no --ntasks-per-gpu (the plugin would make one of `tasks`)
        cpus_per_gpu=cpus_per_gpu_for_cell,
        mem_mb=mem_mb_for_cell,
        runtime=runtime_for_cell,
    params:
        spec=spec_for_cell,
        launch=launch_for_cell,
        slots=gpuslots_for_cell,
        apex=lambda wildcards, input: ["--apex", input.apex] if "apex" in input.keys() else [],
        init_cache=INIT_CACHE,
        code=code_digest("train.train", "plan.launcher"),  # with what they import: cellspec, memory, cellserver
    shell:
        # --defer: where make run stages cells, a timed cell locks its GPU itself once its model is built
        "python -m amprepro.gpuslots --gpus {resources.gpu}{params.slots} --defer --"
        " python -m amprepro.plan.launcher {params.launch} -- --spec {params.spec:q} {params.apex:q}"
        " --plan {input.plan} --threads {threads} {params.init_cache:q}"
        " --metrics {output.metrics} --steps {output.steps} > {log} 2>&1"


rule peak:
    """This GPU's measured matmul ceiling per precision (MFU is reported against it and the datasheet)."""
    input:
        sanity="results/sanity/verdicts.json",
    output:
        peak="results/peak/peak.json",
    log:
        "results/logs/peak.log",
    conda:
        TRAIN_ENV
    resources:
        gpu=1 if GPUS else 0,
        gpu_share=whole_gpu_share,
        cpus_per_gpu=4 if GPUS else 0,
        mem_mb=8000,
        runtime=20,
    params:
        code=code_digest("env.peak", "plan.cellserver"),
    shell:
        # forked from the cell server where make run started one (torch imported once), else a fresh interpreter
        "python -m amprepro.gpuslots --gpus {resources.gpu} --"
        " python -m amprepro.plan.cellserver --run peak -- --out {output.peak} > {log} 2>&1"


rule summary:
    """One table of every cell plus the software versions they ran with."""
    input:
        metrics=run_outputs("metrics.json"),
        env="results/environment/environment.json",
        apex="results/apex/apex.json",
        peak="results/peak/peak.json",
        gate="results/sanity/verdicts.json",  # not read: it makes summary a dependent Snakemake re-judges after sanity
        largest_batch=largest_batch_outputs(),
    output:
        table="results/summary/summary.csv",
        summary="results/summary/summary.json",
    log:
        "results/logs/summary.log",
    conda:
        TRAIN_ENV
    resources:
        mem_mb=2000,
        runtime=30,
    params:
        preset=json.dumps(PRESET, sort_keys=True),
        largest_batch=json.dumps(
            {
                "models": LARGEST_BATCH.get("models", []),
                "note": "" if GPUS else "the search measures GPU memory; this run has no GPU",
            },
            sort_keys=True,
        ),
        code=code_digest("analysis.summary"),
    shell:
        "python -m amprepro.analysis.summary"
        " --metrics {input.metrics} --env {input.env} --apex {input.apex} --peak {input.peak}"
        " --preset {params.preset:q} --largest-batch-asked {params.largest_batch:q}"
        " --largest-batch {input.largest_batch} --csv {output.table} --json {output.summary} > {log} 2>&1"
        # its error (a record of another interpreter than the cells') on the console, not only in the log
        " || {{ grep -h '^ERROR' {log} >&2 || true; exit 1; }}"

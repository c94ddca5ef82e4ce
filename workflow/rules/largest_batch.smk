# "With AMP you can use a bigger batch": the largest batch each precision of runs.largest_batch.models fits on this GPU
# (amprepro.train.batchsearch), after the model's cell at its planned batch. GPU runs only: on a machine without a GPU
# the report says the search did not run and why.


rule largest_batch:
    """The largest batch one precision of a model fits here: two training steps per try, bounded in batch and time."""
    input:
        unpack(largest_batch_inputs),
    output:
        "results/largest_batch/{model}/{precision}.json",
    log:
        "results/logs/largest_batch/{model}/{precision}.log",
    conda:
        TRAIN_ENV
    threads: cell_resources.CPUS_PER_GPU
    resources:
        gpu=1,
        gpu_share=whole_gpu_share,
        cpus_per_gpu=cell_resources.CPUS_PER_GPU,
        mem_mb=16000,
        runtime=10,
    params:
        spec=largest_batch_spec,
        apex=lambda wildcards, input: ["--apex", input.apex] if "apex" in input.keys() else [],
        up_to=LARGEST_BATCH.get("up_to", 8),
        seconds=search_seconds,
        init_cache=INIT_CACHE,
        code=code_digest("train.batchsearch", "train.train", "plan.launcher"),
    shell:
        "python -m amprepro.gpuslots --gpus {resources.gpu} -- python -m amprepro.plan.launcher"
        " --per-node 1 --nodes 1 --device cuda --entry batchsearch -- --spec {params.spec:q} {params.apex:q} --cell {input.cell} --plan {input.plan}"
        " --up-to {params.up_to} --seconds {params.seconds} {params.init_cache:q} --out {output} > {log} 2>&1"

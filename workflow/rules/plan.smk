# The memory plan, a checkpoint like sanity (workflow/rules/sanity.smk): once it has run, Snakemake judges the cells
# again by the content of their model's view (results/plan/models/<model>.json), so a re-plan with the same outcome
# re-runs no cell, and a cell re-runs when its model's batch, shape or memory cap changes.


checkpoint plan:
    """Decide each model's batch (and the 7B model's LLaMA shape) on this GPU, from the memory model and, for a close
    call, a short probe (amprepro.plan.memplan)."""
    input:
        sanity="results/sanity/verdicts.json",
    output:
        plan="results/plan/plan.json",
        views=expand("results/plan/models/{model}.json", model=sorted(RUNS["models"])),
    log:
        "results/logs/plan.log",
    conda:
        TRAIN_ENV
    threads: 1 if not GPUS else cell_resources.CPUS_PER_GPU
    resources:
        gpu=1 if GPUS else 0,
        gpu_share=whole_gpu_share,
        cpus_per_gpu=cell_resources.CPUS_PER_GPU if GPUS else 0,
        mem_mb=8000 if GPUS else 2000,
        runtime=20,
    params:
        cells=json.dumps(plan_cells(RUNS, config), sort_keys=True),
        device="cuda" if GPUS else "cpu",
        limit=["--limit-gib", str(GPU_MEMORY_LIMIT)] if GPU_MEMORY_LIMIT else [],
        views=lambda wildcards, output: str(Path(output.views[0]).parent),
        # its probes run the cell (forked by name)
        code=code_digest("plan.memplan", "plan.probe", "train.train", "plan.cellserver"),
    shell:
        # forked from the cell server where make run started one (torch imported once), else a fresh interpreter
        "python -m amprepro.gpuslots --gpus {resources.gpu} --"
        " python -m amprepro.plan.cellserver --run plan --"
        " --cells {params.cells:q} --device {params.device} {params.limit:q} --threads {threads}"
        " --out {output.plan} --views {params.views} > {log} 2>&1"

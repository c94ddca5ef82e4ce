rule environment:
    """Record the software environment the jobs run in: Python, packages, torch build, conda or not."""
    output:
        env="results/environment/environment.json",
    log:
        "results/logs/environment.log",
    conda:
        TRAIN_ENV
    resources:
        mem_mb=2000,
        runtime=30,
    params:
        code=code_digest("env.environment"),
    shell:
        "python -m amprepro.env.environment --out {output.env} > {log} 2>&1"

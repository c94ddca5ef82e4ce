rule environment:
    """Record the software environment the jobs run in: Python, packages, torch build, conda or not."""
    output:
        env="results/environment/environment.json",
    params:
        code=code_digest("environment"),
    log:
        "results/logs/environment.log",
    resources:
        mem_mb=2000,
    conda:
        TRAIN_ENV
    shell:
        "PYTHONPATH=workflow python -m amprepro.environment --out {output.env} > {log} 2>&1"

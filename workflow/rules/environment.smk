from amprepro.env import jobpython  # noqa: E402

# The jobs' `python` (without --use-conda or a container: the first on PATH), found before any job. One that is not
# the Python running Snakemake is named with the fix; as a parameter of `environment` it re-runs the record whenever
# the jobs' interpreter changes (amprepro.env.jobpython).
if workflow.deployment_settings.deployment_method:
    JOB_PYTHON = "the rule's conda env or container"
else:
    _job_python = jobpython.job_python()
    JOB_PYTHON = jobpython.parameter(_job_python)
    if workflow.is_main_process and (_warning := jobpython.warning(_job_python)):
        print(f"amprepro: {_warning}", file=sys.stderr)


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
        python=JOB_PYTHON,
    shell:
        "python -m amprepro.env.environment --out {output.env} > {log} 2>&1"

from amprepro.verify.verify import reference_inputs  # noqa: E402


rule report:
    """Execute notebooks/report.ipynb with papermill (real parameters), render HTML without code cells."""
    input:
        notebook=workflow_file("notebooks/report.ipynb"),
        summary="results/summary/summary.json",
        table="results/summary/summary.csv",
        env="results/environment/environment.json",
        sanity="results/sanity/sanity.json",
        apex="results/apex/apex.json",
        steps=run_outputs("steps.csv"),
        claims=CLAIMS_FILE,
        reference=reference_inputs(REFERENCE_DIR),
        regimes=regime_measurement_inputs(),  # the 7B claim's regimes table (amprepro.analysis.regimes)
        templates=[
            workflow_file(f"workflow/report/nbconvert/amprepro/{name}")
            for name in ("conf.json", "index.html.j2", "static/report.css")
        ],
    output:
        notebook="results/report/report.ipynb",
        html=report(
            "results/report/report.html",
            category="Report",
            caption="../report/report.rst",
        ),
    log:
        "results/logs/report.log",
    conda:
        REPORT_ENV
    threads: min(8, CORES)  # processes drawing the figures (amprepro.report.figurepool): the run's last job
    resources:
        mem_mb=8000,
        runtime=30,
    params:
        reference_dir=lambda wildcards: REFERENCE_DIR,  # a function: lint takes a plain path for a file prefix
        title=lambda wildcards: config["report"]["title"],  # a function: Snakemake formats a plain string's braces
        # the report's code: render, the modules the notebook imports (with what they import), the HTML templates
        code=code_digest(
            "report.render",
            "report.reportlib",
            "report.reporthtml",
            "report.reportcharts",
            "report.fp8section",
            "report.convergencereport",
            "report.figurepool",
            files=["report/templates"],
        ),
    shell:
        "python -m amprepro.report.render"
        " --notebook {input.notebook:q} --executed {output.notebook} --html {output.html}"
        " --param title={params.title:q} --param summary={input.summary} --param table={input.table}"
        " --param environment={input.env} --param sanity={input.sanity} --param apex={input.apex}"
        " --param runs_dir=results/runs --param claims={input.claims:q} --param reference_dir={params.reference_dir:q}"
        " --param workers={threads}"
        " > {log} 2>&1"

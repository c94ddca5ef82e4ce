rule report:
    """Execute notebooks/report.ipynb with papermill (real parameters), render HTML without code cells."""
    input:
        notebook="notebooks/report.ipynb",
        summary="results/summary/summary.json",
        table="results/summary/summary.csv",
        env="results/environment/environment.json",
        sanity="results/sanity/sanity.json",
        apex="results/apex/apex.json",
        steps=run_outputs("steps.csv"),
        code=[f"{PKG}/render.py", f"{PKG}/reportlib.py"],
    output:
        notebook="results/report/report.ipynb",
        html=report(
            "results/report/report.html",
            category="Report",
            caption="../report/report.rst",
        ),
    params:
        title=config["report"]["title"],
    log:
        "results/logs/report.log",
    conda:
        "../../envs/report.yaml"
    shell:
        "PYTHONPATH=workflow python -m amprepro.render"
        " --notebook {input.notebook} --executed {output.notebook} --html {output.html}"
        " --param title={params.title:q} --param summary={input.summary} --param table={input.table}"
        " --param environment={input.env} --param sanity={input.sanity} --param apex={input.apex}"
        " --param runs_dir=results/runs > {log} 2>&1"

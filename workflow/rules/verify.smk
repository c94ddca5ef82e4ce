# Claims and the reference check.
# The report (rule report) evaluates both from the same inputs and shows them, so `make run` always ends with a
# report. `make run` also writes the comparison (verify_compare, in `rule all`: it never fails), so `make verify` reads
# it. `snakemake verify` / `make verify` is the gate: it fails (non-zero exit) when a cell is out of tolerance,
# naming the cells and by how much. It stays out of `rule all` because it must be able to fail.
from amprepro.analysis.claimfile import load_claims  # noqa: E402
from amprepro.verify.verify import reference_inputs  # noqa: E402


report: "../report/workflow.rst"


# A bad claim stops the run before any job, with a message that names the claim and the field.
CLAIMS = load_claims(CLAIMS_FILE)


rule verify_compare:
    """Compare every cell with the committed reference of the same GPU model; evaluate the claims. Never fails on tolerance."""
    input:
        summary="results/summary/summary.json",
        sanity="results/sanity/sanity.json",
        metrics=run_outputs("metrics.json"),
        claims=CLAIMS_FILE,
        reference=reference_inputs(REFERENCE_DIR),
        regimes=regime_measurement_inputs(),  # the 7B claim's regimes table (amprepro.analysis.regimes)
    output:
        verify=report("results/verify/verify.json", category="Verify", caption="../report/verify.rst"),
        table=report("results/verify/verify.csv", category="Verify", caption="../report/verify.rst"),
    log:
        "results/logs/verify_compare.log",
    conda:
        REPORT_ENV
    resources:
        mem_mb=2000,
        runtime=30,
    params:
        reference_dir=lambda wildcards: REFERENCE_DIR,  # a function: lint takes a plain path for a file prefix
        code=code_digest("verify.verify"),
    shell:
        "python -m amprepro.verify.verify compare"
        " --summary {input.summary} --sanity {input.sanity} --runs-dir results/runs"
        " --reference-dir {params.reference_dir:q} --claims {input.claims:q}"
        " --json {output.verify} --csv {output.table} > {log} 2>&1"


rule verify:
    """make verify: exit non-zero when a cell is out of tolerance against the reference, naming the cells and by how much."""
    input:
        # what it compares: the summary and cells (rule verify_compare); a missing cell or record is re-made by
        # make run (rule all: common.smk's pipeline_outputs)
        verify="results/verify/verify.json",
    log:
        "results/logs/verify.log",
    conda:
        REPORT_ENV
    shell:
        "python -m amprepro.verify.verify gate --verify {input.verify} 2>&1 | tee {log}"

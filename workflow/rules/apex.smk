# Two jobs, so that the cells needing no apex do not wait for the compile. The full build compiles only the extensions
# the run matrix's cells use (APEX_EXTENSIONS, amprepro.apexexts; docs/apex.md); the shell none. apex_build compiles
# into the cache with nvcc and the CPUs only: on this machine it takes no GPU and leaves one cell's CPUs (and a
# thread) free, so those cells run beside it (amprepro.plan.resources.apex_build_threads); on a cluster it runs on a
# GPU node, as the cells will. apex then installs and verifies that build on a GPU, and the cells that use apex wait
# for it. apex is a checkpoint, as sanity is (workflow/rules/sanity.smk): once it has run, Snakemake judges those cells
# again by the content of runs.json, so a rebuild with the same outcome re-runs no cell.
BUILD_GPUS = 1 if GPUS and not workflow.local_exec else 0

# A record that names a build entry or site dir that is gone (deleted by hand) is removed here, so that this run builds
# or installs apex again before the apex cells (amprepro.env.apexrecords); a dry run only says so. Once, in the process
# that plans the run (not in each cluster job).
if workflow.is_main_process:
    from amprepro.env import apexrecords

    _workdir = Path(workflow.workdir_init, workflow.overwrite_workdir or ".").resolve()
    if _said := apexrecords.recover(_workdir / "results" / "apex", _workdir, workflow.output_settings.dryrun):
        print(f"amprepro: {_said}", file=sys.stderr)


rule apex_build:
    """Compile NVIDIA Apex from a pinned source into the build cache (or declare it absent, with the reason)."""
    input:
        env="results/environment/environment.json",
    output:
        build="results/apex/build.json",
    log:
        "results/logs/apex_build.log",
    conda:
        TRAIN_ENV
    threads: BUILD_THREADS
    resources:
        gpu=BUILD_GPUS,
        cpus_per_gpu=BUILD_THREADS if BUILD_GPUS else 0,  # otherwise Slurm gives it its threads
        mem_mb=4000 * BUILD_THREADS if GPUS else 2000,  # each parallel nvcc job takes 2-4 GB
        runtime=120,
    params:
        settings=json.dumps(
            {**config["apex"], "required": APEX_REQUIRED, "extensions": APEX_EXTENSIONS}, sort_keys=True
        ),
        code=code_digest("env.apex_stage"),
    shell:
        "python -m amprepro.env.apex_stage --build-only --settings {params.settings:q} --out {output.build}"
        " --jobs {threads} --cpu-share {threads} > {log} 2>&1"


checkpoint apex:
    """Install the build and verify it on the GPU: every extension it promises imports, the fused kernels compute what
    torch does."""
    input:
        env="results/environment/environment.json",
        build="results/apex/build.json",
    output:
        apex="results/apex/apex.json",
        runs="results/apex/runs.json",  # what the cells read from apex.json (amprepro.runinputs)
    log:
        "results/logs/apex.log",
    conda:
        TRAIN_ENV
    threads: min(4, CORES)  # the checks run in three interpreters side by side
    resources:
        gpu=1 if GPUS else 0,
        gpu_share=whole_gpu_share,
        cpus_per_gpu=4 if GPUS else 0,
        mem_mb=8000,
        runtime=30,
    params:
        settings=json.dumps(
            {**config["apex"], "required": APEX_REQUIRED, "extensions": APEX_EXTENSIONS}, sort_keys=True
        ),
        code=code_digest("env.apex_stage", "runinputs", "plan.cellserver"),  # its probes: forked by name
    shell:
        "python -m amprepro.gpuslots --gpus {resources.gpu} -- python -m amprepro.env.apex_stage"
        " --built {input.build} --settings {params.settings:q} --out {output.apex} --jobs {threads} > {log} 2>&1"
        " && python -m amprepro.runinputs apex --record {output.apex} --out {output.runs}"
        " >> {log} 2>&1"


# The empty shell (issue 38; docs/apex.md): the same pinned source built without --cpp_ext/--cuda_ext, as the
# articles warn a plain `pip install` does. Python only: it builds in seconds with no nvcc. Only the cells of a model
# with `apex_build: shell` read it (amprepro.cellspec.APEX_VIEWS), so a preset without them never builds it. Its
# record says "shell": true and names each missing extension with its import error.
rule apex_shell_build:
    """Build the apex shell (no --cpp_ext/--cuda_ext) from the pinned source into the build cache."""
    input:
        env="results/environment/environment.json",
    output:
        build="results/apex/shell-build.json",
    log:
        "results/logs/apex_shell_build.log",
    conda:
        TRAIN_ENV
    threads: 1
    resources:
        mem_mb=2000,
        runtime=30,
    params:
        settings=json.dumps({**config["apex"], "required": APEX_REQUIRED}, sort_keys=True),
        code=code_digest("env.apex_stage"),
    shell:
        "python -m amprepro.env.apex_stage --shell --build-only --settings {params.settings:q} --out {output.build}"
        " --jobs {threads} --cpu-share {threads} > {log} 2>&1"


# Nothing in the shell's check is timed, so where cells share GPUs here it takes a slot beside the digits cells (one
# of the untimed cells' CELLS_PER_SHARED_GPU) instead of the whole GPU: on a fresh one-GPU H200 it held the GPU for
# 28 s before the first timed cell, 10 of them waiting for those cells (results-reference/perf/04ad031).
checkpoint apex_shell:
    """Install the shell and verify it: apex imports from its site dir, none of the extensions does, apex.amp O1 and O2
    take a step (on the Python fallback without amp_C)."""
    input:
        env="results/environment/environment.json",
        build="results/apex/shell-build.json",
    output:
        apex="results/apex/shell.json",
        runs="results/apex/shell-runs.json",
    log:
        "results/logs/apex_shell.log",
    conda:
        TRAIN_ENV
    threads: min(4, CORES)
    resources:
        gpu=untimed_gpus,
        gpu_share=untimed_gpu_share,
        cpus_per_gpu=4 if GPUS else 0,
        mem_mb=8000,
        runtime=30,
    params:
        settings=json.dumps({**config["apex"], "required": APEX_REQUIRED}, sort_keys=True),
        slots=untimed_gpuslots,
        code=code_digest("env.apex_stage", "runinputs", "plan.cellserver"),  # its probes: forked by name
    shell:
        "python -m amprepro.gpuslots --gpus {resources.gpu}{params.slots} -- python -m amprepro.env.apex_stage --shell"
        " --built {input.build} --settings {params.settings:q} --out {output.apex} --jobs {threads} > {log} 2>&1"
        " && python -m amprepro.runinputs apex --record {output.apex} --out {output.runs}"
        " >> {log} 2>&1"

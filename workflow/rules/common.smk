import hashlib
import json
import os
from pathlib import Path

from amprepro.plan import resources as cell_resources  # noqa: E402
from amprepro.gpuslots import STAGE_ENV  # noqa: E402
from amprepro import apexexts  # noqa: E402
from amprepro.cellid import CellId  # noqa: E402
from amprepro.codedigest import code_digest, keep_trees_in  # noqa: E402
from amprepro.config import (  # noqa: E402
    apex_required,
    cell_spec,
    cell_spec_json,
    check_apex_source,
    cells,
    resolve_runs,
    validate_config,
    gpus_for_jobs,
    gpu_memory_limit,
    largest_batch_searches,
    largest_batch_seconds,
    plan_cells,
    stop_on_config_error,
)

# The parsed source trees the code digests read, kept between Snakemake processes (amprepro.codedigest): in the
# working directory's .snakemake/, beside Snakemake's own records (--directory's, which is not yet the cwd here).
keep_trees_in(
    Path(workflow.workdir_init, workflow.overwrite_workdir or ".", ".snakemake", "amprepro", "code-trees.json")
)

# A bad value stops here with the field and the fix, and no Python frames (stop_on_config_error). The --config values
# go with it: there, nested values arrive as text, which a config file may not quote (refuse_quoted_numbers).
with stop_on_config_error():
    config.update(validate_config(config, dict(getattr(workflow.config_settings, "config", None) or {})))
    GPUS, GPU_PROBE = gpus_for_jobs(config.get("gpu", "auto"))
    RUNS, PRESET = resolve_runs(config, WORKFLOW_DIR / "config" / "presets", GPUS, GPU_PROBE)
    PRESET["config_sha256"] = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()
    CELLS = cells(RUNS)
    APEX_REQUIRED = apex_required(config["apex"]["required"], GPUS)
    check_apex_source(config["apex"], APEX_REQUIRED)  # before the apex job clears apex.json
    # The extensions the full apex build compiles: those the cells use, amp_C alone where none uses one
    # (amprepro.apexexts.build_extensions). A change of the set changes apex_build's params, so Snakemake builds again.
    APEX_EXTENSIONS = apexexts.build_extensions(cell_spec(RUNS, c["model"], c["precision"], c["seed"]) for c in CELLS)
    if config.get("container_image"):  # checked by the schema's pattern; with --sdm apptainer every job runs in it
        workflow.global_container(config["container_image"])
CORES = max(1, workflow.resource_settings.cores or 1)  # None under `snakemake --report`; workflow.cores raises
# Jobs on this machine share its GPUs through `--resources gpu=N`; a cluster job gets its own node's.
LOCAL_GPUS = len(GPUS) if workflow.local_exec else 0
# The launcher's word (amprepro.env.launchargs.stages_cells): on this one GPU a timed cell may start while another
# trains, build its model and then lock the GPU itself (amprepro.gpuslots --defer, which reads the same word).
# Snakemake's cores and `gpu` then count the waiting cell too: the apex build's share is reckoned without it.
STAGED = os.environ.get(STAGE_ENV) == "1" and workflow.local_exec and bool(GPUS)
CORES_BESIDE_STAGED = CORES - cell_resources.CPUS_PER_GPU if STAGED and CORES > cell_resources.CPUS_PER_GPU else CORES
BUILD_THREADS = cell_resources.apex_build_threads(CORES_BESIDE_STAGED, LOCAL_GPUS)
# GPUs that nvidia-smi lists on this machine (not `gpu: true`, jobs sent to GPU nodes elsewhere): only these are shared
# out by gpuslots' locks, so only here may untimed cells share one (shares_gpu).
PROBED_GPUS = 0 if config.get("gpu") in (True, "true") else len(GPUS)


def sharing_here():
    """Whether cells may share a GPU: GPUs listed here and jobs run here. Asked when a job's resources are set, not
    when the Snakefile is read: the executor (local, or a cluster's) is known only then."""
    return bool(PROBED_GPUS) and workflow.local_exec


def whole_gpu_share(wildcards=None):
    """A job that takes a whole GPU here also takes a whole GPU's `gpu_share` (amprepro.env.launch: CELLS_PER_SHARED_GPU
    per GPU), so that Snakemake starts no cell that would share its GPU while it runs (gpuslots would only make it
    wait); none where no cell shares. Where make run stages cells (STAGED: the pools count one GPU twice) a shared cell
    may start beside a timed job, and waits in gpuslots for its shared lock."""
    return cell_resources.CELLS_PER_SHARED_GPU if sharing_here() else 0


def untimed_gpus(wildcards=None):
    """`gpu` of an untimed GPU check that may share its GPU (the apex shell's): none where cells share GPUs here
    (gpu_share counts it), else a GPU where there are GPUs."""
    return 0 if sharing_here() else (1 if GPUS else 0)


def untimed_gpu_share(wildcards=None):
    """`gpu_share` of such a check: one slot beside the untimed cells, as a cell that shares a GPU takes."""
    return 1 if sharing_here() else 0


def untimed_gpuslots(wildcards=None):
    """amprepro.gpuslots' options besides --gpus for such a check: --shared K where it shares, else none."""
    return f" --shared {cell_resources.CELLS_PER_SHARED_GPU:d}" if sharing_here() else ""


RUNTIME_FACTOR = float(config["resources"]["runtime_factor"])  # nested --config values arrive as strings
GPU_MEMORY_LIMIT = gpu_memory_limit(config)  # GiB of an emulated smaller card, or None
LARGEST_BATCH = RUNS.get("largest_batch") or {}  # workflow/rules/largest_batch.smk
SEARCHES = largest_batch_searches(RUNS) if GPUS else []
# Initial weights one cell built, which the next cell of the same model and seed reads instead of building them again
# (amprepro.train.initcache: bit for bit, checked; the cell's record says which). GPU runs only: on the CPU a cell's
# memory figure is its process's peak RSS, which the check of a written file would raise.
INIT_CACHE = ["--init-cache", "results/cache/init"] if GPUS else []
ARCHS = sorted({m["arch"] for m in RUNS["models"].values()})  # sanity checks the libraries they are built from

# How every job finds the amprepro package: the one place. Each shell command starts with PYTHONPATH exported to the
# package's absolute folder (PACKAGE_PATH, from the Snakefile), so rules run `python -m amprepro.<subpackage>.<stage>`
# from any directory (`snakemake --directory`). Set in the command, not in Snakemake's environment: with --use-conda
# Snakemake removes PYTHONPATH from a conda job's environment, and the env's python (no amprepro installed there) must
# still import it; a PYTHONPATH already set (tools/gpu: site packages) is kept after it. `set -euo pipefail` is the
# prefix Snakemake uses when none is set.
shell.prefix("set -euo pipefail; export PYTHONPATH={PACKAGE_PATH:q}${{PYTHONPATH:+:$PYTHONPATH}}; ")


def workflow_file(name):
    """A file or folder of the workflow (config/claims.yaml, reference, notebooks/report.ipynb, ...), for a rule's input
    or params: relative when the working directory is the workflow's own (paths in logs and the report as before),
    else absolute. results/ stays relative to the working directory."""
    path = WORKFLOW_DIR / name
    try:
        return str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


CLAIMS_FILE = workflow_file("config/claims.yaml")
REFERENCE_DIR = workflow_file("reference")  # the committed reference results (reference/README.md)


def regime_measurement_inputs():
    """The committed GPU regime measurements the 7B memory claim's regimes table reads: adding one re-runs the report."""
    from amprepro.analysis.regimes import measurement_files

    return [workflow_file(f"results-reference/regimes/{path.name}") for path in measurement_files()]


wildcard_constraints:
    model="[A-Za-z0-9_]+",
    precision="|".join(RUNS["precisions"]),
    seed=r"\d+",


def largest_batch_outputs():
    return [f"results/largest_batch/{c['model']}/{c['precision']}.json" for c in SEARCHES]


def run_outputs(name):
    """Paths of one output file for every cell of the matrix."""
    return [str(CellId.of(c).path / name) for c in CELLS]


def pipeline_outputs():
    """Every file the report and the verify gate rest on, as inputs of `rule all` (make run). Snakemake (since
    7.7) re-makes a missing file only when a job that needs it must run anyway: a deleted cell, plan, apex or sanity
    record under a report that is still there was never re-made, and the report kept the numbers of cells that no
    longer existed. As inputs of the target, each is re-made when it is missing, and everything after it runs again
    (the checkpoints then re-judge the cells by their views, so a re-made plan or sanity record with the same content
    re-runs no cell)."""
    return [
        "results/environment/environment.json",
        "results/apex/build.json",
        "results/apex/apex.json",
        "results/apex/runs.json",
        "results/sanity/sanity.json",
        "results/sanity/verdicts.json",
        "results/plan/plan.json",
        *expand("results/plan/models/{model}.json", model=sorted(RUNS["models"])),
        "results/peak/peak.json",
        *run_outputs("metrics.json"),
        *run_outputs("steps.csv"),
        *largest_batch_outputs(),
        "results/summary/summary.csv",
        "results/summary/summary.json",
    ]


def model_of(wildcards):
    return RUNS["models"][wildcards.model]


def gpus_for_cell(wildcards):
    """GPUs per node the cell's job takes (Slurm: --gpus, or --gres=gpu:N per node for a multi-node cell). On this
    machine (gpu: auto) never more than it has: Snakemake would refuse the whole run; the launcher then writes the
    cell as skipped, with the reason, before any worker starts."""
    wanted = cell_resources.gpus_per_node(model_of(wildcards), bool(GPUS))
    return min(wanted, len(GPUS)) if config.get("gpu", "auto") == "auto" else wanted


def single_node_gpus(wildcards):
    """`gpu` (--gpus=N per job, with the profile's gpu_model): single-node cells only."""
    return gpus_for_cell(wildcards) if cell_resources.nodes(model_of(wildcards)) == 1 else 0


def per_node_gres(wildcards):
    """`gres` (--gres=gpu:N, per node): multi-node cells, whose GPUs Slurm must split evenly over the nodes."""
    multi_node = cell_resources.nodes(model_of(wildcards)) > 1 and gpus_for_cell(wildcards)
    return f"gpu:{gpus_for_cell(wildcards)}" if multi_node else ""


def shares_gpu(wildcards):
    """Whether this cell runs on a GPU shared with other untimed cells (amprepro.plan.resources.shares_gpu): on this
    machine only, where gpuslots hands out the GPUs (a cluster job gets its own; a gpu=0 job there would get none)."""
    return sharing_here() and cell_resources.shares_gpu(spec_record(wildcards))


def gpu_share_for_cell(wildcards):
    """`gpu_share` (amprepro.env.launch sets its total to CELLS_PER_SHARED_GPU x GPUs): one for a cell that shares a
    GPU, a whole GPU's worth for a timed one, so that nothing shares a GPU with it; none for a CPU job."""
    if shares_gpu(wildcards):
        return 1
    return whole_gpu_share() * single_node_gpus(wildcards)


def gpus_for_train(wildcards):
    """`gpu` of a train job: none for a cell that shares a GPU (gpu_share counts it)."""
    return 0 if shares_gpu(wildcards) else single_node_gpus(wildcards)


def threads_for_cell(wildcards):
    if not GPUS:
        return 1
    return cell_resources.shared_threads() if shares_gpu(wildcards) else cell_resources.CPUS_PER_GPU


def gpuslots_for_cell(wildcards):
    """amprepro.gpuslots' options besides --gpus (one string, from a constant): --shared K for a cell that shares
    a GPU, else none."""
    return untimed_gpuslots() if shares_gpu(wildcards) else ""  # shares_gpu holds only where sharing_here()


def cpus_per_gpu_for_cell(wildcards):
    return cell_resources.cpus_per_gpu(model_of(wildcards), bool(GPUS))


def nodes_for_cell(wildcards):
    return cell_resources.nodes(model_of(wildcards))


def mem_mb_for_cell(wildcards):
    return cell_resources.host_mb(model_of(wildcards), bool(GPUS))


def runtime_for_cell(wildcards):
    train = spec_record(wildcards).train
    return cell_resources.runtime_minutes(model_of(wildcards), train, RUNTIME_FACTOR)


def launch_for_cell(wildcards):
    """amprepro.plan.launcher's arguments: processes per node, nodes, and whether they need CUDA devices."""
    model = model_of(wildcards)
    return [
        "--per-node",
        str(cell_resources.processes_per_node(model)),
        "--nodes",
        str(cell_resources.nodes(model)),
        "--device",
        "cuda" if GPUS else "cpu",
    ]


def train_inputs(wildcards):
    """The sanity gate (the cell never reads it), its model's view of the memory plan, and apex's view only for a cell
    that uses apex: the others start without waiting for the apex build."""
    inputs = {"sanity": "results/sanity/verdicts.json", "plan": f"results/plan/models/{wildcards.model}.json"}
    view = spec_record(wildcards).apex_view  # the full build's, or the shell's (apex_build)
    if view:
        inputs["apex"] = view
    return inputs


def spec_record(wildcards):
    """The cell's CellSpec, read where the DAG needs its settings (no JSON round trip inside this process)."""
    return cell_spec(RUNS, wildcards.model, wildcards.precision, wildcards.seed)


def spec_for_cell(wildcards):
    """The cell's spec as JSON: what its command line carries (--spec)."""
    return spec_record(wildcards).to_json()


def largest_batch_inputs(wildcards):
    seed = next(c["seed"] for c in SEARCHES if c["model"] == wildcards.model)
    inputs = {
        "cell": str(CellId(wildcards.model, wildcards.precision, seed).path / "metrics.json"),
        "plan": f"results/plan/models/{wildcards.model}.json",
    }
    view = cell_spec(RUNS, wildcards.model, wildcards.precision, seed).apex_view
    if view:
        inputs["apex"] = view
    return inputs


def search_seconds(wildcards):
    """This search's share of runs.largest_batch.seconds (a baseline's search counts two shares)."""
    return largest_batch_seconds(SEARCHES, LARGEST_BATCH.get("seconds", 60), wildcards.precision)


def largest_batch_spec(wildcards):
    seed = next(c["seed"] for c in SEARCHES if c["model"] == wildcards.model)
    return cell_spec_json(RUNS, wildcards.model, wildcards.precision, seed)

"""The Snakemake command line the launcher (amprepro.env.launch) builds from the environment the Makefile exports:
CORES, SNAKEMAKE_ARGS (split like a shell would split it, but never run through one), AMPREPRO_GPU_COUNT and the
resources that share the GPUs out; each malformed setting refused with its name and the fix, before anything runs."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

from amprepro.env import cpushare
from amprepro.gpuslots import STAGE_ENV, gpu_count
from amprepro.plan.resources import CELLS_PER_SHARED_GPU, CPUS_PER_GPU, apex_build_threads

CORES_PATTERN = re.compile(r"all|[1-9][0-9]*")
COUNT_PATTERN = re.compile(r"[0-9]+")
CORES_OPTIONS = ("--cores", "-c", "--jobs", "-j")
RESOURCES_OPTIONS = ("--resources", "--res")
PROFILE_OPTIONS = ("--profile", "--workflow-profile")
DIRECTORY_OPTIONS = ("--directory", "-d")
# Jobs that would not run here in the launcher's Python: the cell server would only refuse them, one by one.
# Options under which jobs may run on another host or in a container, with another view of the GPUs than this process
ELSEWHERE_OPTIONS = ("--sdm", "--software-deployment-method", "--executor", "-e", "--use-singularity",
                     "--use-apptainer", *PROFILE_OPTIONS)
NOT_LOCAL_PYTHON_OPTIONS = ("--use-conda", *ELSEWHERE_OPTIONS)
# Runs in which no job runs at all: a server would import torch and the model libraries for nothing (on 2 CPU cores,
# more CPU than the dry run itself).
NO_JOB_OPTIONS = ("-n", "--dry-run", "--dryrun", "--version", "-v")
GATE_TARGETS = ("verify",)  # make verify's: the verdict from results/verify/verify.json


class SettingError(ValueError):
    """A setting is malformed; the message names it and the fix."""


def user_args(env: dict) -> list[str]:
    try:
        return shlex.split(env.get("SNAKEMAKE_ARGS", ""))
    except ValueError as exc:
        raise SettingError(f"SNAKEMAKE_ARGS cannot be split into arguments ({exc}); quote values as in a shell, "
                           "e.g. SNAKEMAKE_ARGS=\"--config 'preset=smoke'\"") from None


def check_config_files(extra: list[str]) -> None:
    """Read every --configfile in SNAKEMAKE_ARGS as amprepro does, before Snakemake does: Snakemake gives no line for
    a YAML error and evaluates a file that sets __use_yte__ as a template that runs Python."""
    from amprepro.config import ConfigError, read_config_file

    index = option_index(extra, ("--configfile", "--configfiles"))
    if index is None:
        return
    inline = extra[index].partition("=")[2]
    for path in [inline] if inline else extra[index + 1:]:
        if path.startswith("-"):
            break
        try:
            read_config_file(path)
        except ConfigError as exc:
            raise SettingError(f"SNAKEMAKE_ARGS --configfile: {exc}") from None


CONFIG_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def option_values(args: list[str], names: tuple[str, ...]) -> list[str]:
    """The words an option takes: `--config a=1 b=2` or `--config=a=1`, up to the next word that starts with '-'."""
    index = option_index(args, names)
    if index is None:
        return []
    inline = args[index].partition("=")[2] if args[index].startswith("--") and "=" in args[index] else ""
    if inline:
        return [inline]
    values = []
    for arg in args[index + 1:]:
        if arg.startswith("-"):
            break
        values.append(arg)
    return values


def nested_form(key: str, value: str) -> str:
    """`runs.seeds=0` as the form Snakemake reads: `runs={seeds: 0}` (a YAML mapping per dot)."""
    top, *inner = key.split(".")
    for name in reversed(inner):
        value = f"{{{name}: {value}}}"
    return f"{top}={value}"


def check_config_values(extra: list[str]) -> None:
    """Snakemake's --config takes NAME=VALUE with a top-level NAME; `runs.seeds=abc`, the dotted form people try
    first, ends in a traceback from Snakemake's parser with no hint. Refused here, with the form that works."""
    for word in option_values(extra, ("--config", "-C")):
        key, equals, value = word.partition("=")
        if not equals:
            raise SettingError(f"SNAKEMAKE_ARGS --config {word!r}: a config value is NAME=VALUE, e.g. "
                               "--config preset=smoke")
        if not CONFIG_KEY.fullmatch(key):
            dotted = all(CONFIG_KEY.fullmatch(part) for part in key.split("."))
            form = shlex.quote(nested_form(key, value)) if dotted else "'runs={seeds: [0, 1]}'"
            raise SettingError(f"SNAKEMAKE_ARGS --config {word!r}: Snakemake's --config sets top-level keys only "
                               f"({key!r} is not one). Write a nested value as YAML: --config {form} "
                               "(or put it in a file given with --configfile; docs/config.md)")


def core_count(cores: str) -> int:
    """A cores_setting value as a number ('all': the usable CPUs)."""
    return len(cpushare.usable_cpus()) if cores == "all" else int(cores)


def cores_setting(env: dict) -> tuple[str, str]:
    """(value for --cores, where it came from)."""
    cores = env.get("CORES", "").strip()
    if not cores:
        return str(len(cpushare.usable_cpus())), "all usable"
    if not CORES_PATTERN.fullmatch(cores):
        raise SettingError(f"CORES={cores!r} is not a whole number above 0 or 'all'; e.g. make run CORES=8, "
                           "or leave it out to use every core")
    return cores, "CORES"


def gpus_to_share(env: dict) -> tuple[int, str]:
    """(GPU count, where it came from)."""
    wanted = env.get("AMPREPRO_GPU_COUNT", "").strip()
    if wanted:
        if not COUNT_PATTERN.fullmatch(wanted):
            raise SettingError(f"AMPREPRO_GPU_COUNT={wanted!r} is not a whole number; set it to the number of GPUs "
                               "the pipeline may use, or unset it to use every GPU nvidia-smi lists")
        return int(wanted), "AMPREPRO_GPU_COUNT"
    return gpu_count(env), "nvidia-smi -L"


def option_index(args: list[str], names: tuple[str, ...]) -> int | None:
    for index, arg in enumerate(args):
        if arg in names or arg.startswith(tuple(f"{name}=" for name in names if name.startswith("--"))):
            return index
    return None


def resource_values(args: list[str], index: int) -> list[str]:
    """The NAME=VALUE words that follow --resources at args[index]."""
    values = []
    for arg in args[index + 1:]:
        if arg.startswith("-") or "=" not in arg:
            break
        values.append(arg)
    return values


def user_resource(extra: list[str], name: str) -> str | None:
    """The value SNAKEMAKE_ARGS' --resources gives `name`, or None."""
    index = option_index(extra, RESOURCES_OPTIONS)
    values = resource_values(extra, index) if index is not None else []
    return next((value.partition("=")[2] for value in values if value.startswith(f"{name}=")), None)


def user_sets_gpu(extra: list[str]) -> bool:
    return user_resource(extra, "gpu") is not None


def with_resources(extra: list[str], added: list[str]) -> tuple[list[str], list[str]]:
    """(arguments to add, user arguments) so that the NAME=VALUE words `added` are among the resources. Snakemake
    keeps only the last --resources, so a user's own --resources (mem_mb=...) gets them added rather than a second
    --resources."""
    if any(arg.startswith(("--resources=", "--res=")) for arg in extra):
        raise SettingError("SNAKEMAKE_ARGS: write --resources NAME=VALUE ... with a space, not --resources=...")
    if not added:
        return [], extra
    index = option_index(extra, RESOURCES_OPTIONS)
    if index is None:
        return ["--resources", *added], extra
    return [], [*extra[:index + 1], *added, *extra[index + 1:]]


def with_gpu_resource(extra: list[str], gpus: int) -> tuple[list[str], list[str]]:
    """with_resources for gpu=<gpus> and, unless the user sets it, gpu_share: CELLS_PER_SHARED_GPU per GPU (a timed
    job takes a GPU's worth, a cell that shares a GPU one: amprepro.plan.resources.shares_gpu)."""
    share = [] if user_resource(extra, "gpu_share") is not None else [f"gpu_share={CELLS_PER_SHARED_GPU * gpus}"]
    return with_resources(extra, [f"gpu={gpus}", *share])


def gpu_share_for_users_gpus(extra: list[str]) -> tuple[list[str], list[str]]:
    """The user sets gpu=M: gpu_share follows M (unless set too), so that the cells that share a GPU are counted."""
    gpus = user_resource(extra, "gpu")
    if user_resource(extra, "gpu_share") is not None or not COUNT_PATTERN.fullmatch(gpus or ""):
        return with_resources(extra, [])  # Snakemake itself refuses a gpu that is not a number
    return with_resources(extra, [f"gpu_share={CELLS_PER_SHARED_GPU * int(gpus)}"])


def stages_cells(env: dict, extra: list[str]) -> bool:
    """Whether a timed cell may start while another trains, build its model on the CPU and then wait for the GPU
    (amprepro.gpuslots --defer; issue 40: about a second of each cell's start-up, hidden behind the cell before). Only
    where the launcher sets the cores and GPU resources itself, for one GPU that the jobs here share through
    amprepro.gpuslots' locks (no CUDA_VISIBLE_DEVICES set, no --config gpu=false or gpu=true), on enough cores
    that the apex build runs beside the cells (16 or more: amprepro.plan.resources.apex_build_threads; on fewer it
    takes every core, and a waiting cell's cores counted on top would let a cell run beside it), and not where
    AMPREPRO_STAGE_CELLS=0. Snakemake then counts one more GPU job and its CPUS_PER_GPU cores: the cell that waits."""
    setting = env.get(STAGE_ENV, "").strip()
    if setting not in ("", "0", "1"):
        raise SettingError(f"{STAGE_ENV}={setting!r}: set it to 0 to start each timed cell only once the GPU is free, "
                           "or leave it unset")
    if setting == "0" or not jobs_see_our_gpus(extra):
        return False
    if option_index(extra, CORES_OPTIONS) is not None or user_sets_gpu(extra):
        return False
    # a GPU a scheduler or the user chose: gpuslots hands out no locks there, and only Snakemake's count (gpu=1) keeps
    # the timed jobs apart
    if env.get("CUDA_VISIBLE_DEVICES") is not None:
        return False
    # --config gpu=false (CPU cells on a GPU machine) or gpu=true (GPU nodes elsewhere): no GPU here to stage for
    if any(word.partition("=")[0] == "gpu" and word.partition("=")[2].strip().lower() not in ("", "auto")
           for word in option_values(extra, ("--config", "-C"))):
        return False
    if user_resource(extra, "gpu_share") is not None:
        return False
    cores = core_count(cores_setting(env)[0])
    return apex_build_threads(cores, 1) < cores and gpus_to_share(env)[0] == 1


def snakemake_command(targets: list[str], env: dict) -> tuple[list[str], str]:
    """The Snakemake command line and one line saying what it uses. Raises SettingError before anything runs."""
    extra = user_args(env)
    command = [sys.executable, "-m", "snakemake", *targets]
    if option_index(extra, PROFILE_OPTIONS) is not None:
        return [*command, "--rerun-incomplete", *extra], "cores and resources as the profile in SNAKEMAKE_ARGS sets"
    said = []
    staged = stages_cells(env, extra)
    if option_index(extra, CORES_OPTIONS) is None:
        cores, source = cores_setting(env)
        if staged:  # the waiting cell's cores on top: it builds its model (a second or so), then only waits
            cores = str(core_count(cores) + CPUS_PER_GPU)
            source += f", and {CPUS_PER_GPU} for the cell that waits for the GPU"
        command += ["--cores", cores]
        said.append(f"{cores} cores ({source})")
    else:
        said.append("cores as SNAKEMAKE_ARGS sets")
    if user_sets_gpu(extra):
        added, extra = gpu_share_for_users_gpus(extra)
        command += added
        said.append("GPUs as SNAKEMAKE_ARGS sets")
    elif (found := gpus_to_share(env))[0]:
        added, extra = with_gpu_resource(extra, found[0] * (2 if staged else 1))
        command += added
        said.append(f"{found[0]} GPU(s) ({found[1]})"
                    + (": the next timed cell builds its model while one trains" if staged else ""))
    else:
        said.append(f"no GPU (none listed by {found[1]})")
    return [*command, "--rerun-incomplete", *extra], ", ".join(said)


def jobs_see_our_gpus(extra: list[str]) -> bool:
    """Whether the jobs run on this host and see its GPUs as this process does (a conda env does; an executor, a
    profile or a container may not)."""
    return option_index(extra, ELSEWHERE_OPTIONS) is None


def serves_cells(extra: list[str], targets: list[str] = ()) -> bool:
    """Whether the cells run here, in this Python: only then does a cell server (amprepro.plan.cellserver) help. Not
    for `make verify` (the targets GATE_TARGETS only): it runs cells only where some are missing, and those start
    fresh interpreters; a server would import torch for nothing (seconds on a GPU box) before the verdict."""
    gate_only = bool(targets) and set(targets) <= set(GATE_TARGETS)
    return (option_index(extra, NOT_LOCAL_PYTHON_OPTIONS) is None and option_index(extra, NO_JOB_OPTIONS) is None
            and not gate_only)


def workdir_of(env: dict) -> Path:
    extra = user_args(env)
    index = option_index(extra, DIRECTORY_OPTIONS)
    if index is None:
        return Path.cwd()
    value = extra[index].partition("=")[2] if "=" in extra[index] else (extra[index + 1:] or [""])[0]
    return Path(value).resolve()

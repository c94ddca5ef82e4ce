"""What the offline `--use-conda` test runs and checks, apart from pytest: the workflow copy, the test env files, the
conda stand-in, and the assertion that every job ran inside its Snakemake-created env (see docs/conda.md)."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / "tools" / "conda-offline"
STANDIN_VENV = REPO / "vendor" / "conda-offline" / "venv"  # made by .ci/setup/30-conda.sh; /vendor/ is gitignored
ENVS_RUN_HERE = ("train.yaml", "report.yaml")  # what a CPU machine uses; envs/train-gpu.yaml needs a GPU box
NOT_COPIED = {".git", ".venv", "vendor", "results", ".snakemake", ".pytest_cache", "__pycache__", ".whl", ".gl",
              "tests", "tools", "docs"}


# ------------------------------------------------------------------------------------------------------ stand-in
@dataclass
class Standin:
    base: Path  # the conda "base prefix": bin/conda (stand-in), bin/activate, channels/, envs/, pkgs/
    venv: Path

    @property
    def channel(self) -> Path:
        return self.base / "channels" / "conda-forge"

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a user with this conda first on PATH and the project's venv activated."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("CONDA", "AMPREPRO_", "SNAKEMAKE_")) and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env["PATH"] = os.pathsep.join([str(self.base / "bin"), str(Path(sys.executable).parent), env.get("PATH", "")])
        env.update(extra)
        return env


def _run(command: list[str], **kwargs) -> None:
    done = subprocess.run(command, capture_output=True, text=True, **kwargs)
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(command)} failed ({done.returncode}):\n"
                             f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}")


def install_standin(base: Path) -> Standin:
    _run(["bash", str(TOOLS / "setup.sh"), "--venv", str(STANDIN_VENV), "--base", str(base)],
         env={**os.environ, "PYTHON": sys.executable})
    return Standin(base, STANDIN_VENV)


def build_channel(standin: Standin, names: list[str]) -> None:
    """The local conda-forge: python from this interpreter's base install (with the probe), and the packages named in
    the env files, repackaged from this interpreter's environment (the project's .venv) with their closure."""
    _run([str(standin.venv / "bin" / "python"), str(TOOLS / "mkchannel.py"), str(standin.channel),
          "--python-prefix", sys.base_prefix, "--site-packages", sysconfig.get_paths()["purelib"], "--probe", *names],
         env={**os.environ, "PATH": f"{standin.venv / 'bin'}{os.pathsep}{os.environ['PATH']}"})


# --------------------------------------------------------------------------------------------- workflow + env files
def copy_workflow(dest: Path) -> Path:
    """What a clone holds, minus tests and tooling, with no results and no .snakemake."""
    dest.mkdir(parents=True)
    for entry in REPO.iterdir():
        if entry.name in NOT_COPIED:
            continue
        if entry.is_dir():
            shutil.copytree(entry, dest / entry.name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(entry, dest / entry.name)
    for pin in (dest / "envs").glob("*.pin.txt"):  # real pin files name conda-forge URLs this test cannot fetch
        pin.unlink()
    return dest


def env_specs(env_file: Path) -> list[str]:
    return [str(spec) for spec in yaml.safe_load(env_file.read_text())["dependencies"]]


def spec_name(spec: str) -> str:
    return re.split(r"[=<>!~ ]", spec, maxsplit=1)[0]


def offline_env(env_file: Path, channel: Path) -> str:
    """The env file as the test uses it: the same channels and the same packages, each pinned to the version the local
    channel has (the donor venv's), with the build selector kept. Fails if the channel lacks a package."""
    repodata = json.loads((channel / "linux-64" / "repodata.json").read_text())
    local = {r["name"]: r for r in {**repodata.get("packages", {}), **repodata.get("packages.conda", {})}.values()}
    env = yaml.safe_load(env_file.read_text())
    pinned = []
    for spec in env["dependencies"]:
        name = spec_name(spec)
        if name not in local:
            raise AssertionError(f"{env_file.name} names {name}, which the offline test channel does not provide")
        parts = spec.split("=")
        build = f"={parts[2]}" if len(parts) == 3 else ""
        pinned.append(f"{name}={local[name]['version']}{build}")
    env["dependencies"] = pinned
    header = (f"# TEST COPY of envs/{env_file.name} (tests/conda): same channels and packages, versions of the local\n"
              "# offline channel, served by the rattler-backed conda stand-in.\n")
    return header + yaml.safe_dump(env, sort_keys=False)


# -------------------------------------------------------------------------------------- did every job run in its env
@dataclass
class Job:
    rule: str
    outputs: list[str]
    env: str | None = None  # as Snakemake logs it: .snakemake/conda/<hash>_
    starts: list[dict] = field(default_factory=list)


def jobs_in_log(log: str) -> list[Job]:
    """The jobs a Snakemake log announces, with their outputs and the conda env Snakemake activated for each."""
    jobs: list[Job] = []
    for line in log.splitlines():
        if match := re.match(r"^(?:local)?(?:rule|checkpoint) (\w+):$", line):
            jobs.append(Job(match.group(1), []))
        elif jobs and (match := re.match(r"^\s+output: (.*)$", line)):
            jobs[-1].outputs = [path.strip() for path in match.group(1).split(",")]
        elif jobs and (match := re.match(r"^Activating conda environment: (\S+)$", line)):
            jobs[-1].env = match.group(1)
    return jobs


def read_probe(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# The options the rules' commands name an output with; a path after any other option is something read (verify_compare
# reads --summary and --sanity, the files of the jobs before it).
OUTPUT_OPTIONS = ("--out", "--csv", "--json", "--executed", "--html", "--metrics", "--steps", "--views")


def writes(argv: list[str], outputs: list[str]) -> bool:
    """Whether this python's command line writes one of the job's outputs."""
    return any(value in outputs and option in OUTPUT_OPTIONS for option, value in itertools.pairwise(argv))


def isolation_problems(workdir: Path, jobs: list[Job], starts: list[dict]) -> list[str]:
    """Every job with outputs must have activated a .snakemake/conda/<hash>_ env, and its python must have started
    from that env (the probe logs only interpreters of the test channel's python, i.e. of conda envs). A job that ran in
    the launching venv or on the system python leaves no probe line and is reported."""
    problems = []
    conda_dir = (workdir / ".snakemake" / "conda").resolve()
    for job in jobs:
        if not job.outputs:
            continue  # the target rule `all`
        if job.env is None:
            problems.append(f"{job.rule} {job.outputs[0]}: Snakemake activated no conda env")
            continue
        env = (workdir / job.env).resolve()
        if env.parent != conda_dir or not re.fullmatch(r"[0-9a-f]{32}_", env.name):
            problems.append(f"{job.rule}: env {job.env} is not a .snakemake/conda/<hash>_ env")
        job.starts = [s for s in starts if writes(s["argv"], job.outputs)]
        if not job.starts:
            problems.append(f"{job.rule} {job.outputs[0]}: no python of a conda env ran it (ran outside its env?)")
        for start in job.starts:
            if Path(start["prefix"]).resolve() != env or not start["executable"].startswith(str(env) + os.sep) \
                    or Path(start["conda_prefix"] or "/").resolve() != env:
                problems.append(f"{job.rule} {job.outputs[0]}: python {start['executable']} (sys.prefix "
                                f"{start['prefix']}, CONDA_PREFIX {start['conda_prefix']}) is not env {env}")
            if start["snakemake_importable"]:
                problems.append(f"{job.rule}: snakemake was importable inside the env, so it saw the launcher's venv")
    return problems

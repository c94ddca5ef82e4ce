"""A rattler-backed STAND-IN for the `conda` command line. For testing only; it is not conda.

It exists so that amprepro's CI can run `snakemake --use-conda` for real on a machine with no conda and no access to
conda channels. It implements just the conda commands that Snakemake 9 (`snakemake/deployment/conda.py`), snakedeploy
(`pin-conda-envs`) and amprepro (`environment` stage, `condacheck`) call, with py-rattler as the solver and installer:

    conda --version                          (reports 24.7.1, Snakemake's minimum, or $CONDA_STANDIN_REPORTED_VERSION)
    conda info [--json]
    conda config --get [KEY ...] [--json]
    conda env create --file ENV.yaml (--prefix P | --name N)
    conda create [--dry-run] [--json] (--prefix P | --name N) [--file SPECS_OR_EXPLICIT] [-c CH] [SPEC ...]
    conda list [--explicit] [--md5] [--json] (--prefix P | --name N)
    conda env remove (--prefix P | --name N)
    conda clean [--tarballs] [--packages]

Its base directory ("conda prefix") is the folder above bin/conda. It holds bin/activate (the script Snakemake sources
before every job), .condarc, envs/ and pkgs/. Channel names resolve through `channel_alias` in .condarc, as they do in
real conda, so `channels: [conda-forge]` in an env file finds a local file:// channel named conda-forge.
It never touches the network unless a channel URL points there. `pip:` sections are refused (amprepro has none).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
from pathlib import Path

import yaml

BASE = Path(os.environ.get("CONDA_STANDIN_BASE") or Path(__file__).resolve().parent.parent)
REPORTED_VERSION = os.environ.get("CONDA_STANDIN_REPORTED_VERSION", "24.7.1")
PLATFORM = "linux-64"
BANNER = "rattler-backed stand-in for the conda CLI, for testing only (tools/conda-offline)"


class StandinError(Exception):
    """A failure reported the way conda reports one: a named exception and a message, exit status 1."""

    def __init__(self, name: str, message: str):
        super().__init__(message)
        self.name, self.message = name, message


def condarc() -> dict:
    path = BASE / ".condarc"
    rc = (yaml.safe_load(path.read_text()) if path.exists() else None) or {}
    rc.setdefault("channel_alias", f"file://{BASE}/channels/")
    rc.setdefault("channels", ["conda-forge"])
    rc.setdefault("channel_priority", "strict")
    return rc


def target_prefix(args) -> Path:
    if args.prefix:
        return Path(args.prefix).expanduser().absolute()
    if args.name:
        return BASE if args.name == "base" else BASE / "envs" / args.name
    raise StandinError("ArgumentError", "one of --prefix or --name is required")


def existing_prefix(args) -> Path:
    prefix = target_prefix(args)
    if not (prefix / "conda-meta").is_dir():
        raise StandinError("EnvironmentLocationNotFound", f"Not a conda environment: {prefix}")
    return prefix


# ------------------------------------------------------------------------------------------------ solving, installing
def channels(names: list[str]):
    from rattler import Channel, ChannelConfig

    config = ChannelConfig(channel_alias=condarc()["channel_alias"])
    return [Channel(name, config) for name in names if name != "nodefaults"]


async def solve(channel_names: list[str], specs: list[str]):
    import rattler

    try:
        match_specs = [rattler.MatchSpec(spec, strict=False) for spec in specs]  # conda's own lenient syntax
    except Exception as exc:
        raise StandinError("InvalidMatchSpec", str(exc)) from exc
    try:
        return await rattler.solve(channels(channel_names), match_specs, platforms=[PLATFORM, "noarch"],
                                   virtual_packages=rattler.VirtualPackage.detect(),
                                   channel_priority=rattler.ChannelPriority.Strict)
    except Exception as exc:  # rattler's SolverError / GatewayError: conda calls these unsatisfiable / not found
        name = "PackagesNotFoundError" if "No candidates" in str(exc) else "UnsatisfiableError"
        raise StandinError(name, f"{type(exc).__name__}: {exc}") from exc


async def install(records, prefix: Path) -> None:
    import rattler

    await rattler.install(records, target_prefix=str(prefix), cache_dir=str(BASE / "pkgs"), show_progress=False,
                          execute_link_scripts=False)
    for record in records:
        print(f"  + {record.name.normalized} {record.version} {record.build}")


def explicit_records(path: Path):
    """The records an explicit (pin) file lists, looked up in the local channels' repodata; no download."""
    from urllib.parse import unquote, urlparse

    from rattler import Channel, RepoData
    from rattler.explicit_environment import ExplicitEnvironmentSpec

    records, indexes = [], {}
    for package in ExplicitEnvironmentSpec.from_path(path).packages:
        url = urlparse(package.url.split("#", 1)[0])
        if url.scheme != "file":
            raise StandinError("CondaHTTPError", f"this offline stand-in cannot download {package.url}")
        archive = Path(unquote(url.path))
        repodata = archive.parent / "repodata.json"
        if not repodata.exists():
            raise StandinError("PackagesNotFoundError", f"{archive} is not in an indexed channel")
        if repodata not in indexes:
            channel = Channel(f"file://{archive.parent.parent}/")
            indexes[repodata] = {r.file_name: r for r in RepoData.from_path(repodata).into_repo_data(channel)}
        if archive.name not in indexes[repodata]:
            raise StandinError("PackagesNotFoundError", f"{archive.name} is not listed in {repodata}")
        records.append(indexes[repodata][archive.name])
    return records


# --------------------------------------------------------------------------------------------------------- commands
def cmd_info(args) -> dict | None:
    rc = condarc()
    envs = sorted(str(p) for p in (BASE / "envs").glob("*") if (p / "conda-meta").is_dir())
    info = {"conda_version": REPORTED_VERSION, "conda_prefix": str(BASE), "root_prefix": str(BASE),
            "platform": PLATFORM, "channels": rc["channels"], "channel_alias": rc["channel_alias"],
            "envs_dirs": [str(BASE / "envs")], "pkgs_dirs": [str(BASE / "pkgs")], "envs": [str(BASE), *envs],
            "active_prefix": os.environ.get("CONDA_PREFIX"), "sys.version": sys.version, "standin": BANNER}
    if args.json:
        return info
    for key, value in info.items():
        print(f"{key:>20} : {value}")
    return None


def cmd_config(args) -> dict | None:
    rc = condarc()
    if args.get is None:
        raise StandinError("NotImplementedError", "this stand-in supports only `conda config --get`")
    keys = args.get or list(rc)
    found = {key: rc[key] for key in keys if key in rc}
    if args.json:
        return {"get": found, "rc_path": str(BASE / ".condarc"), "success": True, "warnings": []}
    for key, value in found.items():
        print(f"--set {key} {value}")
    return None


def cmd_env_create(args) -> None:
    prefix = target_prefix(args)
    if (prefix / "conda-meta").exists():
        raise StandinError("CondaValueError", f"prefix already exists: {prefix}")
    env = yaml.safe_load(Path(args.file).read_text()) or {}
    specs = env.get("dependencies") or []
    if any(isinstance(spec, dict) for spec in specs):
        raise StandinError("NotImplementedError", f"{args.file}: `pip:` sections are not supported by this stand-in")
    records = asyncio.run(solve(env.get("channels") or condarc()["channels"], [str(s) for s in specs]))
    asyncio.run(install(records, prefix))


def cmd_create(args) -> dict | None:
    prefix = target_prefix(args)
    specs = list(args.specs)
    if args.file:
        lines = [line.strip() for line in Path(args.file).read_text().splitlines()]
        if "@EXPLICIT" in lines:  # a pin file: install exactly these packages, no solve
            records = explicit_records(Path(args.file))
            if not args.dry_run:
                asyncio.run(install(records, prefix))
            return {"success": True, "dry_run": args.dry_run} if args.json else None
        specs += [line for line in lines if line and not line.startswith("#")]
    channel_names = list(args.channel) + ([] if args.override_channels else condarc()["channels"])
    records = asyncio.run(solve(channel_names, specs))
    if args.dry_run:
        if args.json:
            return {"success": True, "dry_run": True,
                    "actions": {"LINK": [{"name": r.name.normalized, "version": str(r.version), "build": str(r.build)}
                                         for r in records]}}
        print("DryRunExit: Dry run. Not exiting.")
        return None
    asyncio.run(install(records, prefix))
    return {"success": True, "prefix": str(prefix)} if args.json else None


def prefix_records(prefix: Path) -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted((prefix / "conda-meta").glob("*.json"))]


def cmd_list(args) -> list | None:
    records = prefix_records(existing_prefix(args))
    if args.explicit:
        print("# This file may be used to create an environment using:\n"
              "# $ conda create --name <env> --file <this file>"
              f"\n# platform: {PLATFORM}\n@EXPLICIT")
        for record in records:
            print(record["url"] + (f"#{record['md5']}" if args.md5 and record.get("md5") else ""))
        return None
    if args.json:
        return [{"name": r["name"], "version": r["version"], "build_string": r["build"],
                 "channel": r.get("channel", "")} for r in records]
    for record in records:
        print(f"{record['name']:<30}{record['version']:<16}{record['build']}")
    return None


def cmd_env_remove(args) -> None:
    shutil.rmtree(existing_prefix(args))


def cmd_clean(args) -> None:
    packages = BASE / "pkgs"
    if args.packages or args.all:
        shutil.rmtree(packages, ignore_errors=True)
    else:  # --tarballs, what Snakemake runs after each env
        for archive in [*packages.glob("*.conda"), *packages.glob("*.tar.bz2")]:
            archive.unlink()


# ------------------------------------------------------------------------------------------------------- argparse
def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="conda", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    top.add_argument("-V", "--version", action="store_true")
    sub = top.add_subparsers(dest="command")

    def command(subparsers, name, func, target=False, flags=()):
        p = subparsers.add_parser(name)
        p.set_defaults(func=func)
        if target:
            group = p.add_mutually_exclusive_group()
            group.add_argument("-p", "--prefix")
            group.add_argument("-n", "--name")
        for flag in ("--json", "-q", "--quiet", "-y", "--yes", *flags):
            p.add_argument(flag, action="store_true")
        return p

    command(sub, "info", cmd_info, flags=("-e", "--envs"))
    command(sub, "config", cmd_config).add_argument("--get", nargs="*")
    p = command(sub, "create", cmd_create, target=True,
                flags=("--dry-run", "-d", "--no-default-packages", "--override-channels", "--offline"))
    p.add_argument("-f", "--file")
    p.add_argument("-c", "--channel", action="append", default=[])
    p.add_argument("specs", nargs="*")
    command(sub, "list", cmd_list, target=True, flags=("--explicit", "--md5"))
    command(sub, "clean", cmd_clean, flags=("-t", "--tarballs", "--packages", "-a", "--all"))
    env = sub.add_parser("env").add_subparsers(dest="env_command", required=True)
    command(env, "create", cmd_env_create, target=True, flags=("--no-default-packages",)).add_argument(
        "-f", "--file", required=True)
    command(env, "remove", cmd_env_remove, target=True)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.version:
        print(f"conda {REPORTED_VERSION}")
        return 0
    if not args.command:
        parser().print_help()
        return 0
    try:
        result = args.func(args)
    except StandinError as exc:
        if getattr(args, "json", False):
            print(json.dumps({"exception_name": exc.name, "message": exc.message, "error": exc.message}))
        else:
            print(f"\n{exc.name}: {exc.message}\n", file=sys.stderr)
        return 1
    if result is not None:
        print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    status = main()
    # Leave without interpreter finalization: py-rattler's native runtime occasionally segfaults while Python tears
    # down after an install with a cold package cache (about 1 run in 10 here, always after the work was done).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)

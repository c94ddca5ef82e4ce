"""Read and check a config, resolve the run matrix: one validation pass before any job, field-naming messages.

  python -m amprepro.config check FILE [FILE ...]   # what `snakemake --configfile FILE ...` would run, run nothing
"""

from __future__ import annotations

import argparse
import sys

from amprepro.config.checks import check_apex_source
from amprepro.config.errors import ConfigError
from amprepro.config.matrix import cells
from amprepro.config.reading import read_config_file
from amprepro.config.runs import apex_required, gpus_for_jobs, resolve_runs
from amprepro.config.schema import REPO, validate_config
from amprepro.gpuslots import visible_gpus
from amprepro.presets import deep_merge


def checked(files: list[str], probe=visible_gpus) -> str:
    """What `snakemake --configfile FILES` would run, found without running anything; ConfigError otherwise."""
    config = read_config_file(REPO / "config" / "config.yaml")
    for path in files:
        config = deep_merge(config, read_config_file(path))
    config = validate_config(config)
    gpus, why = gpus_for_jobs(config.get("gpu", "auto"), probe)
    runs, choice = resolve_runs(config, REPO / "config" / "presets", gpus, why)
    check_apex_source(config["apex"], apex_required(config["apex"]["required"], gpus))
    return f"{', '.join(map(str, files))}: OK. {choice['reason']}; {len(cells(runs))} cells."


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m amprepro.config", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    checking = commands.add_parser("check", help="read and validate config files; nothing in them is run")
    checking.add_argument("files", nargs="+")
    args = parser.parse_args(argv)
    try:
        print(checked(args.files))
    except ConfigError as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return 1
    return 0

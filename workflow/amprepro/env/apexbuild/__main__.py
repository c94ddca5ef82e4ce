"""Command line: `export` a pinned apex commit into a checked plain directory; `build` outside Snakemake.

  python -m amprepro.env.apexbuild export --git-dir ~/src/apex/.git --ref 25.05 --dest vendor/apex-25.05
  python -m amprepro.env.apexbuild build --settings '{"required": true, "source": {...}}' --jobs 16
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from amprepro.env.apexbuild import ApexError, build_and_verify
from amprepro.env.apexbuild.source import export, export_marker


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m amprepro.env.apexbuild", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    exporting = commands.add_parser("export", help="git archive a ref into a directory and write its marker")
    exporting.add_argument("--git-dir", required=True)
    exporting.add_argument("--ref", required=True)
    exporting.add_argument("--dest", required=True, type=Path)
    building = commands.add_parser("build", help="build_and_verify with a settings JSON; prints the record")
    building.add_argument("--settings", required=True)
    building.add_argument("--jobs", type=int, default=1)
    building.add_argument("--results-dir", default="results/apex")
    args = parser.parse_args(argv)
    try:
        if args.command == "export":
            record = export(args.git_dir, args.ref, args.dest)
            print(f"exported {record['commit']} (tree {record['tree']}) to {args.dest}; "
                  f"marker {export_marker(args.dest)}")
        else:
            print(json.dumps(build_and_verify(json.loads(args.settings), args.jobs, args.results_dir), indent=2))
    except ApexError as exc:
        print(f"ERROR (apex): {exc}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()

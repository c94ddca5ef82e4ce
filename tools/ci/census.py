"""CPU seconds by kind of process from cpusample.py records, one column per file: only the processes started during
the run, and none of another worktree's mutation runs. Usage: python tools/ci/census.py A.json [B.json ...]"""

import collections
import json
import re
import sys

KINDS = [  # (kind, pattern of the command line), first match wins
    ("cell (launcher/train)", r"amprepro\.plan\.launcher|amprepro\.train\.train"),
    ("cellserver", r"amprepro\.plan\.cellserver"),
    ("snakemake job (Slurm's inner ones)", r"-m snakemake .*--target-jobs"),
    ("snakemake main", r"-m snakemake|snakemake\.cli| snakemake "),
    ("ipykernel (report notebook)", r"ipykernel"),
    ("pytest workers", r"pytest|exec\(eval\(sys\.stdin"),
    ("pip", r"\bpip\b"),
    ("the sampler", r"cpusample"),
]


def kind(record: dict) -> str:
    for name, pattern in KINDS:
        if re.search(pattern, record["cmd"]):
            return name
    found = re.search(r"amprepro\.([\w.]+)", record["cmd"])
    return f"amprepro.{found.group(1)}" if found else f"other: {record['comm']}"


def by_kind(path: str) -> collections.Counter:
    with open(path) as handle:
        records = [r for r in json.load(handle) if "mutmut" not in r["cmd"] and "/work/wt-" not in r["cwd"]]
    start = min(r["t0"] for r in records)
    totals = collections.Counter()
    for record in records:
        if record["t0"] > start + 1:  # started during the run: its whole CPU time is the run's
            totals[kind(record)] += record["cpu"]
    totals["TOTAL"] = sum(totals.values())
    return totals


def main() -> None:
    columns = {path: by_kind(path) for path in sys.argv[1:]}
    names = sorted(set().union(*columns.values()), key=lambda n: -max(c[n] for c in columns.values()))
    for name in names[:30]:
        print(f"{name:36s}", *(f"{columns[path][name]:8.1f}" for path in columns))


if __name__ == "__main__":
    main()

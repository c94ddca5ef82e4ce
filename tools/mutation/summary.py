"""The mutation run's counts per module (killed / survived / timed out / no tests), from mutmut's own results, written
into docs/mutation.md between its summary markers, with every survivor's name (`mutmut show NAME` gives its diff).

    .venv/bin/python tools/mutation/summary.py --doc docs/mutation.md --seconds 1234
    .venv/bin/python tools/mutation/summary.py --doc docs/mutation.md --module amprepro.verify.verify

With --module (repeatable) the table holds only those modules: the run was `mutmut_workflow.py run "<module>*"`, and
the other modules' mutants, not run, would read "not checked".
"""

from __future__ import annotations

import argparse
import collections
import datetime
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

HERE = Path(__file__).resolve().parent
START, END = "<!-- mutation-summary:start -->", "<!-- mutation-summary:end -->"
COLUMNS = ["killed", "survived", "timeout", "no tests", "not checked", "other"]


def module_of(key: str) -> str:
    """amprepro.analysis.claimmodels.x_evaluate_model__mutmut_3 -> amprepro.analysis.claimmodels
    (methods: xǁClassǁname)."""
    parts = key.split(".")
    for index, part in enumerate(parts):
        if part.startswith(("x_", "xǁ")):
            return ".".join(parts[:index])
    raise ValueError(f"not a mutmut mutant name: {key}")


def results() -> dict[str, str]:
    out = subprocess.run([sys.executable, str(HERE / "mutmut_workflow.py"), "results", "--all", "true"],
                         capture_output=True, text=True, check=True).stdout
    found = dict(re.findall(r"^\s+(\S+): (.+?)\s*$", out, re.M))
    if not found:
        raise SystemExit("no mutation results: run `make mutation` (mutmut run) first")
    return found


def table(found: dict[str, str], modules: list[str] | None = None) -> tuple[str, dict]:
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    survivors: dict[str, list[str]] = collections.defaultdict(list)
    for key, status in sorted(found.items()):
        module = module_of(key)
        if modules and module not in modules:
            continue
        column = status if status in COLUMNS else "other"
        counts[module][column] += 1
        if status != "killed":
            survivors[module].append(f"{key} ({status})")
    lines = ["| module | mutants | " + " | ".join(COLUMNS) + " | killed % |",
             "| --- | ---: | " + " | ".join("---:" for _ in COLUMNS) + " | ---: |"]
    for module, counter in sorted(counts.items()):
        total = sum(counter.values())
        lines.append(f"| `{module}` | {total} | " + " | ".join(str(counter[c]) for c in COLUMNS)
                     + f" | {100 * counter['killed'] / total:.1f} |")
    return "\n".join(lines), survivors


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--doc", required=True, type=Path)
    parser.add_argument("--seconds", type=float, help="how long `mutmut run` took")
    parser.add_argument("--module", action="append", help="only this module (repeatable), e.g. amprepro.verify.verify")
    args = parser.parse_args(argv)
    found = results()
    unknown = sorted(set(args.module or []) - {module_of(key) for key in found})
    if unknown:
        raise SystemExit(f"no mutants of {', '.join(unknown)}: name a module [tool.mutmut] in pyproject.toml mutates")
    text, survivors = table(found, args.module)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    took = f", `mutmut run` took {args.seconds:.0f} s" if args.seconds else ""
    which = f" of {', '.join(f'`{m}`' for m in args.module)}" if args.module else ""
    block = [START, f"Run{which} {when} at commit {commit} with mutmut {version('mutmut')}{took}:", "", text, "",
             "Every mutant not killed:", ""]
    for module, names in sorted(survivors.items()):
        block += [f"- `{module}`: " + ", ".join(f"`{n}`" for n in names)]
    block += [END]
    doc = args.doc.read_text() if args.doc.exists() else f"# Mutation testing\n\n{START}\n{END}\n"
    if START not in doc or END not in doc:
        raise SystemExit(f"{args.doc} has no {START} ... {END} markers")
    head, rest = doc.split(START, 1)
    args.doc.write_text(head + "\n".join(block) + rest.split(END, 1)[1])
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Mutation testing of the config schema's numeric bounds, which mutmut cannot mutate
(workflow/schemas/config.schema.yaml is YAML, not Python). Each bound (minimum, maximum, exclusiveMinimum,
exclusiveMaximum, minLength, maxLength, minItems, maxItems, minProperties, maxProperties, multipleOf) is changed one
at a time: one more, one less, inclusive made exclusive or the reverse (minimum <-> exclusiveMinimum, maximum <->
exclusiveMaximum), and removed. The mutated schema is written into a copy of the working tree and the bound tests
(tests/backbone/test_schema_bounds.py, all but the inventory, which would catch every mutant by comparing the table)
are run against it; a mutant is CAUGHT when a
test fails. Prints one line per mutant and the counts; exit status 1 when a mutant is MISSED.

    .venv/bin/python tools/mutation/schema_bounds.py            # about 160 mutants, a few minutes on 2 cores
    .venv/bin/python tools/mutation/schema_bounds.py --list     # the mutants only
"""

from __future__ import annotations

import argparse
import copy
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
SCHEMA = pathlib.Path("workflow/schemas/config.schema.yaml")
TESTS = ["tests/backbone/test_schema_bounds.py", "-k", "not inventory"]
KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength", "minItems",
            "maxItems", "minProperties", "maxProperties", "multipleOf")
SWAP = {"minimum": "exclusiveMinimum", "exclusiveMinimum": "minimum", "maximum": "exclusiveMaximum",
        "exclusiveMaximum": "maximum"}


def bounds(node, where=()):
    """(path of the node that holds it, keyword, value) for every numeric bound, in the file's order."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in KEYWORDS and isinstance(value, (int, float)) and not isinstance(value, bool):
                yield where, key, value
            else:
                yield from bounds(value, (*where, key))
    elif isinstance(node, list):
        for i, item in enumerate(node):
            yield from bounds(item, (*where, i))


def mutants(schema: dict):
    """(name, mutated schema) for each change of each bound."""
    for where, keyword, value in bounds(schema):
        changes = [(f"{keyword}: {value} -> {value + 1}", keyword, value + 1),
                   (f"{keyword}: {value} -> {value - 1}", keyword, value - 1)]
        if keyword in SWAP:
            changes.append((f"{keyword}: {value} -> {SWAP[keyword]}: {value}", SWAP[keyword], value))
        changes.append((f"{keyword}: {value} removed", None, None))
        for change, new_keyword, new_value in changes:
            mutated = copy.deepcopy(schema)
            node = mutated
            for key in where:
                node = node[key]
            # the same position in the mapping (the order does not matter to jsonschema; it keeps the dump readable)
            items = [(new_keyword, new_value) if key == keyword else (key, item) for key, item in node.items()]
            node.clear()
            node.update((key, item) for key, item in items if key is not None)
            yield f"{'/'.join(map(str, where))}: {change}", mutated


def run_tests(copy_root: pathlib.Path) -> tuple[bool, str]:
    """(whether a test failed, pytest's last line) for the schema now in copy_root."""
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-p", "no:randomly",
                           "-p", "no:xdist", *TESTS], cwd=copy_root, capture_output=True, text=True, timeout=600)
    last = ([line for line in done.stdout.splitlines() if " passed" in line or " failed" in line] or ["?"])[-1]
    return done.returncode != 0 and " failed" in last, last.strip("= ")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--list", action="store_true", help="print the mutants, run nothing")
    args = parser.parse_args(argv)
    schema = yaml.safe_load((REPO / SCHEMA).read_text())
    every = list(mutants(schema))
    if args.list:
        print("\n".join(name for name, _ in every))
        return 0
    caught = missed = 0
    with tempfile.TemporaryDirectory(prefix="amprepro-schema-mutants-") as tmp:
        root = pathlib.Path(tmp)
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
        for part in ("workflow", "tests", "config"):
            shutil.copytree(REPO / part, root / part, ignore=ignore, symlinks=True)
        shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
        target = root / SCHEMA
        # The unmutated schema through the same dump: the tests must pass on it, or no mutant says anything
        target.write_text(yaml.safe_dump(schema, sort_keys=False))
        failed, last = run_tests(root)
        if failed or " passed" not in last:
            print(f"the tests do not pass on the unmutated schema ({last}): fix them first", flush=True)
            return 2
        print(f"unmutated: {last}", flush=True)
        started = time.time()
        for name, mutated in every:
            target.write_text(yaml.safe_dump(mutated, sort_keys=False))
            failed, last = run_tests(root)
            caught += failed
            missed += not failed
            print(f"{'CAUGHT' if failed else 'MISSED'} | {name} | {last}", flush=True)
    print(f"{caught} of {caught + missed} schema-bound mutants caught, {missed} missed "
          f"({time.time() - started:.0f} s)", flush=True)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())

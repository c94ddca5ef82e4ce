"""Whether the apex records still describe files that exist, read when the workflow starts (workflow/rules/apex.smk).

results/apex/build.json names the build's cache entry (results/apex/build/<key>/, its wheel and manifest) and
results/apex/apex.json and runs.json the site dir the apex cells put first on sys.path (results/apex/site/<key>/).
Those folders are no outputs Snakemake knows: their key is known only once the build has run. When one is deleted
while the records stay, Snakemake sees nothing missing, and the apex cells fail with `ModuleNotFoundError: No module
named 'apex'`. So the start checks the records against the folders and, where one is gone, removes the records: the
run then builds the entry again (or takes it from the shared cache) and installs it, before any apex cell.

No torch, no Snakemake: this runs at DAG build time.
"""

from __future__ import annotations

import json
from pathlib import Path

# amprepro.env.apexbuild.install.STAMP: the file a finished install writes last (not imported: that would load the
# whole build package at every start; tests/backbone/test_reruns.py checks the two agree).
STAMP = ".amprepro-wheel-sha256"
# The records that describe one build, in the order the stages write them.
RECORDS = ("build.json", "apex.json", "runs.json")


def _record(path: Path) -> dict:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _entry_gone(entry: Path) -> bool:
    """A cache entry is usable while its manifest.json and the wheel it names are there."""
    wheel = (_record(entry / "manifest.json").get("wheel") or {}).get("file")
    return not wheel or not (entry / wheel).is_file()


def missing(apex_dir: Path, workdir: Path) -> list[str]:
    """What the records in apex_dir (results/apex) name that no longer exists, one each ("<path> (named by
    <records>)"); [] when every record that says "built" still has its files, or there is no record, or apex was
    skipped. Relative paths in a record are relative to the working directory the run wrote them from (workdir)."""
    gone: dict[str, list[str]] = {}
    for name in RECORDS:
        record = _record(apex_dir / name)
        if record.get("status") != "built":
            continue
        for field, is_gone in (("entry", _entry_gone), ("site_dir", lambda site: not (site / STAMP).is_file())):
            if isinstance(record.get(field), str) and record[field]:
                path = Path(record[field]) if Path(record[field]).is_absolute() else workdir / record[field]
                if is_gone(path):
                    gone.setdefault(record[field], []).append(name)
    return [f"{path} (named by {' and '.join(names)})" for path, names in gone.items()]


def remove_records(apex_dir: Path) -> list[Path]:
    """Remove the records (so that Snakemake re-makes them); the ones that were there."""
    removed = []
    for name in RECORDS:
        path = apex_dir / name
        if path.exists():
            path.unlink()
            removed.append(path)
    return removed


def recover(apex_dir: Path, workdir: Path, dry_run: bool) -> str | None:
    """One line for the console when a record names something gone, or None. A real run removes the records; a dry
    run only says that the next run will."""
    problems = missing(apex_dir, workdir)
    if not problems:
        return None
    said = f"the apex records in {apex_dir} name what is gone: {'; '.join(problems)}."
    if dry_run:
        return f"{said} A run (not a dry run) removes them and builds or installs apex again before the apex cells."
    removed = remove_records(apex_dir)
    return (f"{said} Removed {', '.join(path.name for path in removed)}: this run builds apex again (or takes it "
            "from the build cache) and installs it before the apex cells.")

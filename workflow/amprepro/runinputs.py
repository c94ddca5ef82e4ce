"""What the training jobs take from the apex and sanity stages, in files whose bytes change only when that does.

apex.json and sanity.json say more than the runs read: build times, cache hits, paths, version strings. The train and
peak rules read these views instead, so Snakemake, which compares an updated input's checksum with the one it
recorded, re-runs no cell when apex or sanity ran again with the same outcome (sanity is a checkpoint: Snakemake
re-judges the cells after it, see workflow/rules/sanity.smk).

    python -m amprepro.runinputs apex --record results/apex/apex.json --out results/apex/runs.json
    python -m amprepro.runinputs sanity --record results/sanity/sanity.json --out results/sanity/verdicts.json
"""

from __future__ import annotations

import argparse

from amprepro.files import read_json, write_json

# Everything train.py, precision.py and measure.py read from apex.json. site_dir names the build's cache key (apex
# commit, torch, CUDA, Python, architectures, flags), so a different build is a different view. shell and
# missing_extensions: the empty shell of issue 38 (results/apex/shell.json), which its cells say they ran on.
# extensions_built: what the full build compiled (only what the run's cells use, issue 40; amprepro.apexexts.missing).
APEX_KEYS = ("status", "required", "site_dir", "has_amp", "commit", "shell", "missing_extensions",
             "extensions_built")


def apex_for_runs(record: dict) -> dict:
    view = {key: record.get(key) for key in APEX_KEYS}
    view["shell"] = bool(view["shell"])  # records written before the shell existed are full builds
    view["missing_extensions"] = view["missing_extensions"] or {}
    if record.get("status") != "built":  # why not, which a skipped apex cell quotes; a built one's has timings
        view["reason"] = record.get("reason")
    return view


def sanity_verdicts(record: dict) -> dict:
    """Each check's verdict, without its details. The file exists only when no required check failed."""
    return {"checks": [[check["name"], check["status"]] for check in record["checks"]]}


VIEWS = {"apex": apex_for_runs, "sanity": sanity_verdicts}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stage", choices=sorted(VIEWS))
    parser.add_argument("--record", required=True, help="the stage's own result file")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    write_json(args.out, VIEWS[args.stage](read_json(args.record)))


if __name__ == "__main__":
    main()

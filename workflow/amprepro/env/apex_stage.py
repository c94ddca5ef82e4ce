"""The apex stage: decide whether apex is needed and buildable here, then build and verify it or say why not.

The build itself (source fetch and checks, preflight, compile, cache, verification) lives in amprepro.env.apexbuild.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from amprepro.files import write_json


def cuda_build_possible() -> tuple[bool, str]:
    """Whether this machine can compile CUDA extensions against its torch at all (details in apexbuild preflight)."""
    try:
        import torch
    except ImportError:
        return False, "torch is not importable in this env"
    if torch.version.cuda is None:
        return False, f"torch {torch.__version__} is a CPU-only build (torch.version.cuda is None)"
    return True, f"torch {torch.__version__} built with CUDA {torch.version.cuda}"


def source_configured(source: dict) -> bool:
    return bool(source.get("path") or source.get("tarball") or source.get("url"))


def skipped(settings: dict, reason: str) -> dict:
    return {
        "status": "skipped",
        "required": False,
        "reason": reason,
        "site_dir": None,
        "has_amp": False,
        "commit": None,
        "extensions": {},
        "verification": {},
        "manifest": None,
        "settings": settings,
    }


def decide(settings: dict) -> dict | None:
    """A skipped record when apex is optional and cannot be built here; None when a build must be attempted."""
    if settings["required"]:
        return None
    possible, why = cuda_build_possible()
    if not source_configured(settings.get("source") or {}):
        return skipped(settings, "apex is optional here (no CUDA GPU visible) and no apex source is configured")
    if not possible:
        return skipped(settings, f"apex is optional here (no CUDA GPU visible) and cannot be compiled: {why}. "
                                 "apex cells are skipped; native torch.amp cells still run")
    return None


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--settings", required=True, help="JSON of config['apex'] with 'required' resolved")
    parser.add_argument("--out", required=True)
    parser.add_argument("--jobs", type=int, default=1)
    args = parser.parse_args(argv)
    settings = json.loads(args.settings)
    record = decide(settings)
    if record is None:
        from amprepro.env import apexbuild

        try:
            record = apexbuild.build_and_verify(settings, jobs=args.jobs, results_dir=Path(args.out).parent)
        except apexbuild.ApexError as exc:
            if settings["required"]:
                print(f"ERROR (apex): {exc}", file=sys.stderr)
                sys.exit(1)
            # Optional apex that fails to build: the native torch.amp cells still run; apex cells say why not.
            print(f"WARNING (apex, optional): {exc}", file=sys.stderr)
            record = skipped(settings, f"apex is optional here and its build failed: {exc}")
    write_json(args.out, record)
    print(f"apex: {record['status']}: {record['reason']}")


if __name__ == "__main__":
    main()

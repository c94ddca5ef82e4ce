"""The apex stage: decide whether apex is needed and buildable here, then build and verify it or say why not.

Two steps, two jobs: `--build-only` compiles (CPU only, beside the cells that need no apex), `--built FILE` installs
and verifies that build on the GPU.

The build itself (source fetch and checks, preflight, compile, cache, verification) lives in amprepro.env.apexbuild.
--shell builds and verifies the same source without --cpp_ext/--cuda_ext: the "empty shell" of issue 38.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from amprepro.env import cpushare
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


def skipped(settings: dict, reason: str, shell: bool = False) -> dict:
    return {
        "status": "skipped",
        "shell": shell,
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


def decide(settings: dict, shell: bool = False) -> dict | None:
    """A skipped record when apex is optional and cannot be built here; None when a build must be attempted."""
    if settings["required"]:
        return None
    possible, why = cuda_build_possible()
    if not source_configured(settings.get("source") or {}):
        return skipped(settings, "apex is optional here (no CUDA GPU visible) and no apex source is configured",
                       shell)
    if not possible:
        what = "its shell would have no GPU to run on" if shell else "cannot be compiled"
        return skipped(settings, f"apex is optional here (no CUDA GPU visible) and {what}: {why}. "
                                 "apex cells are skipped; native torch.amp cells still run", shell)
    return None


def provide(settings: dict, jobs: int, out: Path, build_record: dict | None, shell: bool = False) -> dict:
    """build_record None: the compile only (the apex_build job). Else: install and verify what that job built."""
    if build_record is not None and build_record["status"] != "built":
        return build_record  # skipped or failed optionally: the build job already said why
    record = decide(settings, shell)
    if record is not None:
        return record
    from amprepro.env import apexbuild  # only now: its imports (packaging, ...) are build requirements

    try:
        if build_record is None:
            return apexbuild.build_only(settings, jobs=jobs, results_dir=out.parent, shell=shell)
        return apexbuild.build_and_verify(settings, jobs=jobs, results_dir=out.parent, built=build_record, shell=shell)
    except apexbuild.ApexError as exc:
        if settings["required"]:
            print(f"ERROR (apex): {exc}", file=sys.stderr)
            sys.exit(1)
        # Optional apex that fails to build: the native torch.amp cells still run; apex cells say why not.
        print(f"WARNING (apex, optional): {exc}", file=sys.stderr)
        return skipped(settings, f"apex is optional here and its build failed: {exc}", shell)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--settings", required=True, help="JSON of config['apex'] with 'required' resolved")
    parser.add_argument("--out", required=True)
    parser.add_argument("--jobs", type=int, default=1)
    step = parser.add_mutually_exclusive_group()
    step.add_argument("--build-only", action="store_true", help="compile into the cache; write the build record")
    step.add_argument("--built", help="the build record (results/apex/build.json): install and verify that build")
    parser.add_argument("--cpu-share", type=int, default=None, metavar="N",
                        help="confine the build to N of the usable CPUs at a lower priority (amprepro.env.cpushare): "
                             "the cells timed beside it keep the rest")
    parser.add_argument("--shell", action="store_true",
                        help="build without --cpp_ext/--cuda_ext (Python only, the articles' 'empty shell')")
    args = parser.parse_args(argv)
    settings = json.loads(args.settings)
    out = Path(args.out)
    build_record = None if args.build_only or not args.built else json.loads(Path(args.built).read_text())
    share = cpushare.confine(args.cpu_share) if args.cpu_share is not None else None
    if args.build_only or args.built:
        record = provide(settings, args.jobs, out, build_record, args.shell)
    else:  # both steps in one process (tests, and anyone calling the stage by hand)
        record = provide(settings, args.jobs, out, provide(settings, args.jobs, out, None, args.shell), args.shell)
    if share is not None:
        record = {**record, "cpu_share": share}
    write_json(out, record)
    print(f"apex: {record['status']}: {record.get('reason') or record.get('cache')}")


if __name__ == "__main__":
    main()

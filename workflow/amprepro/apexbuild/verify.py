"""Verification in fresh interpreters: every promised extension imports, and the fused kernels compute what torch does.

apex.amp O1 patches torch functions for the whole process (apex issue #896), so each opt level gets its own
interpreter; the three interpreters run side by side to keep a rerun within seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from amprepro.apexbuild.errors import ApexError

PROBE = Path(__file__).with_name("verify_probe.py")
TIMEOUT_SECONDS = 600


def plan_checks(promised: list[str], has_amp: bool) -> list[list[str]]:
    """Groups of checks, one interpreter per group."""
    first = ["imports"]
    first += ["apex_C"] if "apex_C" in promised else []
    first += ["fused_adam"] if "amp_C" in promised else []
    first += ["fused_layer_norm"] if "fused_layer_norm_cuda" in promised else []
    return [first] + ([["amp_O1"], ["amp_O2"]] if has_amp else [])


def verify(site: Path, promised: list[str], built: list[str], has_amp: bool) -> dict:
    groups = plan_checks(promised, has_amp)
    site_abs = os.path.abspath(site)
    processes = [subprocess.Popen([sys.executable, str(PROBE), site_abs, ",".join(group), ",".join(promised)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for group in groups]
    checks, gpu = {}, None
    for group, process in zip(groups, processes):
        out, err = process.communicate(timeout=TIMEOUT_SECONDS)
        report = _last_json(out)
        if report is None:
            checks.update({name: {"ok": False, "error": f"verifier exited {process.returncode}: {err.strip()[-1500:]}"}
                           for name in group})
            continue
        gpu = gpu or report["gpu"]
        checks.update(report["checks"])
    imports = checks["imports"].get("extensions", {})
    extensions = {name: {"built": name in built, "importable": imports.get(name, {}).get("importable", False),
                         "error": imports.get(name, {}).get("error")} for name in promised}
    failed = [name for name, result in checks.items() if result.get("ok") is False]
    return {"ok": not failed, "failed": failed, "gpu": gpu, "checks": checks, "extensions": extensions}


def require_ok(verification: dict, site: Path) -> None:
    if verification["ok"]:
        return
    reasons = []
    for name in verification["failed"]:
        result = verification["checks"][name]
        if name == "imports":
            bad = {ext: info["error"] for ext, info in result.get("extensions", {}).items() if not info["importable"]}
            reasons.append(f"not importable: {bad}" if bad else f"apex imported from {result.get('apex_file')}, "
                                                               f"not from {site}")
        else:
            reasons.append(f"{name}: {result.get('error') or {k: v for k, v in result.items() if k != 'ok'}}")
    raise ApexError(f"apex in {site} failed verification: {'; '.join(reasons)}. Fix: delete {site} and its "
                    "build entry to rebuild; if it fails again the build is broken for this torch/CUDA, see the log.")


def _last_json(out: str) -> dict | None:
    for line in reversed(out.strip().splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                return None
    return None

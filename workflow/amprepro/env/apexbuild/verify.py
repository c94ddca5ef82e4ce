"""Verification in processes of their own: every promised extension imports, and the fused kernels compute what torch
does.

apex.amp O1 patches torch functions for the whole process (apex issue #896), so each opt level gets its own process;
the processes run side by side. Each is forked from the run's cell server where there is one (amprepro.plan.cellserver
--run apex_probe: torch and torch._dynamo already imported, as in the cells that will use apex), else a fresh
interpreter. The GPU checks cost seconds of CUDA start-up each (14 s for a rerun on the H200), so their results are
kept beside the site dir and reused while the installed wheel and the GPU (name, uuid, driver) are unchanged; the
import checks always run afresh. AMPREPRO_APEX_REVERIFY=1 reruns all.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

from amprepro.env.apexbuild.errors import ApexError
from amprepro.files import write_json

PROBE_ENTRY = ["-m", "amprepro.plan.cellserver", "--run", "apex_probe", "--"]  # verify_probe, forked or fresh
TIMEOUT_SECONDS = 600
RECORD = ".amprepro-verification.json"
REVERIFY = "AMPREPRO_APEX_REVERIFY"
GPU_CHECKS = {"fused_adam", "fused_layer_norm", "amp_O1", "amp_O2"}  # as in verify_probe.py


def plan_checks(promised: list[str], has_amp: bool, absent: list[str] = ()) -> list[list[str]]:
    """Groups of checks, one process per group. absent: the extensions a shell lacks, whose import errors the
    "absent" check records (apex.amp O1/O2 are still checked: they fall back to Python without amp_C)."""
    first = ["imports"] + (["absent"] if absent else [])
    first += ["apex_C"] if "apex_C" in promised else []
    first += ["fused_adam"] if "amp_C" in promised else []
    first += ["fused_layer_norm"] if "fused_layer_norm_cuda" in promised else []
    return [first] + ([["amp_O1"], ["amp_O2"]] if has_amp else [])


def verify(site: Path, promised: list[str], built: list[str], has_amp: bool, wheel_sha256: str, gpu: str,
           env: dict, absent: list[str] = ()) -> dict:
    groups = plan_checks(promised, has_amp, absent)
    earlier = reusable_gpu_checks(site, wheel_sha256, gpu, env)
    if earlier:
        groups = [[name for name in groups[0] if name not in GPU_CHECKS]]
    checks, gpu_name = run_groups(groups, site, promised, env, absent)
    if earlier:
        checks.update(earlier["checks"])
        gpu_name = earlier["gpu"]
    imports = checks["imports"].get("extensions", {})
    extensions = {name: {"built": name in built, "importable": imports.get(name, {}).get("importable", False),
                         "error": imports.get(name, {}).get("error")} for name in promised}
    failed = [name for name, result in checks.items() if result.get("ok") is False]
    verification = {"ok": not failed, "failed": failed, "gpu": gpu_name, "gpu_identity": gpu, "checks": checks,
                    "extensions": extensions, "gpu_checks_reused_from": earlier["verified_at"] if earlier else None}
    if not earlier and not failed:
        write_json(site / RECORD, {"wheel_sha256": wheel_sha256, "gpu_identity": gpu, "gpu": gpu_name,
                                   "verified_at": _now(), "checks": {name: result for name, result in checks.items()
                                                                     if name in GPU_CHECKS}})
    return verification


def reusable_gpu_checks(site: Path, wheel_sha256: str, gpu: str, env: dict) -> dict | None:
    record = site / RECORD
    if env.get(REVERIFY) == "1" or not record.is_file():
        return None
    earlier = json.loads(record.read_text())
    if earlier["wheel_sha256"] != wheel_sha256 or earlier["gpu_identity"] != gpu:
        return None
    return {**earlier, "checks": {name: {**result, "reused": True} for name, result in earlier["checks"].items()}}


def run_groups(groups: list[list[str]], site: Path, promised: list[str], env: dict, absent: list[str] = ()
               ) -> tuple[dict, str | None]:
    site_abs = os.path.abspath(site)
    processes = [subprocess.Popen([sys.executable, *PROBE_ENTRY, site_abs, ",".join(group), ",".join(promised),
                                   ",".join(absent)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                 for group in groups]
    checks, gpu_name = {}, None
    for group, process in zip(groups, processes):
        out, err = process.communicate(timeout=TIMEOUT_SECONDS)
        report = _last_json(out)
        if report is None:
            checks.update({name: {"ok": False, "error": f"verifier exited {process.returncode}: {err.strip()[-1500:]}"}
                           for name in group})
            continue
        gpu_name = gpu_name or report["gpu"]
        checks.update({name: {**result, "process": report.get("process")} for name, result in report["checks"].items()})
    return checks, gpu_name


def require_ok(verification: dict, site: Path) -> None:
    if verification["ok"]:
        return
    reasons = []
    for name in verification["failed"]:
        result = verification["checks"][name]
        if name == "absent":
            found = [ext for ext, info in result.get("extensions", {}).items() if info.get("importable")]
            reasons.append(f"a shell was asked for, but these extensions import: {found}")
        elif name == "imports":
            bad = {ext: info["error"] for ext, info in result.get("extensions", {}).items() if not info["importable"]}
            reasons.append(f"not importable: {bad}" if bad else f"apex imported from {result.get('apex_file')}, "
                                                               f"not from {site}")
        else:
            detail = {k: v for k, v in result.items() if k not in ("ok", "process")}
            reasons.append(f"{name}: {result.get('error') or detail}")
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


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")

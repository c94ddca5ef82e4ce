"""Promote a finished GPU run into the reference: read its results directory, name its machine, archive its step
logs, write reference/<gpu-slug>/runs/<run-id>/ and rebuild the aggregate (amprepro.verify.reference reads it back).

Run with `python -m amprepro.verify.verify promote [RESULTS] --note "..."` (the command line is verify's).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import io
import json
import tarfile
from pathlib import Path

from amprepro.cellid import CellId
from amprepro.files import read_json, write_json
from amprepro.gitinfo import head_commit
from amprepro.verify.reference import ReferenceError, gpu_slug, read_runs, rebuild


def results_file(results: Path, name: str) -> Path:
    """results/summary/summary.json, or summary.json at the top of a copied results directory."""
    for candidate in (results / "summary" / name, results / name):
        if candidate.is_file():
            return candidate
    raise ReferenceError(f"{results} has no summary/{name}: pass the results directory of a finished run "
                         "(the one holding summary/, runs/, environment/).")


def cell_metrics(runs_dir: Path) -> list[tuple[Path, dict]]:
    found = []
    for path in sorted(runs_dir.glob("*/*/seed*/metrics.json")):
        try:
            found.append((path, json.loads(path.read_text())))
        except (OSError, ValueError) as exc:
            raise ReferenceError(f"{path} cannot be read ({exc}): the run is incomplete; finish it first.") from exc
    return found


def machine_identity(metrics: list[dict], environment: dict) -> dict:
    """Host name and GPU UUIDs (metrics.json hardware): the same machine gives the same id, whatever the process."""
    hardware = [m.get("hardware") or {} for m in metrics]
    uuids = sorted({h["gpu_uuid"] for h in hardware if h.get("gpu_uuid")})
    host = (environment.get("platform") or {}).get("node")
    gpus = max([len(uuids)] + [h.get("gpu_count") or 0 for h in hardware])
    known = bool(host or uuids)
    return {"id": hashlib.sha256(json.dumps([host, uuids]).encode()).hexdigest()[:12] if known else None,
            "host": host, "gpu_uuids": uuids, "gpu_count": gpus,
            "gpu_count_source": "GPUs the cells saw: the most any cell saw, or the distinct GPU UUIDs the cells ran "
                                "on, whichever is larger"}


def steps_archive(runs_dir: Path) -> tuple[bytes, int]:
    """Every cell's steps.csv in one gzip'd tar, byte-identical for the same files (no dates, owners, order)."""
    buffer = io.BytesIO()
    count = 0
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=9, format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(runs_dir.glob("*/*/seed*/steps.csv")):
            data = path.read_bytes()
            info = tarfile.TarInfo(f"runs/{path.relative_to(runs_dir).as_posix()}")
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))
            count += 1
    raw = buffer.getvalue()
    return raw[:4] + b"\0\0\0\0" + raw[8:], count  # zero gzip's header timestamp (bytes 4-7)


def add_run(results: str | Path, reference_dir: str | Path, note: str) -> tuple[Path, dict]:
    """Copy a finished GPU run into reference/<gpu-slug>/runs/<run-id>/ and rebuild the aggregate."""
    results = Path(results)
    if not note.strip():
        raise ReferenceError("--note is empty: say who ran it, on which machine (kind, lease), anything unusual.")
    summary = read_json(results_file(results, "summary.json"))
    table_path = results_file(results, "summary.csv")
    versions = summary.get("versions", {})
    gpu = versions.get("gpu")
    if not gpu:
        raise ReferenceError(f"{results} is a run without a GPU: references are per GPU model; add a run made on one.")
    if not any(c["status"] == "ok" for c in summary.get("cells", [])):
        raise ReferenceError(f"no cell of {results} is ok: nothing worth keeping as a reference.")
    runs_dir = results / "runs"
    metrics = [m for _, m in cell_metrics(runs_dir)] if runs_dir.is_dir() else []
    if not metrics:
        raise ReferenceError(f"{runs_dir} has no metrics.json: copy the whole results directory (runs/ included).")
    table = table_path.read_bytes()
    digest = hashlib.sha256(table).hexdigest()
    now = _dt.datetime.now(_dt.UTC)
    reference = Path(reference_dir) / gpu_slug(gpu)
    for existing in read_runs(reference):
        if existing.provenance.get("summary_csv_sha256") == digest:
            raise ReferenceError(f"{results} is already in the reference as run {existing.id}.")
    run_id = f"{now:%Y-%m-%d}-{digest[:8]}"
    environment_path = results / "environment" / "environment.json"
    environment = read_json(environment_path) if environment_path.exists() else {}
    archive, kept = steps_archive(runs_dir)
    provenance = {
        "run_id": run_id, "gpu": gpu, "driver": versions.get("driver"), "cuda": versions.get("cuda"),
        "cudnn": versions.get("cudnn"), "torch": versions.get("torch"), "apex_commit": versions.get("apex_commit"),
        "python": versions.get("python"), "isolation": versions.get("isolation"),
        "packages": versions.get("packages", {}), "preset": summary.get("preset", {}),
        "machine": machine_identity(metrics, environment),
        "pipeline_commit": head_commit(),
        "pipeline_commit_source": "HEAD of the checkout that added the run (the results do not record the commit "
                                  "they were made at; the note should say it if it differs)",
        "created_utc": now.strftime("%Y-%m-%dT%H:%M:%SZ"), "summary_csv_sha256": digest, "note": note,
        "steps": {"kept": kept > 0, "file": "steps.tar.gz", "cells": kept},
        "specs": {CellId.of(m).reference_key: m["spec"] for m in metrics if m.get("spec")},
    }
    folder = reference / "runs" / run_id
    staging = reference / f".adding-{run_id}"  # outside runs/: a run appears whole or not at all
    staging.mkdir(parents=True)
    (staging / "summary.csv").write_bytes(table)
    if kept:
        (staging / "steps.tar.gz").write_bytes(archive)
    write_json(staging / "provenance.json", provenance)
    folder.parent.mkdir(exist_ok=True)
    staging.rename(folder)
    return folder, rebuild(reference)

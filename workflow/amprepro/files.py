"""Atomic writes: a killed job never leaves a half-written result that looks complete."""

from __future__ import annotations

import csv
import json
import os
import tempfile
from pathlib import Path


def _atomic_write(path: str | Path, write) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", newline="") as handle:
            write(handle)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: str | Path, data) -> None:
    _atomic_write(path, lambda h: (json.dump(data, h, indent=2, sort_keys=True, default=str), h.write("\n")))


def read_json(path: str | Path):
    return json.loads(Path(path).read_text())


def write_csv(path: str | Path, rows: list[dict], fieldnames: list[str]) -> None:
    def write(handle):
        writer = csv.DictWriter(handle, fieldnames=fieldnames, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)

    _atomic_write(path, write)

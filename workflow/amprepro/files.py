"""Atomic writes: a killed job never leaves a half-written result that looks complete.

Results are created with the modes any other tool gives (0666 / 0777 less the user's umask), so a group or everyone can
read them where the umask says so: tempfile's mkstemp (0600) and mkdtemp (0700) are not used for results."""

from __future__ import annotations

import csv
import json
import os
import secrets
from pathlib import Path


def _new_sibling(directory: Path, prefix: str, create):
    """create(path) on a fresh hidden name in directory; create must fail with FileExistsError on a taken name."""
    for _ in range(100):
        candidate = directory / f"{prefix}{secrets.token_hex(6)}"
        try:
            return create(candidate)
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name {prefix}* in {directory}")


def _new_file(path: Path) -> tuple[int, Path]:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666), path


def _new_dir(path: Path) -> Path:
    os.mkdir(path, 0o777)
    return path


def make_temp_dir(parent: str | Path, prefix: str) -> Path:
    """A new empty directory in parent (to fill, then rename into place), mode 0777 less the umask."""
    return _new_sibling(Path(parent), prefix, _new_dir)


def _atomic_write(path: str | Path, write, mode: str = "w") -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _new_sibling(path.parent, f".{path.name}.", _new_file)
    try:
        with os.fdopen(fd, mode, **({"newline": ""} if "b" not in mode else {})) as handle:
            write(handle)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json(path: str | Path, data) -> None:
    _atomic_write(path, lambda h: (json.dump(data, h, indent=2, sort_keys=True, default=str), h.write("\n")))


def write_binary(path: str | Path, write) -> None:
    """write(handle) into a binary file that appears at path only once complete."""
    _atomic_write(path, write, "wb")


def read_json(path: str | Path):
    return json.loads(Path(path).read_text())


def write_csv(path: str | Path, rows: list[dict], fieldnames: list[str]) -> None:
    def write(handle):
        writer = csv.DictWriter(handle, fieldnames=fieldnames, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)

    _atomic_write(path, write)

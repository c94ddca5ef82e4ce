"""Built wheels kept by key: results/apex/build/<key>/ always, and a shared cache_dir/<key>/ when configured.

An entry is a directory with the wheel, manifest.json and build.log. It becomes visible only complete: it is
assembled in a temporary sibling and renamed into place, under an fcntl lock on <root>/.locks/<key>.lock, so
concurrent builders of one key build once and the others reuse the result.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from amprepro.env.apexbuild.source import file_sha256
from amprepro.files import make_temp_dir

KEY_SCHEMA = 1


def cache_key(inputs: dict) -> str:
    """Hash of exactly the inputs that change the binary: apex commit, torch, CUDA, Python, arch list, flags."""
    canonical = json.dumps({"schema": KEY_SCHEMA, **inputs}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:20]


def is_complete(entry: Path) -> bool:
    manifest = entry / "manifest.json"
    if not manifest.is_file():
        return False
    wheel = json.loads(manifest.read_text())["wheel"]
    path = entry / wheel["file"]
    return path.is_file() and file_sha256(path) == wheel["sha256"]


class Store:
    def __init__(self, local_root: Path, shared_root: Path | None):
        self.local_root = Path(local_root)
        self.shared_root = Path(shared_root) if shared_root else None

    @property
    def build_root(self) -> Path:
        """Where a miss is built: the shared cache when there is one, so the next workflow finds it."""
        return self.shared_root or self.local_root

    def find(self, key: str) -> tuple[Path, str] | None:
        """A complete local entry, copying it from the shared cache first if only that has it."""
        local = self.local_root / key
        if is_complete(local):
            return local, "hit (results)"
        if self.shared_root and is_complete(self.shared_root / key):
            return self.adopt(self.shared_root / key, key), "hit (shared cache)"
        return None

    def adopt(self, entry: Path, key: str) -> Path:
        local = self.local_root / key
        if entry == local:
            return local
        self.local_root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=self.local_root))
        shutil.rmtree(tmp)
        shutil.copytree(entry, tmp)
        if local.exists():  # an incomplete leftover
            shutil.rmtree(local)
        os.rename(tmp, local)
        return local

    @contextlib.contextmanager
    def lock(self, key: str, echo=print):
        locks = self.build_root / ".locks"
        locks.mkdir(parents=True, exist_ok=True)
        with open(locks / f"{key}.lock", "a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                echo(f"[apex] another process is building {key}; waiting for it ({locks / key}.lock)", flush=True)
                fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def staging(self, key: str) -> Path:
        """A fresh directory beside the final entry (same filesystem, so publish can rename it)."""
        self.build_root.mkdir(parents=True, exist_ok=True)
        return make_temp_dir(self.build_root, f".tmp-{key}-")

    def publish(self, staged: Path, key: str) -> Path:
        final = self.build_root / key
        if final.exists():  # incomplete leftover of a killed build (complete ones are found before building)
            shutil.rmtree(final)
        os.rename(staged, final)
        return self.adopt(final, key)

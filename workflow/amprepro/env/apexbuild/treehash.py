"""Git's tree hash of a plain directory, computed without git, so an exported source can be checked against its commit.

Matches `git rev-parse <commit>^{tree}` for a `git archive` export: file modes are 100644/100755 (owner exec bit),
symlinks 120000, empty directories are absent from git trees, and submodules (gitlinks) are exported by git archive
as empty directories, so their commit ids must be supplied.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def _object_id(kind: bytes, data: bytes) -> bytes:
    return hashlib.sha1(kind + b" %d\0" % len(data) + data).digest()


def _file_id(path: str) -> bytes:
    with open(path, "rb") as handle:
        return _object_id(b"blob", handle.read())


def _tree_id(directory: str, relative: str, gitlinks: dict[str, str]) -> bytes | None:
    entries = []  # (sort key, mode, name, id); git sorts trees as if their name ended in "/"
    for entry in os.scandir(directory):
        name = os.fsencode(entry.name)
        path = f"{relative}{entry.name}"
        if entry.name == ".git":
            continue
        if entry.is_symlink():
            entries.append((name, b"120000", name, _object_id(b"blob", os.fsencode(os.readlink(entry.path)))))
        elif entry.is_dir():
            if path in gitlinks:
                entries.append((name, b"160000", name, bytes.fromhex(gitlinks[path])))
                continue
            sub = _tree_id(entry.path, path + "/", gitlinks)
            if sub is not None:
                entries.append((name + b"/", b"40000", name, sub))
        else:
            mode = b"100755" if entry.stat().st_mode & 0o100 else b"100644"
            entries.append((name, mode, name, _file_id(entry.path)))
    if not entries:
        return None
    entries.sort(key=lambda e: e[0])
    return _object_id(b"tree", b"".join(mode + b" " + name + b"\0" + oid for _, mode, name, oid in entries))


def tree_hash(root: str | Path, gitlinks: dict[str, str] | None = None) -> str:
    """The git tree id of root's content; gitlinks maps submodule paths (relative, '/'-separated) to commit ids."""
    tree = _tree_id(str(root), "", gitlinks or {})
    return (tree or _object_id(b"tree", b"")).hex()

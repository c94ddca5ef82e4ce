"""Real text that every machine has: the Python standard library's own source files (data: python_stdlib).

The corpus is the `.py` files under the stdlib directory of the interpreter that runs the cell
(``sysconfig.get_paths()["stdlib"]``), read as bytes: one token per byte, vocabulary 256, no tokenizer and no
download. Third-party packages and the stdlib's own test suites are left out (any path with a directory named in
SKIPPED_DIRS): distributions ship the test suites separately (Debian: libpython3.X-testsuite), so leaving them out
keeps the corpus the same across more machines of one Python version.

The held-out split is by file, by the sha256 of its relative path (HELDOUT_PERCENT of the files), so it does not
depend on the seed, the machine or the order the files are listed in. What a cell trained on is recorded
(``corpus_record``): the Python version, the number of files and bytes on each side, the sha256 of the sorted file
list and the sha256 of every file's relative path and content sha256; two machines with the same ``corpus_sha256``
trained on the same bytes.

torch is imported where it is used: amprepro.config reads this module at DAG build time.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
import sysconfig
from pathlib import Path

from amprepro.modelsettings import EVAL_WINDOWS

DATA_KIND = "python_stdlib"
VOCAB_SIZE = 256  # one token per byte
SKIPPED_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"})
HELDOUT_PERCENT = 10
HELDOUT_RULE = (f"a file is held out when int(sha256(relative path)[:8], 16) % 100 < {HELDOUT_PERCENT} "
                "(by file, independent of seed and machine)")
# held-out windows of seq_len + 1 bytes, evenly spaced over the held-out bytes (the setting's default:
# amprepro.modelsettings)
DEFAULT_EVAL_WINDOWS = EVAL_WINDOWS


class CorpusError(RuntimeError):
    """The stdlib corpus cannot be built here (no stdlib sources, or too few of them); the message says what to do."""


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def source_files(root: Path) -> list[str]:
    """The corpus's files: relative POSIX paths of the .py files under root, outside SKIPPED_DIRS, sorted."""
    found = []
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = [d for d in subdirs if d not in SKIPPED_DIRS]
        for name in files:
            if name.endswith(".py"):
                found.append(Path(directory, name).relative_to(root).as_posix())
    return sorted(found)


def is_heldout(relative_path: str, percent: int = HELDOUT_PERCENT) -> bool:
    return int(hashlib.sha256(relative_path.encode("utf-8")).hexdigest()[:8], 16) % 100 < percent


def read_corpus(root: Path | None = None) -> tuple[bytes, bytes, dict]:
    """(train bytes, held-out bytes, record): every file's bytes, concatenated in sorted path order per side."""
    root = Path(root) if root is not None else stdlib_root()
    if not root.is_dir():
        raise CorpusError(f"the Python standard library directory {root} does not exist; this interpreter has no "
                          "stdlib sources to train on. Fix: run the cell with a CPython that ships its .py files")
    files = source_files(root)
    train, heldout, manifest = [], [], hashlib.sha256()
    counts = {"train": 0, "heldout": 0}
    for relative in files:
        content = (root / relative).read_bytes()
        manifest.update(f"{relative}\t{hashlib.sha256(content).hexdigest()}\n".encode())
        side = "heldout" if is_heldout(relative) else "train"
        (heldout if side == "heldout" else train).append(content)
        counts[side] += 1
    if not counts["train"] or not counts["heldout"]:
        raise CorpusError(f"{root} holds {len(files)} .py files outside {sorted(SKIPPED_DIRS)}: too few for a "
                          f"train and a held-out split ({counts}). Fix: use a Python whose stdlib sources are "
                          "installed (Debian/Ubuntu: the libpython3.X-stdlib package)")
    train_bytes, heldout_bytes = b"".join(train), b"".join(heldout)
    record = {
        "kind": DATA_KIND,
        "source": "the .py files of the Python standard library of the interpreter that ran the cell",
        "root": str(root),
        "python": platform.python_version(),
        "implementation": sys.implementation.name,
        "files": len(files),
        "train_files": counts["train"],
        "heldout_files": counts["heldout"],
        "train_bytes": len(train_bytes),
        "heldout_bytes": len(heldout_bytes),
        "skipped_dirs": sorted(SKIPPED_DIRS),
        "heldout_rule": HELDOUT_RULE,
        "file_list_sha256": hashlib.sha256("\n".join(files).encode("utf-8")).hexdigest(),
        "corpus_sha256": manifest.hexdigest(),
        "corpus_sha256_of": "sha256 over the sorted lines '<relative path>\\t<sha256 of its bytes>\\n'",
        "tokens": f"bytes, vocabulary {VOCAB_SIZE}",
    }
    return train_bytes, heldout_bytes, record


class StdlibTextBatches:
    """Random windows of the training bytes (positions from the seed), and a fixed held-out set for every seed."""

    def __init__(self, batch_size: int, seq_len: int, seed: int, device, eval_windows: int = DEFAULT_EVAL_WINDOWS,
                 root: Path | None = None):
        import torch

        train, heldout, self.record = read_corpus(root)
        if len(heldout) < seq_len + 2 or len(train) < seq_len + 2:
            raise CorpusError(f"seq_len {seq_len} is longer than the corpus's held-out bytes ({len(heldout)}). "
                              "Fix: lower seq_len")
        self.train = torch.frombuffer(bytearray(train), dtype=torch.uint8)
        held = torch.frombuffer(bytearray(heldout), dtype=torch.uint8)
        self.batch_size, self.seq_len, self.device = batch_size, seq_len, device
        self.generator = torch.Generator().manual_seed(seed)
        self.offsets = torch.arange(seq_len + 1)
        starts = torch.linspace(0, len(held) - seq_len - 1, eval_windows).long()
        windows = held[starts[:, None] + self.offsets].long()
        self.test_x, self.test_y = windows[:, :-1].contiguous().to(device), windows[:, 1:].contiguous().to(device)
        self.record = {**self.record, "seq_len": seq_len, "eval_windows": eval_windows,
                       "eval_tokens": eval_windows * seq_len}

    def next(self):
        import torch

        starts = torch.randint(0, len(self.train) - self.seq_len - 1, (self.batch_size,), generator=self.generator)
        windows = self.train[starts[:, None] + self.offsets].long().to(self.device)
        return windows[:, :-1], windows[:, 1:]

    def test_set(self):
        return self.test_x, self.test_y

"""Result files and directories follow the user's umask, like any other tool's output (not mkstemp's 0600)."""

from __future__ import annotations

import contextlib
import os
import stat

import pytest

from amprepro import files
from amprepro.env.apexbuild.store import Store


@contextlib.contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("mask,file_mode,dir_mode", [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700),
                                                      (0o002, 0o664, 0o775)], ids=["022", "077", "002"])
def test_results_follow_the_umask(tmp_path, mask, file_mode, dir_mode):
    with umask(mask):
        files.write_json(tmp_path / "out" / "metrics.json", {"a": 1})
        files.write_csv(tmp_path / "out" / "steps.csv", [{"step": 0}], ["step"])
        staged = Store(tmp_path / "apex", None).staging("key")  # becomes results/apex/... or the shared cache entry
    assert mode(tmp_path / "out" / "metrics.json") == file_mode
    assert mode(tmp_path / "out" / "steps.csv") == file_mode
    assert mode(staged) == dir_mode
    assert files.read_json(tmp_path / "out" / "metrics.json") == {"a": 1}
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["metrics.json", "steps.csv"], "no temp file left"


def test_a_failed_write_leaves_the_old_result_and_no_temp_file(tmp_path):
    target = tmp_path / "summary.json"
    files.write_json(target, {"good": True})

    def broken(handle):
        handle.write("{half")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        files._atomic_write(target, broken)
    assert files.read_json(target) == {"good": True}
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_temp_names_are_fresh(tmp_path):
    first, second = files.make_temp_dir(tmp_path, ".tmp-x-"), files.make_temp_dir(tmp_path, ".tmp-x-")
    assert first != second and first.is_dir() and second.is_dir()

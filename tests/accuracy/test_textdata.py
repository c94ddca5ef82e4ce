"""The stdlib text corpus: the split is by file and deterministic, and the record says what was read."""

import hashlib

import pytest
import torch

from amprepro.train import textdata


def write_tree(root, files):
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text)


def fixture_files(n=40):
    return {f"pkg{i % 3}/mod{i}.py": f"def f{i}():\n    return {i}\n".encode() * 20 for i in range(n)}


def test_the_split_is_by_file_hash_and_does_not_depend_on_the_listing_order(tmp_path):
    write_tree(tmp_path, fixture_files())
    files = textdata.source_files(tmp_path)
    assert files == sorted(files) and len(files) == 40
    expected = {f for f in files if int(hashlib.sha256(f.encode()).hexdigest()[:8], 16) % 100 < 10}
    assert {f for f in files if textdata.is_heldout(f)} == expected
    _, heldout, record = textdata.read_corpus(tmp_path)
    assert record["heldout_files"] == len(expected) and record["train_files"] == 40 - len(expected)
    assert heldout == b"".join((tmp_path / f).read_bytes() for f in sorted(expected))


def test_skipped_directories_and_other_files_are_not_read(tmp_path):
    write_tree(tmp_path, {**fixture_files(), "site-packages/numpy/x.py": b"x", "test/test_x.py": b"y",
                          "idlelib/idle_test/t.py": b"z", "pkg0/data.txt": b"not python"})
    assert not [f for f in textdata.source_files(tmp_path)
                if f.startswith(("site-packages", "test/")) or "idle_test" in f or f.endswith(".txt")]


def test_the_record_hashes_the_file_list_and_the_contents(tmp_path):
    write_tree(tmp_path, fixture_files())
    _, _, first = textdata.read_corpus(tmp_path)
    assert first["file_list_sha256"] == hashlib.sha256("\n".join(textdata.source_files(tmp_path)).encode()).hexdigest()
    (tmp_path / "pkg1/mod1.py").write_bytes(b"changed = True\n")
    _, _, second = textdata.read_corpus(tmp_path)
    assert second["file_list_sha256"] == first["file_list_sha256"]  # same names
    assert second["corpus_sha256"] != first["corpus_sha256"]  # other bytes
    assert first["python"] and first["root"] == str(tmp_path)


def test_a_tree_too_small_to_split_is_refused_with_the_fix(tmp_path):
    write_tree(tmp_path, {"only.py": b"x = 1\n"})
    with pytest.raises(textdata.CorpusError, match="Fix"):
        textdata.read_corpus(tmp_path)
    with pytest.raises(textdata.CorpusError, match="does not exist"):
        textdata.read_corpus(tmp_path / "nowhere")


def test_batches_are_next_byte_pairs_from_the_seed_and_the_heldout_set_is_the_same_for_every_seed(tmp_path):
    write_tree(tmp_path, fixture_files())
    a = textdata.StdlibTextBatches(4, 16, 0, torch.device("cpu"), eval_windows=8, root=tmp_path)
    b = textdata.StdlibTextBatches(4, 16, 1, torch.device("cpu"), eval_windows=8, root=tmp_path)
    x, y = a.next()
    assert x.shape == (4, 16) and torch.equal(x[:, 1:], y[:, :-1]) and int(x.max()) < textdata.VOCAB_SIZE
    assert not torch.equal(x, b.next()[0])
    assert torch.equal(a.test_set()[0], b.test_set()[0]) and a.test_set()[0].shape == (8, 16)
    assert a.record["eval_tokens"] == 128 and a.record["seq_len"] == 16


def test_the_running_pythons_stdlib_is_a_corpus():
    _, _, record = textdata.read_corpus()
    assert record["files"] > 100 and record["heldout_files"] > 5 and record["heldout_bytes"] > 100_000

"""amprepro.train.initcache: a model's initial weights read from the cache are the weights a fresh build gives, bit for
bit, and the cell goes on from the same random state; a damaged file or one the meta device cannot reproduce is
never used."""

import dataclasses
import json
import os
import random
import sys
import threading
import types
import zlib

import numpy as np
import pytest
import torch
from torch import nn

from amprepro import archs
from amprepro.modelsettings import ModelSettings
from amprepro.train import initcache, models, train
from amprepro.train.cell import seed_everything

NO_APEX = {"status": "skipped", "reason": "no apex source configured"}
# Every arch built on the CPU without a package this machine may lack (torchvision and timm: GPU boxes).
CPU_ARCHS = {"small_cnn": "digits", "tiny_transformer": "digits", "gpt_tiny": "synthetic_tokens",
             "gpt_bytes": "python_stdlib", "lstm_bytes": "python_stdlib", "gumbel_bytes": "python_stdlib"}


@pytest.fixture(autouse=True)
def cache_every_build(monkeypatch):
    monkeypatch.setattr(initcache, "MIN_BUILD_SECONDS", 0.0)  # the test models build in milliseconds


def settings(arch, **more):
    return ModelSettings.of_entry({"arch": arch, "data": CPU_ARCHS.get(arch, "synthetic_images"), "batch_size": 8,
                                   **more})


def build(arch, cache, seed=0, **more):
    """The model as a cell builds it (seeded, then initcache.build), and what the generators give next."""
    s = settings(arch, **more)
    seed_everything(seed, False)
    model, record = initcache.build(s.arch_entry, s, lambda: models.build(s.arch, s), cache)
    return model, record, (torch.rand(3).tolist(), random.random(), float(np.random.rand()))


def state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def assert_same(a, b):
    sa, sb = state(a), state(b)
    assert list(sa) == list(sb)
    assert all(torch.equal(sa[k], sb[k]) and sa[k].dtype == sb[k].dtype for k in sa)


@pytest.mark.parametrize("arch", sorted(CPU_ARCHS))
def test_a_hit_gives_the_fresh_build_and_its_random_state(arch, tmp_path):
    fresh, record, after = build(arch, None)
    assert record["source"] == "built" and record["key"] is None
    first, record_first, after_first = build(arch, tmp_path)
    assert record_first["source"] == "built" and record_first["note"] is None, record_first
    hit, record_hit, after_hit = build(arch, tmp_path)
    assert record_hit == {**record_hit, "source": "cache", "key": record_first["key"], "note": None}
    assert_same(fresh, first)
    assert_same(fresh, hit)
    assert after == after_first == after_hit  # the cell draws its data as if it had built the weights
    assert not any(t.device.type == "meta" for t in list(hit.parameters()) + list(hit.buffers()))
    assert [p.requires_grad for p in hit.parameters()] == [p.requires_grad for p in fresh.parameters()]


def test_tied_weights_stay_tied(tmp_path):
    build("gpt_tiny", tmp_path)
    hit, record, _ = build("gpt_tiny", tmp_path)
    assert record["source"] == "cache"
    assert hit.lm_head.weight is hit.tok.weight
    assert len(list(hit.parameters())) == len(list(build("gpt_tiny", None)[0].parameters()))


def test_the_key_follows_the_seed_and_the_builders_settings_not_the_batch(tmp_path):
    key = build("gpt_tiny", tmp_path)[1]["key"]
    assert build("gpt_tiny", tmp_path, seed=1)[1]["key"] != key
    assert build("gpt_tiny", tmp_path, seq_len=32)[1]["key"] != key
    assert build("gpt_tiny", tmp_path, naive_norm_eps=1e-8)[1]["key"] != key
    same = build("gpt_tiny", tmp_path, batch_size=64, compile=True)
    assert same[1] == {**same[1], "source": "cache", "key": key}


def test_a_damaged_file_is_rebuilt_and_replaced(tmp_path):
    key = build("small_cnn", tmp_path)[1]["key"]
    data = tmp_path / f"{key}.pt"
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    model, record, after = build("small_cnn", tmp_path)
    assert record["source"] == "built" and "CRC-32" in record["note"]
    assert_same(model, build("small_cnn", None)[0])
    assert after == build("small_cnn", None)[2]
    assert build("small_cnn", tmp_path)[1]["source"] == "cache"  # the rebuild wrote a good file again


@pytest.mark.parametrize("damage", ["truncate", "garbage-manifest", "deleted-data"])
def test_an_unreadable_cache_builds_afresh_and_says_why(tmp_path, damage):
    key = build("tiny_transformer", tmp_path)[1]["key"]
    if damage == "truncate":
        (tmp_path / f"{key}.pt").write_bytes((tmp_path / f"{key}.pt").read_bytes()[:100])
    elif damage == "garbage-manifest":
        (tmp_path / f"{key}.json").write_text("{not json")
    else:
        (tmp_path / f"{key}.pt").unlink()
    model, record, after = build("tiny_transformer", tmp_path)
    assert record["source"] == "built" and record["note"].startswith("cache ")
    assert_same(model, build("tiny_transformer", None)[0])
    assert after == build("tiny_transformer", None)[2]


def test_another_models_file_under_the_key_is_not_used(tmp_path):
    key = build("small_cnn", tmp_path)[1]["key"]
    other = build("tiny_transformer", tmp_path)[1]["key"]
    for suffix in (".pt", ".json"):
        (tmp_path / f"{key}{suffix}").write_bytes((tmp_path / f"{other}{suffix}").read_bytes())
    model, record, _ = build("small_cnn", tmp_path)
    assert record["source"] == "built" and "another model" in record["note"]
    assert_same(model, build("small_cnn", None)[0])


class RandomAttribute(nn.Module):
    """A module with a random tensor that is neither parameter nor buffer: the meta build cannot give it back."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.projection = torch.randn(4, 4)


def test_a_model_the_meta_build_cannot_reproduce_is_not_cached(tmp_path, monkeypatch):
    entry = dataclasses.replace(archs.get("small_cnn"), builder="random_attribute")
    s = settings("small_cnn")
    seed_everything(0, False)
    model, record = initcache.build(entry, s, RandomAttribute, tmp_path)
    assert record["source"] == "built" and "differs from the fresh build" in record["note"]
    assert list(tmp_path.iterdir()) == []
    seed_everything(0, False)
    assert torch.equal(model.projection, RandomAttribute().projection)


def test_a_cache_that_cannot_be_written_leaves_the_build_as_it_is(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("")
    model, record, after = build("small_cnn", blocked)
    assert record["source"] == "built" and record["note"].startswith("not cached")
    assert_same(model, build("small_cnn", None)[0])
    assert after == build("small_cnn", None)[2]


def test_llama_is_never_cached(tmp_path):
    s = ModelSettings.of_entry({"arch": "llama_tiny", "data": "synthetic_tokens", "batch_size": 2, "seq_len": 16})
    _, record = initcache.build(s.arch_entry, s, lambda: models.build(s.arch, s), tmp_path)
    assert record == {**record, "source": "built", "key": None}
    assert list(tmp_path.iterdir()) == []


def test_no_builder_reads_the_settings_the_key_leaves_out(monkeypatch):
    """NOT_THE_BUILDERS may differ between cells that share a file: every builder runs with settings that record the
    reads (torchvision and timm stubbed: what our builder passes them is what counts)."""
    reads = []

    class Recording(ModelSettings):
        def __getattribute__(self, name):
            if name in initcache.NOT_THE_BUILDERS:
                reads.append(name)
            return super().__getattribute__(name)

    stub = types.SimpleNamespace(vit_b_16=lambda **kw: nn.Linear(2, 2), resnet50=lambda **kw: nn.Linear(2, 2))
    monkeypatch.setitem(sys.modules, "torchvision", types.SimpleNamespace(models=stub))
    monkeypatch.setitem(sys.modules, "timm", types.SimpleNamespace(create_model=lambda *a, **kw: nn.Linear(2, 2)))
    for arch in archs.REGISTRY:
        base = ModelSettings.of_entry({"arch": arch, "data": CPU_ARCHS.get(arch, "synthetic_images"),
                                       "batch_size": 2, "seq_len": 16 if "llama" in arch else None}
                                      if "llama" in arch else
                                      {"arch": arch, "data": CPU_ARCHS.get(arch, "synthetic_images"), "batch_size": 2})
        recording = Recording(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)})
        models.build(arch, recording)
    assert reads == []


def test_a_cell_with_the_cache_trains_as_one_without(tmp_path):
    """The whole cell: the same losses with weights built, written and read; its record says where they came from."""
    spec = {"model": "m", "precision": "fp32", "seed": 0,
            "model_config": {"arch": "gpt_tiny", "data": "synthetic_tokens", "batch_size": 4, "seq_len": 16},
            "train": {"steps": 5, "warmup_steps": 1, "lr": 0.001, "optimizer": "adamw"}}
    plain, plain_rows = train.run(spec, NO_APEX, 1)
    written, written_rows = train.run(spec, NO_APEX, 1, init_cache=tmp_path)
    read, read_rows = train.run(spec, NO_APEX, 1, init_cache=tmp_path)
    losses = [[r["loss"] for r in rows] for rows in (plain_rows, written_rows, read_rows)]
    assert losses[0] == losses[1] == losses[2]
    assert (plain["init_weights"]["source"], written["init_weights"]["source"],
            read["init_weights"]["source"]) == ("built", "built", "cache")
    manifest = json.loads((tmp_path / f"{read['init_weights']['key']}.json").read_text())
    assert manifest["key"] == read["init_weights"]["key"]


def test_the_folder_keeps_to_its_size_dropping_what_was_used_longest_ago(tmp_path, monkeypatch):
    import os

    keys = [build(arch, tmp_path)[1]["key"] for arch in ("small_cnn", "tiny_transformer", "gpt_tiny")]
    sizes = {key: (tmp_path / f"{key}.pt").stat().st_size for key in keys}
    for age, key in enumerate(keys):  # written in this order, 100 s apart
        os.utime(tmp_path / f"{key}.pt", (1000 + 100 * age, 1000 + 100 * age))
    assert build("small_cnn", tmp_path)[1]["source"] == "cache"  # read now: the most recently used
    initcache.prune(tmp_path, sum(sizes.values()) - sizes[keys[1]])
    left = {path.stem for path in tmp_path.glob("*.pt")}
    assert left == {keys[0], keys[2]}  # tiny_transformer, the least recently used, went; small_cnn stayed
    assert {path.stem for path in tmp_path.glob("*.json")} == left
    monkeypatch.setattr(initcache, "MAX_BYTES", 0)  # a write prunes: all but the file it wrote
    written = build("gpt_bytes", tmp_path)[1]["key"]
    assert {path.name for path in tmp_path.iterdir()} == {f"{written}.pt", f"{written}.json"}


def test_the_key_names_the_cpu_kernels_and_the_torch_build(tmp_path, monkeypatch):
    """torch's CPU normal_ draws differently on AVX2 and AVX-512: a file built on one never serves the other."""
    key = build("small_cnn", tmp_path)[1]["key"]
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "another")
    record = build("small_cnn", tmp_path)[1]
    assert record["source"] == "built" and record["key"] != key


class RandomState(nn.Module):
    """Random values kept outside parameters and buffers, drawn after a parameter's initialisation."""

    def __init__(self, where):
        super().__init__()
        self.linear = nn.Linear(4, 4)
        if where == "dict":
            self.table = {"w": torch.randn(3)}
        elif where == "number":
            self.jitter = float(torch.rand(1))
        else:
            self.nested = types.SimpleNamespace(values=[np.random.rand(2), torch.randn(2)])


@pytest.mark.parametrize("where", ["dict", "number", "object"])
def test_random_state_outside_the_tensors_is_never_served_from_a_file(tmp_path, where):
    entry = dataclasses.replace(archs.get("small_cnn"), builder=f"random_{where}")
    seed_everything(0, False)
    _, record = initcache.build(entry, settings("small_cnn"), lambda: RandomState(where), tmp_path)
    assert record["source"] == "built" and "differs from the fresh build" in record["note"]
    assert not list(tmp_path.glob("*.pt")) and not list(tmp_path.glob("*.json"))


class SharedNorm(nn.Module):
    """One submodule (with a buffer) reached under two names."""

    def __init__(self):
        super().__init__()
        self.a = nn.BatchNorm1d(4)
        self.b = self.a
        self.linear = nn.Linear(4, 4)


def test_a_shared_module_comes_back_shared(tmp_path):
    entry = dataclasses.replace(archs.get("small_cnn"), builder="shared_norm")
    for expected in ("built", "cache"):
        seed_everything(0, False)
        model, record = initcache.build(entry, settings("small_cnn"), SharedNorm, tmp_path)
        assert record["source"] == expected, record
    assert model.a is model.b and model.a.running_mean is model.b.running_mean


def test_a_write_that_fails_leaves_no_file_and_the_build_as_it_is(tmp_path, monkeypatch):
    def broken(tensors, handle):
        handle.write(b"half")
        raise RuntimeError("PytorchStreamWriter failed writing file")

    monkeypatch.setattr(initcache, "save", broken)
    model, record, after = build("small_cnn", tmp_path)
    assert record["source"] == "built" and "RuntimeError: PytorchStreamWriter failed" in record["note"]
    assert list(tmp_path.iterdir()) == []
    assert_same(model, build("small_cnn", None)[0])
    assert after == build("small_cnn", None)[2]


def test_a_prune_that_fails_leaves_the_written_file_cached_and_said_so(tmp_path, monkeypatch):
    """Another user's file in a shared results/ cannot be removed: the file just written still serves, and the
    record says it was cached (not "not cached")."""
    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(initcache, "prune", denied)
    _, written, _ = build("small_cnn", tmp_path)
    assert written["source"] == "built" and written["note"] is None, written
    _, read, _ = build("small_cnn", tmp_path)
    assert read["source"] == "cache", read


def test_pruning_spares_the_file_named_and_removes_what_a_killed_writer_left(tmp_path):
    import os

    key = build("small_cnn", tmp_path)[1]["key"]
    left = tmp_path / f".{key}.pt.abcdef"
    left.write_bytes(b"half")
    os.utime(left, (1000, 1000))
    fresh = tmp_path / f".{key}.pt.012345"  # a writer at work now
    fresh.write_bytes(b"half")
    initcache.prune(tmp_path, 0, keep=key)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f"{key}.pt", f"{key}.json", fresh.name])
    initcache.prune(tmp_path, 0)
    assert [p.name for p in tmp_path.iterdir()] == [fresh.name]


@pytest.mark.parametrize("split", [0, 1, 7, 1000, 4093])
def test_crc32_combine_gives_zlibs_crc_of_the_joined_bytes(split):
    data = random.Random(split).randbytes(4096 + 1000)
    first, second = data[:split], data[split:]
    combined = initcache.crc32_combine(zlib.crc32(first), zlib.crc32(second), len(second))
    assert combined == zlib.crc32(data)
    assert initcache.crc32_combine(zlib.crc32(data), zlib.crc32(b""), 0) == zlib.crc32(data)


@pytest.mark.parametrize("size", [0, 1, 999, 1000, 1001, 12345])
@pytest.mark.parametrize("workers", [1, 4])
def test_the_file_crc_read_in_parallel_chunks_is_the_whole_files(tmp_path, monkeypatch, size, workers):
    monkeypatch.setattr(initcache, "CHUNK", 1000)  # several chunks of a small file, the last one short
    path = tmp_path / "weights.pt"
    data = random.Random(size).randbytes(size)
    path.write_bytes(data)
    assert initcache.file_crc(path, workers=workers) == zlib.crc32(data)
    damaged = bytearray(data or b"\0")
    damaged[-1] ^= 0x40  # a flipped bit in the last chunk is seen
    path.write_bytes(bytes(damaged))
    assert initcache.file_crc(path, workers=workers) != zlib.crc32(data)


def test_crc32_combine_at_the_real_chunk_size_and_past_4_gib():
    """Lengths the small cases above never reach: a whole CHUNK against zlib, and lengths over 2**32, where joining
    A + B + C must give one CRC however it is grouped (a combine that drops the length's high bits does not)."""
    data = random.Random(1).randbytes(2 * initcache.CHUNK + 7)
    head, chunk, tail = data[:initcache.CHUNK], data[initcache.CHUNK:2 * initcache.CHUNK], data[2 * initcache.CHUNK:]
    crc = initcache.crc32_combine(zlib.crc32(head), zlib.crc32(chunk), len(chunk))
    assert initcache.crc32_combine(crc, zlib.crc32(tail), len(tail)) == zlib.crc32(data)
    combine, rng = initcache.crc32_combine, random.Random(3)
    for length_b, length_c in [(2**32 + 5, 3), (2**32, 2**32), (2**40 + 1, 7), (5, 2**33 + 11)]:
        a, b, c = (rng.getrandbits(32) for _ in range(3))
        assert combine(combine(a, b, length_b), c, length_c) == combine(a, combine(b, c, length_c), length_b + length_c)


def test_the_real_chunk_size_file_crc_is_zlibs_and_uses_threads(tmp_path, monkeypatch):
    path = tmp_path / "weights.pt"
    data = random.Random(2).randbytes(2 * initcache.CHUNK + 7)
    path.write_bytes(data)
    threads, crc32 = set(), zlib.crc32

    def counting_crc32(chunk, *start):
        threads.add(threading.get_ident())
        return crc32(chunk, *start)

    monkeypatch.setattr(initcache.zlib, "crc32", counting_crc32)
    assert initcache.file_crc(path, workers=3) == crc32(data)
    assert len(threads) > 1  # the chunks were checked in the pool, not one after another


def test_a_file_that_changes_size_while_checked_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(initcache, "CHUNK", 1000)
    path = tmp_path / "weights.pt"
    path.write_bytes(bytes(5000))
    pread = os.pread
    monkeypatch.setattr(initcache.os, "pread", lambda fd, n, offset: pread(fd, n, offset)[: n // 2])  # cut short
    with pytest.raises(OSError, match="changed size"):
        initcache.file_crc(path, workers=2)

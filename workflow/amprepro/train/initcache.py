"""A model's initial weights, built once per key and reused by every cell that builds the same model from the same
random state (issue 40: time to a verdict).

A cell builds its model on the CPU from its seed (torchvision, timm and our own builders draw the initial weights
from the CPU's generator): 0.3 s for ResNet-50, 1.0 s for ViT-B/16, 1.6 s for GPT-124M on the H200 box
(results-reference/paper-h200/2026-12-01-cell-profile), about 49 s of the paper route's 391 s
(results-reference/perf/04ad031). The paper preset builds ViT-B/16 at seed 0 fifteen times. The same arch and
settings from the same random state give the same tensors, so:

- a miss builds the model as before, then writes its parameters and buffers to `<dir>/<key>.pt` with a manifest
  `<dir>/<key>.json` (their names and the CRC-32 of the file, and where the build left the random generators);
- a hit builds the module with its parameters on the meta device (no initialisation), puts the file's tensors in
  their place (tied parameters stay tied) and sets the generators to where the build left them: the cell goes on
  exactly as if it had built the weights itself.

Bit for bit, and checked: a miss keeps its file only if a hit from it gives the same model as the build just made
(every parameter, buffer and tensor attribute equal, nothing left on the meta device), and a hit reads a file only
if its CRC-32 matches the manifest. Anything else builds afresh; the cell's record says which happened and why
(metrics.json's init_weights).

The key: the arch and its builder, the model's settings but those applied after the build or not the model's
(NOT_THE_BUILDERS), torch's version and the arch package's, the code of amprepro.train.models (with what it
imports) and a digest of the random generators' states before the build. Only models built on the CPU are cached:
a LLaMA is built on the meta device and initialised on its GPU (models.place), and a build faster than
MIN_BUILD_SECONDS is not worth a file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import time
import zlib
from pathlib import Path

import numpy as np
import torch
from torch import nn

# Settings the builders never read: the batch (the plan lowers it per card), what prepare_model or the cell applies
# after the build (channels_last, fused_layer_norm, lora, compile, the apex build, DDP's processes) and the data's own
# (tests/backbone/test_initcache.py checks that no builder reads them).
NOT_THE_BUILDERS = ("batch_size", "channels_last", "compile", "fused_layer_norm", "apex_build", "gpus", "nodes",
                    "sync_batchnorm", "lora", "epoch_tokens", "eval_every", "eval_windows", "download")
NOT_CACHED = ("llama",)  # builders whose model is not built on the CPU
MIN_BUILD_SECONDS = 0.2
MAX_BYTES = 8 << 30  # the folder's size after a write: the files least recently written or read go first
CHUNK = 1 << 24


def record(source: str, key: str | None, seconds: float, note: str | None = None) -> dict:
    """What a cell's record says of its initial weights (metrics.json's init_weights)."""
    return {"source": source, "key": key, "seconds": round(seconds, 4), "note": note}


def build(entry, settings, make, cache_dir: str | Path | None) -> tuple[nn.Module, dict]:
    """The model that make() builds, and the record of where its weights came from. cache_dir None: no cache."""
    start = time.perf_counter()
    if cache_dir is None or entry.builder in NOT_CACHED:
        return make(), record("built", None, time.perf_counter() - start)
    cache = Path(cache_dir)
    key = cache_key(entry, settings)
    model, why = load(cache, key, make)
    if model is not None:
        return model, record("cache", key, time.perf_counter() - start)
    before, built = generator_states(), time.perf_counter()
    model = make()
    if time.perf_counter() - built < MIN_BUILD_SECONDS:
        note = why or f"built in under {MIN_BUILD_SECONDS} s: not cached"
    else:
        note = "; ".join(filter(None, [why, store(cache, key, model, make, before)])) or None
    return model, record("built", key, time.perf_counter() - start, note)


# ---- the key ----------------------------------------------------------------------------------------------------


def cache_key(entry, settings) -> str:
    """sha256 of what the build's tensors depend on (the module's docstring lists it)."""
    from importlib import metadata

    from amprepro.codedigest import code_digest

    model_settings = {k: v for k, v in settings.resolved().items() if k not in NOT_THE_BUILDERS}
    versions = {"torch": torch.__version__}
    if entry.package:
        try:
            versions[entry.package] = metadata.version(entry.package)
        except metadata.PackageNotFoundError:
            versions[entry.package] = None
    facts = {"arch": entry.name, "builder": entry.builder, "settings": model_settings, "versions": versions,
             "code": code_digest("train.models"), "dtype": str(torch.get_default_dtype()),
             "generators": states_digest(generator_states())}
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:32]


def generator_states() -> dict:
    """The CPU generators a build may draw from: torch's, Python's random and numpy's global one."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {"torch": torch.get_rng_state().tolist(), "random": [version, list(internal), gauss],
            "numpy": [kind, keys.tolist(), pos, has_gauss, cached]}


def set_generator_states(states: dict) -> None:
    torch.set_rng_state(torch.tensor(states["torch"], dtype=torch.uint8))
    version, internal, gauss = states["random"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = states["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))


def states_digest(states: dict) -> str:
    return hashlib.sha256(json.dumps(states, sort_keys=True).encode()).hexdigest()


# ---- a hit ------------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def parameters_on_meta():
    """Every parameter a module registers goes to the meta device, so the builder's initialisation does nothing (as
    accelerate's init_empty_weights); buffers and other tensors are made as usual."""
    original = nn.Module.register_parameter

    def register(module, name, param):
        original(module, name, param)
        if param is not None and param.device.type != "meta":
            held = module._parameters[name]
            module._parameters[name] = nn.Parameter(held.to("meta"), requires_grad=held.requires_grad)

    nn.Module.register_parameter = register
    try:
        yield
    finally:
        nn.Module.register_parameter = original


def load(cache: Path, key: str, make) -> tuple[nn.Module | None, str | None]:
    """The model from the cache's file for `key`, or None and why not (None: there is none)."""
    try:
        manifest = json.loads((cache / f"{key}.json").read_text())
    except (FileNotFoundError, NotADirectoryError):
        return None, None
    except (OSError, ValueError) as exc:
        return None, f"cache manifest {cache / f'{key}.json'} unreadable ({exc}): rebuilt"
    return rebuild(cache / f"{key}.pt", manifest, make)


def rebuild(data_path: Path, manifest: dict, make, crc_checked: bool = False) -> tuple[nn.Module | None, str | None]:
    """The model make() builds, with its parameters on the meta device, filled from data_path; the generators then
    where the manifest says the build left them. On failure: None, why, and the generators as they were.
    crc_checked: the caller has just computed the file's CRC-32 (store)."""
    states = generator_states()
    try:
        if not crc_checked and file_crc(data_path) != manifest["crc32"]:
            why = f"cache file {data_path} does not match its manifest's CRC-32: rebuilt"
        else:
            tensors = torch.load(data_path, map_location="cpu", weights_only=True, mmap=True)
            with parameters_on_meta():
                model = make()
            if layout(model) == manifest["layout"]:
                fill(model, tensors)
            if layout(model) == manifest["layout"] and not on_meta(model):
                set_generator_states(manifest["after"])
                if not crc_checked:
                    with contextlib.suppress(OSError):  # read now: the last to go when the folder is pruned
                        os.utime(data_path)
                return model, None
            why = f"cache file {data_path} holds another model's tensors: rebuilt"
    except Exception as exc:  # an unreadable file, a builder the meta device cannot run: build afresh, say why
        why = f"cache file {data_path} not used ({type(exc).__name__}: {exc}): rebuilt"
    set_generator_states(states)
    return None, why


def fill(model: nn.Module, tensors: dict) -> None:
    """Put the named tensors in place of the model's parameters and buffers; a parameter reached under two names
    (tied weights) gets one tensor, under its first name."""
    placed = {}
    for prefix, module in model.named_modules(remove_duplicate=False):
        for name, param in list(module._parameters.items()):
            if param is None:
                continue
            full = f"{prefix}.{name}" if prefix else name
            if id(param) not in placed:
                placed[id(param)] = nn.Parameter(tensors[full], requires_grad=param.requires_grad)
            setattr(module, name, placed[id(param)])  # through the module: an LSTM re-lists its flat weights
        for name, buffer in list(module._buffers.items()):
            if buffer is not None:
                setattr(module, name, tensors[f"{prefix}.{name}" if prefix else name])


def on_meta(model: nn.Module) -> bool:
    return any(t.device.type == "meta" for _, t in tensors_of(model))


def layout(model: nn.Module) -> list:
    """Every parameter and buffer under every name it has: its name, shape, dtype, whether it trains and the first
    name of the tensor it is (tied weights share one)."""
    first, out = {}, []
    for prefix, module in model.named_modules(remove_duplicate=False):
        for kind, held in (("parameter", module._parameters), ("buffer", module._buffers)):
            for name, tensor in held.items():
                if tensor is None:
                    continue
                full = f"{prefix}.{name}" if prefix else name
                first.setdefault(id(tensor), full)
                out.append([kind, full, list(tensor.shape), str(tensor.dtype), tensor.requires_grad,
                            first[id(tensor)]])
    return out


# ---- a miss -----------------------------------------------------------------------------------------------------


def store(cache: Path, key: str, model: nn.Module, make, before: dict) -> str | None:
    """Write the model's tensors for `key`, and its manifest only if a hit from them gives this model back (the
    generators as the build left them, either way). None, or why the file was not kept."""
    from amprepro import files

    after = generator_states()
    tensors = {full: tensor_at(model, full, kind).detach()
               for kind, full, _, _, _, first in layout(model) if full == first}
    data_path = cache / f"{key}.pt"
    try:
        files.write_binary(data_path, lambda handle: save(tensors, handle))
        manifest = {"key": key, "crc32": file_crc(data_path), "layout": layout(model), "after": after}
        set_generator_states(before)  # where the fresh build started
        rebuilt, why = rebuild(data_path, manifest, make, crc_checked=True)
        set_generator_states(after)
        if rebuilt is None or not same_model(model, rebuilt):
            for path in (data_path, cache / f"{key}.json"):
                path.unlink(missing_ok=True)
            return f"not cached: {why or 'the model rebuilt from the file differs from the fresh build'}"
        files.write_json(cache / f"{key}.json", manifest)
        prune(cache, MAX_BYTES)
    except OSError as exc:
        set_generator_states(after)
        return f"not cached: cannot write {cache} ({exc})"
    return None


def prune(cache: Path, limit: int) -> None:
    """Remove the files least recently written or read until the folder holds at most `limit` bytes: old keys (code
    or versions that changed) go first, the file just written last."""
    data = sorted(cache.glob("*.pt"), key=lambda path: path.stat().st_mtime)
    total = sum(path.stat().st_size for path in data)
    for path in data[:-1]:
        if total <= limit:
            break
        total -= path.stat().st_size
        for stale in (path, path.with_suffix(".json")):
            stale.unlink(missing_ok=True)


def save(tensors: dict, handle) -> None:
    """torch.save without torch's own CRC-32 of each record: the manifest holds the file's (file_crc)."""
    crc32 = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(False)
    try:
        torch.save(tensors, handle)
    finally:
        torch.serialization.set_crc32_options(crc32)


def tensor_at(model: nn.Module, full: str, kind: str) -> torch.Tensor:
    prefix, _, name = full.rpartition(".")
    module = model.get_submodule(prefix) if prefix else model
    return (module._parameters if kind == "parameter" else module._buffers)[name]


def same_model(a: nn.Module, b: nn.Module) -> bool:
    """Equal layout, every parameter and buffer bit for bit, and every other tensor attribute of every module."""
    if layout(a) != layout(b):
        return False
    for (name_a, ta), (name_b, tb) in zip(tensors_of(a), tensors_of(b)):
        if name_a != name_b or tb.device.type == "meta" or ta.dtype != tb.dtype or ta.shape != tb.shape:
            return False
        if not torch.equal(ta, tb):
            return False
    return len(list(tensors_of(a))) == len(list(tensors_of(b)))


def tensors_of(model: nn.Module):
    for prefix, module in model.named_modules(remove_duplicate=False):
        for name, value in sorted(vars(module).items()):
            if name in ("_parameters", "_buffers"):
                value = {k: v for k, v in value.items() if v is not None}
                for inner, tensor in value.items():
                    yield f"{prefix}.{name}.{inner}", tensor
            elif isinstance(value, torch.Tensor):
                yield f"{prefix}.{name}", value
            elif isinstance(value, (list, tuple)):
                for i, item in enumerate(value):
                    if isinstance(item, torch.Tensor):
                        yield f"{prefix}.{name}[{i}]", item


def file_crc(path: Path) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc


def warm() -> None:
    """Run the meta device's first operations (about 0.9 s of lazy set-up) and the code digest once: the cell server
    calls it before it forks, so that a cell's hit costs what loading the file costs."""
    from amprepro.codedigest import code_digest

    with parameters_on_meta():
        layer = nn.Linear(2, 2)
        nn.Embedding(2, 2)
        nn.LayerNorm(2)
        nn.Conv2d(1, 1, 1)
        nn.init.trunc_normal_(layer.weight)
    code_digest("train.models")

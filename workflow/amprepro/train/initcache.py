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

import concurrent.futures
import contextlib
import functools
import hashlib
import json
import os
import platform
import random
import secrets
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
DEPTH = 4  # how deep same_value looks into a module's attributes (lists, dicts, plain objects)
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
    # torch's CPU kernels draw differently per instruction set (normal_ on AVX2 and AVX-512), and one version number
    # names several builds (PyPI's, conda-forge's): the machine and the build are part of the key
    versions = {"torch": torch.__version__, "torch_build": torch.version.git_version, "numpy": np.__version__,
                "python": platform.python_version(), "machine": platform.machine(),
                "cpu_capability": torch.backends.cpu.get_cpu_capability()}
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
            tensors = torch.load(data_path, map_location="cpu", weights_only=True)  # in memory, not mapped
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
    """Put the named tensors in place of the model's parameters and buffers; a tensor reached under two names (tied
    weights, a shared module) gets one tensor, under its first name."""
    placed, replaced = {}, []  # replaced: kept alive, so that no id in `placed` is reused while this runs
    for prefix, module in model.named_modules(remove_duplicate=False):
        for name, param in list(module._parameters.items()):
            if param is None:
                continue
            replaced.append(param)
            full = f"{prefix}.{name}" if prefix else name
            if id(param) not in placed:
                new = nn.Parameter(tensors[full], requires_grad=param.requires_grad)
                placed[id(param)] = placed[id(new)] = new  # a shared module is met again already filled
            setattr(module, name, placed[id(param)])  # through the module: an LSTM re-lists its flat weights
        for name, buffer in list(module._buffers.items()):
            if buffer is None:
                continue
            replaced.append(buffer)
            if id(buffer) not in placed:
                new = tensors[f"{prefix}.{name}" if prefix else name]
                placed[id(buffer)] = placed[id(new)] = new
            setattr(module, name, placed[id(buffer)])


def on_meta(model: nn.Module) -> bool:
    return any(t.device.type == "meta" for _, module in model.named_modules(remove_duplicate=False)
               for t in tensors_in(state(module)))


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
    """Write the model's tensors for `key` to a temporary file; put it in place, with its manifest, only if a hit from
    it gives this model back. The generators are left as the build left them either way. None, or why not kept."""
    from amprepro import files

    after = generator_states()
    tensors = {full: tensor_at(model, full, kind).detach()
               for kind, full, _, _, _, first in layout(model) if full == first}
    temporary = cache / f".{key}.pt.{secrets.token_hex(6)}"  # hidden: prune and readers never take it for a file
    try:
        cache.mkdir(parents=True, exist_ok=True)
        with open(temporary, "xb") as handle:
            save(tensors, handle)
        manifest = {"key": key, "crc32": file_crc(temporary), "layout": layout(model), "after": after}
        set_generator_states(before)  # where the fresh build started
        rebuilt, why = rebuild(temporary, manifest, make, crc_checked=True)
        set_generator_states(after)
        if rebuilt is None or not same_model(model, rebuilt):
            return f"not cached: {why or 'the model rebuilt from the file differs from the fresh build'}"
        del rebuilt
        os.replace(temporary, cache / f"{key}.pt")
        files.write_json(cache / f"{key}.json", manifest)
    except Exception as exc:  # a full disk, a folder that cannot be written, a tensor torch cannot save: build as is
        set_generator_states(after)
        return f"not cached: {cache} ({type(exc).__name__}: {exc})"
    finally:
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # the file is in place and will be served: a failed prune does not un-cache it
        prune(cache, MAX_BYTES, keep=key)
    return None


def prune(cache: Path, limit: int, keep: str | None = None) -> None:
    """Remove the files least recently written or read until the folder holds at most `limit` bytes: old keys (code
    or versions that changed) go first, `keep` never; temporary files a killed writer left, older than an hour, too."""
    now, sized = time.time(), []
    for path in cache.glob(".*.pt.*"):
        with contextlib.suppress(OSError):
            if now - path.stat().st_mtime > 3600:
                path.unlink()
    for path in cache.glob("*.pt"):
        with contextlib.suppress(OSError):  # another process pruned it first
            stat = path.stat()
            sized.append((stat.st_mtime, stat.st_size, path))
    total = sum(size for _, size, _ in sized)
    for _, size, path in sorted(sized):
        if total <= limit:
            break
        if path.stem == keep:
            continue
        total -= size
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
    """Equal layout and, module by module, equal state: every parameter and buffer bit for bit, and every other
    attribute (tensors, numbers, strings, arrays, and what lists, dicts and plain objects hold), none on the meta
    device. Modules are compared in their own turn; functions and hooks are code, not state."""
    if layout(a) != layout(b):
        return False
    modules_a = [m for _, m in a.named_modules(remove_duplicate=False)]
    modules_b = [m for _, m in b.named_modules(remove_duplicate=False)]
    return len(modules_a) == len(modules_b) and all(
        same_value(state(x), state(y)) for x, y in zip(modules_a, modules_b))


def state(module: nn.Module) -> dict:
    return {name: value for name, value in vars(module).items() if name != "_modules"}


def same_value(a, b, depth: int = 0) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and "meta" not in (a.device.type,
                b.device.type) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b))
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
    if isinstance(a, (bool, int, float, complex, str, bytes, type(None), set, frozenset, torch.dtype, torch.device)):
        return a == b or (a != a and b != b)  # NaN equals NaN here
    if depth > DEPTH or isinstance(a, nn.Module) or callable(a):
        return True  # compared in its own turn, code, or deeper than anything a builder keeps
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_value(x, y, depth + 1) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same_value(a[k], b[k], depth + 1) for k in a)
    if hasattr(a, "__dict__"):
        return same_value(vars(a), vars(b), depth + 1)
    return True  # an object without visible state


def tensors_in(value, depth: int = 0):
    """Every tensor an attribute holds, as same_value looks into it."""
    if isinstance(value, torch.Tensor):
        yield value
    elif depth > DEPTH or isinstance(value, nn.Module) or callable(value):
        return
    elif isinstance(value, (list, tuple, set, frozenset)):
        for item in value:
            yield from tensors_in(item, depth + 1)
    elif isinstance(value, dict):
        for item in value.values():
            yield from tensors_in(item, depth + 1)
    elif hasattr(value, "__dict__") and not isinstance(value, type):
        yield from tensors_in(vars(value), depth + 1)


def file_crc(path: Path, workers: int | None = None) -> int:
    """The file's CRC-32, as zlib.crc32 of its bytes gives it: its CHUNKs read (os.pread) and checked in a pool of
    threads (both release the GIL), then combined (crc32_combine). In one thread, GPT-124M's 498 MB file took 0.33 s
    of a 0.60 s hit on this project's 2-core machine; in two, 0.16 s of 0.43 s
    (results-reference/perf/cpu-initcache-crc/).
    workers: threads; None: torch's thread count here (a cell's job threads), at most the usable CPUs and 8."""
    if workers is None:
        usable = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
        workers = min(8, len(usable), torch.get_num_threads())
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        offsets = range(0, size, CHUNK)
        if workers <= 1 or len(offsets) <= 1 or not hasattr(os, "pread"):
            crc = 0
            while chunk := f.read(CHUNK):
                crc = zlib.crc32(chunk, crc)
            return crc
        descriptor = f.fileno()

        def chunk_crc(offset: int) -> tuple[int, int]:
            data = os.pread(descriptor, CHUNK, offset)
            return zlib.crc32(data), len(data)

        with concurrent.futures.ThreadPoolExecutor(max_workers=min(workers, len(offsets))) as pool:
            parts = list(pool.map(chunk_crc, offsets))
    if sum(length for _, length in parts) != size:
        raise OSError(f"{path} changed size while its CRC-32 was computed")
    crc = 0
    for part, length in parts:
        crc = crc32_combine(crc, part, length)
    return crc


def crc32_combine(crc1: int, crc2: int, length2: int) -> int:
    """The CRC-32 of A + B from crc32(A), crc32(B) and len(B): zlib's crc32_combine (its matrix form, zlib 1.2.11 and
    before), which Python's zlib does not expose. Feeding length2 zero bytes through the CRC's register is a linear
    map (a 32 x 32 matrix over GF(2)), computed by repeated squaring; the map for CHUNK bytes, the common case, is
    kept."""
    if length2 <= 0:
        return crc1
    return _gf2_times(_zeros_operator(length2), crc1) ^ crc2


def _gf2_times(matrix: tuple[int, ...], vector: int) -> int:
    total, row = 0, 0
    while vector:
        if vector & 1:
            total ^= matrix[row]
        vector >>= 1
        row += 1
    return total


def _gf2_square(matrix: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(_gf2_times(matrix, matrix[n]) for n in range(32))


@functools.lru_cache(maxsize=8)
def _zeros_operator(length: int) -> tuple[int, ...]:
    """The matrix that takes a CRC-32's register past `length` zero bytes (as zlib 1.2.11's crc32_combine builds it)."""
    power = (0xEDB88320, *(1 << n for n in range(31)))  # one zero bit
    power = _gf2_square(_gf2_square(_gf2_square(power)))  # one zero byte (8 bits)
    result = None
    while length:
        if length & 1:
            result = power if result is None else tuple(_gf2_times(power, column) for column in result)
        length >>= 1
        if length:
            power = _gf2_square(power)
    return result


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

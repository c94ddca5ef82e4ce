"""What a cell's initial-weights cache hit costs, with the file's CRC-32 read in one thread (as before) and in
parallel chunks (amprepro.train.initcache.file_crc): GPT-124M as the paper preset builds it, on this machine's CPU.

    PYTHONPATH=workflow python results-reference/perf/cpu-initcache-crc/initcache_hit.py [repeats]

One miss writes the file; then, alternating, `repeats` hits each way. Each hit is the whole initcache.build (CRC,
torch.load, the meta build, the fill), timed with perf_counter; the file is in the page cache, as on a box where the
earlier cell just wrote or read it.
"""
import functools
import json
import os
import platform
import statistics
import sys
import tempfile
import time

import torch

from amprepro.modelsettings import ModelSettings
from amprepro.train import initcache, models
from amprepro.train.cell import seed_everything

repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 5
settings = ModelSettings.of_entry({"arch": "gpt", "data": "synthetic_tokens", "batch_size": 16, "seq_len": 1024})
parallel_crc = initcache.file_crc


def hit(cache, crc):
    initcache.file_crc = crc
    seed_everything(0, False)
    start = time.perf_counter()
    model, record = initcache.build(settings.arch_entry, settings, lambda: models.build(settings.arch, settings), cache)
    seconds = time.perf_counter() - start
    assert record["source"] == "cache", record
    return seconds


with tempfile.TemporaryDirectory() as cache:
    seed_everything(0, False)
    start = time.perf_counter()
    _, first = initcache.build(settings.arch_entry, settings, lambda: models.build(settings.arch, settings), cache)
    miss = time.perf_counter() - start
    size = sum(os.path.getsize(os.path.join(cache, f)) for f in os.listdir(cache) if f.endswith(".pt"))
    times = {"one thread": [], "parallel chunks": []}
    for _ in range(repeats):
        times["one thread"].append(hit(cache, functools.partial(parallel_crc, workers=1)))
        times["parallel chunks"].append(hit(cache, parallel_crc))
    crc_only = {}
    path = next(os.path.join(cache, f) for f in os.listdir(cache) if f.endswith(".pt"))
    for name, workers in (("one thread", 1), ("parallel chunks", None)):
        runs = []
        for _ in range(repeats):
            start = time.perf_counter()
            parallel_crc(path, workers=workers)
            runs.append(time.perf_counter() - start)
        crc_only[name] = runs
print(json.dumps({
    "what": "initcache hit of GPT-124M (arch gpt, seq_len 1024): whole initcache.build, seconds",
    "machine": {"cpus": len(os.sched_getaffinity(0)), "python": platform.python_version(), "torch": torch.__version__,
                "load_1min": os.getloadavg()[0]},
    "file_bytes": size, "miss_seconds": round(miss, 3), "miss_source": first["source"],
    "hit_seconds": {k: [round(x, 4) for x in v] for k, v in times.items()},
    "hit_median": {k: round(statistics.median(v), 4) for k, v in times.items()},
    "crc_only_seconds": {k: [round(x, 4) for x in v] for k, v in crc_only.items()},
    "crc_only_median": {k: round(statistics.median(v), 4) for k, v in crc_only.items()},
}, indent=1))

"""amprepro.train.initcache on the paper preset's torchvision and timm models, on a GPU box (where they import: this
machine's PyPI torchvision is built for CUDA torch): a hit gives the fresh build bit for bit, with the
random state after it, and costs less than the build (the times are printed: tools/gpu/checks.sh keeps them)."""

import random
import time

import numpy as np
import pytest
import torch

from amprepro.modelsettings import ModelSettings
from amprepro.train import initcache, models
from amprepro.train.cell import seed_everything

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; this machine has none")]
ARCHS = ["resnet50", "vit_b_16", "vit_base_patch16_224"]


def build(arch, cache):
    if models.unavailable_reason(arch):
        pytest.skip(models.unavailable_reason(arch))
    s = ModelSettings.of_entry({"arch": arch, "data": "synthetic_images", "batch_size": 8})
    seed_everything(0, False)
    started = time.perf_counter()
    model, record = initcache.build(s.arch_entry, s, lambda: models.build(s.arch, s), cache)
    seconds = time.perf_counter() - started
    return model, record, seconds, (torch.rand(3).tolist(), random.random(), float(np.random.rand()))


@pytest.mark.parametrize("arch", ARCHS)
def test_a_hit_is_the_fresh_build_and_cheaper(arch, tmp_path, monkeypatch):
    threshold = initcache.MIN_BUILD_SECONDS
    monkeypatch.setattr(initcache, "MIN_BUILD_SECONDS", 0.0)  # a warm ResNet-50 may build in under it: cache anyway
    initcache.warm()  # as the cell server does before it forks
    fresh, _, fresh_s, after = build(arch, None)
    first, written, write_s, after_written = build(arch, tmp_path)
    hit, read, hit_s, after_hit = build(arch, tmp_path)
    assert written["source"] == "built" and written["note"] is None, written
    assert read["source"] == "cache", read
    for a, b in ((fresh, first), (fresh, hit)):
        sa, sb = a.state_dict(), b.state_dict()
        assert list(sa) == list(sb) and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert after == after_written == after_hit
    print(f"initcache {arch}: fresh build {fresh_s:.3f} s, build and write {write_s:.3f} s, hit {hit_s:.3f} s")
    if fresh_s >= threshold:  # the cache pays only for builds the pipeline caches (MIN_BUILD_SECONDS and over)
        assert hit_s < fresh_s

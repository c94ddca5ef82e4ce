"""The largest-batch search on a real GPU (skipped, with the reason, without CUDA): under an allocator cap, the batch
it calls the largest runs as a real cell in a fresh process, and the next batch on the grid does not; an
out-of-memory try leaves the search's process able to go on. Run by tools/gpu/measurement.sh."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from amprepro import memory
from amprepro.cellspec import CellSpec
from amprepro.train import batchsearch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; this machine has none")]
REPO = Path(__file__).resolve().parents[2]
LIMIT = 3 * 2**30  # an emulated 3 GiB card: small enough that a ViT-B/16 search ends exact within seconds


def view(tmp: Path, batch: int) -> Path:
    path = tmp / f"view-{batch}.json"
    path.write_text(json.dumps({"model": "vit", "batch_size": batch, "fits": True, "why": "test",
                                "allocator_limit_bytes": LIMIT, "cap_gib": LIMIT / 2**30}))
    return path


def fresh_cell(spec: CellSpec, tmp: Path, batch: int) -> dict:
    out = tmp / f"cell-{batch}"
    out.mkdir()
    args = ["--spec", spec.with_train(steps=3, warmup_steps=1).to_json(), "--plan", str(view(tmp, batch)),
            "--metrics", str(out / "metrics.json"), "--steps", str(out / "steps.csv")]
    subprocess.run([sys.executable, "-m", "amprepro.train.train", *args], check=True, timeout=300,
                   env={**os.environ, "PYTHONPATH": str(REPO / "workflow")})
    return json.loads((out / "metrics.json").read_text())


@pytest.mark.parametrize("precision", ["fp32", "amp_bf16"])
def test_the_largest_batch_runs_in_a_fresh_process_and_the_next_does_not(tmp_path, precision):
    # Planned at 4 (not a multiple of 8: a grid of 1), so the answer is exact to one item. On the H200, 2026-12-01,
    # planned at 8 (a grid of 8), fp32 fitted only its planned batch, and amp_bf16's answer (24) finished its one try
    # and then ran out of memory at a fresh cell's second step: hence amprepro.memory.HEADROOM.
    spec = CellSpec("vit", precision, 0, {"arch": "vit_b_16", "data": "synthetic_images", "batch_size": 4,
                                          "image_size": 224}, {"lr": 1e-4, "optimizer": "adamw", "steps": 3,
                                                               "warmup_steps": 1})
    plan = json.loads(view(tmp_path, 4).read_text())
    record = batchsearch.run(spec, {"status": "ok"}, plan, {}, up_to=64, seconds=60)
    assert record["status"] == "ok" and record["bound"] == "exact", record
    largest, failing = record["largest_batch"], record["smallest_failing_batch"]
    assert largest >= 4 and failing == largest + 1 and any(not t["fits"] for t in record["tries"])
    assert all(0 <= t["data_seconds"] <= t["seconds"] for t in record["tries"] if t["fits"]), record["tries"]
    cell = fresh_cell(spec, tmp_path, largest)
    assert cell["status"] == "ok" and memory.within_headroom(cell["peak_allocated_bytes"], LIMIT), cell
    over = fresh_cell(spec, tmp_path, failing)  # out of memory (skipped for memory), or no headroom left
    assert over["status"] == "skipped" or not memory.within_headroom(over["peak_allocated_bytes"], LIMIT), over

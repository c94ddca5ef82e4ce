"""A cell's identity has one spelling (CellId.key, its folder's path under results/runs); the reference's committed
files keep their older key, which CellId reads and writes as reference_key."""

from __future__ import annotations

from pathlib import Path

import pytest

from amprepro.cellid import CellId


def test_one_spelling_the_runs_folders():
    cell = CellId("resnet50", "amp_fp16", "0")
    assert cell.seed == 0 and cell == CellId("resnet50", "amp_fp16", 0)
    assert cell.key == str(cell) == "resnet50/amp_fp16/seed0"
    assert cell.path == Path("results/runs/resnet50/amp_fp16/seed0")
    assert cell.under("elsewhere") == Path("elsewhere/resnet50/amp_fp16/seed0")
    assert cell.reference_key == "resnet50/amp_fp16/0"
    assert cell.at("fp32") == CellId("resnet50", "fp32", 0)


def test_from_any_record_and_back_from_either_key():
    row = {"model": "gpt124m", "precision": "amp_bf16", "seed": 1, "status": "ok"}
    cell = CellId.of(row)
    assert CellId.from_key(cell.key) == cell == CellId.from_key(cell.reference_key)
    assert {cell: row}[CellId("gpt124m", "amp_bf16", "1")] is row  # a CSV's "1" finds the same cell
    with pytest.raises(ValueError, match="'gpt124m/amp_bf16' is not a cell key"):
        CellId.from_key("gpt124m/amp_bf16")


def test_cells_sort_by_model_precision_seed():
    cells = [CellId("b", "fp32", 0), CellId("a", "tf32", 1), CellId("a", "tf32", 0), CellId("a", "fp32", 2)]
    assert [c.key for c in sorted(cells)] == ["a/fp32/seed2", "a/tf32/seed0", "a/tf32/seed1", "b/fp32/seed0"]

"""build_cell, the one factory of a cell (amprepro.train.cell): what the training run and the largest-batch search
both build, on the CPU."""

from __future__ import annotations

import inspect

import torch

from amprepro.cellspec import CellSpec
from amprepro.train import batchsearch, cell, lora


def spec(precision="fp32", train=None, **model):
    return CellSpec.of({"model": "m", "precision": precision, "seed": 0,
                        "model_config": {"arch": "small_cnn", "data": "digits", "batch_size": 32, **model},
                        "train": {"steps": 3, "warmup_steps": 1, "lr": 0.002, "optimizer": "adamw", **(train or {})}})


def test_the_plan_sets_the_batch_the_cell_is_built_at():
    built = cell.build_cell(spec(), torch.device("cpu"), {"batch_size": 8, "shape": None})
    assert built.spec.batch_size == 8
    assert cell.build_cell(spec(), torch.device("cpu"), None).spec.batch_size == 32


def test_channels_last_reaches_the_model_and_its_image_batches_only():
    built = cell.build_cell(spec(channels_last=True), torch.device("cpu"), None)
    conv = next(p for p in built.model.parameters() if p.dim() == 4 and p.shape[1] > 1)
    assert conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous()
    images = torch.randn(2, 3, 8, 8)
    assert built.inputs(images).is_contiguous(memory_format=torch.channels_last)
    assert built.inputs(torch.randn(2, 8, 8)).is_contiguous()  # not a 4-D batch: as it came
    plain = cell.build_cell(spec(), torch.device("cpu"), None)
    assert plain.inputs(images) is images


def test_the_scaler_starts_at_the_cells_init_scale():
    built = cell.build_cell(spec("amp_fp16", {"grad_scaler_init_scale": 2.0 ** 14}), torch.device("cpu"), None)
    assert built.trainer.scaler.get_scale() == 2.0 ** 14
    assert cell.build_cell(spec("amp_fp16"), torch.device("cpu"), None).trainer.scaler.get_scale() == 2.0 ** 16


def test_the_optimizer_holds_only_what_trains():
    model = {"arch": "llama_tiny", "data": "python_stdlib", "batch_size": 2, "seq_len": 32,
             "lora": {"rank": 4, "alpha": 8, "base": "fp32"}}
    built = cell.build_cell(CellSpec.of({"model": "l", "precision": "fp32", "seed": 0, "model_config": model,
                                         "train": {"steps": 2, "warmup_steps": 1, "lr": 0.01, "optimizer": "adamw"}}),
                            torch.device("cpu"), None)
    held = {id(p) for group in built.trainer.optimizer.param_groups for p in group["params"]}
    adapters = {id(p) for a in lora.adapters(built.model) for p in (a.lora_A.weight, a.lora_B.weight)}
    assert held == adapters


def test_a_compiling_precision_compiles_once_now_or_when_the_caller_says():
    later = cell.build_cell(spec("amp_bf16_compile"), torch.device("cpu"), None, compile_now=False)
    assert later.compiles and later.compiled is None and later.trainer.model is later.model
    later.compile()
    compiled = later.trainer.model
    assert later.compiled == "torch.compile of the whole model" and compiled is not later.model
    later.compile()
    assert later.trainer.model is compiled  # once
    now = cell.build_cell(spec("amp_bf16_compile"), torch.device("cpu"), None)
    assert now.compiled == "torch.compile of the whole model"
    eager = cell.build_cell(spec("amp_bf16"), torch.device("cpu"), None)
    assert not eager.compiles and eager.compiled is None and eager.trainer.model is eager.model


def test_the_search_builds_its_trial_through_build_cell():
    source = inspect.getsource(batchsearch.run)
    assert "build_cell(spec, device, plan, init_cache=init_cache)" in source
    assert "prepare_model" not in source and "make_optimizer" not in source and "Trainer(" not in source

"""FP8 through torchao (issue 26): the registry entries, the skip path (no torchao; compute capability < 8.9), the
nn.Linear filter, the peak stage's FP8 row, per-block compile and the comparison against compiled bf16."""

from __future__ import annotations

import csv
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from torch import nn

from amprepro import config as cfg
from amprepro import precisions
from amprepro.analysis import claimfile, fp8, summary
from amprepro.report import fp8section, reportlib
from amprepro.train import cellsupport, float8, flops, models, precision, train

REPO = Path(__file__).resolve().parents[2]
FP8 = ["fp8_tensorwise", "fp8_rowwise"]
CUDA = SimpleNamespace(type="cuda")
NO_APEX = {"status": "skipped", "reason": "no apex source configured"}


def spec(precision="fp8_tensorwise", arch="gpt_tiny"):
    return {"model": "m", "precision": precision, "seed": 0,
            "model_config": {"arch": arch, "data": "synthetic_tokens", "batch_size": 2, "seq_len": 16},
            "train": {"steps": 3, "warmup_steps": 1, "lr": 0.01, "optimizer": "adamw"}}


@pytest.fixture
def gpu(monkeypatch):
    """A CUDA device as the checks see it, of the compute capability the test sets."""
    def capability(value):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: value)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
        return CUDA
    return capability


def test_the_registry_entries_reach_the_schemas_the_report_order_and_the_peak():
    names = precisions.names()
    assert names[-3:] == ["amp_bf16_compile", *FP8]
    assert cfg.load_schema()["$defs"]["precision"]["enum"] == names
    assert set(FP8) <= set(claimfile.schema()["$defs"]["precision"]["enum"])
    frame = reportlib.cells_frame({"cells": [{"model": "m", "precision": p, "seed": 0}
                                             for p in ["fp8_rowwise", "fp32", "amp_bf16_compile", "fp8_tensorwise"]]})
    assert list(frame["precision"].astype(str)) == ["fp32", "amp_bf16_compile", "fp8_tensorwise", "fp8_rowwise"]
    for name in FP8:
        p = precisions.get(name)
        assert (p.peak_kind, p.autocast_dtype, p.compile, p.min_capability, p.baseline) == (
            "fp8", "bfloat16", True, (8, 9), "amp_bf16_compile")
        assert p.needs_torchao and not p.needs_apex and not p.grad_scaler
    assert precisions.get("fp8_tensorwise").float8_recipe == "tensorwise"
    assert precisions.get("fp8_rowwise").float8_recipe == "rowwise"
    compiled = precisions.get("amp_bf16_compile")
    assert compiled.compile and compiled.baseline == "amp_bf16" and not compiled.needs_torchao
    assert flops.datasheet_peak("NVIDIA H200", "fp8_tensorwise") == 1979.0


def test_the_datasheet_fp8_figures_are_dense_and_only_where_the_hardware_has_fp8():
    for product, row in flops.DATASHEET_TFLOPS.items():
        assert "fp8" in row, f"{product}: no fp8 entry"
        if product.startswith(("A100", "A10", "V100")):
            assert row["fp8"] is None, f"{product} has no FP8 Tensor Cores"
        else:  # dense FP8 is twice dense bf16 on Hopper and Ada; a sparse figure would be four times
            assert 1.95 <= row["fp8"] / row["bf16"] <= 2.05, product


def test_the_fp8_preset_runs_fp8_beside_compiled_bf16_and_is_valid():
    base = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config = cfg.validate_config(cfg.deep_merge(base, {"preset": "fp8"}))
    runs, _ = cfg.resolve_runs(config, REPO / "config" / "presets", [], "test")
    cells = {(c["model"], c["precision"]) for c in cfg.cells(runs)}
    for model in ("llama7b", "gpt124m", "vit_b_16"):
        assert {(model, p) for p in ["amp_bf16_compile", *FP8]} <= cells
    paper = yaml.safe_load((REPO / "config" / "presets" / "paper.yaml").read_text())
    fp8_preset = yaml.safe_load((REPO / "config" / "presets" / "fp8.yaml").read_text())
    assert ("llama7b_text", "fp8_tensorwise") in cells and ("llama7b_text", "amp_bf16_compile") in cells
    text = fp8_preset["models"].pop("llama7b_text")  # the 7B shape on real text: the fp8 preset's own model
    assert {k: text[k] for k in ("arch", "batch_size", "seq_len", "activation_checkpointing")} == \
           {k: paper["models"]["llama7b"][k] for k in ("arch", "batch_size", "seq_len", "activation_checkpointing")}
    assert text["data"] == "python_stdlib" and text["train"]["steps"] > paper["models"]["llama7b"]["train"]["steps"]
    for model, settings in fp8_preset["models"].items():  # the same cells as the paper preset's, where both have them
        drop = ("precisions",)
        assert {k: v for k, v in settings.items() if k not in drop} == \
               {k: v for k, v in paper["models"][model].items() if k not in drop}
    assert fp8_preset["train"] == paper["train"]
    assert cfg.choose_preset("auto", ["NVIDIA H200"], "a GPU")["preset"] == "paper"  # auto never picks fp8


def test_the_fp8_loss_preset_is_the_text_cell_over_seeds_with_a_decayed_rate():
    base = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config = cfg.validate_config(cfg.deep_merge(base, {"preset": "fp8_loss"}))
    runs, choice = cfg.resolve_runs(config, REPO / "config" / "presets", ["NVIDIA H200"], "test")
    assert choice["preset"] == "fp8_loss"
    cells = {(c["model"], c["precision"], c["seed"]) for c in cfg.cells(runs)}
    seeds = runs["models"]["llama7b_text_cosine"]["seeds"]
    assert len(seeds) >= 2 and cells == {("llama7b_text_cosine", p, s) for s in seeds
                                         for p in ("amp_bf16", "amp_bf16_compile", "fp8_tensorwise")}
    text = yaml.safe_load((REPO / "config" / "presets" / "fp8.yaml").read_text())["models"]["llama7b_text"]
    loss = runs["models"]["llama7b_text_cosine"]
    assert {k: loss[k] for k in ("arch", "data", "batch_size", "seq_len", "activation_checkpointing")} == \
           {k: text[k] for k in ("arch", "data", "batch_size", "seq_len", "activation_checkpointing")}
    assert loss["train"]["lr_schedule"] == "cosine" and loss["train"]["lr"] == text["train"]["lr"]
    assert loss["train"]["steps"] > text["train"]["steps"] and loss["eval_every"] < loss["train"]["steps"]
    assert cfg.choose_preset("auto", ["NVIDIA H200"], "a GPU")["preset"] == "paper"  # auto never picks it


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU skip record")
def test_on_a_cpu_the_fp8_cells_are_skipped_for_the_machine():
    metrics, rows = train.run(spec(), NO_APEX, threads=1)
    assert (metrics["status"], metrics["skip_cause"], metrics["skip_needs"]) == ("skipped", "machine", "a CUDA GPU")
    assert "compute capability >= 8.9" in metrics["reason"] and rows == []


def test_below_compute_capability_8_9_the_fp8_cells_are_skipped_with_it(gpu):
    device = gpu((8, 0))
    cause, needs, reason = cellsupport.skip_cause(spec(), device, NO_APEX)
    assert (cause, needs) == ("machine", "compute capability >= 8.9")
    assert "this GPU is 8.0" in reason
    assert precision.unsupported_reason("amp_bf16_compile", device, NO_APEX) is None  # bf16 runs on 8.0
    assert precision.unsupported_reason("fp8_rowwise", gpu((8, 9)), NO_APEX) is None
    assert precision.unsupported_reason("fp8_rowwise", gpu((9, 0)), NO_APEX) is None


def test_without_torchao_the_fp8_cells_are_skipped_as_software(gpu, monkeypatch):
    real = importlib.import_module

    def no_torchao(name, *args):
        if name.startswith("torchao"):
            raise ImportError("No module named 'torchao'")
        return real(name, *args)

    monkeypatch.setattr(float8.importlib, "import_module", no_torchao)
    cause, needs, reason = cellsupport.skip_cause(spec(), gpu((9, 0)), NO_APEX)
    assert (cause, needs) == ("software", "torchao")
    assert "torchao==0.18.0" in reason and "No module named" in reason
    assert cellsupport.skip_cause(spec("amp_bf16_compile"), gpu((9, 0)), NO_APEX) is None  # needs no torchao


def test_the_torchao_pin_is_the_one_the_skip_reason_names():
    pins = dict(line.split("==") for line in (REPO / "requirements.txt").read_text().splitlines()
                if line.startswith("torchao=="))
    assert pins == {"torchao": float8.TORCHAO_VERSION}


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(256, 1024)  # FP8
        self.down = nn.Linear(1024, 256, bias=False)  # FP8
        self.odd = nn.Linear(256, 100)  # 100 is no multiple of 16
        self.narrow = nn.Linear(256, 128)  # below MIN_DIM
        self.attn = nn.MultiheadAttention(256, 4)  # out_proj: a Linear whose forward MHA never calls
        self.lm_head = nn.Linear(256, 512)  # the output layer


def test_the_linear_filter_keeps_the_output_small_odd_and_attention_layers_in_bf16():
    decisions = float8.plan(Small())
    assert {fqn for fqn, why in decisions.items() if why is None} == {"up", "down"}
    assert set(decisions) == {"up", "down", "odd", "narrow", "attn.out_proj", "lm_head"}
    assert "multiple of 16" in decisions["odd"] and "smaller than 256" in decisions["narrow"]
    assert "output layer" in decisions["lm_head"] and "MultiheadAttention" in decisions["attn.out_proj"]


def test_the_filter_on_the_presets_models():
    with torch.device("meta"):
        gpt = models.GPT()
        llama = models.Llama()
    gpt_plan, llama_plan = float8.plan(gpt), float8.plan(llama)
    assert [fqn for fqn, why in gpt_plan.items() if why] == ["lm_head"]
    assert [fqn for fqn, why in llama_plan.items() if why] == ["lm_head"]
    assert len(llama_plan) == 32 * 4 + 1
    if models.unavailable_reason("vit_b_16"):
        pytest.skip(models.unavailable_reason("vit_b_16"))
    with torch.device("meta"):
        vit_plan = float8.plan(models.build("vit_b_16", {}))
    kept = {fqn for fqn, why in vit_plan.items() if why}
    assert kept == {"heads.head"} | {f"encoder.layers.encoder_layer_{i}.self_attention.out_proj" for i in range(12)}
    assert sum(why is None for why in vit_plan.values()) == 24  # each block's two MLP layers


def test_convert_swaps_exactly_the_planned_layers_and_keeps_the_parameters():
    pytest.importorskip("torchao.float8")
    model = Small()
    params = {id(p) for p in model.parameters()}
    record = float8.convert(model, "fp8_rowwise")
    assert {fqn for fqn, m in model.named_modules() if type(m).__name__ == "Float8Linear"} == {"up", "down"}
    assert {id(p) for p in model.parameters()} == params  # an optimizer keeps training the same tensors
    assert (record["recipe"], record["fp8_layers"], record["linear_layers"]) == ("rowwise", 2, 6)
    linear = [256 * 1024, 1024 * 256, 256 * 100, 256 * 128, 256 * 256, 256 * 512]
    assert record["fp8_weight_fraction"] == pytest.approx(sum(linear[:2]) / sum(linear))
    assert float8.convert(Small(), "amp_bf16_compile") is None


def test_a_llama_compiles_per_block_with_its_checkpoint_inside():
    model = models.build("llama_tiny", {"seq_len": 16}).materialize("cpu")
    assert model.checkpointing
    compiled, how = float8.compile_model(model)
    assert compiled is model and "per block" in how
    assert all(isinstance(b, float8.CompiledBlock) and b.checkpointing for b in model.blocks)
    assert not model.checkpointing  # the blocks checkpoint themselves, inside the compiled region
    other, how = float8.compile_model(models.build("gpt_tiny", {"seq_len": 16}))
    assert "whole model" in how and other is not None


COMPILE_PER_BLOCK = """
import json, sys, types
# this venv's torchvision is the CUDA wheel beside a CPU torch: its operator registrations fail, its models build
sys.modules["torchvision._meta_registrations"] = types.ModuleType("torchvision._meta_registrations")
import torch
from amprepro import archs
from amprepro.cellspec import CellSpec
from amprepro.train import cell

path = archs.get("vit_b_16").compiled_blocks
spec = CellSpec.of({"model": "v", "precision": "amp_bf16", "seed": 0,
                    "model_config": {"arch": "vit_b_16", "data": "synthetic_images", "batch_size": 2, "compile": True},
                    "train": {"steps": 2, "warmup_steps": 1, "lr": 0.001, "optimizer": "adamw"}})
built = cell.build_cell(spec, torch.device("cpu"), None, compile_now=False)  # the training run's order
model, keys = built.trainer.model, list(built.trainer.model.state_dict())
built.compile()
layers = model.get_submodule(path)
print(json.dumps({"same": built.trainer.model is model, "keys": list(model.state_dict()) == keys,
                  "how": built.compiled, "layers": [layer._compiled_call_impl is not None for layer in layers],
                  "rest": [m._compiled_call_impl is not None for m in (model, model.conv_proj, model.heads)]}))
"""


def test_vit_compiles_each_encoder_layer_in_place():
    """A ViT-B/16 cell that compiles (its registry entry's compiled_blocks, through Cell.compile): each encoder layer
    compiled in place (PyTorch's regional compilation: one graph serves the 12), the model object and its state_dict
    keys unchanged, the rest eager."""
    from amprepro import archs

    run = subprocess.run([sys.executable, "-c", COMPILE_PER_BLOCK], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(REPO / "workflow")})
    assert run.returncode == 0, run.stderr[-2000:]
    found = json.loads(run.stdout.splitlines()[-1])
    assert found["same"] and found["keys"] and found["layers"] == [True] * 12 and found["rest"] == [False] * 3
    assert "the 12 blocks of encoder.layers" in found["how"]
    assert [name for name, entry in archs.REGISTRY.items() if entry.compiled_blocks] == ["vit_b_16"], \
        "a new compiled_blocks entry gets its own check here"


def test_the_fp8_peak_row_is_skipped_without_a_gpu_of_8_9(gpu):
    assert "no CUDA GPU" in flops.fp8_peak_skip_reason(torch.device("cpu"))
    assert "this GPU is 8.6" in flops.fp8_peak_skip_reason(gpu((8, 6)))
    assert flops.fp8_peak_skip_reason(gpu((9, 0))) is None
    if not torch.cuda.is_available():
        from amprepro.env import peak

        assert peak.measure()["status"] == "skipped"


def write_cell(root: Path, precision: str, losses: list[float], throughput: float, peak: int, **extra) -> str:
    cell = root / "m" / precision / "seed0"
    cell.mkdir(parents=True)
    with (cell / "steps.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=train.STEP_FIELDS)
        writer.writeheader()
        for step, loss in enumerate(losses):
            writer.writerow({"step": step, "loss": loss, "loss_scale": "", "skipped": False, "step_time_s": 0.1})
    metrics = {"model": "m", "precision": precision, "seed": 0, "status": "ok", "throughput_per_s": throughput,
               "throughput_unit": "tokens/s", "peak_allocated_bytes": peak,
               "nonfinite_steps": sum(loss != loss for loss in losses), **extra}
    (cell / "metrics.json").write_text(json.dumps(metrics))
    return str(cell / "metrics.json")


def test_the_summary_compares_fp8_with_compiled_bf16_step_by_step(tmp_path):
    files = [write_cell(tmp_path, "amp_bf16_compile", [10.0, 9.0, 8.0], 1000.0, 100),
             write_cell(tmp_path, "fp8_tensorwise", [10.0, 9.09, 8.04], 1100.0, 80,
                        float8={"fp8_weight_fraction": 0.9}),
             write_cell(tmp_path, "fp8_rowwise", [10.0, float("nan"), 8.0], 950.0, 80)]
    rows = {r["precision"]: r for r in summary.summarize(files, {}, {}, {})["cells"]}
    tw, rw = rows["fp8_tensorwise"], rows["fp8_rowwise"]
    assert tw["baseline_precision"] == "amp_bf16_compile"
    assert tw["speedup_vs_baseline"] == pytest.approx(1.1) and tw["memory_ratio_vs_baseline"] == pytest.approx(0.8)
    assert tw["loss_gap_final_vs_baseline"] == pytest.approx(0.005)
    assert tw["loss_gap_final_abs_vs_baseline"] == pytest.approx(0.04) and tw["baseline_loss_first"] == 10.0
    assert tw["baseline_loss_final"] == 8.0 and tw["loss_gap_max_unmemorised_vs_baseline"] == pytest.approx(0.01)
    assert tw["loss_gap_max_vs_baseline"] == pytest.approx(0.01) and tw["loss_gap_steps"] == 3
    assert tw["fp8_weight_fraction"] == 0.9 and tw["nonfinite_steps"] == 0
    assert rw["loss_gap_steps"] == 2 and rw["nonfinite_steps"] == 1  # the NaN step is not compared, but counted
    assert rows["amp_bf16_compile"]["speedup_vs_baseline"] is None  # its eager bf16 baseline did not run
    assert set(fp8.COLUMNS) <= set(summary.COLUMNS)

    said = fp8.verdicts(fp8.fp8_rows({"cells": list(rows.values())}))
    assert said[0].startswith("m FP8 tensorwise (torchao) (seed 0): pays, 1.100x")
    assert said[0].endswith("final loss +0.50 % against bf16 AMP, compiled") and "nats" not in said[0]
    assert said[1].startswith("m FP8 rowwise (torchao) (seed 0): does not pay, 0.950x") and "5.0 % slower" in said[1]
    section = fp8section.section_html({"cells": list(rows.values())})
    assert "does not pay" in section and "<script" not in section


def test_a_memorised_batch_gets_the_absolute_gap_and_the_gap_before_it(tmp_path):
    """The 7B shape memorises its one synthetic batch (on the H200: 11.17 to 0.003 nats in 10 steps): the verdict
    gives the gap in nats and the largest relative gap while the baseline's loss was at least MEMORISED of its first."""
    files = [write_cell(tmp_path, "amp_bf16_compile", [10.0, 2.0, 0.2, 0.05], 1000.0, 100),
             write_cell(tmp_path, "fp8_tensorwise", [10.0, 2.5, 0.3, 0.06], 1200.0, 100)]
    rows = {r["precision"]: r for r in summary.summarize(files, {}, {}, {})["cells"]}
    tw = rows["fp8_tensorwise"]
    assert tw["loss_gap_final_vs_baseline"] == pytest.approx(0.2)
    assert tw["loss_gap_max_vs_baseline"] == pytest.approx(0.5)
    assert tw["loss_gap_final_abs_vs_baseline"] == pytest.approx(0.01)
    assert tw["loss_gap_max_unmemorised_vs_baseline"] == pytest.approx(0.5)  # step 2 (0.2 >= 0.01 x 10) still counts
    assert fp8.memorised(tw) and not fp8.memorised({**tw, "baseline_loss_final": 0.1})  # 0.1 is 1 %: not below
    said = fp8.verdicts(fp8.fp8_rows({"cells": list(rows.values())}))[0]
    assert "final loss +0.0100 nats against bf16 AMP, compiled's 0.0500 (+20.00 %" in said
    assert "fell from 10.00 to below 1%" in said and "largest step gap before that 50.00 %" in said
    files = [write_cell(tmp_path / "b", "amp_bf16_compile", [10.0, 0.05], 1000.0, 100),
             write_cell(tmp_path / "b", "fp8_tensorwise", [10.0, 0.06], 1000.0, 100)]
    tw = {r["precision"]: r for r in summary.summarize(files, {}, {}, {})["cells"]}["fp8_tensorwise"]
    assert tw["loss_gap_max_unmemorised_vs_baseline"] == 0.0  # only step 0 is above 1 % of the first loss


def test_the_held_out_gap_and_two_runs_of_one_precision_beside_it(tmp_path):
    """The real-text cells (llama7b_text): the held-out loss gap against compiled bf16, and compiled against eager
    bf16 (one precision, two kernels) over the same steps, the drift of two runs that should agree."""
    files = [write_cell(tmp_path, "amp_bf16", [10.0, 9.0, 8.0], 900.0, 100, heldout_loss_final=4.0),
             write_cell(tmp_path, "amp_bf16_compile", [10.0, 9.09, 8.08], 1000.0, 100, heldout_loss_final=4.04),
             write_cell(tmp_path, "fp8_tensorwise", [10.0, 9.0, 8.4], 1200.0, 100, heldout_loss_final=4.2)]
    rows = {r["precision"]: r for r in summary.summarize(files, {}, {}, {})["cells"]}
    tw, compiled = rows["fp8_tensorwise"], rows["amp_bf16_compile"]
    assert tw["heldout_gap_final_vs_baseline"] == pytest.approx(0.16 / 4.04)
    assert tw["baseline_heldout_loss_final"] == 4.04
    assert compiled["heldout_gap_final_vs_baseline"] == pytest.approx(0.01)
    assert rows["amp_bf16"]["heldout_gap_final_vs_baseline"] is None  # no baseline of its own
    said = fp8.verdicts(fp8.fp8_rows({"cells": list(rows.values())}))[0]
    assert said.endswith("final loss +3.96 % against bf16 AMP, compiled, held-out loss +3.96 % (4.2000 against "
                         "4.0400 nats); bf16 AMP, compiled against bf16 AMP over the same steps: final loss +1.00 %, "
                         "held-out +1.00 %, largest step gap 1.00 %")
    assert "+3.96 %" in fp8section.table_html(fp8.fp8_rows({"cells": list(rows.values())}))
    memorised = [write_cell(tmp_path / "b", "amp_bf16", [10.0, 2.01, 0.2, 0.049], 900.0, 100),
                 write_cell(tmp_path / "b", "amp_bf16_compile", [10.0, 2.0, 0.2, 0.05], 1000.0, 100),
                 write_cell(tmp_path / "b", "fp8_tensorwise", [10.0, 2.5, 0.3, 0.06], 1200.0, 100)]
    rows = summary.summarize(memorised, {}, {}, {})["cells"]
    said = fp8.verdicts(fp8.fp8_rows({"cells": rows}))[0]
    assert "held-out" not in said  # no cell records one
    assert said.endswith("bf16 AMP, compiled against bf16 AMP over the same steps: largest step gap before the batch "
                         "was memorised 0.50 %, final +0.0010 nats")


def test_the_section_says_when_no_fp8_cell_ran():
    section = fp8section.section_html({"cells": [{"model": "m", "precision": "fp32", "seed": 0, "status": "ok"}]})
    assert "no FP8 cell in this run" in section


def test_a_converted_model_trains_and_stays_close_to_bf16_on_a_cpu():
    """torch._scaled_mm has a CPU kernel: the converted layers really run through FP8 casts here (eager, no compile),
    so the numerics can be checked without a GPU: a few steps, loss against the same model in bf16."""
    pytest.importorskip("torchao.float8")
    torch.manual_seed(0)
    bf16, x = Small(), torch.randn(64, 256)
    converted = Small()
    converted.load_state_dict(bf16.state_dict())
    float8.convert(converted, "fp8_tensorwise")

    def forward(model):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return model.lm_head(model.down(torch.relu(model.up(x)))).float().pow(2).mean()

    losses = {}
    for name, model in (("bf16", bf16), ("fp8", converted)):
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        losses[name] = []
        for _ in range(3):
            loss = forward(model)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses[name].append(float(loss))
    assert losses["fp8"][-1] < losses["fp8"][0]
    assert losses["fp8"] != losses["bf16"]  # FP8 casts happened
    assert all(abs(a - b) / b < 0.05 for a, b in zip(losses["fp8"], losses["bf16"]))

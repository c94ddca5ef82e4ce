"""Short CPU cells of the accuracy preset's models, the image data readers on fixtures in the real on-disk formats,
and the report section drawn from the cells' own files."""

import json
import pickle
import re

import numpy as np
import pytest
import torch

from amprepro.cellspec import CellSpec
from amprepro.files import write_csv, write_json
from amprepro.report import convergencereport
from amprepro.train import distributed, imagedata, models, train
from amprepro.train import precision as precision_mod

NO_APEX = {"status": "skipped", "reason": "no apex source configured"}


def text_spec(precision="fp32", seed=0, steps=12, **model):
    return {"model": "stdlib_gpt", "precision": precision, "seed": seed,
            "model_config": {"arch": "gpt_bytes", "data": "python_stdlib", "batch_size": 4, "seq_len": 32,
                             "eval_every": 4, "eval_windows": 8, **model},
            "train": {"steps": steps, "warmup_steps": 2, "lr": 0.003, "optimizer": "adamw", "lr_schedule": "cosine"}}


def test_a_text_cell_records_its_heldout_curve_and_corpus():
    metrics, rows = train.run(text_spec(), NO_APEX, threads=1)
    assert metrics["status"] == "ok" and len(rows) == 12 and metrics["throughput_unit"] == "tokens/s"
    assert [p["step"] for p in metrics["heldout_curve"]] == [0, 4, 8, 12]
    first, last = metrics["heldout_curve"][0]["loss"], metrics["heldout_loss_final"]
    assert first == pytest.approx(np.log(256), abs=0.3) and last < first - 0.5  # it learned from the text
    record = metrics["data_record"]
    assert record["kind"] == "python_stdlib" and len(record["corpus_sha256"]) == 64 and record["python"]
    assert 0.0 <= metrics["eval_accuracy"] <= 1.0  # next-byte accuracy on the held-out windows


def test_a_llama_shape_reads_the_text_too():
    """The fp8 preset's llama7b_text: a LLaMA shape on the stdlib's bytes (ids below its vocabulary), held-out curve
    and all; here the tiny shape (vocabulary 256) in FP32 on the CPU."""
    metrics, rows = train.run(text_spec(arch="llama_tiny"), NO_APEX, threads=1)
    assert metrics["status"] == "ok" and len(rows) == 12 and metrics["data_record"]["kind"] == "python_stdlib"
    first, last = metrics["heldout_curve"][0]["loss"], metrics["heldout_loss_final"]
    assert first == pytest.approx(np.log(256), abs=0.3) and last < first - 0.5


def test_the_cosine_schedule_ends_at_a_tenth_of_the_rate():
    spec = text_spec(steps=11)["train"]
    assert train.lr_at(spec, 0) == pytest.approx(0.003) and train.lr_at(spec, 10) == pytest.approx(0.0003)
    assert train.lr_at({**spec, "lr_schedule": "constant"}, 10) == 0.003


def test_the_learning_rate_ramp_rises_linearly_then_the_schedule_takes_over():
    spec = {**text_spec(steps=14)["train"], "lr_warmup_steps": 3}
    assert [train.lr_at(spec, s) for s in range(4)] == pytest.approx([0.00075, 0.0015, 0.00225, 0.003])
    assert train.lr_at(spec, 13) == pytest.approx(0.0003)  # the cosine over steps 3..13, to a tenth at the last
    assert train.lr_at(spec, 8) == pytest.approx(0.003 * (0.1 + 0.9 * 0.5))  # halfway down the cosine
    constant = {**spec, "lr_schedule": "constant"}
    assert [train.lr_at(constant, s) for s in (0, 2, 3, 13)] == pytest.approx([0.00075, 0.00225, 0.003, 0.003])
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.003)
    train.set_lr(optimizer, constant, 1)  # a constant schedule with a ramp still sets the rate
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.0015)
    train.set_lr(optimizer, {**constant, "lr_warmup_steps": 0}, 1)  # no ramp, constant: left as it is
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.0015)


def test_half_eps_norm_is_a_layer_norm_in_fp32_and_loses_its_epsilon_in_fp16():
    norm = models.HalfEpsNorm(8, eps=1e-8)
    x = torch.randn(3, 8)
    assert torch.allclose(norm(x), torch.nn.functional.layer_norm(x, (8,), eps=1e-8), atol=1e-5)
    flat = torch.full((1, 8), 0.25)  # zero variance: FP32's eps keeps it finite, fp16's eps is 0
    assert torch.isfinite(norm(flat)).all()
    with torch.autocast("cpu", dtype=torch.float16):
        assert not torch.isfinite(norm(flat)).all()
    swapped = models.build("gpt_bytes", {"seq_len": 16, "naive_norm_eps": 1e-8})
    assert not any(isinstance(m, torch.nn.LayerNorm) for m in swapped.modules())


def write_cifar(root, per_batch=6):
    folder = root / imagedata.CIFAR_DIR
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in imagedata.CIFAR_TRAIN + imagedata.CIFAR_TEST:
        batch = {b"data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
                 b"labels": [int(v) for v in rng.integers(0, 10, per_batch)], b"batch_label": name.encode()}
        with open(folder / name, "wb") as handle:
            pickle.dump(batch, handle)


def image_spec(data, path, **model):
    return {"model": "img", "precision": "fp32", "seed": 0,
            "model_config": {"arch": "small_cnn", "data": data, "data_path": str(path), "batch_size": 4,
                             "eval_every": 3, **model},
            "train": {"steps": 6, "warmup_steps": 1, "lr": 0.002, "optimizer": "adamw"}}


def test_a_cifar10_cell_reads_the_python_version_format(tmp_path):
    write_cifar(tmp_path)
    metrics, _ = train.run(image_spec("cifar10", tmp_path), NO_APEX, threads=1)
    assert metrics["status"] == "ok", metrics.get("reason")
    record = metrics["data_record"]
    assert record["train_images"] == 30 and record["test_images"] == 6
    assert record["official_release"] is False  # a fixture, and the record says so
    assert len(metrics["heldout_curve"]) == 3


def test_missing_cifar10_is_a_skip_with_the_reason(tmp_path):
    metrics, rows = train.run(image_spec("cifar10", tmp_path / "none"), NO_APEX, threads=1)
    assert metrics["status"] == "skipped" and rows == [] and "download: true" in metrics["reason"]


def test_an_imagefolder_cell_reads_class_folders(tmp_path):
    from PIL import Image

    for split in ("train", "val"):
        for label, color in (("cat", (255, 0, 0)), ("dog", (0, 0, 255))):
            (tmp_path / split / label).mkdir(parents=True)
            for i in range(5 if split == "train" else 2):
                Image.new("RGB", (12, 10), color).save(tmp_path / split / label / f"{i}.png")
    metrics, _ = train.run(image_spec("imagefolder", tmp_path, image_size=16), NO_APEX, threads=1)
    assert metrics["status"] == "ok", metrics.get("reason")
    assert metrics["data_record"]["classes"] == ["cat", "dog"] and metrics["data_record"]["train_images"] == 10
    (tmp_path / "val" / "dog" / "0.png").unlink()
    (tmp_path / "val" / "dog" / "1.png").unlink()
    assert "different classes" in imagedata.unavailable_reason(image_spec("imagefolder", tmp_path)["model_config"])


def test_the_report_section_draws_the_cells_files(tmp_path):
    runs, cells = tmp_path / "runs", []
    for precision, offset in (("fp32", 0.0), ("amp_bf16", 0.01), ("amp_fp16", 0.2)):
        for seed in range(3):
            final = 1.5 + offset + 0.01 * seed
            folder = runs / "stdlib_gpt" / precision / f"seed{seed}"
            folder.mkdir(parents=True)
            rows = [{"step": s, "loss": 3 - s / 20, "loss_scale": 65536.0 if precision == "amp_fp16" else None,
                     "skipped": precision == "amp_fp16" and s == 5, "step_time_s": 0.01} for s in range(20)]
            write_csv(folder / "steps.csv", rows, train.STEP_FIELDS)
            curve = [{"step": s, "loss": 5.5 - (5.5 - final) * s / 20} for s in (0, 10, 15, 20)]
            write_json(folder / "metrics.json", {"heldout_curve": curve, "data_record": {
                "kind": "python_stdlib", "python": "3.11.7", "files": 734, "root": "/x", "train_bytes": 10,
                "heldout_files": 71, "heldout_bytes": 5, "eval_windows": 64, "seq_len": 128,
                "corpus_sha256": "a" * 64, "file_list_sha256": "b" * 64}})
            cells.append({"model": "stdlib_gpt", "precision": precision, "seed": seed, "status": "ok",
                          "heldout_loss_final": final})
    html = convergencereport.section({"cells": cells}, str(runs))
    assert html.count("<img") == 2 and "Python 3.11.7 standard library" in html
    cells_shown = re.findall(r"<td [^>]*>([^<]*)</td>", html)
    assert cells_shown[10:18] == ["amp_fp16", "3 ok", "1.7100 ± 0.0100", "1.7000–1.7200",
                                  "+13.25 % (+13.03 % to +13.46 %, 3 seeds)", "+13.10 % / +13.39 %", "over", "higher"]
    assert cells_shown[20:28] == ["amp_bf16", "3 ok", "1.5200 ± 0.0100", "1.5100–1.5300",
                                  "+0.66 % (+0.65 % to +0.67 %, 3 seeds)", "+0.65 % / +0.67 %", "under", "higher"]
    assert "not ImageNet" in html and "vs the 1 % margin" in html
    empty = convergencereport.section({"cells": [{"model": "cnn", "precision": "fp32", "seed": 0, "status": "ok"}]},
                                      str(runs))
    assert "nothing to show" in empty and "<img" not in empty
    assert json.loads((runs / "stdlib_gpt/fp32/seed0/metrics.json").read_text())["heldout_curve"]


# --- paired seeds (issue 39) ---
# Every precision of a seed starts from the same initial weights and draws the same batches,
# so the paired gap of two cells of one seed is the precision's effect, not two draws of the seed noise. Checked on the
# CPU through train.train_cell itself, for each precision of the accuracy preset (those this CPU cannot train get a
# stand-in trainer: nothing the precision does happens before the weights and the batch order are fixed).

PAIRED_PRECISIONS = ["fp32", "tf32", "amp_fp16", "amp_bf16", "apex_o1", "apex_o2", "apex_o3"]


class StandIn:
    """A Trainer that does nothing: apex and CUDA are not here, and the weights are taken before any step."""

    def __init__(self, name, model, optimizer, *args, **kwargs):
        self.model, self.optimizer, self.apex_cast_cache, self.apex_fused_kernels = model, optimizer, None, None


def start_of(spec_dict, monkeypatch, stand_in: bool):
    """The cell's initial weights and its first three batches, as train_cell hands them to the loop."""
    seen = {}

    def loop(spec, dist, device, base, cell, batches, breakdown, settings):
        seen["weights"] = {k: v.detach().clone() for k, v in cell.model.state_dict().items()}
        seen["batches"] = [batches.next() for _ in range(3)]
        return {}, []

    monkeypatch.setattr(train, "train_loop", loop)
    if stand_in:
        monkeypatch.setattr(precision_mod, "Trainer", StandIn)
    spec = CellSpec.of(spec_dict)
    device = torch.device("cpu")
    dist = distributed.Dist()
    flags = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    try:
        train.train_cell(spec, NO_APEX, dist, device, train.base_record(spec, NO_APEX, device, dist))
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags
    return seen


def same(a, b) -> bool:
    return a["weights"].keys() == b["weights"].keys() and all(
        torch.equal(a["weights"][k], b["weights"][k]) for k in a["weights"]) and all(
        torch.equal(x, y) for pa, pb in zip(a["batches"], b["batches"]) for x, y in zip(pa, pb))


@pytest.mark.parametrize("seed", [0, 3])
def test_every_precision_of_a_seed_starts_from_the_same_weights_and_batches(seed, monkeypatch):
    fp32 = start_of(text_spec("fp32", seed), monkeypatch, stand_in=False)
    for name in PAIRED_PRECISIONS[1:]:
        assert same(start_of(text_spec(name, seed), monkeypatch, stand_in=True), fp32), name
    # the real bf16 AMP Trainer (it runs on the CPU) changes nothing before the loop either
    monkeypatch.undo()
    assert same(start_of(text_spec("amp_bf16", seed), monkeypatch, stand_in=False), fp32)


def test_another_seed_starts_elsewhere(monkeypatch):
    zero = start_of(text_spec("fp32", 0), monkeypatch, stand_in=False)
    one = start_of(text_spec("fp32", 1), monkeypatch, stand_in=False)
    assert not same(zero, one)
    assert not torch.equal(zero["batches"][0][0], one["batches"][0][0])


def test_two_real_cells_of_one_seed_start_from_the_same_loss():
    """fp32 and bf16 AMP cells trained for real: step 0's loss is the same model on the same batch (bf16 rounding
    apart), and the held-out loss at step 0 too."""
    fp32, rows32 = train.run(text_spec("fp32", 2, steps=3), NO_APEX, threads=1)
    bf16, rows16 = train.run(text_spec("amp_bf16", 2, steps=3), NO_APEX, threads=1)
    assert fp32["status"] == bf16["status"] == "ok"
    assert rows16[0]["loss"] == pytest.approx(rows32[0]["loss"], rel=0.01)
    assert bf16["heldout_curve"][0]["loss"] == pytest.approx(fp32["heldout_curve"][0]["loss"], rel=0.01)
    _, rows = train.run(text_spec("fp32", 5, steps=3), NO_APEX, threads=1)
    assert rows[0]["loss"] != rows32[0]["loss"]

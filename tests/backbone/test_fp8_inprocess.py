"""amprepro.report.fp8 in-process, by exact output: the loss gaps' edge cases, every verdict wording, the table's
cells and the section (what mutation testing of the module asks for: docs/mutation.md)."""

import math

import pytest

from amprepro.report import fp8, reporthtml

NONE = {"loss_gap_final_vs_baseline": None, "loss_gap_final_abs_vs_baseline": None, "baseline_loss_first": None,
        "baseline_loss_final": None, "loss_gap_max_vs_baseline": None, "loss_gap_max_unmemorised_vs_baseline": None,
        "loss_gap_steps": 0}


def test_nothing_to_compare_gives_every_key_empty():
    for cell, base in [(None, {0: 1.0}), ({0: 1.0}, None), ({}, {0: 1.0}), ({0: 1.0}, {1: 1.0}),
                       ({0: math.nan}, {0: 1.0}), ({0: 1.0}, {0: 0.0})]:
        assert fp8.loss_gaps(cell, base) == NONE, (cell, base)


def test_steps_one_cell_lacks_are_not_compared_and_a_non_finite_last_step_has_no_final_gap():
    gaps = fp8.loss_gaps({0: 10.0, 1: 11.0, 2: 12.0}, {0: 10.0, 1: 10.0})  # step 2 only in the cell
    assert gaps["loss_gap_steps"] == 2 and gaps["loss_gap_final_vs_baseline"] == pytest.approx(0.1)
    assert gaps["loss_gap_final_abs_vs_baseline"] == pytest.approx(1.0) and gaps["baseline_loss_final"] == 10.0
    assert fp8.loss_gaps({0: 10.0, 1: 10.0}, {0: 10.0, 1: 10.0, 2: 9.0})["loss_gap_steps"] == 2
    gaps = fp8.loss_gaps({0: 10.0, 1: 11.0, 2: math.inf}, {0: 10.0, 1: 10.0, 2: 9.0})
    assert gaps["loss_gap_steps"] == 2 and gaps["loss_gap_max_vs_baseline"] == pytest.approx(0.1)
    assert gaps["loss_gap_final_vs_baseline"] is None and gaps["loss_gap_final_abs_vs_baseline"] is None
    assert gaps["baseline_loss_final"] is None and gaps["baseline_loss_first"] == 10.0


def test_a_baseline_of_one_is_compared_and_the_memorised_edge_counts_as_not_memorised():
    gaps = fp8.loss_gaps({0: 1.1, 1: 1.1}, {0: 1.0, 1: 1.0})
    assert gaps["loss_gap_steps"] == 2 and gaps["loss_gap_max_vs_baseline"] == pytest.approx(0.1)
    gaps = fp8.loss_gaps({0: 100.0, 1: 2.0}, {0: 100.0, 1: 1.0})  # 1.0 is exactly MEMORISED of 100
    assert gaps["loss_gap_max_unmemorised_vs_baseline"] == pytest.approx(1.0)
    gaps = fp8.loss_gaps({0: 100.0, 1: 2.0}, {0: 100.0, 1: 0.5})  # below it: only step 0 is unmemorised
    assert gaps["loss_gap_max_unmemorised_vs_baseline"] == 0.0


def test_ratios_and_numbers():
    assert fp8._ratio(3.0, 2.0) == 1.5 and fp8._ratio(None, 2.0) is None and fp8._ratio(3.0, 0) is None
    assert fp8._ratio(0, 2.0) is None
    assert fp8._num(None, ".1f") == "" and fp8._num(2.25, ".1f") == "2.2" and fp8._pct(None) == ""
    assert fp8._pct(0.0123) == "1.23 %" and fp8._pct(0.0123, signed=True) == "+1.23 %"


def row(precision, **extra):
    return {"model": "m", "seed": 0, "precision": precision, "status": "ok", "baseline_precision": None, **extra}


def metrics_files(tmp_path, rows, losses):
    files = []
    for r in rows:
        cell = tmp_path / r["precision"]
        cell.mkdir()
        if r["precision"] in losses:
            (cell / "steps.csv").write_text("step,loss\n" + "".join(f"{i},{v}\n" for i, v in
                                                                   enumerate(losses[r["precision"]])))
        files.append(str(cell / "metrics.json"))
    return files


def test_add_baseline_fills_every_column_and_leaves_cells_without_a_baseline_empty(tmp_path):
    rows = [row("amp_bf16_compile", throughput_per_s=100.0, peak_allocated_bytes=10, heldout_loss_final=2.0),
            row("fp8_tensorwise", throughput_per_s=120.0, peak_allocated_bytes=9, heldout_loss_final=2.1),
            row("fp8_rowwise", status="collapsed", throughput_per_s=90.0, peak_allocated_bytes=9),
            row("fp32", throughput_per_s=50.0), row("amp_bf16", status="failed"), row("unknown_precision")]
    metrics = [{}, {"nonfinite_steps": 0, "float8": {"fp8_weight_fraction": 0.5}}, {"nonfinite_steps": 3}, {}, {}, {}]
    files = metrics_files(tmp_path, rows, {"amp_bf16_compile": [4.0, 2.0], "fp8_tensorwise": [4.0, 2.2],
                                           "fp8_rowwise": [4.0, math.nan]})
    out = {r["precision"]: r for r in fp8.add_baseline(rows, metrics, files)}
    tw, rw = out["fp8_tensorwise"], out["fp8_rowwise"]
    assert tw["speedup_vs_baseline"] == pytest.approx(1.2) and tw["memory_ratio_vs_baseline"] == pytest.approx(0.9)
    assert tw["heldout_gap_final_vs_baseline"] == pytest.approx(0.05) and tw["baseline_heldout_loss_final"] == 2.0
    assert tw["fp8_weight_fraction"] == 0.5 and tw["nonfinite_steps"] == 0 and tw["loss_gap_steps"] == 2
    assert rw["speedup_vs_baseline"] == pytest.approx(0.9) and rw["nonfinite_steps"] == 3  # a collapsed cell counts
    assert rw["heldout_gap_final_vs_baseline"] is None and rw["baseline_heldout_loss_final"] is None
    assert rw["loss_gap_steps"] == 1 and rw["fp8_weight_fraction"] is None
    for name in ("fp32", "amp_bf16", "unknown_precision", "amp_bf16_compile"):  # no baseline, or it did not run
        assert all(out[name][c] is None for c in fp8.COLUMNS if c not in ("loss_gap_steps", "baseline_precision",
                                                                         "nonfinite_steps")), name
        assert out[name]["loss_gap_steps"] == 0, name
    assert out["amp_bf16_compile"]["baseline_precision"] == "amp_bf16" and out["fp32"]["baseline_precision"] is None
    assert out["unknown_precision"]["baseline_precision"] is None


def test_a_held_out_loss_on_one_side_only_gives_no_held_out_gap(tmp_path):
    rows = [row("amp_bf16_compile", throughput_per_s=1.0), row("fp8_tensorwise", throughput_per_s=1.0,
                                                               heldout_loss_final=2.0)]
    out = fp8.add_baseline(rows, [{}, {}], metrics_files(tmp_path, rows, {}))
    assert out[1]["heldout_gap_final_vs_baseline"] is None and out[1]["baseline_heldout_loss_final"] is None


def test_the_rows_are_the_fp8_models_cells_in_the_registry_order():
    cells = [row("fp8_rowwise"), row("amp_bf16"), row("amp_bf16_compile"), row("fp8_tensorwise"),
             {**row("amp_bf16_compile"), "model": "no_fp8_here"}, row("fp32")]
    assert [c["precision"] for c in fp8.fp8_rows({"cells": cells})] == \
           ["amp_bf16_compile", "fp8_tensorwise", "fp8_rowwise"]
    assert fp8.fp8_rows({}) == []


BASE = "bf16 AMP, compiled"


def verdict(**cell):
    return fp8.verdicts([row("fp8_tensorwise", **cell)])


def test_every_verdict_wording():
    assert fp8.verdicts([row("amp_bf16_compile", speedup_vs_baseline=2.0)]) == []  # baselines get none
    assert verdict(status="skipped", reason="needs torchao") == \
           ["m FP8 tensorwise (torchao) (seed 0): not measured, skipped: needs torchao"]
    assert verdict(status="failed") == ["m FP8 tensorwise (torchao) (seed 0): not measured, failed: "]
    assert verdict() == [f"m FP8 tensorwise (torchao) (seed 0): no {BASE} cell of the same model and seed ran, so "
                         "no speedup"]
    assert verdict(status="collapsed", speedup_vs_baseline=1.5, nonfinite_steps=2) == \
           ["m FP8 tensorwise (torchao) (seed 0): does not pay, the loss went non-finite, 2 non-finite steps"]
    assert verdict(speedup_vs_baseline=1.25, memory_ratio_vs_baseline=0.5, nonfinite_steps=1) == \
           [f"m FP8 tensorwise (torchao) (seed 0): pays, 1.250x {BASE}, peak memory 0.50x, 1 non-finite steps"]
    assert verdict(speedup_vs_baseline=1.0, nonfinite_steps=0) == \
           [f"m FP8 tensorwise (torchao) (seed 0): does not pay, 1.000x {BASE} (0.0 % slower)"]
    assert verdict(speedup_vs_baseline=0.75, heldout_gap_final_vs_baseline=0.02, heldout_loss_final=3.06,
                   baseline_heldout_loss_final=3.0) == \
           [f"m FP8 tensorwise (torchao) (seed 0): does not pay, 0.750x {BASE} (25.0 % slower), held-out loss "
            "+2.00 % (3.0600 against 3.0000 nats)"]
    two = fp8.verdicts([row("fp8_tensorwise", speedup_vs_baseline=1.1), row("fp8_rowwise", speedup_vs_baseline=0.9)])
    assert len(two) == 2 and two[1].startswith("m FP8 rowwise (torchao) (seed 0): does not pay")
    after_skips = fp8.verdicts([row("fp8_tensorwise", status="skipped"), row("fp8_rowwise"),
                                row("fp8_tensorwise", seed=1, speedup_vs_baseline=1.1)])
    assert len(after_skips) == 3 and after_skips[2].startswith("m FP8 tensorwise (torchao) (seed 1): pays")


def test_gap_texts_with_and_without_the_numbers_they_need():
    assert fp8.gap_text({}, BASE) == ""
    memorised = {"loss_gap_final_vs_baseline": 0.5, "loss_gap_final_abs_vs_baseline": 0.001,
                 "baseline_loss_first": 10.0, "baseline_loss_final": 0.002}
    assert fp8.gap_text(memorised, BASE) == (
        f", final loss +0.0010 nats against {BASE}'s 0.0020 (+50.00 %: {BASE}'s loss fell from 10.00 to below 1% of "
        "it, the fixed synthetic batch memorised, so the relative gap compares two near-zero losses)")
    assert fp8.heldout_text({}) == ""
    fp8_row = row("fp8_tensorwise")
    assert fp8.floor_text(fp8_row, [fp8_row], BASE) == ""  # its baseline did not run
    compiled = row("amp_bf16_compile", baseline_precision="amp_bf16", loss_gap_final_vs_baseline=0.001,
                   loss_gap_max_vs_baseline=0.002)
    assert fp8.floor_text(fp8_row, [fp8_row, compiled], BASE) == (
        f"; {BASE} against bf16 AMP over the same steps: final loss +0.10 %, largest step gap 0.20 %")
    other_seed = {**compiled, "seed": 1}
    assert fp8.floor_text(fp8_row, [other_seed], BASE) == ""
    no_gap = {**compiled, "loss_gap_final_vs_baseline": None}
    assert fp8.floor_text(fp8_row, [no_gap], BASE) == ""


def test_the_table_row_has_every_cell_in_its_column():
    cell = row("fp8_tensorwise", throughput_per_s=1234.56, throughput_unit="tokens/s",
               baseline_precision="amp_bf16_compile", speedup_vs_baseline=1.2345, peak_allocated_bytes=3 * 2**30,
               memory_ratio_vs_baseline=0.987, loss_gap_final_vs_baseline=0.0123, loss_gap_final_abs_vs_baseline=0.5,
               loss_gap_max_vs_baseline=0.05, loss_gap_steps=7, heldout_gap_final_vs_baseline=0.031,
               nonfinite_steps=0, fp8_weight_fraction=0.98, mfu_vs_measured_peak=0.25, mfu_vs_datasheet=0.2)
    html = fp8.table_html([cell])
    expected = ["m", "FP8 tensorwise (torchao)", "0", "ok", "1234.6 tokens/s", BASE, "1.234", "3.0", "0.99", "+1.23 %",
                "+0.5000", "5.00 %", "7", "+3.10 %", "0", "98.00 %", "25.00 %", "20.00 %"]
    assert "<tr>" + "".join(f"<td>{v}</td>" for v in expected) + "</tr>" in html
    heads = ["model", "precision", "seed", "status", "throughput", "vs baseline", "speedup", "peak GiB",
             "memory vs baseline", "final loss gap", "final gap (nats)", "max step gap", "steps compared",
             "held-out gap", "non-finite steps", "weights in FP8", "MFU (measured peak)", "MFU (datasheet)"]
    assert html.startswith('<div class="table-wrap"><table class="results fp8"><thead><tr>'
                           + "".join(f"<th>{h}</th>" for h in heads) + "</tr></thead><tbody><tr>")
    assert html.endswith("</tr></tbody></table></div>") and len(heads) == len(expected)
    two = fp8.table_html([cell, cell])
    assert "</tr><tr>" in two and two.count("<tr>") == 3
    bare = fp8.table_html([row("fp8_rowwise", status="skipped")])
    assert "<tr>" + "".join(f"<td>{v}</td>" for v in ["m", "FP8 rowwise (torchao)", "0", "skipped"] + [""] * 14) + \
           "</tr>" in bare
    assert "&lt;b&gt;" in fp8.table_html([{**cell, "model": "<b>"}])  # escaped


def test_the_section_with_and_without_fp8_cells():
    assert fp8.section_html({"cells": []}) == reporthtml.section_html(
        "FP8 against compiled bf16", "", "no FP8 cell in this run: the fp8 preset has them (`--config preset=fp8`, "
        "docs/fp8.md)")
    cells = [row("fp8_tensorwise", speedup_vs_baseline=1.5), row("fp8_rowwise", speedup_vs_baseline=0.5)]
    rows = fp8.fp8_rows({"cells": cells})
    said = "".join(f"<li>{line}</li>" for line in fp8.verdicts(rows))
    assert fp8.section_html({"cells": cells}) == reporthtml.section_html(
        "FP8 against compiled bf16", f"<ul>{said}</ul>{fp8.table_html(rows)}", "", fp8.INTRO)
    assert "on the qualifying nn.Linear layers" in fp8.INTRO and "against the FP8 peak" in fp8.INTRO

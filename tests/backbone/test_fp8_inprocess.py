"""amprepro.analysis.fp8 in-process, by exact output: the loss gaps' edge cases, every verdict wording, the table's
cells and the section (what mutation testing of the module asks for: docs/mutation.md)."""

import html
import json
import math

import pytest

from amprepro.analysis import fp8
from amprepro.report import fp8section, reporthtml

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
    assert fp8section._num(None, ".1f") == "" and fp8section._num(2.25, ".1f") == "2.2" and fp8._pct(None) == ""
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
    html = fp8section.table_html([cell])
    expected = ["m", "FP8 tensorwise (torchao)", "0", "ok", "1234.6 tokens/s", BASE, "1.234", "3.0", "0.99", "+1.23 %",
                "+0.5000", "5.00 %", "7", "+3.10 %", "0", "98.00 %", "25.00 %", "20.00 %"]
    assert "<tr>" + "".join(f"<td>{v}</td>" for v in expected) + "</tr>" in html
    heads = ["model", "precision", "seed", "status", "throughput", "vs baseline", "speedup", "peak GiB",
             "memory vs baseline", "final loss gap", "final gap (nats)", "max step gap", "steps compared",
             "held-out gap", "non-finite steps", "weights in FP8", "MFU (measured peak)", "MFU (datasheet)"]
    assert html.startswith('<div class="table-wrap"><table class="results fp8"><thead><tr>'
                           + "".join(f"<th>{h}</th>" for h in heads) + "</tr></thead><tbody><tr>")
    assert html.endswith("</tr></tbody></table></div>") and len(heads) == len(expected)
    two = fp8section.table_html([cell, cell])
    assert "</tr><tr>" in two and two.count("<tr>") == 3
    bare = fp8section.table_html([row("fp8_rowwise", status="skipped")])
    assert "<tr>" + "".join(f"<td>{v}</td>" for v in ["m", "FP8 rowwise (torchao)", "0", "skipped"] + [""] * 14) + \
           "</tr>" in bare
    assert "&lt;b&gt;" in fp8section.table_html([{**cell, "model": "<b>"}])  # escaped


def test_the_section_with_and_without_fp8_cells():
    assert fp8section.section_html({"cells": []}) == reporthtml.section_html(
        "FP8 against compiled bf16", "", "no FP8 cell in this run: the fp8 preset has them (`--config preset=fp8`, "
        "docs/fp8.md)")
    cells = [row("fp8_tensorwise", speedup_vs_baseline=1.5), row("fp8_rowwise", speedup_vs_baseline=0.5)]
    rows = fp8.fp8_rows({"cells": cells})
    said = "".join(f"<li>{line}</li>" for line in fp8.verdicts(rows))
    assert fp8section.section_html({"cells": cells}) == reporthtml.section_html(
        "FP8 against compiled bf16", f"<ul>{said}</ul>{fp8section.table_html(rows)}", "", fp8section.INTRO)
    assert "on the qualifying nn.Linear layers" in fp8section.INTRO and "against the FP8 peak" in fp8section.INTRO


# --- the gaps over seeds (seed_gaps) ---

def test_the_t_tables_are_the_exact_quantiles_rounded_up():
    scipy_t = pytest.importorskip("scipy.stats").t
    for table, p in [(fp8.T_TWO_SIDED_95, 0.975), (fp8.T_ONE_SIDED_95, 0.95)]:
        assert len(table) == 30
        for df, value in enumerate(table, start=1):
            exact = float(scipy_t.ppf(p, df))
            assert exact <= value < exact + 0.001, (p, df, value, exact)
    assert fp8.t_quantile(fp8.T_TWO_SIDED_95, 1) == 12.707 and fp8.t_quantile(fp8.T_ONE_SIDED_95, 30) == 1.698
    assert fp8.t_quantile(fp8.T_ONE_SIDED_95, 31) == 1.698 and fp8.t_quantile(fp8.T_ONE_SIDED_95, 200) == 1.698


def test_the_interval_of_the_mean_and_each_verdict():
    assert fp8.seed_interval([]) is None and fp8.seed_interval([0.001]) is None
    under = fp8.seed_interval([0.001, 0.003])  # mean 0.002, sd sqrt(2e-6), se 0.001
    assert under["n"] == 2 and under["verdict"] == "under"
    assert under["mean"] == pytest.approx(0.002) and under["sd"] == pytest.approx(math.sqrt(2e-6))
    assert under["low"] == pytest.approx(0.002 - 12.707e-3) and under["high"] == pytest.approx(0.002 + 12.707e-3)
    assert under["upper"] == pytest.approx(0.002 + 6.314e-3)
    over = fp8.seed_interval([0.02, 0.04, 0.03])  # mean 0.03, se 0.01 / sqrt(3): lower bound 0.0131 > 0.01
    assert over["verdict"] == "over" and over["upper"] == pytest.approx(0.03 + 2.920 * 0.01 / math.sqrt(3))
    assert fp8.seed_interval([0.0, 0.02])["verdict"] == "not settled"  # mean at the limit
    assert fp8.seed_interval([-0.05, -0.04, -0.03])["verdict"] == "under"  # lower than the baseline is under
    assert fp8.seed_interval([0.0095, 0.0095, 0.0095])["verdict"] == "under"  # no spread: the mean itself
    assert fp8.seed_interval([0.0105, 0.0105, 0.0105])["verdict"] == "over"
    assert fp8.seed_interval([0.009, 0.011])["verdict"] == "not settled"
    assert fp8.seed_interval([0.01, 0.01])["verdict"] == "not settled"  # at the limit exactly: neither side


def paired(seed, held, final, precision="fp8_tensorwise", **extra):
    return row(precision, **{"seed": seed, "baseline_precision": "amp_bf16_compile", "speedup_vs_baseline": 1.2,
                             "heldout_gap_final_vs_baseline": held, "loss_gap_final_vs_baseline": final,
                             "heldout_loss_final": 2.5, "baseline_heldout_loss_final": 2.5, **extra})


def test_the_gaps_over_seeds_take_each_models_pairs_and_leave_out_what_cannot_count():
    rows = [paired(0, 0.01, 0.02), paired(1, 0.03, None), paired(2, 0.02, 0.04),
            paired(3, None, None, status="collapsed"),
            paired(4, 0.5, 0.5, baseline_loss_first=10.0, baseline_loss_final=0.05),  # memorised: left out
            paired(5, 0.5, 0.5, speedup_vs_baseline=None),  # its baseline did not run: left out
            paired(0, 0.002, 0.004, precision="fp8_rowwise"),  # one seed: no interval, no entry
            row("amp_bf16", seed=0, heldout_gap_final_vs_baseline=0.5)]  # no baseline: never counted
    [entry] = fp8.seed_gaps(rows)
    assert {k: entry[k] for k in ("model", "precision", "baseline", "collapsed_seeds")} == \
           {"model": "m", "precision": "fp8_tensorwise", "baseline": "amp_bf16_compile", "collapsed_seeds": [3]}
    assert entry["heldout_gap_final_vs_baseline"] == fp8.seed_interval([0.01, 0.03, 0.02])
    assert entry["loss_gap_final_vs_baseline"] == fp8.seed_interval([0.02, 0.04])
    two_models = fp8.seed_gaps([paired(0, 0.01, None), paired(1, 0.02, None),
                                {**paired(0, 0.01, None), "model": "n"}, {**paired(1, 0.01, None), "model": "n"}])
    assert [(e["model"], e["loss_gap_final_vs_baseline"]) for e in two_models] == [("m", None), ("n", None)]
    assert fp8.seed_gaps([paired(0, None, None), paired(1, None, None)]) == []


def test_the_sentence_of_the_gaps_over_seeds():
    entry = {"model": "m", "precision": "fp8_tensorwise", "baseline": "amp_bf16_compile", "collapsed_seeds": [],
             "heldout_gap_final_vs_baseline": {"n": 6, "mean": 0.0026, "sd": 0.0067, "low": -0.0045, "high": 0.0096,
                                               "upper": 0.0081, "verdict": "under"},
             "loss_gap_final_vs_baseline": None}
    assert fp8.seed_gap_text(entry) == (
        f"m FP8 tensorwise (torchao) against {BASE}, the mean of the paired gaps: final held-out loss +0.26 % over 6 "
        "seeds (sd 0.67 %, 95 % interval -0.45 % to +0.96 %, one-sided 95 % upper bound +0.81 %): under 1 %")
    both = {**entry, "collapsed_seeds": [2, 5],
            "loss_gap_final_vs_baseline": {"n": 2, "mean": 0.03, "sd": 0.01, "low": -0.1, "high": 0.16, "upper": 0.07,
                                           "verdict": "not settled"}}
    assert fp8.seed_gap_text(both).endswith(
        "under 1 %; final training loss +3.00 % over 2 seeds (sd 1.00 %, 95 % interval -10.00 % to +16.00 %, "
        "one-sided 95 % upper bound +7.00 %): not settled against 1 %; seeds 2, 5 collapsed (non-finite loss) and "
        "are left out")
    positive = {**entry, "heldout_gap_final_vs_baseline": {**entry["heldout_gap_final_vs_baseline"], "low": 0.001}}
    assert "95 % interval +0.10 % to +0.96 %" in fp8.seed_gap_text(positive)
    assert fp8.VERDICT_WORDS == {"under": "under 1 %", "over": "over 1 %", "not settled": "not settled against 1 %"}


def test_the_section_gives_the_gaps_over_seeds_where_two_seeds_ran():
    cells = [paired(0, 0.01, 0.02), paired(1, 0.03, 0.01)]
    rows = fp8.fp8_rows({"cells": cells})
    said = "".join(f"<li>{line}</li>" for line in fp8.verdicts(rows))
    [entry] = fp8.seed_gaps(rows)
    over = f"<p>{html.escape(fp8.SEEDS_INTRO)}</p><ul><li>{html.escape(fp8.seed_gap_text(entry))}</li></ul>"
    assert fp8section.section_html({"cells": cells}) == reporthtml.section_html(
        "FP8 against compiled bf16", f"<ul>{said}</ul>{over}{fp8section.table_html(rows)}", "", fp8section.INTRO)
    assert "under when the one-sided 95 % upper bound is below it" in fp8.SEEDS_INTRO
    two = [*cells, paired(0, 0.0, 0.0, precision="fp8_rowwise"), paired(1, 0.01, 0.0, precision="fp8_rowwise")]
    entries = fp8.seed_gaps(fp8.fp8_rows({"cells": two}))
    assert len(entries) == 2 and f"</li><li>{html.escape(fp8.seed_gap_text(entries[1]))}</li></ul>" in \
        fp8section.section_html({"cells": two})
    assert "<b>" not in fp8section.section_html({"cells": [{**c, "model": "<b>"} for c in cells]})


def test_the_section_as_text_from_a_summary_file(tmp_path, capsys, monkeypatch):
    cells = [paired(0, 0.01, 0.02), paired(1, 0.03, 0.01)]
    rows = fp8.fp8_rows({"cells": cells})
    assert fp8.report_lines({"cells": cells}) == [*fp8.verdicts(rows), fp8.SEEDS_INTRO,
                                                  fp8.seed_gap_text(fp8.seed_gaps(rows)[0])]
    one = [paired(0, 0.01, 0.02)]
    assert fp8.report_lines({"cells": one}) == fp8.verdicts(fp8.fp8_rows({"cells": one}))
    (tmp_path / "summary.json").write_text(json.dumps({"cells": cells}))
    fp8.main(["--summary", str(tmp_path / "summary.json")])
    assert capsys.readouterr().out == "".join(f"{line}\n" for line in fp8.report_lines({"cells": cells}))
    (tmp_path / "results" / "summary").mkdir(parents=True)
    (tmp_path / "results" / "summary" / "summary.json").write_text(json.dumps({"cells": one}))
    monkeypatch.chdir(tmp_path)
    fp8.main([])  # the run's own summary by default
    assert capsys.readouterr().out == "".join(f"{line}\n" for line in fp8.report_lines({"cells": one}))
    with pytest.raises(SystemExit):
        fp8.main(["--help"])
    assert "\n\nThe report's FP8 section as text (amprepro.analysis.fp8).\n\n" in capsys.readouterr().out

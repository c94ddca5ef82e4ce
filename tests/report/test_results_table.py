from amprepro.report import reportlib


def cell(precision, **extra):
    return {"model": "vit", "precision": precision, "seed": 0, "status": "ok", "reason": "",
            "throughput_per_s": 2500.0, "throughput_unit": "samples/s", "step_time_median_s": 0.05,
            "step_time_p90_s": 0.051, "peak_allocated_bytes": 2**33, "speedup_vs_fp32": 6.0, "speedup_vs_tf32": 2.0,
            "final_loss": 6.9, "eval_accuracy": None, "skipped_steps": 0, **extra}


def test_results_table_states_mfu_against_both_peaks():
    table = reportlib.results_table({"cells": [cell("amp_bf16", achieved_tflops=400.0, mfu_vs_measured_peak=0.5,
                                                    mfu_vs_datasheet=0.404)]})
    row = table.iloc[0]
    assert (row["TFLOP/s"], row["MFU measured peak"], row["MFU datasheet"]) == ("400.0", "50.0%", "40.4%")


def test_results_table_reads_summaries_without_mfu_columns():
    table = reportlib.results_table({"cells": [cell("fp32")]})
    assert table.iloc[0]["MFU datasheet"] == ""


def test_uneven_step_times_are_noted_on_ok_cells_only():
    table = reportlib.results_table({"cells": [
        cell("fp32", step_time_p90_s=0.0545),  # 9 % above the median: as steady as the H200's big-model cells
        cell("amp_fp16", step_time_p90_s=0.06),  # 20 %
        cell("amp_bf16", status="skipped", reason="needs a GPU", step_time_median_s=None, step_time_p90_s=None),
        cell("apex_o1", reason=None)]})
    notes = dict(zip(table["precision"], table["reason"]))
    assert notes["fp32"] == ""
    assert notes["amp_fp16"] == "uneven step times: p90 is 20% above the median, so this throughput is less certain"
    assert notes["amp_bf16"] == "needs a GPU" and notes["apex_o1"] == ""


def test_a_small_tflops_keeps_its_significant_digits():
    """Issue 41: a CPU cell's 0.0184 TFLOP/s read 0.0."""
    table = reportlib.results_table({"cells": [cell("fp32", achieved_tflops=value)
                                               for value in (0.0184381, 0.0523, 1.534, 12.34, 1234.5, 0.0)]})
    assert list(table["TFLOP/s"]) == ["0.0184", "0.0523", "1.53", "12.3", "1,234.5", "0.0"]


def test_seed_zero_is_shown_in_the_html_table():
    """Issue 41: the folded HTML table dropped every falsy value, so seed 0 was blank on every row."""
    from amprepro.report import reporthtml

    html = reporthtml.results_html({"cells": [cell("fp32", seed=0), cell("amp_bf16", seed=3, skipped_steps=None)]})
    rows = html.split("<tbody>")[1].split("</tr>")
    assert '<td>fp32</td><td class="num">0</td>' in rows[0]
    assert '<td>amp_bf16</td><td class="num">3</td>' in rows[1]

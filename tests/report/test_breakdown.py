"""The 7B section of the report: how each cell's allocator peak splits, and the derived epoch time, from summary.csv."""

from __future__ import annotations

import base64
import re

import pandas as pd
import pytest
from report_helpers import GPU, LLM7B

from amprepro.report import reportcharts, reporthtml, reportlib

CSV = LLM7B / "summary/summary.csv"
RUNS = LLM7B / "runs"
PARAMS = 6_738_415_616  # the fixture's llama7b
GIB = 2**30


def table_rows(html: str) -> dict[str, list[str]]:
    """precision -> the cell texts of its row in the breakdown table."""
    body = html[html.index('<table class="breakdown">'):html.index("</table>")]
    rows = {}
    for tr in re.findall(r"<tr class=\"status-\w+\">(.*?)</tr>", body):
        cells = [re.sub(r"<[^>]+>", "", td) for td in re.findall(r"<td[^>]*>(.*?)</td>", tr)]
        rows[cells[0]] = cells
    return rows


def headers(html: str) -> list[str]:
    head = html[html.index('<table class="breakdown">'):html.index("</thead>")]
    return [re.sub(r"<[^>]+>", "", th) for th in re.findall(r"<th[^>]*>(.*?)</th>", head)]


def test_breakdown_table_splits_each_peak_into_its_parts():
    html = reporthtml.breakdown_html(str(CSV), str(RUNS))
    cols = headers(html)
    rows = table_rows(html)
    assert list(rows) == ["fp32", "tf32", "amp_fp16", "amp_bf16", "apex_o1", "apex_o2"]
    at = {name: cols.index(name) for name in cols}
    fp32, o2 = rows["fp32"], rows["apex_o2"]
    # FP32: 4 + 4 + 8 bytes per parameter, plus 6 GiB activations
    assert fp32[at["weights (GiB)"]] == f"{4 * PARAMS / GIB:.1f}" == "25.1"
    assert fp32[at["optimizer state (GiB)"]] == f"{8 * PARAMS / GIB:.1f}"
    assert fp32[at["allocator peak (GiB)"]] == f"{(16 * PARAMS + 6 * GIB) / GIB:.1f}"
    assert fp32[at["FP32 master weights (GiB)"]] == ""
    # apex O2: FP16 weights and gradients, FP32 master weights
    assert o2[at["weights (GiB)"]] == f"{2 * PARAMS / GIB:.1f}" and o2[at["FP32 master weights (GiB)"]] == "25.1"
    assert fp32[at["estimate before the run (GiB)"]] == f"{(16 * PARAMS + 8 * GIB) / GIB:.1f}"


def test_epoch_times_are_labelled_derived_with_their_token_count():
    html = reporthtml.breakdown_html(str(CSV), str(RUNS))
    title = "epoch time (h), derived from tokens/s for 1,000,000,000 tokens"
    assert title in headers(html)
    rows = table_rows(html)
    column = headers(html).index(title)
    assert rows["fp32"][column] == f"{1e9 / 720 / 3600:,.2f}"  # 720 tokens/s
    assert rows["apex_o1"][column] == f"{1e9 / 3050 / 3600:,.2f}"


def test_without_a_token_count_the_epoch_time_is_left_out_and_says_why(tmp_path):
    html = reporthtml.breakdown_html(str(CSV), None)  # no metrics.json, no epoch_tokens column
    assert "for 1,000,000,000 tokens" not in html
    rows = table_rows(html)
    column = headers(html).index("epoch time (h), derived from tokens/s")
    assert rows["fp32"][column] == ""
    assert "epoch time left out: its token count is not recorded" in rows["fp32"][-1]


def test_explanation_says_why_amp_saves_little_memory_at_this_size():
    html = reporthtml.breakdown_html(str(CSV), str(RUNS))
    assert "16 bytes per parameter" in html and "activation checkpointing" in html and "master weights" in html
    fixed, peak = 16 * PARAMS / GIB, (16 * PARAMS + 6 * GIB) / GIB
    assert (f"In strict FP32 here, weights, gradients and optimizer state take {fixed:.1f} GiB of the {peak:.1f} GiB "
            f"allocator peak ({fixed / peak:.0%}); activations and workspace 6.0 GiB.") in html


def test_breakdown_chart_is_an_embedded_png_of_stacked_parts():
    html = reporthtml.breakdown_html(str(CSV), str(RUNS))
    (src,) = re.findall(r'alt="memory breakdown chart" src="data:image/png;base64,([^"]+)"', html)
    assert base64.b64decode(src).startswith(b"\x89PNG")
    fig = reportcharts.breakdown_chart(reportlib.breakdown_frame(str(CSV), str(RUNS)))
    ax = fig.axes[0]
    bars = [p for p in ax.patches]
    assert len(bars) == 6 * 5  # six cells, five parts each (master weights 0 where there are none)
    tops = {}
    for bar in bars:
        tops[bar.get_x()] = max(tops.get(bar.get_x(), 0), bar.get_y() + bar.get_height())
    assert sorted(tops.values())[-1] == pytest.approx((16 * PARAMS + 6 * GIB) / GIB)  # the FP32 bar is its peak


def test_a_skipped_7b_cell_shows_its_estimate_and_reason(tmp_path):
    frame = pd.read_csv(CSV, dtype={"reason": object})
    why = "needs about 118.0 GiB (estimate), 80.0 GiB free on this GPU"
    gone = frame["precision"] == "apex_o2"
    frame.loc[gone, ["status", "reason"]] = ["skipped", why]
    for column in ["throughput_per_s", "peak_allocated_bytes", "epoch_hours_derived", *reportlib.MEMORY_PARTS]:
        frame.loc[gone, column] = None
    path = tmp_path / "summary.csv"
    frame.to_csv(path, index=False)
    html = reporthtml.breakdown_html(str(path), str(RUNS))
    row = table_rows(html)["apex_o2"]
    assert row[2] == "skipped" and why in row[-1]
    assert row[headers(html).index("estimate before the run (GiB)")] != ""
    fig = reportcharts.breakdown_chart(reportlib.breakdown_frame(str(path), str(RUNS)))
    assert len(fig.axes[0].patches) == 5 * 4  # five cells ran; none of them has master weights


def test_no_breakdown_columns_say_so():
    html = reporthtml.breakdown_html(str(GPU / "summary/summary.csv"), str(GPU / "runs"))
    assert html.startswith("<p>No cell of this run records how its peak memory splits")
    assert "<table" not in html and "<img" not in html


def test_the_rendered_report_shows_the_7b_verdicts_caveats_and_breakdown(llm7b_html):
    html = llm7b_html.read_text()
    top = html[html.index('<section class="glance">'):html.index("</section>")]
    epoch = top[top.index("<b>llm7b-epoch-time</b>"):]
    assert "exceeds the claim vs strict FP32; holds vs TF32" in epoch[:epoch.index("</tr>")]
    memory = top[top.index("<b>llm7b-peak-memory</b>"):]
    assert "falls short vs strict FP32 and TF32" in memory[:memory.index("</tr>")]
    assert "caveats: see Claims" in epoch[:epoch.index("</tr>")]
    claims_part = html[html.index(">Claims<"):html.index(">Reference check<")]
    assert "<b>Caveats:</b>" in claims_part and "micro-batch 1 (one 2048-token sequence)" in claims_part
    section = html[html.index(">Where the peak memory goes (7B)<"):html.index(">Loss curves: FP32 against AMP<")]
    assert '<table class="breakdown">' in section and 'alt="memory breakdown chart"' in section
    assert "derived from tokens/s for 1,000,000,000 tokens" in section


def test_only_models_that_estimate_their_memory_get_the_section(tmp_path):
    """Every cell records a breakdown (the GPT and digits cells too); the section is for the 7B cells."""
    frame = pd.read_csv(CSV)
    other = frame.iloc[[0]].assign(model="gpt124m", mem_estimate_total_bytes=None, epoch_hours_derived=None)
    table = tmp_path / "summary.csv"
    pd.concat([frame, other]).to_csv(table, index=False)
    assert set(reportlib.breakdown_frame(str(table), str(RUNS))["model"]) == {"llama7b"}


def test_a_cpu_run_whose_cells_only_estimate_says_why_there_is_no_breakdown(tmp_path):
    """Issue 41: a CPU run's cells make the memory estimate but have no allocator peak to split; the section showed a
    table of empty columns per model and an empty chart."""
    cpu = pd.DataFrame([{"model": m, "precision": p, "seed": 0, "status": "ok", "mem_estimate_total_bytes": 75733368,
                         "peak_rss_bytes": 2**29, "throughput_per_s": 2500.0, "throughput_unit": "samples/s"}
                        for m in ("cnn", "transformer") for p in ("fp32", "amp_bf16")])
    cpu.to_csv(tmp_path / "summary.csv", index=False)
    assert reportlib.breakdown_frame(str(tmp_path / "summary.csv")).empty
    html = reporthtml.breakdown_section(str(tmp_path / "summary.csv"))
    assert "<table" not in html and "<img" not in html
    assert ("nothing to show on this run: the split is of the GPU allocator&#39;s peak, and no cell of this run ran on "
            "a GPU") in html
    gpu = cpu.assign(peak_allocated_bytes=2**33)  # a GPU run whose cells record no split: the other reason
    gpu.to_csv(tmp_path / "summary.csv", index=False)
    assert "no cell records how its peak memory splits" in reporthtml.breakdown_section(str(tmp_path / "summary.csv"))
    split = gpu.assign(mem_weights_bytes=2**31)  # with the split: the table and chart
    split.to_csv(tmp_path / "summary.csv", index=False)
    assert len(reportlib.breakdown_frame(str(tmp_path / "summary.csv"))) == 4

"""The rendered report: self-contained, no code, the one-screen summary first, provenance last, every claim judged."""

from __future__ import annotations

import base64
import re

import pytest
import yaml
from report_helpers import CLAIMS

from amprepro.report import render

SECTIONS = ["Claims", "Reference check", "Results", "Throughput", "Speedup against both baselines", "Peak memory",
            "Where the peak memory goes (7B)", "Largest batch per precision", "Loss curves: FP32 against AMP",
            "Loss scale", "Sanity checks", "Environment", "Provenance"]
VERDICTS = ("holds", "exceeds the claim", "falls short", "not measurable here", "depends on the baseline")
IMG = re.compile(r"<img\b[^>]*>")
ATTR = re.compile(r'(\w+)="([^"]*)"')


def charts(html: str) -> list[tuple[str, str]]:
    """(alt, base64 PNG) of every chart image, whatever order nbconvert writes the attributes in."""
    out = []
    for tag in IMG.findall(html):
        attrs = dict(ATTR.findall(tag))
        assert attrs.get("class") == "chart" and attrs["src"].startswith("data:image/png;base64,"), tag[:200]
        out.append((attrs["alt"], attrs["src"].split(",", 1)[1]))
    return out


def claim_ids():
    """The claims a run's own cells judge (one with `evidence:` is judged from a committed file: test_pythonclaim)."""
    return [c["id"] for c in yaml.safe_load(CLAIMS.read_text())["claims"] if "evidence" not in c]


def glance(html: str) -> str:
    start = html.index('<section class="glance">')
    return html[start:html.index("</section>", start)]


@pytest.mark.parametrize("which", ["smoke_html", "gpu_html"])
def test_self_contained_without_code(request, which):
    html = request.getfixturevalue(which).read_text()
    assert render.check_offline(html) == []
    assert "<script" not in html.lower() and "cdnjs" not in html and "mermaid" not in html
    assert "Content-Security-Policy" in html and "default-src 'none'" in html
    assert "reportlib." not in html and "import " not in html and "def " not in html
    assert "In&nbsp;[" not in html
    assert "<style" in html and "table.claims-glance" in html  # the report's own CSS is inlined


@pytest.mark.parametrize("which", ["smoke_html", "gpu_html"])
def test_sections_in_order_summary_first_provenance_last(request, which):
    html = request.getfixturevalue(which).read_text()
    positions = [html.index(f">{section}<") for section in SECTIONS]
    assert positions == sorted(positions)
    assert html.index('<section class="glance">') < positions[0]
    assert html.rindex("pipeline commit") > positions[-1]
    for item in ("config sha256", "claims file", "GPU", "driver", "CUDA", "torch", "apex", "environment"):
        assert re.search(rf"<td\b[^>]*>{item}", html[positions[-1]:]), item


@pytest.mark.parametrize("which", ["smoke_html", "gpu_html"])
def test_every_chart_is_an_embedded_non_empty_png(request, which):
    html = request.getfixturevalue(which).read_text()
    found = charts(html)
    expected = {"throughput chart", "speedup chart", "memory chart", "loss curves"}
    if which == "gpu_html":  # on the CPU run no claim is measured and no fp16 cell scales its loss: no empty chart
        expected |= {"claims chart: measured against claimed", "loss scale chart"}
    assert expected <= {alt for alt, _ in found}
    for alt, data in found:
        raw = base64.b64decode(data)
        assert raw.startswith(b"\x89PNG\r\n\x1a\n") and len(raw) > 5000, alt
    assert html.count("<img") == len(found)


def test_smoke_summary_lists_every_claim_with_a_reason(smoke_html):
    top = glance(smoke_html.read_text())
    for claim_id in claim_ids():
        row = top[top.index(f"<b>{claim_id}</b>"):]
        row = row[:row.index("</tr>")]
        assert re.search(r"cells \(.*\), on a GPU|needs a Tensor Core GPU|benchmark models, on a GPU", row), row
        assert "not measurable here" not in row and "smoke preset on CPU" not in row  # said once, above
    assert top.count("A CPU run.") == 1 and "What needs a CUDA GPU:</b> TF32" in top
    assert f"{len(claim_ids())} from the articles, none measurable on this run (smoke preset on CPU)" in top
    o3 = top[top.index("<b>apex-o3-not-for-training</b>"):]
    assert o3[:o3.index("</tr>")].endswith(
        "<td>stdlib_gpt cells (--config preset=accuracy), on a GPU (accuracy preset)</td>")
    assert "no any model" not in top
    assert "Ran in the project's venv" in top and "NOT ISOLATED" not in top  # make run's route, named as such
    assert "CPU only" in top and "NO REFERENCE" in top and "smoke preset" in top


def test_cpu_report_sections_and_cells_say_what_they_lack(smoke_html):
    html = smoke_html.read_text()
    for title in ("Loss scale", "Where the peak memory goes (7B)", "Reference check"):
        assert f'<div class="section-empty"><h2>{title}</h2><span class="why">' in html, title
    assert ">True<" not in html and ">False<" not in html  # sanity's required column says yes / no
    assert "none (a CPU-only torch build)" in html  # torch CUDA, cuDNN and NCCL are not blank
    assert "No cell of this run has a value for TFLOP/s, MFU measured / datasheet peak" in html


def test_gpu_summary_shows_verdicts_verify_failure_and_hardware(gpu_html):
    html = gpu_html.read_text()
    top = glance(html)
    assert "NVIDIA H200" in top
    assert "FAIL" in top and "4 of 36 cells out of tolerance" in top and "resnet50/amp_fp16/seed0" in top
    assert "exceeds the claim vs strict FP32; holds vs TF32" in top  # vit-apex-o1-speed: 5.80x / 1.87x for 1.75x
    assert "falls short vs strict FP32 and TF32" in top  # amp-memory-40-60: gpt124m −36.7 %, vit_b_16 −39.4 %
    assert "does not hold" not in top
    for claim_id in claim_ids():
        assert f"<b>{claim_id}</b>" in top
    assert sum(top.count(v) for v in VERDICTS) >= len(claim_ids())
    assert "reference check chart: this run / reference per cell" in html
    assert 'class="row-fail"' in html and "collapsed" in html


def test_check_offline_catches_what_would_break_offline():
    assert render.check_offline('<p>ok</p><img src="data:image/png;base64,AAAA"/>') == []
    assert render.check_offline('<script type="module">import("https://x/y.mjs")</script>')
    assert render.check_offline('<img src="https://example.org/a.png">')
    assert render.check_offline('<link rel="stylesheet" href="//cdn.example.org/a.css">')
    assert render.check_offline("<style>@import 'x.css';</style>")
    assert render.check_offline('<img src="figures/a.png">') == []  # relative files are caught by the browser test


def test_cell_seconds_reads_papermills_durations_slowest_first():
    from amprepro.report.render import cell_seconds

    notebook = {"cells": [
        {"cell_type": "markdown", "metadata": {}}, {"cell_type": "code", "metadata": {"papermill": {"duration": 0.5}}},
        {"cell_type": "code", "metadata": {"papermill": {"duration": 1.25}}},
        {"cell_type": "code", "metadata": {"papermill": {"duration": None}}}]}
    assert cell_seconds(notebook) == [(1.25, 2), (0.5, 1)]

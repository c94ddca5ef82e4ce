"""The report in a real headless Chromium: loads with no console error, fetches nothing, every chart image decodes.

Needs Debian's chromium (.ci/setup/10-chromium.sh installs it). Without it the tests skip, except in CI (CI=true),
where a missing browser is a failure: the browser test must really run there.
"""

from __future__ import annotations

import os

import pytest
from report_browser import CJK_BOXES_JS, chromium_binary, dump_dom, fonts_without_cjk, open_page, page_layout

BINARY = chromium_binary()
if BINARY is None:
    if os.environ.get("CI"):
        raise RuntimeError("chromium is missing in CI: .ci/setup/10-chromium.sh should have installed it")
    pytest.skip("no chromium on PATH (Debian: apt-get install chromium; CI runs .ci/setup/10-chromium.sh)",
                allow_module_level=True)


def test_the_harness_sees_console_errors_exceptions_and_network(tmp_path):
    """Negative control: a page that logs an error, throws, and asks for a loopback URL must be caught."""
    page = tmp_path / "bad.html"
    page.write_text("<html><body><img alt='x' src='http://127.0.0.1:9/missing.png'>"
                    "<script>console.error('boom from the page'); undefinedFunction();</script></body></html>")
    report = open_page(page.as_uri(), BINARY)
    text = "\n".join(report.errors)
    assert "boom from the page" in text
    assert "undefinedFunction" in text
    assert report.network == ["http://127.0.0.1:9/missing.png"]
    assert any(not image["complete"] or image["width"] == 0 for image in report.images)


@pytest.mark.parametrize("which", ["smoke_html", "gpu_html"])
def test_report_loads_clean_offline_with_every_chart(request, which):
    html = request.getfixturevalue(which)
    report = open_page(html.as_uri(), BINARY)
    assert report.errors == [], report.errors
    assert report.network == [], report.network
    assert report.images, "no chart in the report"
    for image in report.images:
        assert image["scheme"] == "data", image
        assert image["complete"] and image["width"] > 100 and image["height"] > 100, image
    assert report.title


def test_dump_dom_has_the_summary_and_the_charts(gpu_html):
    dom = dump_dom(gpu_html.as_uri(), BINARY)
    assert '<section class="glance">' in dom
    assert dom.count('class="chart"') >= 7
    assert "Provenance" in dom


def test_the_cpu_report_fits_1400_px_and_has_no_empty_section(smoke_html):
    """Issue 22: on the CPU report nothing scrolls sideways at 1400 px (the results table's reason stays in view), and
    every section shows something or is one line saying why not."""
    layout = page_layout(smoke_html.as_uri(), BINARY, width=1400)
    assert layout["innerWidth"] == 1400
    assert layout["scrollWidth"] <= 1400, layout["scrollWidth"]
    assert [w for w in layout["wraps"] if w["overflow"] > 0] == [], layout["wraps"]
    assert layout["reasonRight"] is not None and layout["reasonRight"] <= 1400, layout["reasonRight"]
    sections = {s["title"]: s for s in layout["sections"]}
    assert [s["title"] for s in layout["sections"] if not s["collapsed"] and s["content"] == 0] == [], sections
    for title in ("Loss scale", "Where the peak memory goes (7B)"):  # nothing of them runs on a CPU
        assert sections[title]["collapsed"] and "nothing to show on this run" in sections[title]["why"], sections[title]
        assert sections[title]["height"] < 60, sections[title]  # one line
    for title in ("Results", "Throughput", "Speedup against both baselines", "Peak memory",
                  "Loss curves: FP32 against AMP", "Sanity checks", "Environment", "Provenance"):
        assert not sections[title]["collapsed"] and sections[title]["content"] > 0, sections[title]


def test_the_harness_sees_sideways_scroll_and_empty_sections(tmp_path):
    """Negative control for the layout check: a too-wide table and a heading with nothing under it are caught."""
    page = tmp_path / "wide.html"
    page.write_text("<html><body><h2>Empty</h2><h2>Wide</h2><div class='table-wrap' style='overflow-x:auto'>"
                    "<table class='results'><tr><th style='min-width:2000px'>x</th><th>reason</th></tr></table>"
                    "</div></body></html>")
    layout = page_layout(page.as_uri(), BINARY, width=1400)
    assert [w["overflow"] > 0 for w in layout["wraps"]] == [True]
    assert layout["reasonRight"] > 1400
    assert [(s["title"], s["content"]) for s in layout["sections"]] == [("Empty", 0), ("Wide", 1)]


def test_without_a_cjk_font_the_report_says_which_font_to_install(smoke_html, tmp_path):
    """Issue 41: on a machine without a CJK font every article title and quote was a row of boxes, with nothing saying
    a font is needed. Chromium here knows only DejaVu (fontconfig): the Chinese text is boxes (checked), and the page's
    own text names the package that fixes it."""
    report = open_page(smoke_html.as_uri(), BINARY, env=fonts_without_cjk(tmp_path / "fonts"),
                       expressions={"boxes": CJK_BOXES_JS, "text": "document.body.innerText",
                                    "zh": "document.querySelectorAll('[lang=zh]').length"})
    assert report.values["boxes"] is True, "a CJK font was found: this test needs a browser without one"
    assert report.values["zh"] >= 10  # every claim's title (and quote) is marked as Chinese
    text = report.values["text"]
    assert "Where they show as empty boxes, this browser has no CJK font" in text
    assert "sudo apt-get install fonts-noto-cjk" in text

"""The report in a real headless Chromium: loads with no console error, fetches nothing, every chart image decodes.

Needs Debian's chromium (.ci/setup/10-chromium.sh installs it). Without it the tests skip, except in CI (CI=true),
where a missing browser is a failure: the browser test must really run there.
"""

from __future__ import annotations

import os

import pytest
from report_browser import chromium_binary, dump_dom, open_page

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

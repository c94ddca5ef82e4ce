"""The report's HTML templates: autoescape on, so a value from a claim, a reason or a package version stays text."""

from __future__ import annotations

import pandas as pd

from amprepro.report import reporthtml

EVIL = '<img src="https://example.org/x.png" onerror="alert(1)"><script>alert(2)</script>'


def test_every_template_escapes_what_it_is_given():
    assert reporthtml.ENV.autoescape is True  # for every template, whatever its name ends with
    for name in reporthtml.ENV.list_templates():
        assert name.endswith(".html.j2"), name


def test_injected_markup_in_values_comes_out_as_text():
    sanity = {"checks": [{"name": EVIL, "status": EVIL, "required": True, "detail": EVIL, "fix": EVIL}]}
    kv = pd.DataFrame([(EVIL, EVIL)], columns=["item", "value"])
    results = {"cells": [{"model": EVIL, "precision": "fp32", "seed": 0, "status": "skipped", "reason": EVIL}]}
    for html in (reporthtml.sanity_html(sanity), reporthtml.kv_html(kv), reporthtml.results_html(results),
                 reporthtml.verify_html({"status": "fail", "message": EVIL, "failures": [EVIL], "warnings": [EVIL],
                                         "machine": {"gpu_count": EVIL}, "cells": []})):
        assert "<script" not in html and "<img" not in html, html
        assert "&lt;script&gt;" in html

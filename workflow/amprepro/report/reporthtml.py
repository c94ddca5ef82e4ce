"""The report's HTML, from the Jinja2 templates in workflow/report/templates and pandas' Styler.

Each function here picks what a section shows from the data amprepro.report.reportlib shapes and renders that section's
template; no markup is written in Python. Autoescape is on for every template, so no value (a claim, a reason, a
package version) can inject markup. The CSS that styles the classes is
workflow/report/nbconvert/amprepro/static/report.css.
"""

from __future__ import annotations

import base64
from pathlib import Path

import jinja2
import pandas as pd

from amprepro.report import claims as claims_mod
from amprepro.report.cellcompare import METRIC_LABEL
from amprepro.report.reportcharts import breakdown_chart, png_bytes
from amprepro.report.reportlib import (
    BREAKDOWN_WHY,
    breakdown_frame,
    breakdown_table,
    fixed_share_text,
    hardware,
    results_table,
    shorten,
)
from amprepro.train import precisions

TEMPLATE_DIR = Path(__file__).resolve().parents[2] / "report" / "templates"
VERIFY_LABEL = {"pass": "PASS", "fail": "FAIL", "no_reference": "NO REFERENCE", "not_comparable": "NOT COMPARABLE"}
VERDICT_BADGE = {"pass": "s-pass", "fail": "s-fail"}
RESULTS_NUMERIC = {"seed", "throughput", "median step ms", "p90 step ms", "× fp32", "× tf32", "final loss",
                   "eval acc", "skipped steps", "TFLOP/s", "MFU measured peak", "MFU datasheet"}

ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATE_DIR), autoescape=True, trim_blocks=True,
                         lstrip_blocks=True, undefined=jinja2.StrictUndefined)
ENV.globals.update(VERIFY_LABEL=VERIFY_LABEL)
ENV.filters["blank"] = lambda value: "" if value is None else value
ENV.filters["precision_label"] = precisions.label


def render(template: str, **context) -> str:
    return ENV.get_template(template).render(**context).strip()


def figure_html(fig, alt: str, caption: str = "") -> str:
    """The figure as an embedded PNG (base64): the HTML report opens offline with every chart inside it."""
    return render("figure.html.j2", png=base64.b64encode(png_bytes(fig)).decode("ascii"), alt=alt, caption=caption)


def glance_html(data: dict, title: str = "") -> str:
    """Verdicts, reference check and hardware: what a reader needs before scrolling."""
    summary, isolation = data["summary"], data["environment"].get("isolation", {})
    claims = data.get("claims")
    return render("glance.html.j2", title=title, hardware=hardware(summary), versions=summary["versions"],
                  counts=summary["counts"], preset=summary["preset"], n_cells=len(summary["cells"]),
                  sanity=data["sanity"], apex=data["apex"], verify=data.get("verify"),
                  isolation_warning=(None if isolation.get("isolated", True)
                                     else isolation.get("message", "NOT ISOLATED")),
                  claims=None if claims is None else [{**r, "detail": claim_detail(r)} for r in claims],
                  claim_counts=None if claims is None else claims_mod.counts(claims))


def claim_detail(result: dict) -> str:
    """One screen: the measured value or why not, cut at a word boundary (the Claims section has it in full)."""
    detail = shorten(result["measured_text"] if result["verdict"] != "not_measurable" else result["reason"])
    if result.get("caveats"):
        detail += f" ({len(result['caveats'])} caveats: see Claims)"
    return detail


def claims_detail_html(results: list[dict] | None) -> str:
    return render("claims_detail.html.j2",
                  claims=None if results is None else [{**r, "measured_items": measured_items(r)} for r in results])


def measured_items(r: dict) -> list[dict]:
    """What a claim's "measured per baseline" cell lists, one item per line, each of a kind the template knows."""
    items = []
    if r["verdict"] == "not_measurable":
        items.append({"kind": "why", "text": r["reason"]})
    else:
        for baseline, b in r.get("by_baseline", {}).items():
            label = precisions.label(baseline)
            if b["verdict"] == "not_measurable":
                items.append({"kind": "baseline_not_measurable", "label": label, "reason": b["reason"]})
                continue
            for model, m in b["models"].items():
                shown = m["verdict"] == "not_measurable" or m.get("borderline")
                items.append({"kind": "model", "label": label, "model": model,
                              "measured": m.get("measured_text") or "—",
                              "verdict": m["verdict"], "verdict_text": claims_mod.VERDICT_TEXT[m["verdict"]],
                              "reason": m["reason"] if shown else None})
    if r.get("proxy"):
        p = r["proxy"]
        outcome = (f"{p['measured_text']} (at that scale: {p['verdict_text']})" if p["verdict"] != "not_measurable"
                   else p["reason"])
        items.append({"kind": "proxy", "models": p["models"], "outcome": outcome, "note": p["note"]})
    if r.get("note"):
        items.append({"kind": "note", "text": r["note"]})
    if r.get("caveats"):
        items.append({"kind": "caveats", "caveats": r["caveats"]})
    return items


def verify_html(result: dict | None) -> str:
    """The reference check's outcome and a row per cell with its ratio to the reference for each metric."""
    if result is None:
        return render("verify.html.j2", result=None)
    metrics = list(dict.fromkeys(ch["metric"] for c in result.get("cells", []) for ch in c["checks"]))
    rows = []
    for cell in result.get("cells", []):
        kind = VERDICT_BADGE.get(cell["verdict"], "s-no_reference")
        rows.append({"cell": cell["cell"], "verdict": cell["verdict"].replace("_", " "), "verdict_kind": kind,
                     "row_class": "row-fail" if kind == "s-fail" else "",
                     "status": f"{cell['status_here'] or '—'} / {cell['status_reference'] or '—'}",
                     "runs": cell.get("reference_runs", ""), "note": cell["note"],
                     "checks": {check["metric"]: ratio_check(check) for check in cell["checks"]}})
    columns = [("cell", "cell"), ("verdict", "verdict"), ("status", "status here / reference"),
               ("runs", "reference runs")]
    columns += [(m, f"{METRIC_LABEL.get(m, m)}: this run / reference median") for m in metrics]
    columns += [("note", "note")]
    return render("verify.html.j2", result=result, rows=rows, columns=columns, metrics=metrics)


def ratio_check(check: dict) -> dict:
    """One metric of one cell: this run / the reference median, in bold when out of tolerance, and its band."""
    text = "n/a" if check.get("ratio") is None else f"{check['ratio']:.3f}×"
    return {"text": text, "bold": check["ok"] is False, "allowed": check["allowed"]}


def results_html(summary: dict) -> str:
    """The results table; a skipped cell's reason spans the measurement columns instead of squeezing into one."""
    frame = results_table(summary)
    return render("results.html.j2", columns=[c for c in frame.columns if c != "reason"],
                  rows=frame.to_dict("records"), numeric=RESULTS_NUMERIC)


def breakdown_html(table: str, runs_dir: str | None = None) -> str:
    """The section for the cells that record a memory breakdown: why, a table per model, and the stacked bars."""
    frame = breakdown_frame(table, runs_dir)
    if frame.empty:
        return render("breakdown.html.j2", models=[])
    models = [{"name": model, "share": fixed_share_text(frame[frame["model"] == model]),
               **breakdown_table(frame[frame["model"] == model])} for model in dict.fromkeys(frame["model"])]
    return render("breakdown.html.j2", models=models, why=BREAKDOWN_WHY, alt="memory breakdown chart", caption="",
                  png=base64.b64encode(png_bytes(breakdown_chart(frame))).decode("ascii"))


def sanity_html(sanity: dict) -> str:
    return render("sanity.html.j2", checks=sanity["checks"])


def kv_html(frame: pd.DataFrame, classes: str = "kv") -> str:
    """A two-column table (item, value) through pandas' Styler: escaped, no index, the report's classes."""
    styler = frame.style.hide(axis="index").format(escape="html", na_rep="")
    styler = styler.set_table_attributes(f'class="{classes}"').set_uuid(classes.replace(" ", "-"))
    return render("table_wrap.html.j2", table=styler.to_html())

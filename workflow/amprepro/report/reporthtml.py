"""The report's HTML, from the Jinja2 templates in workflow/report/templates and pandas' Styler.

Each function here picks what a section shows from the data amprepro.report.reportlib shapes and renders that section's
template; no markup is written in Python. Autoescape is on for every template, so no value (a claim, a reason, a
package version) can inject markup. The CSS that styles the classes is
workflow/report/nbconvert/amprepro/static/report.css.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

import jinja2
import markupsafe
import pandas as pd

from amprepro import precisions
from amprepro.analysis import claimmetrics
from amprepro.analysis import claims as claims_mod
from amprepro.memory import gib
from amprepro.report import figurepool, reportcharts
from amprepro.report.reportcharts import breakdown_chart
from amprepro.report.reportlib import (
    BREAKDOWN_WHY,
    breakdown_frame,
    breakdown_table,
    fixed_share_text,
    hardware,
    results_table,
    shorten,
)
from amprepro.verify.cellcompare import METRIC_LABEL

TEMPLATE_DIR = Path(__file__).resolve().parents[2] / "report" / "templates"
VERIFY_LABEL = {"pass": "PASS", "fail": "FAIL", "no_reference": "NO REFERENCE", "not_comparable": "NOT COMPARABLE"}
VERDICT_BADGE = {"pass": "s-pass", "fail": "s-fail"}
RESULTS_NUMERIC = {"seed", "throughput", "median step ms", "p90 step ms", "× fp32", "× tf32", "final loss",
                   "eval acc", "skipped steps", "TFLOP/s", "MFU measured peak", "MFU datasheet"}

ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATE_DIR), autoescape=True, trim_blocks=True,
                         lstrip_blocks=True, undefined=jinja2.StrictUndefined)
ENV.globals.update(VERIFY_LABEL=VERIFY_LABEL)
ENV.filters["blank"] = lambda value: "" if value is None else value
# escaped as html.escape escapes (quotes as &quot; and &#x27;): the FP8 section's text, as it was before its template
ENV.filters["html_escape"] = lambda value: markupsafe.Markup(html.escape(str(value)))
# an environment claim's (amprepro.analysis.envclaims) variant and baseline are no precisions: their names as written
ENV.filters["precision_label"] = lambda name: precisions.label(name) if name in precisions.REGISTRY else name


def render(template: str, **context) -> str:
    return ENV.get_template(template).render(**context).strip()


def figure_html(fig, alt: str, caption: str = "") -> str:
    """The figure as an embedded PNG (base64): the HTML report opens offline with every chart inside it. While the
    notebook's figure pool runs, a token stands for the PNG until the pool puts it in (amprepro.report.figurepool)."""
    return render("figure.html.j2", png=figurepool.embed(fig), alt=alt, caption=caption)


def glance_html(data: dict, title: str = "") -> str:
    """Verdicts, reference check and hardware: what a reader needs before scrolling. On a CPU run, one banner says what
    the run shows and what needs a GPU; claims none of which is measurable are listed with what each needs, instead of
    the same verdict and reason on every row."""
    summary, isolation = data["summary"], data["environment"].get("isolation", {})
    claims = data.get("claims")
    # A claim judged from a committed evidence file (amprepro.analysis.pythonclaim) has its verdict on every run: where
    # none of this run's own claims is measurable it is shown apart, under the list of what the others need.
    evidence = [r for r in claims or [] if r.get("evidence")]
    pending = bool(claims) and len(evidence) < len(claims) and all(
        r["verdict"] == "not_measurable" for r in claims if not r.get("evidence"))
    if pending:
        claims = [r for r in claims if not r.get("evidence")]
    return render("glance.html.j2", title=title, hardware=hardware(summary), versions=summary["versions"],
                  counts=summary["counts"], preset=summary["preset"], n_cells=len(summary["cells"]),
                  sanity=data["sanity"], apex=data["apex"], verify=data.get("verify"),
                  isolation=environment_route(isolation), cpu=cpu_run(summary),
                  context=claims_mod.run_context(summary),
                  claims=None if claims is None else [{**r, "detail": claim_detail(r),
                                                       "needs": claim_needs(r, summary)} for r in claims],
                  evidence_claims=[{**r, "detail": claim_detail(r)} for r in evidence] if pending else [],
                  claims_pending=pending, claim_counts=None if claims is None else claims_mod.counts(claims))


def environment_route(isolation: dict) -> dict:
    """How the jobs' environment is named: a pinned conda env, the project's venv (`make run`: the pinned requirements,
    its stamp written after they all installed), or an environment nobody pinned (the amber warning)."""
    if isolation.get("isolated", True):
        return {"kind": "conda", "text": isolation.get("message", "")}
    if isolation.get("project_venv"):
        return {"kind": "venv", "prefix": isolation.get("prefix", "")}
    return {"kind": "unpinned", "text": isolation.get("message", "NOT ISOLATED")}


def cpu_run(summary: dict) -> dict | None:
    """What a run without a GPU measured (the precisions and models that ran) and what it could not; None on a GPU."""
    if summary.get("versions", {}).get("gpu"):
        return None
    cells = summary["cells"]
    ran = [c for c in cells if c["status"] == "ok"]
    ran_precisions = [p for p in precisions.names() if any(c["precision"] == p for c in ran)]
    not_here = [p for p in precisions.names()
                if any(c["precision"] == p for c in cells) and p not in ran_precisions]
    return {"ran": len(ran), "precisions": ran_precisions, "models": list(dict.fromkeys(c["model"] for c in ran)),
            "not_here": not_here, "skipped": sum(c["status"] == "skipped" for c in cells)}


def claim_needs(result: dict, summary: dict) -> str:
    """What a claim that is not measurable here needs: its reason without the run context the banner states once."""
    if result["verdict"] != "not_measurable":
        return ""
    if result.get("needs"):  # a claim judged by its own module says what it needs (amprepro.analysis.loraclaim)
        return result["needs"]
    reason = (result.get("reason") or "").split(f": {claims_mod.run_context(summary)}")[0].split("; no CUDA GPU")[0]
    if set(result.get("models") or []) & {"any", "benchmark"} and reason.startswith(
            ("no benchmark model", "no model is in this run")):  # claims.no_model_ran's words for a generic claim
        return "cells of the paper preset's benchmark models, on a GPU"
    missing = re.fullmatch(r"no (.+) cell ran \((.+)\)", reason)
    if missing is None:
        return reason
    preset = ("accuracy preset" if result.get("stability_models")  # amprepro.analysis.optlevels
              else "risk preset" if result.get("risk_preset") else "paper preset")  # amprepro.analysis.riskclaims
    return f"{missing.group(1)} cells ({missing.group(2)}), on a GPU ({preset})"


def claim_detail(result: dict) -> str:
    """One screen: the measured value or why not, cut at a word boundary (the Claims section has it in full)."""
    detail = shorten(result["measured_text"] if result["verdict"] != "not_measurable" else result["reason"])
    if result.get("caveats"):
        detail += f" ({len(result['caveats'])} caveats: see Claims)"
    return detail


def claims_detail_html(results: list[dict] | None) -> str:
    return render("claims_detail.html.j2",
                  claims=None if results is None else [{**r, "measured_items": measured_items(r)} for r in results],
                  regimes=[] if results is None else [regimes_view(r) for r in results if r.get("regimes")])


# A regime's predicted verdict, in words that say it is one: "holds" beside a run that measured nothing read like a
# result (issue 41).
PREDICTED_VERDICT = {"holds": "would hold", "exceeds": "would exceed the claim", "falls_short": "would fall short"}
NOTHING_MEASURED = ("This run measured nothing for this claim (its verdict: not measurable here), so every figure and "
                    "word below is a prediction from amprepro.memory, or a committed measurement where a row says "
                    "measured. ")


def regimes_view(r: dict) -> dict:
    """A claim's regimes table (amprepro.analysis.regimes) as text cells: predictions, and measurements where a
    committed file has them."""
    rows = []
    for row in r["regimes"]["rows"]:
        p, m = row["predicted"], row["measured"]
        rows.append({"regime": row["regime"], "note": row["note"], "cells": f"{row['baseline']} → {row['variant']}",
                     "fp32": gib(p["baseline_peak_bytes"]), "amp": gib(p["variant_peak_bytes"]),
                     "saving": row["predicted_text"], "label": row["label"],
                     "verdict": PREDICTED_VERDICT.get(row.get("predicted_verdict"), ""),
                     "measured": (f"{gib(m['baseline_peak_bytes'])} → {gib(m['variant_peak_bytes'])}: "
                                  f"{row['measured_text']}") if m else row.get("measured_note", "not measured")})
    intro = (NOTHING_MEASURED if r.get("verdict") == "not_measurable" else "") + r["regimes"]["intro"]
    return {"id": r["id"], "intro": intro, "error": r["regimes"].get("measurement_error"),
            "rows": rows}


def measured_items(r: dict) -> list[dict]:
    """What a claim's "measured per baseline" cell lists, one item per line, each of a kind the template knows."""
    items = []
    if r["verdict"] == "not_measurable":
        items.append({"kind": "why", "text": r["reason"]})
    elif r["verdict"] in ("not_settled", "nothing_to_rescue") and not r.get("by_baseline"):  # its numbers: one text
        items.append({"kind": "why", "text": r["measured_text"] or r["reason"]})
    else:
        for baseline, b in r.get("by_baseline", {}).items():
            label = ENV.filters["precision_label"](baseline)  # an environment claim's "environment pairs" too
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


def verify_section(result: dict | None) -> str:
    """The reference check section; one line when there is nothing to compare (no reference for this machine)."""
    no_gpu = not (result or {}).get("machine", {}).get("gpu_count")
    if result is None or (result.get("status") == "no_reference" and no_gpu):  # a GPU without one: how to add it
        why = "not run" if result is None else f"nothing compared: {result.get('message', 'no reference')}"
        return section_html("Reference check", "", why)
    body = render("verify_intro.html.j2") + verify_html(result)
    figure = reportcharts.verify_chart(result)
    if figure is not None:
        body += figure_html(figure, "reference check chart: this run / reference per cell")
    return section_html("Reference check", body, "")


def ratio_check(check: dict) -> dict:
    """One metric of one cell: this run / the reference median, in bold when out of tolerance, and its band."""
    text = "n/a" if check.get("ratio") is None else f"{check['ratio']:.3f}×"
    return {"text": text, "bold": check["ok"] is False, "allowed": check["allowed"]}


# The results table as shown: related columns folded into one ("a / b"), so the table fits a 1400 px window with the
# reason visible. (shown column, the results_table columns in it); a folded column with no value in any row is left out.
RESULTS_FOLDED = [
    ("model", ["model"]), ("precision", ["precision"]), ("seed", ["seed"]), ("status", ["status"]),
    ("throughput", ["throughput", "unit"]), ("step ms median / p90", ["median step ms", "p90 step ms"]),
    ("peak memory", ["peak memory"]), ("× fp32 / × tf32", ["× fp32", "× tf32"]),
    ("final loss", ["final loss"]), ("eval acc", ["eval acc"]), ("skipped steps", ["skipped steps"]),
    ("TFLOP/s", ["TFLOP/s"]), ("MFU measured / datasheet peak", ["MFU measured peak", "MFU datasheet"]),
]
RESULTS_FOLDED_NUMERIC = {"seed", "throughput", "step ms median / p90", "× fp32 / × tf32", "final loss", "eval acc",
                          "skipped steps", "TFLOP/s", "MFU measured / datasheet peak"}
ALWAYS_SHOWN = {"model", "precision", "seed", "status"}


def fold(row: dict, parts: list[str]) -> str:
    """The values of one folded column: "a / b", a missing one as "—"; "" when none has a value."""
    # 0 is a value (seed 0 was blank on every row); None and NaN are not
    values = ["" if row.get(part) is None or pd.isna(row.get(part)) else str(row.get(part)) for part in parts]
    if not any(values):
        return ""
    if len(parts) == 2 and parts[1] == "unit":  # throughput and its unit
        return f"{values[0]} {values[1]}".strip()
    return " / ".join(value or "—" for value in values)


def results_html(summary: dict) -> str:
    """The results table; a skipped cell's reason spans the measurement columns instead of squeezing into one.
    Related columns are folded, and a column no cell filled is named once under the table instead of shown empty."""
    frame = results_table(summary)
    records = frame.to_dict("records")
    rows = [{"status": r["status"], "reason": r["reason"], **{shown: fold(r, parts) for shown, parts in RESULTS_FOLDED}}
            for r in records]
    columns = [shown for shown, _ in RESULTS_FOLDED if shown in ALWAYS_SHOWN or any(row[shown] for row in rows)]
    empty = [shown for shown, _ in RESULTS_FOLDED if shown not in columns]
    return render("results.html.j2", columns=columns, rows=rows, numeric=RESULTS_FOLDED_NUMERIC, empty=empty)


def section_html(title: str, body: str | None, empty: str, intro: str = "") -> str:
    """A report section: its heading, intro and body; or, with nothing to show (body None or ""), one line: the heading
    and why there is nothing, instead of an empty chart or table."""
    return render("section.html.j2", title=title, body=body or "", empty=empty, intro=intro)


def claims_chart_html(results: list[dict] | None, summary: dict) -> str:
    """The claims chart, or nothing when no claim has a measured value on this run (the banner says why)."""
    if not reportcharts.claim_points(results):
        return ""
    return figure_html(reportcharts.claims_chart(results, summary), "claims chart: measured against claimed")


def speedup_section(summary: dict) -> str:
    baselines = reportcharts.speedup_baselines(summary)
    body = (figure_html(reportcharts.speedup_chart(summary, only_measured=True), "speedup chart") if baselines
            else "")
    missing = [label for column, label in reportcharts.SPEEDUP_BASELINES if (column, label) not in baselines]
    intro = (f"No {' or '.join(missing)} baseline ran here, so there is no speedup against it (Results says why)."
             if body and missing else "")
    return section_html("Speedup against both baselines", body, "nothing to show on this run: no cell ran beside a "
                        "strict FP32 or TF32 baseline of the same model and seed", intro)


def loss_scale_section(summary: dict, runs_dir: str) -> str:
    body = (figure_html(reportcharts.loss_scale_chart(summary, runs_dir), "loss scale chart")
            if reportcharts.has_loss_scale(summary, runs_dir) else "")
    return section_html("Loss scale", body, "nothing to show on this run: no fp16 cell with a loss scaler ran "
                        "(fp16 with GradScaler needs a CUDA GPU)")


def breakdown_section(table: str, runs_dir: str | None = None) -> str:
    frame = breakdown_frame(table, runs_dir)
    body = breakdown_html(table, runs_dir) if not frame.empty else ""
    cells = pd.read_csv(table)
    on_gpu = "peak_allocated_bytes" in cells and cells["peak_allocated_bytes"].notna().any()
    why = ("no cell records how its peak memory splits" if on_gpu else
           "the split is of the GPU allocator's peak, and no cell of this run ran on a GPU")
    return section_html("Where the peak memory goes (7B)", body, f"nothing to show on this run: {why} (the paper "
                        "preset's 7B cells on a GPU record it)", intro=BREAKDOWN_INTRO)


BREAKDOWN_INTRO = (
    "For the cells that record it (the paper preset's 7B cells), the GPU allocator peak split into weights, gradients, "
    "optimizer state, FP32 master weights (apex O2) and activations with workspace, next to the estimate each cell "
    "made before allocating; and the epoch time per precision, derived from the measured tokens/s for the stated "
    "token count (not timed over an epoch).")


def breakdown_html(table: str, runs_dir: str | None = None) -> str:
    """The section for the cells that record a memory breakdown: why, a table per model, and the stacked bars."""
    frame = breakdown_frame(table, runs_dir)
    if frame.empty:
        return render("breakdown.html.j2", models=[])
    models = [{"name": model, "share": fixed_share_text(frame[frame["model"] == model]),
               **breakdown_table(frame[frame["model"] == model])} for model in dict.fromkeys(frame["model"])]
    return render("breakdown.html.j2", models=models, why=BREAKDOWN_WHY, alt="memory breakdown chart", caption="",
                  png=figurepool.embed(breakdown_chart(frame)))


def largest_batch_section(summary: dict) -> str:
    """Each searched model's largest batch per precision on this card (amprepro.train.batchsearch) and its ratio to
    strict FP32's, with how each search ended."""
    found = summary.get("largest_batch") or {}
    records = [r for r in found.get("records", []) if r.get("status") == "ok"]
    skipped = [r for r in found.get("records", []) if r.get("status") != "ok"]
    rows = []
    for model in dict.fromkeys(r["model"] for r in records):
        mine = {r["precision"]: r for r in records if r["model"] == model}
        fp32 = mine.get("fp32")
        for name in precisions.names():
            r = mine.get(name)
            if r is None:
                continue
            ratio = ratio_text(r, fp32) if fp32 else "—"
            rows.append({"Model": model, "Precision": precisions.get(name).label, "Planned batch": r["planned_batch"],
                         "Largest batch": r["largest_batch"], "vs strict FP32": ratio, "How it ended": r["why"],
                         "Tries": len(r["tries"]), "Trial seconds": f"{r['trial_seconds']:.1f}"})
    rows += [{"Model": r["model"], "Precision": precisions.get(r["precision"]).label, "Planned batch": "",
              "Largest batch": "", "vs strict FP32": "", "How it ended": f"not searched: {r['reason']}", "Tries": "",
              "Trial seconds": ""} for r in skipped]
    body = kv_html(pd.DataFrame(rows), classes="kv largest-batch") if rows else ""
    why = found.get("why_none") or "no search ran"
    return section_html("Largest batch per precision", body, f"nothing to show on this run: {why}",
                        intro=LARGEST_BATCH_INTRO if rows else "")


def _as_row(record: dict) -> dict:
    return {"model": record["model"], "precision": record["precision"],
            **claimmetrics.largest_batch_fields(record)}


def ratio_text(record: dict, fp32: dict) -> str:
    """A precision's largest batch over strict FP32's: '1.60×', or the interval two searches cut short leave
    ('1.41× to 1.63×', '≥ 1.41×'), or '—' where they leave it unbounded."""
    low, high, _ = claimmetrics.batch_ratio(_as_row(record), _as_row(fp32))
    if low is None or (low == 0 and high == float("inf")):
        return "—"
    if low == high:
        return f"{low:.2f}×"
    return f"≥ {low:.2f}×" if high == float("inf") else f"{low:.2f}× to {high:.2f}×"


LARGEST_BATCH_INTRO = (
    "\"With AMP you can use a bigger batch\": for each model of runs.largest_batch, the largest batch each precision "
    "fits on this card (under gpu_memory_limit_gib where set), found with two training steps per try on the planned "
    "batch's grid, up to a cap, within a time budget. \"exact\": the next batch on the grid did not fit; \"capped\": "
    "it fits at the cap, so the ratio is a lower bound; \"at_least\": the time ran out first, and the ratio is the "
    "interval the two searches leave (from the largest batch that fitted to one step under the smallest that failed).")


def sanity_html(sanity: dict) -> str:
    checks = [{**check, "required": "yes" if check.get("required") else "no"} for check in sanity["checks"]]
    return render("sanity.html.j2", checks=checks)


def kv_html(frame: pd.DataFrame, classes: str = "kv") -> str:
    """A two-column table (item, value) through pandas' Styler: escaped, no index, the report's classes."""
    styler = frame.style.hide(axis="index").format(escape="html", na_rep="")
    styler = styler.set_table_attributes(f'class="{classes}"').set_uuid(classes.replace(" ", "-"))
    return render("table_wrap.html.j2", table=styler.to_html())

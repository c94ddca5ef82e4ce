"""The report's HTML: every table and section the notebook shows, from the data amprepro.reportlib shapes."""

from __future__ import annotations

import base64
import html

import pandas as pd

from amprepro import claims as claims_mod
from amprepro import verify as verify_mod
from amprepro.reportcharts import breakdown_chart, png_bytes
from amprepro.reportlib import (
    BREAKDOWN_WHY,
    ESTIMATE_COLUMN,
    MEMORY_PARTS,
    breakdown_frame,
    breakdown_reason,
    epoch_cell,
    epoch_header,
    fixed_share_text,
    gib,
    hardware,
    parts_here,
    results_table,
    shorten,
)

esc = html.escape


def figure_html(fig, alt: str, caption: str = "") -> str:
    """The figure as an embedded PNG (base64): the HTML report opens offline with every chart inside it."""
    data = base64.b64encode(png_bytes(fig)).decode("ascii")
    img = f'<img class="chart" alt="{esc(alt)}" src="data:image/png;base64,{data}"/>'
    return f"<figure>{img}<figcaption>{esc(caption)}</figcaption></figure>" if caption else img


def badge(kind: str, text: str) -> str:
    return f'<span class="badge {esc(kind)}">{esc(text)}</span>'


def verdict_badge(result: dict) -> str:
    return badge(f"v-{result['verdict']}", result["verdict_text"])


VERIFY_LABEL = {"pass": "PASS", "fail": "FAIL", "no_reference": "NO REFERENCE", "not_comparable": "NOT COMPARABLE"}


def verify_badge(result: dict | None) -> str:
    if result is None:
        return badge("s-no_reference", "NOT RUN")
    return badge(f"s-{result['status']}", VERIFY_LABEL[result["status"]])


def _cls(name: str) -> str:
    return f' class="{esc(name)}"' if name else ""


def html_table(rows: list[dict], columns: list[tuple[str, str]], classes: str = "", row_class=None,
               raw: set[str] = frozenset(), numeric: set[str] = frozenset()) -> str:
    """rows -> <table>. columns: (key, header). Values are escaped unless the key is in raw."""
    head = "".join(f'<th{_cls("num" if key in numeric else "")}>{esc(title)}</th>' for key, title in columns)
    body = []
    for row in rows:
        cls = row_class(row) if row_class else ""
        tds = []
        for key, _ in columns:
            value = row.get(key, "")
            value = "" if value is None else value
            text = str(value) if key in raw else esc(str(value))
            css = "num" if key in numeric else ("reason" if key in ("reason", "note", "detail") else "")
            tds.append(f'<td{_cls(css)}>{text}</td>')
        body.append(f'<tr{_cls(cls)}>{"".join(tds)}</tr>')
    return (f'<div class="table-wrap"><table class="{esc(classes)}"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table></div>')


def glance_html(data: dict, title: str = "") -> str:
    """Verdicts, reference check and hardware: what a reader needs before scrolling."""
    summary, env, sanity, apex = data["summary"], data["environment"], data["sanity"], data["apex"]
    versions, counts, preset = summary["versions"], summary["counts"], summary["preset"]
    isolation = env.get("isolation", {})
    verify = data.get("verify")
    parts = [f"<h1>{esc(title)}</h1>" if title else ""]
    if not isolation.get("isolated", True):
        parts.append(f"<p class='warn'><b>{esc(isolation.get('message', 'NOT ISOLATED'))}</b></p>")
    cards = [
        ("Hardware", esc(hardware(summary))
         + f"<br><span class='small'>torch {esc(str(versions.get('torch')))}, Python {esc(str(versions.get('python')))}"
         + f", apex {esc(str(apex.get('status')))}"
         + (f" ({esc(str(versions.get('apex_commit'))[:12])})" if versions.get("apex_commit") else "") + "</span>", ""),
        ("Run", f"{esc(preset.get('preset', '?'))} preset<br><span class='small'>{esc(preset.get('reason', ''))}</span>"
         f"<br>{counts.get('ok', 0)} cells ran, {counts.get('skipped', 0)} skipped, {counts.get('collapsed', 0)} "
         f"collapsed" + (f", <b>{counts['failed']} failed</b> (reasons in the results table)" if counts.get("failed")
                         else "") + f" of {len(summary['cells'])}; sanity {sanity.get('passed', 0)} passed, "
         f"{sanity.get('failed', 0)} failed, {sanity.get('skipped', 0)} skipped", ""),
    ]
    if verify is not None:
        kind = "fail" if verify["status"] == "fail" else "pass" if verify["status"] == "pass" else ""
        failures = verify.get("failures", [])
        detail = esc(verify["message"])
        if failures:
            detail += "<br><span class='small'>" + "<br>".join(esc(f) for f in failures[:4]) + (
                f"<br>… and {len(failures) - 4} more" if len(failures) > 4 else "") + "</span>"
        detail += stack_note_html(verify)
        cards.append(("Reference check (make verify)", f"{verify_badge(verify)} {detail}", kind))
    parts.append('<div class="cards">' + "".join(
        f'<div class="card {kind}"><b class="label">{esc(label)}</b>{body}</div>' for label, body, kind in cards)
        + "</div>")
    if data.get("claims") is not None:
        c = claims_mod.counts(data["claims"])
        parts.append(f"<b>Claims:</b> {len(data['claims'])} evaluated: {c['holds']} hold, {c['exceeds']} exceed the "
                     f"claim (better than claimed), {c['falls_short']} fall short, {c['depends_on_baseline']} depend "
                     f"on the baseline, {c['not_measurable']} not measurable here.")
        parts.append(claims_glance_table(data["claims"]))
    return '<section class="glance">' + "".join(parts) + "</section>"


def claims_glance_table(results: list[dict]) -> str:
    rows = []
    for r in results:
        detail = shorten(r["measured_text"] if r["verdict"] != "not_measurable" else r["reason"])
        if r.get("caveats"):
            detail += f" ({len(r['caveats'])} caveats: see Claims)"
        rows.append({"claim": f"<b>{esc(r['id'])}</b><br>{esc(r['statement'])}", "verdict": verdict_badge(r),
                     "claimed": esc(r["claimed_text"]), "detail": esc(detail)})
    return html_table(rows, [("claim", "claim"), ("verdict", "verdict on this run"), ("claimed", "claimed"),
                             ("detail", "measured (median, min–max over seeds) or why not")],
                      classes="claims-glance", raw={"claim", "verdict", "claimed", "detail"})


def claims_detail_html(results: list[dict]) -> str:
    rows = []
    for r in results:
        src = r["source"]
        source = (f"{esc(src['title'])}<br><span class='small'>{esc(src['file'])}</span>"
                  + (f"<blockquote class='quote'>{esc(src['quote'])}</blockquote>" if src.get("quote") else ""))
        tested = (f"{esc(r['model'])} → {esc(', '.join(r['matched_models']) or '/'.join(r['models']))}<br>"
                  f"{esc(claims_mod.PRECISION_LABEL[r['variant']])} vs "
                  + esc(" and ".join(claims_mod.PRECISION_LABEL[b] for b in r["baselines"]))
                  + f"<br><span class='small'>{esc(r['metric'])}</span>")
        per = []
        if r["verdict"] == "not_measurable":
            per.append(f"<span class='why'>{esc(r['reason'])}</span>")
        else:
            for baseline, b in r.get("by_baseline", {}).items():
                label = esc(claims_mod.PRECISION_LABEL[baseline])
                if b["verdict"] == "not_measurable":
                    per.append(f"vs {label}: {badge('v-not_measurable', 'not measurable')} "
                               f"<span class='why'>{esc(b['reason'])}</span>")
                    continue
                for model, m in b["models"].items():
                    per.append(f"vs {label}, {esc(model)}: {esc(m.get('measured_text') or '—')} "
                               f"{badge('v-' + m['verdict'], claims_mod.VERDICT_TEXT[m['verdict']])}"
                               + (f" <span class='why'>{esc(m['reason'])}</span>"
                                  if m["verdict"] == "not_measurable" or m.get("borderline") else ""))
        if r.get("proxy"):
            p = r["proxy"]
            outcome = (f"{p['measured_text']} (at that scale: {p['verdict_text']})" if p["verdict"] != "not_measurable"
                       else p["reason"])
            per.append(f"<span class='small'><b>Shape check on {esc(', '.join(p['models']))} (context, not a verdict):"
                       f"</b> {esc(outcome)}. {esc(p['note'])}</span>")
        if r.get("note"):
            per.append(f"<span class='small'>Note: {esc(r['note'])}</span>")
        if r.get("caveats"):
            per.append("<span class='small'><b>Caveats:</b></span><ul class='caveats small'>"
                       + "".join(f"<li>{esc(c)}</li>" for c in r["caveats"]) + "</ul>")
        rows.append({"claim": f"<b>{esc(r['id'])}</b><br>{esc(r['statement'])}", "source": source, "tested": tested,
                     "claimed": esc(r["claimed_text"]) + f"<br><span class='small'>tolerance {r['tolerance']:g}</span>",
                     "verdict": verdict_badge(r), "measured": "<br>".join(per)})
    return html_table(rows, [("claim", "claim"), ("source", "article"), ("tested", "model → cells; variant vs baseline"),
                             ("claimed", "claimed"), ("verdict", "verdict"), ("measured", "measured per baseline")],
                      classes="claims-detail", raw={"claim", "source", "tested", "claimed", "verdict", "measured"})


def stack_note_html(result: dict) -> str:
    """Where this run's software or machine is not the reference's: said before any verdict is read as final."""
    differences = (result.get("stack") or {}).get("differences") or []
    if not differences:
        return ""
    return ("<br><span class='warn'><b>Not the reference's stack:</b> "
            + "; ".join(esc(d["text"]) for d in differences) + "</span>")


def _reference_runs_html(reference: dict) -> str:
    runs = reference.get("runs") or {}
    items = "".join(
        f"<li><code>{esc(run_id)}</code>: {esc(str(run.get('created_utc')))}, machine "
        f"{esc(str((run.get('machine') or {}).get('id')))} ({esc(str((run.get('machine') or {}).get('gpu_count')))} "
        f"GPUs), torch {esc(str(run['stack'].get('torch')))}, CUDA {esc(str(run['stack'].get('cuda')))}, driver "
        f"{esc(str(run['stack'].get('driver')))}; per-step data {'kept' if run.get('steps_kept') else 'not kept'}</li>"
        for run_id, run in runs.items())
    return (f"<p class='small'>Reference: <code>{esc(reference['path'])}</code>, the median of "
            f"{reference['n_runs']} run(s) on {reference['n_machines']} machine(s); each band is max(floor, k × the "
            "runs' observed range) around that median"
            + (" (one run: every band is its floor)" if reference["n_runs"] == 1 else "") + ":</p>"
            + f"<ul class='small'>{items}</ul>")


VERDICT_BADGE = {"pass": "s-pass", "fail": "s-fail"}


def verify_html(result: dict | None) -> str:
    if result is None:
        return "<p>The reference check did not run.</p>"
    machine = result.get("machine") or {}
    parts = [f"<p>{verify_badge(result)} {esc(result['message'])}.{stack_note_html(result)}</p>",
             f"<p class='small'>This machine: {esc(str(machine.get('gpu_count')))} GPU(s) "
             f"({esc(str(machine.get('source')))}).</p>"]
    if result["status"] == "no_reference":
        parts.append("<p class='small'>Reference results are kept per GPU model under <code>reference/&lt;gpu-slug&gt;/"
                     "</code>; <code>make verify</code> exits 0 with this warning. To add a run from this GPU: "
                     "<code>PYTHONPATH=workflow python -m amprepro.verify promote results --note '...'</code>, then "
                     "review and commit it (reference/README.md).</p>")
    if result.get("failures"):
        parts.append("<p><b>Out of tolerance:</b></p><ul>" + "".join(f"<li>{esc(f)}</li>" for f in result["failures"])
                     + "</ul>")
    for warning in result.get("warnings", []):
        parts.append(f"<p class='warn'>{esc(warning)}</p>")
    if result.get("reference"):
        parts.append(_reference_runs_html(result["reference"])
                     + f"<p class='small'>Band rules from {esc(', '.join(result['tolerances'].get('sources', [])))}."
                       "</p>")
    rows = []
    for cell in result.get("cells", []):
        row = {"cell": cell["cell"], "verdict": badge(VERDICT_BADGE.get(cell["verdict"], "s-no_reference"),
                                                      cell["verdict"].replace("_", " ")),
               "status": f"{cell['status_here'] or '—'} / {cell['status_reference'] or '—'}",
               "runs": cell.get("reference_runs", ""), "note": cell["note"]}
        for check in cell["checks"]:
            text = "n/a" if check.get("ratio") is None else f"{check['ratio']:.3f}×"
            if check["ok"] is False:
                text = f"<b>{text}</b>"
            row[check["metric"]] = text + (f"<br><span class='small'>{esc(check['allowed'])}</span>"
                                           if check["allowed"] else "")
        rows.append(row)
    if rows:
        metrics = list(dict.fromkeys(ch["metric"] for c in result["cells"] for ch in c["checks"]))
        columns = [("cell", "cell"), ("verdict", "verdict"), ("status", "status here / reference"),
                   ("runs", "reference runs")]
        columns += [(m, f"{verify_mod.METRIC_LABEL.get(m, m)}: this run / reference median") for m in metrics]
        columns += [("note", "note")]
        parts.append(html_table(rows, columns, classes="verify", raw={"verdict", *metrics},
                                numeric=set(metrics), row_class=lambda r: "row-fail" if "s-fail" in r["verdict"] else ""))
    return "".join(parts)


def results_html(summary: dict) -> str:
    """The results table; a skipped cell's reason spans the measurement columns instead of squeezing into one."""
    frame = results_table(summary)
    numeric = {"seed", "throughput", "median step ms", "p90 step ms", "× fp32", "× tf32", "final loss", "eval acc",
               "skipped steps", "TFLOP/s", "MFU measured peak", "MFU datasheet"}
    columns = [c for c in frame.columns if c != "reason"]
    measured = columns[4:]
    head = "".join(f'<th{_cls("num" if c in numeric else "")}>{esc(c)}</th>' for c in columns + ["reason"])
    body = []
    for row in frame.to_dict("records"):
        first = "".join(f'<td{_cls("num" if c in numeric else "")}>{esc(str(row[c]))}</td>' for c in columns[:4])
        if row["status"] == "skipped":
            rest = f'<td class="why" colspan="{len(measured) + 1}">{esc(row["reason"])}</td>'
        else:
            rest = "".join(f'<td{_cls("num" if c in numeric else "")}>{esc(str(row[c]))}</td>' for c in measured)
            rest += f'<td class="reason">{esc(row["reason"])}</td>'
        body.append(f'<tr class="status-{esc(row["status"])}">{first}{rest}</tr>')
    return (f'<div class="table-wrap"><table class="results"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table></div>')


def breakdown_table_html(sub: pd.DataFrame) -> str:
    parts = parts_here(sub)
    epoch_title, shared = epoch_header(sub)
    columns = [("precision", "precision"), ("seed", "seed"), ("status", "status"),
               ("peak", "allocator peak (GiB)")] + [(c, f"{MEMORY_PARTS[c]} (GiB)") for c in parts]
    if ESTIMATE_COLUMN in sub:
        columns.append(("estimate", "estimate before the run (GiB)"))
    columns += [("throughput", "throughput"), ("epoch", epoch_title), ("reason", "reason")]
    rows = []
    for _, row in sub.iterrows():
        unit = row["throughput_unit"] if isinstance(row.get("throughput_unit"), str) else ""
        rows.append({"precision": str(row["precision"]), "seed": int(row["seed"]), "status": row["status"],
                     "peak": gib(row.get("peak_allocated_bytes")), **{c: gib(row[c]) for c in parts},
                     "estimate": gib(row.get(ESTIMATE_COLUMN)),
                     "throughput": (f"{row['throughput_per_s']:,.0f} {unit}".strip()
                                    if pd.notna(row.get("throughput_per_s")) else ""),
                     "epoch": epoch_cell(row, shared), "reason": breakdown_reason(row)})
    numeric = {"seed", "peak", "estimate", "throughput", "epoch", *parts}
    return html_table(rows, columns, classes="breakdown", numeric=numeric,
                      row_class=lambda r: f"status-{r['status']}")


def breakdown_html(table: str, runs_dir: str | None = None) -> str:
    """The section for the cells that record a memory breakdown: why, a table per model, and the stacked bars."""
    frame = breakdown_frame(table, runs_dir)
    if frame.empty:
        return ("<p>No cell of this run records how its peak memory splits into weights, gradients, optimizer state "
                "and activations (the paper preset's 7B cells do).</p>")
    parts = [f"<p>{esc(BREAKDOWN_WHY)}</p>"]
    for model in dict.fromkeys(frame["model"]):
        sub = frame[frame["model"] == model]
        parts.append(f"<h3>{esc(model)}</h3>")
        share = fixed_share_text(sub)
        if share:
            parts.append(f"<p>{esc(share)}</p>")
        parts.append(breakdown_table_html(sub))
    parts.append(figure_html(breakdown_chart(frame), "memory breakdown chart"))
    return "".join(parts)


def sanity_html(sanity: dict) -> str:
    rows = [{**c, "status": badge({"pass": "s-pass", "fail": "s-fail"}.get(c["status"], "s-no_reference"), c["status"])}
            for c in sanity["checks"]]
    return html_table(rows, [("name", "check"), ("status", "status"), ("required", "required"), ("detail", "detail"),
                             ("fix", "fix")], classes="sanity", raw={"status"})


def kv_html(frame: pd.DataFrame, classes: str = "kv") -> str:
    return html_table(frame.to_dict("records"), [(c, c) for c in frame.columns], classes=classes)

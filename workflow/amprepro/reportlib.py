"""Tables and charts for notebooks/report.ipynb. The notebook only calls these, so they are tested like code.

Every chart is a titled matplotlib figure with units and min-max error bars over seeds, embedded as a base64 PNG;
every table is HTML with classes the report's CSS (workflow/report/nbconvert/amprepro/static/report.css) styles.
"""

from __future__ import annotations

import base64
import datetime as _dt
import hashlib
import html
import io
import subprocess
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from amprepro import claims as claims_mod
from amprepro import precisions
from amprepro import summary as summary_columns
from amprepro import verify as verify_mod
from amprepro.files import read_json

VERDICT_COLOR = {"holds": "#1a7f37", "exceeds": "#175cd3", "falls_short": "#b42318"}  # as the badges in report.css
GIB = 2**30
esc = html.escape

plt.rcParams.update({"figure.dpi": 100, "axes.grid": True, "grid.alpha": 0.3, "axes.axisbelow": True,
                     "axes.spines.top": False, "axes.spines.right": False, "font.size": 9, "axes.titlesize": 10})


# ----------------------------------------------------------------------------------------------------------------------
# Inputs


def load(summary: str, environment: str, sanity: str, apex: str, claims: str | None = None,
         reference_dir: str | None = None, runs_dir: str | None = None) -> dict:
    """Everything the report shows; the claims and the reference check are evaluated here, from the same inputs."""
    data = {"summary": read_json(summary), "environment": read_json(environment), "sanity": read_json(sanity),
            "apex": read_json(apex), "runs_dir": runs_dir, "claims_path": claims, "reference_dir": reference_dir}
    data["claims"] = None
    if claims:
        data["claims"] = claims_mod.evaluate_run(claims, data["summary"], data["sanity"], runs_dir)
    data["verify"] = verify_mod.verify(data["summary"], reference_dir, runs_dir) if reference_dir else None
    return data


def cells_frame(summary: dict) -> pd.DataFrame:
    """Every summary column, also those no cell filled (a run where every cell was skipped has no measurements)."""
    frame = pd.DataFrame(summary["cells"])
    for column in (*summary_columns.COLUMNS, "throughput_unit", "peak_allocated_bytes", "peak_rss_bytes",
                   "first_nonfinite_step", "skipped_steps", "reason"):
        if column not in frame:
            frame[column] = None
    frame["precision"] = pd.Categorical(frame["precision"], precisions.names(), ordered=True)
    return frame.sort_values(["model", "precision", "seed"]).reset_index(drop=True)


def _ok(summary: dict) -> pd.DataFrame:
    frame = cells_frame(summary)
    return frame[frame["status"] == "ok"].copy()


def _hardware(summary: dict) -> str:
    v = summary.get("versions", {})
    if v.get("gpu"):
        count = f" ×{v['gpu_count']}" if (v.get("gpu_count") or 1) > 1 else ""
        return f"{v['gpu']}{count}, driver {v.get('driver') or 'n/a'}, CUDA {v.get('cuda') or 'n/a'}"
    return f"CPU only ({v.get('cpu') or 'unknown CPU'}): no CUDA GPU"


# ----------------------------------------------------------------------------------------------------------------------
# HTML helpers


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


def figure_html(fig, alt: str, caption: str = "") -> str:
    """The figure as an embedded PNG (base64): the HTML report opens offline with every chart inside it."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    img = f'<img class="chart" alt="{esc(alt)}" src="data:image/png;base64,{data}"/>'
    return f"<figure>{img}<figcaption>{esc(caption)}</figcaption></figure>" if caption else img


# ----------------------------------------------------------------------------------------------------------------------
# The one-screen summary


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
        ("Hardware", esc(_hardware(summary))
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


def shorten(text: str, limit: int = 150) -> str:
    """One screen: long reasons are cut at a word boundary (the Claims section has them in full)."""
    if len(text) <= limit:
        return text
    return text[:limit].rsplit(" ", 1)[0].rstrip(",;:(") + " …"


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


# ----------------------------------------------------------------------------------------------------------------------
# Claims in detail


def claims_detail_html(results: list[dict]) -> str:
    rows = []
    for r in results:
        src = r["source"]
        source = (f"{esc(src['title'])}<br><span class='small'>{esc(src['file'])}</span>"
                  + (f"<blockquote class='quote'>{esc(src['quote'])}</blockquote>" if src.get("quote") else ""))
        tested = (f"{esc(r['model'])} → {esc(', '.join(r['matched_models']) or '/'.join(r['models']))}<br>"
                  f"{esc(precisions.label(r['variant']))} vs "
                  + esc(" and ".join(precisions.label(b) for b in r["baselines"]))
                  + f"<br><span class='small'>{esc(r['metric'])}</span>")
        per = []
        if r["verdict"] == "not_measurable":
            per.append(f"<span class='why'>{esc(r['reason'])}</span>")
        else:
            for baseline, b in r.get("by_baseline", {}).items():
                label = esc(precisions.label(baseline))
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


def claims_chart(results: list[dict], summary: dict):
    """Measured (median, min-max bar over seeds) against the claimed band, per claim, baseline and model."""
    points = []
    for r in results:
        for baseline, b in r.get("by_baseline", {}).items():
            for model, m in b["models"].items():
                if m.get("median") is not None:
                    points.append((r, baseline, model, m))
    metrics = [mt for mt in ("speedup", "memory_reduction", "accuracy_delta") if any(p[0]["metric"] == mt for p in points)]
    if not metrics:
        fig, ax = plt.subplots(figsize=(9, 1.8))
        ax.axis("off")
        ax.text(0.5, 0.55, f"No claim is measurable on this run ({claims_mod.run_context(summary)}).",
                ha="center", va="center", fontsize=11)
        ax.text(0.5, 0.2, "Each claim's reason is in the table above.", ha="center", va="center", color="#5b6472")
        ax.set_title("Claims: measured against claimed")
        return fig
    unit = {"speedup": ("speedup over the baseline (×)", 1.0), "memory_reduction": ("peak memory reduction (%)", 100.0),
            "accuracy_delta": ("accuracy change (percentage points)", 100.0)}
    heights = [max(1.6, 0.42 * sum(p[0]["metric"] == mt for p in points) + 1.0) for mt in metrics]
    fig, axes = plt.subplots(len(metrics), 1, figsize=(9.5, sum(heights)), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    for ax, metric in zip(axes[:, 0], metrics):
        label, scale = unit[metric]
        rows = [p for p in points if p[0]["metric"] == metric]
        for y, (r, baseline, model, m) in enumerate(rows):
            low, high = claims_mod.claimed_band(r)
            finite_low = low if low != float("-inf") else min(m["min"], high) - abs(high) * 0.25 - 0.05
            finite_high = high if high != float("inf") else max(m["max"], low) + abs(low) * 0.25 + 0.05
            ax.barh(y, (finite_high - finite_low) * scale, left=finite_low * scale, height=0.6, color="#b7dfc2",
                    alpha=0.7, label="claimed (with tolerance)" if y == 0 else None)
            color = VERDICT_COLOR.get(m["verdict"], "#475467")
            ax.errorbar(m["median"] * scale, y, xerr=[[(m["median"] - m["min"]) * scale], [(m["max"] - m["median"]) * scale]],
                        fmt="o", color=color, capsize=4, label="measured: median, min–max over seeds" if y == 0 else None)
            ax.annotate(claims_mod.fmt_value(metric, m["median"]), (m["median"] * scale, y), textcoords="offset points",
                        xytext=(6, 5), fontsize=8, color=color)
        ax.set_yticks(range(len(rows)), [f"{r['id']}\n{model} vs {precisions.label(b)}" for r, b, model, _ in rows],
                      fontsize=7.5)
        ax.invert_yaxis()
        better = "right" if claims_mod.HIGHER_IS_BETTER[metric] else "left"
        ax.set_xlabel(f"{label}; {better} of the band = better than claimed (blue: exceeds, red: falls short)")
        ax.set_title(f"Claims ({metric.replace('_', ' ')}): measured against the claimed band")
        ax.legend(fontsize=7.5, loc="lower right")
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------------------------------------------------
# Reference check


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


def verify_chart(result: dict | None):
    """Ratio of this run to the reference median per cell and metric, with each cell's band; None without one."""
    if not result or not any(c["checks"] for c in result.get("cells", [])):
        return None
    metrics = list(dict.fromkeys(ch["metric"] for c in result["cells"] for ch in c["checks"]
                                 if ch.get("ratio") is not None))
    if not metrics:
        return None
    fig, axes = plt.subplots(len(metrics), 1, figsize=(10, 2.6 * len(metrics)), squeeze=False)
    for ax, metric in zip(axes[:, 0], metrics):
        xs, ys, colors, labels, bands = [], [], [], [], []
        for c in result["cells"]:
            for ch in c["checks"]:
                if ch["metric"] == metric and ch.get("ratio") is not None:
                    xs.append(len(xs))
                    ys.append(ch["ratio"])
                    colors.append("#b42318" if ch["ok"] is False else "#1a7f37")
                    labels.append(c["cell"].replace("/seed", "/s"))
                    bands.append(ch.get("band_ratio"))
        for x, band in zip(xs, bands):
            if band:
                ax.bar(x, band[1] - band[0], bottom=band[0], width=0.8, color="#e6f4ea", edgecolor="none",
                       label="tolerance band" if x == 0 else None)
        ax.scatter(xs, ys, c=colors, zorder=3, s=22, label="this run / reference median")
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xticks(xs, labels, rotation=70, ha="right", fontsize=6.5)
        ax.set_ylabel("ratio (×)")
        ax.set_title(f"{verify_mod.METRIC_LABEL.get(metric, metric)}: this run / reference median, per cell "
                     "(red = out of tolerance)")
        ax.legend(fontsize=7.5, loc="best")
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------------------------------------------------
# Results table and charts


def _fmt_num(v, spec: str) -> str:
    return format(v, spec) if pd.notna(v) else ""


def memory_label(row) -> str:
    if pd.notna(row.get("peak_allocated_bytes")):
        return f"{row['peak_allocated_bytes'] / GIB:.2f} GiB (allocator)"
    if pd.notna(row.get("peak_rss_bytes")):
        return f"{row['peak_rss_bytes'] / GIB:.2f} GiB (process RSS)"
    return ""


# p90 this far above the median: the steps did not all run at one speed (other work on the host or the GPU, clocks,
# a launch-bound model), so the throughput of that cell is less certain than the others'.
SPREAD_NOTE_ABOVE = 0.10


def timing_note(row) -> str:
    median, p90 = row.get("step_time_median_s"), row.get("step_time_p90_s")
    if row.get("status") != "ok" or not (pd.notna(median) and pd.notna(p90)) or median <= 0:
        return ""
    spread = p90 / median - 1
    if spread <= SPREAD_NOTE_ABOVE:
        return ""
    return f"uneven step times: p90 is {spread:.0%} above the median, so this throughput is less certain"


def results_table(summary: dict) -> pd.DataFrame:
    frame = cells_frame(summary)
    reasons = ["; ".join(part for part in (row["reason"] if isinstance(row["reason"], str) else "", timing_note(row))
                         if part) for _, row in frame.iterrows()]
    return pd.DataFrame({
        "model": frame["model"], "precision": frame["precision"].astype(str), "seed": frame["seed"],
        "status": frame["status"],
        "throughput": frame["throughput_per_s"].map(lambda v: _fmt_num(v, ",.1f")),
        "unit": frame["throughput_unit"].fillna(""),
        "median step ms": (frame["step_time_median_s"] * 1000).map(lambda v: _fmt_num(v, ".2f")),
        "p90 step ms": (frame["step_time_p90_s"] * 1000).map(lambda v: _fmt_num(v, ".2f")),
        "peak memory": [memory_label(row) for _, row in frame.iterrows()],
        "× fp32": frame["speedup_vs_fp32"].map(lambda v: _fmt_num(v, ".2f")),
        "× tf32": frame["speedup_vs_tf32"].map(lambda v: _fmt_num(v, ".2f")),
        "final loss": frame["final_loss"].map(lambda v: _fmt_num(v, ".4f")),
        "eval acc": frame["eval_accuracy"].map(lambda v: _fmt_num(v, ".3f")),
        "skipped steps": frame["skipped_steps"].map(lambda v: "" if pd.isna(v) else str(int(v))),
        "TFLOP/s": _column(frame, "achieved_tflops").map(lambda v: _fmt_num(v, ".1f")),
        "MFU measured peak": _column(frame, "mfu_vs_measured_peak").map(lambda v: _fmt_num(v, ".1%")),
        "MFU datasheet": _column(frame, "mfu_vs_datasheet").map(lambda v: _fmt_num(v, ".1%")),
        "reason": reasons,
    })


def _column(frame: pd.DataFrame, name: str) -> pd.Series:
    """A summary column, or an empty one for summaries written before it existed (older fixtures, references)."""
    return frame[name] if name in frame else pd.Series([None] * len(frame), index=frame.index, dtype=float)


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


def _per_model_axes(models: list[str], height: float = 3.2):
    n = max(len(models), 1)
    fig, axes = plt.subplots(1, n, figsize=(max(4.2 * n, 7), height), squeeze=False)
    return fig, list(axes[0])


def _bars(ax, sub: pd.DataFrame, column: str, scale: float = 1.0, fmt: str = "{:.0f}"):
    """Bars of the median over seeds per precision, error bars spanning min to max over seeds, value on top."""
    stats = sub.groupby("precision", observed=True)[column].agg(["median", "min", "max", "count"]).reset_index()
    stats = stats[stats["count"] > 0]
    xs = list(range(len(stats)))
    med = stats["median"] / scale
    err = [(stats["median"] - stats["min"]) / scale, (stats["max"] - stats["median"]) / scale]
    colors = [precisions.color(str(p), "#888") for p in stats["precision"]]
    ax.bar(xs, med, yerr=err, capsize=4, color=colors, error_kw={"elinewidth": 1})
    for x, value in zip(xs, med):
        ax.annotate(fmt.format(value), (x, value), textcoords="offset points", xytext=(0, 3), ha="center", fontsize=7.5)
    ax.set_xticks(xs, [str(p) for p in stats["precision"]], rotation=20)
    ax.margins(y=0.15)


def _skipped_note(summary: dict, model: str) -> str:
    frame = cells_frame(summary)
    gone = frame[(frame["model"] == model) & (frame["status"] != "ok")]
    parts = []
    for status in ("skipped", "collapsed", "failed"):
        names = list(dict.fromkeys(gone[gone["status"] == status]["precision"].astype(str)))
        if names:
            parts.append(f"{status}: {', '.join(names)}")
    return "; ".join(parts)


def _no_data(ax, text: str):
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#5b6472")
    ax.set_xticks([])
    ax.set_yticks([])


def throughput_chart(summary: dict):
    frame = _ok(summary)
    models = list(dict.fromkeys(frame["model"]))
    fig, axes = _per_model_axes(models)
    if not models:
        _no_data(axes[0], "no cell ran")
        axes[0].set_title("Training throughput")
    for ax, model in zip(axes, models):
        sub = frame[frame["model"] == model]
        _bars(ax, sub, "throughput_per_s", fmt="{:,.0f}")
        unit = sub["throughput_unit"].dropna().iloc[0] if sub["throughput_unit"].notna().any() else "items/s"
        ax.set_ylabel(f"throughput ({unit})")
        ax.set_title(f"{model}: training throughput")
        note = _skipped_note(summary, model)
        if note:
            ax.set_xlabel(note, fontsize=7, color="#5b6472")
    fig.suptitle("Throughput: median over seeds; error bars span min–max over seeds (higher is better)", fontsize=10)
    fig.tight_layout()
    return fig


def memory_chart(summary: dict):
    frame = _ok(summary)
    on_gpu = bool(frame["peak_allocated_bytes"].notna().any()) if not frame.empty else False
    column = "peak_allocated_bytes" if on_gpu else "peak_rss_bytes"
    models = list(dict.fromkeys(frame["model"]))
    fig, axes = _per_model_axes(models)
    if not models:
        _no_data(axes[0], "no cell ran")
        axes[0].set_title("Peak memory")
    for ax, model in zip(axes, models):
        sub = frame[(frame["model"] == model) & frame[column].notna()]
        if sub.empty:
            _no_data(ax, "no memory recorded")
        else:
            _bars(ax, sub, column, scale=GIB, fmt="{:.2f}")
        ax.set_ylabel("peak GPU allocator memory (GiB)" if on_gpu else "peak process RSS (GiB)")
        ax.set_title(f"{model}: peak memory")
    what = "GPU allocator peak (max_memory_allocated)" if on_gpu else "process peak RSS (CPU: no allocator statistics)"
    fig.suptitle(f"Peak memory: {what}; lower is better; error bars span min–max over seeds", fontsize=10)
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------------------------------------------------
# Where the allocator peak goes (the 7B cells), and their derived epoch time

# summary.csv columns of a cell that records how its allocator peak splits (the 7B cells do), in stacking order.
MEMORY_PARTS = {"mem_weights_bytes": "weights", "mem_gradients_bytes": "gradients",
                "mem_optimizer_state_bytes": "optimizer state", "mem_master_weights_bytes": "FP32 master weights",
                "mem_activations_bytes": "activations and workspace"}
PART_COLOR = {"mem_weights_bytes": "#30638e", "mem_gradients_bytes": "#00798c",
              "mem_optimizer_state_bytes": "#8f9bb3", "mem_master_weights_bytes": "#5b3fa6",
              "mem_activations_bytes": "#edae49"}
ESTIMATE_COLUMN = "mem_estimate_total_bytes"
EPOCH_COLUMN = "epoch_hours_derived"
BREAKDOWN_WHY = (
    "With FP32 master weights, the weights (4 bytes per parameter), gradients (4) and AdamW's two moments (8) stay "
    "FP32 in every precision, 16 bytes per parameter, while AMP changes only the activations and workspace "
    "(lower-precision activations, and the low-precision copies of the weights it casts), which activation "
    "checkpointing has already made a small part of the peak: so at this size AMP saves little memory, and apex O2, "
    "which keeps FP16 model weights next to its FP32 master weights, can need more.")


def _epoch_tokens(row, runs_dir: str | None):
    """The token count a cell's derived epoch time is for: summary.csv's epoch_tokens, else the cell's metrics.json."""
    if pd.notna(row.get("epoch_tokens")):
        return int(row["epoch_tokens"])
    path = Path(runs_dir or "") / str(row["model"]) / str(row["precision"]) / f"seed{int(row['seed'])}" / "metrics.json"
    if runs_dir and path.exists():
        value = read_json(str(path)).get("epoch_tokens")
        return int(value) if value else None
    return None


def breakdown_frame(table: str, runs_dir: str | None = None) -> pd.DataFrame:
    """The cells of the models that estimate their memory before allocating (the 7B cells), one row each, with the
    token count of their derived epoch time. Every cell records a breakdown; only these need one explained."""
    frame = pd.read_csv(table)
    if ESTIMATE_COLUMN not in frame:
        return pd.DataFrame()
    estimating = set(frame.loc[frame[ESTIMATE_COLUMN].notna(), "model"])
    frame = frame[frame["model"].isin(estimating)].copy()
    if frame.empty:
        return frame
    frame["epoch_tokens"] = [_epoch_tokens(row, runs_dir) for _, row in frame.iterrows()]
    frame["precision"] = pd.Categorical(frame["precision"], precisions.names(), ordered=True)
    return frame.sort_values(["model", "precision", "seed"]).reset_index(drop=True)


def _gib(value) -> str:
    return f"{value / GIB:,.1f}" if pd.notna(value) else ""


def _parts_here(frame: pd.DataFrame) -> list[str]:
    return [c for c in MEMORY_PARTS if c in frame and frame[c].notna().any()]


def _epoch_header(frame: pd.DataFrame) -> tuple[str, bool]:
    """The epoch column's title, and whether it states the one token count every row shares."""
    counts = set(frame.loc[frame[EPOCH_COLUMN].notna(), "epoch_tokens"].dropna()) if EPOCH_COLUMN in frame else set()
    if len(counts) == 1:
        return f"epoch time (h), derived from tokens/s for {int(next(iter(counts))):,} tokens", True
    return "epoch time (h), derived from tokens/s", False


def _epoch_cell(row, shared: bool) -> str:
    hours = row.get(EPOCH_COLUMN)
    if pd.isna(hours):
        return ""
    if pd.isna(row.get("epoch_tokens")):
        return ""  # an epoch time whose token count is not recorded cannot be labelled: left out (the reason says so)
    return f"{hours:,.2f}" if shared else f"{hours:,.2f} for {int(row['epoch_tokens']):,} tokens"


def _breakdown_reason(row) -> str:
    reason = row["reason"] if isinstance(row.get("reason"), str) else ""
    if pd.notna(row.get(EPOCH_COLUMN)) and pd.isna(row.get("epoch_tokens")):
        reason = "; ".join(p for p in (reason, "epoch time left out: its token count is not recorded") if p)
    return reason


def fixed_share_text(sub: pd.DataFrame) -> str:
    """How much of the strict-FP32 peak is weights, gradients and optimizer state, from the cell's own numbers."""
    fp32 = sub[(sub["precision"].astype(str) == "fp32") & (sub["status"] == "ok")]
    if fp32.empty or pd.isna(fp32.iloc[0].get("peak_allocated_bytes")):
        return ""
    row = fp32.iloc[0]
    parts = [c for c in MEMORY_PARTS if c != "mem_activations_bytes" and pd.notna(row.get(c))]
    if not parts:
        return ""
    fixed = sum(row[c] for c in parts)
    names = [MEMORY_PARTS[c] for c in parts]
    named = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    text = (f"In strict FP32 here, {named} take {_gib(fixed)} GiB of the "
            f"{_gib(row['peak_allocated_bytes'])} GiB allocator peak ({fixed / row['peak_allocated_bytes']:.0%})")
    if pd.notna(row.get("mem_activations_bytes")):
        text += f"; activations and workspace {_gib(row['mem_activations_bytes'])} GiB"
    return text + "."


def breakdown_table_html(sub: pd.DataFrame) -> str:
    parts = _parts_here(sub)
    epoch_title, shared = _epoch_header(sub)
    columns = [("precision", "precision"), ("seed", "seed"), ("status", "status"),
               ("peak", "allocator peak (GiB)")] + [(c, f"{MEMORY_PARTS[c]} (GiB)") for c in parts]
    if ESTIMATE_COLUMN in sub:
        columns.append(("estimate", "estimate before the run (GiB)"))
    columns += [("throughput", "throughput"), ("epoch", epoch_title), ("reason", "reason")]
    rows = []
    for _, row in sub.iterrows():
        unit = row["throughput_unit"] if isinstance(row.get("throughput_unit"), str) else ""
        rows.append({"precision": str(row["precision"]), "seed": int(row["seed"]), "status": row["status"],
                     "peak": _gib(row.get("peak_allocated_bytes")), **{c: _gib(row[c]) for c in parts},
                     "estimate": _gib(row.get(ESTIMATE_COLUMN)),
                     "throughput": (f"{row['throughput_per_s']:,.0f} {unit}".strip()
                                    if pd.notna(row.get("throughput_per_s")) else ""),
                     "epoch": _epoch_cell(row, shared), "reason": _breakdown_reason(row)})
    numeric = {"seed", "peak", "estimate", "throughput", "epoch", *parts}
    return html_table(rows, columns, classes="breakdown", numeric=numeric,
                      row_class=lambda r: f"status-{r['status']}")


def breakdown_chart(frame: pd.DataFrame):
    """Per model, one stacked bar per cell: the parts of its allocator peak (GiB), with the peak and the estimate."""
    models = list(dict.fromkeys(frame["model"]))
    fig, axes = _per_model_axes(models, height=3.8)
    for ax, model in zip(axes, models):
        sub = frame[(frame["model"] == model) & (frame["status"] == "ok")]
        parts = _parts_here(sub)
        sub = sub[sub[parts].notna().any(axis=1)] if parts else sub.iloc[0:0]
        if sub.empty:
            _no_data(ax, "no cell ran")
            ax.set_title(f"{model}: allocator peak by part")
            continue
        several_seeds = sub["seed"].nunique() > 1
        labels = [f"{p}/s{s}" if several_seeds else str(p) for p, s in zip(sub["precision"], sub["seed"])]
        xs = list(range(len(sub)))
        bottom = [0.0] * len(sub)
        for column in parts:
            heights = (sub[column].fillna(0) / GIB).tolist()
            ax.bar(xs, heights, bottom=bottom, color=PART_COLOR[column], label=MEMORY_PARTS[column])
            bottom = [b + h for b, h in zip(bottom, heights)]
        ax.scatter(xs, sub["peak_allocated_bytes"] / GIB, marker="_", s=900, color="black", zorder=3,
                   label="allocator peak (measured)")
        if ESTIMATE_COLUMN in sub and sub[ESTIMATE_COLUMN].notna().any():
            ax.scatter(xs, sub[ESTIMATE_COLUMN] / GIB, marker="x", color="#b42318", zorder=3,
                       label="estimate before the run")
        ax.set_xticks(xs, labels, rotation=20)
        ax.set_ylabel("GiB")
        ax.set_title(f"{model}: allocator peak by part")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle("Where the peak memory goes: weights, gradients and optimizer state against activations", fontsize=10)
    fig.tight_layout()
    return fig


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


def speedup_chart(summary: dict):
    frame = _ok(summary)
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.4))
    for ax, column, baseline in zip(axes, ["speedup_vs_fp32", "speedup_vs_tf32"], ["strict FP32", "TF32"]):
        base = column.removeprefix("speedup_vs_")
        sub = frame[frame[column].notna() & (frame["precision"].astype(str) != base)]
        if sub.empty:
            _no_data(ax, f"no {baseline} baseline ran here" if frame[column].isna().all()
                     else f"nothing but the {baseline} baseline ran here")
        else:
            stats = sub.groupby(["model", "precision"], observed=True)[column].agg(["median", "min", "max"]).reset_index()
            models = list(dict.fromkeys(stats["model"]))
            shown = [p for p in precisions.names() if p in set(stats["precision"].astype(str))]
            width = 0.8 / max(len(shown), 1)
            for i, precision in enumerate(shown):
                part = stats[stats["precision"].astype(str) == precision].set_index("model").reindex(models)
                x = [m + i * width for m in range(len(models))]
                ax.bar(x, part["median"], width, yerr=[part["median"] - part["min"], part["max"] - part["median"]],
                       capsize=3, label=precision, color=precisions.color(precision))
            ax.set_xticks([m + width * (len(shown) - 1) / 2 for m in range(len(models))], models)
            ax.axhline(1.0, color="grey", linewidth=0.8)
            ax.legend(fontsize=7.5)
        ax.set_title(f"Speedup vs {baseline} (same model and seed)")
        ax.set_ylabel(f"throughput / {baseline} throughput (×)")
    fig.suptitle("Speedup against both baselines: median over seeds, error bars span min–max (higher is faster)",
                 fontsize=10)
    fig.tight_layout()
    return fig


def read_steps(runs_dir: str, model: str, precision: str, seed: int) -> pd.DataFrame | None:
    path = Path(runs_dir) / model / precision / f"seed{seed}" / "steps.csv"
    if not path.exists() or path.stat().st_size == 0:
        return None
    frame = pd.read_csv(path)
    return frame if not frame.empty else None


def _steps_by_precision(summary: dict, runs_dir: str, model: str, column: str) -> dict:
    """precision -> DataFrame(step x seed) of one column of steps.csv, for the ok cells of one model."""
    frame = _ok(summary)
    out = {}
    for precision in precisions.names():
        series = {}
        for _, row in frame[(frame["model"] == model) & (frame["precision"].astype(str) == precision)].iterrows():
            steps = read_steps(runs_dir, model, precision, int(row["seed"]))
            if steps is not None and column in steps and steps[column].notna().any():
                series[int(row["seed"])] = steps.set_index("step")[column]
        if series:
            out[precision] = pd.DataFrame(series)
    return out


def loss_curves(summary: dict, runs_dir: str):
    frame = _ok(summary)
    models = list(dict.fromkeys(frame["model"]))
    fig, axes = _per_model_axes(models, height=3.4)
    if not models:
        _no_data(axes[0], "no cell ran")
        axes[0].set_title("Loss curves")
    for ax, model in zip(axes, models):
        for precision, table in _steps_by_precision(summary, runs_dir, model, "loss").items():
            color = precisions.color(precision)
            seeds = table.shape[1]
            ax.plot(table.index, table.median(axis=1), color=color, linewidth=1.8 if precision == "fp32" else 1.1,
                    label=precision + (f" ({seeds} seeds)" if seeds > 1 else ""))
            if seeds > 1:
                ax.fill_between(table.index, table.min(axis=1), table.max(axis=1), color=color, alpha=0.18)
        ax.set_title(f"{model}: training loss, FP32 against AMP")
        ax.set_xlabel("step")
        ax.set_ylabel("training loss (cross-entropy)")
        if ax.lines:
            ax.legend(fontsize=7.5)
        else:
            _no_data(ax, "no steps.csv")
    fig.suptitle("Loss curves: median over seeds, shaded band spans min–max over seeds", fontsize=10)
    fig.tight_layout()
    return fig


def loss_scale_chart(summary: dict, runs_dir: str):
    frame = _ok(summary)
    fig, ax = plt.subplots(figsize=(9, 3))
    for index, model in enumerate(dict.fromkeys(frame["model"])):
        for precision, table in _steps_by_precision(summary, runs_dir, model, "loss_scale").items():
            ax.plot(table.index, table.median(axis=1), label=f"{model} {precision}",
                    color=precisions.color(precision), linestyle=["-", "--", ":", "-."][index % 4])
            if table.shape[1] > 1:
                ax.fill_between(table.index, table.min(axis=1), table.max(axis=1), alpha=0.15,
                                color=precisions.color(precision))
    if ax.lines:
        ax.set_yscale("log", base=2)
        ax.legend(fontsize=7.5, ncol=2)
    else:
        _no_data(ax, "no loss-scaled (fp16) run here")
    ax.set_title("Dynamic loss scale per step (fp16 runs; median over seeds, band = min–max)")
    ax.set_xlabel("step")
    ax.set_ylabel("loss scale (log2 axis)")
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------------------------------------------------
# Sanity, environment, provenance


def sanity_html(sanity: dict) -> str:
    rows = [{**c, "status": badge({"pass": "s-pass", "fail": "s-fail"}.get(c["status"], "s-no_reference"), c["status"])}
            for c in sanity["checks"]]
    return html_table(rows, [("name", "check"), ("status", "status"), ("required", "required"), ("detail", "detail"),
                             ("fix", "fix")], classes="sanity", raw={"status"})


def sanity_table(sanity: dict) -> pd.DataFrame:
    frame = pd.DataFrame(sanity["checks"])
    return frame[["name", "status", "required", "detail", "fix"]]


def environment_table(env: dict) -> pd.DataFrame:
    torch = env.get("torch", {})
    platform = env.get("platform", {})
    rows = [("Python", env.get("python", {}).get("version")),
            ("Platform", f"{platform.get('system')} {platform.get('release')} {platform.get('machine')}"),
            ("CPU cores", platform.get("cpu_count")), ("Environment", env.get("isolation", {}).get("message")),
            ("torch", torch.get("version")), ("torch CUDA", torch.get("cuda")), ("cuDNN", torch.get("cudnn")),
            ("NCCL", torch.get("nccl")), ("Packages recorded", len(env.get("packages", {})))]
    return pd.DataFrame(rows, columns=["item", "value"])


def kv_html(frame: pd.DataFrame, classes: str = "kv") -> str:
    return html_table(frame.to_dict("records"), [(c, c) for c in frame.columns], classes=classes)


def pipeline_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, timeout=10).stdout.strip()
        return out.stdout.strip() + (" (with uncommitted changes)" if dirty else "") if out.returncode == 0 else "n/a"
    except OSError:
        return "n/a"


def _sha256(path: str | None) -> str:
    if not path or not Path(path).exists():
        return "n/a"
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def provenance_table(data: dict) -> pd.DataFrame:
    versions, preset = data["summary"]["versions"], data["summary"]["preset"]
    env = data["environment"]
    verify = data.get("verify") or {}
    reference = verify.get("reference") or {}
    rows = [("pipeline commit", pipeline_commit()), ("config sha256", preset.get("config_sha256")),
            ("claims file", f"{data.get('claims_path') or 'none'} (sha256 {_sha256(data.get('claims_path'))})"),
            ("reference used", reference.get("path") or f"none ({verify.get('status', 'not run')})"),
            ("preset", f"{preset.get('preset')}: {preset.get('reason')}"),
            ("environment", f"{versions.get('isolation')}: {env.get('isolation', {}).get('prefix', '')}"),
            ("GPU", versions.get("gpu") or "none"), ("GPU count", versions.get("gpu_count")),
            ("driver", versions.get("driver") or "n/a"), ("CUDA", versions.get("cuda") or "none"),
            ("cuDNN", versions.get("cudnn") or "n/a"), ("torch", versions.get("torch")),
            ("apex", f"{data['apex'].get('status')}, commit {versions.get('apex_commit') or 'not built'}"),
            ("Python", versions.get("python")), ("report rendered (UTC)",
                                                  _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M:%S"))]
    rows += [(f"package {name}", version) for name, version in versions.get("packages", {}).items()]
    return pd.DataFrame(rows, columns=["item", "value"])

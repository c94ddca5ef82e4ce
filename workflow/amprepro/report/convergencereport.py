"""The report's "Does AMP change what the model learns?" section: for each model whose cells record a held-out loss
curve (model_config eval_every), the train and held-out loss curves per precision overlaid (mean over seeds, min–max
band), the loss scale and skipped steps of the loss-scaled precisions, each precision's final held-out loss beside
FP32's (FP32's mean ± the margin shaded), and the paired gaps against FP32 with the verdicts of
amprepro.analysis.convergence in a table.

Collapsed cells are shown too (their curves until the loss went non-finite): a precision that breaks is the point of
the fragile cell (HalfEpsNorm, naive_norm_eps).
"""

from __future__ import annotations

import json
import math

import matplotlib.pyplot as plt
import pandas as pd

from amprepro import precisions
from amprepro.analysis import convergence, paired
from amprepro.cellid import CellId
from amprepro.report import reporthtml
from amprepro.report.reportlib import read_steps

SMOOTH_STEPS = 20  # the train loss is shown as a rolling mean over this many steps (per seed, before the seed mean)
TAIL = 0.25  # the flattening figure: the held-out loss change over the last quarter of the steps


def read_metrics(runs_dir: str, model: str, precision: str, seed: int) -> dict | None:
    path = CellId(model, precision, seed).under(runs_dir) / "metrics.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def shown_cells(summary: dict, model: str) -> list[dict]:
    """The model's cells that trained (ok or collapsed), in the registry's precision order, then by seed."""
    order = {name: i for i, name in enumerate(precisions.names())}
    cells = [c for c in summary.get("cells", []) if c["model"] == model and c["status"] in ("ok", "collapsed")]
    return sorted(cells, key=lambda c: (order.get(c["precision"], 99), int(c["seed"])))


def curves(summary: dict, runs_dir: str, model: str) -> dict:
    """precision -> {"train": DataFrame(step x seed, smoothed), "heldout": DataFrame(step x seed),
    "scale": DataFrame, "skipped": {seed: [steps]}, "record": data record}."""
    out: dict = {}
    for cell in shown_cells(summary, model):
        precision, seed = cell["precision"], int(cell["seed"])
        entry = out.setdefault(precision, {"train": {}, "heldout": {}, "scale": {}, "skipped": {}, "record": None})
        steps = read_steps(runs_dir, model, precision, seed)
        if steps is not None:
            frame = steps.set_index("step")
            entry["train"][seed] = frame["loss"].rolling(SMOOTH_STEPS, min_periods=1, center=True).mean()
            if frame["loss_scale"].notna().any():
                entry["scale"][seed] = frame["loss_scale"]
            skipped = frame.index[frame["skipped"].astype(str).str.lower().isin(["true", "1"])]
            entry["skipped"][seed] = list(skipped)
        metrics = read_metrics(runs_dir, model, precision, seed) or {}
        points = metrics.get("heldout_curve") or []
        if points:
            entry["heldout"][seed] = pd.Series({p["step"]: p["loss"] for p in points})
        entry["record"] = entry["record"] or metrics.get("data_record")
    for entry in out.values():
        for key in ("train", "heldout", "scale"):
            entry[key] = pd.DataFrame(entry[key]) if entry[key] else None
    return out


def flattening(heldout: pd.DataFrame | None) -> str:
    """How much the mean held-out loss still fell over the last TAIL of the steps, against the whole fall."""
    if heldout is None or len(heldout.index) < 3:
        return "n/a"
    mean = heldout.mean(axis=1)
    last = mean.index.max()
    tail = mean[mean.index >= last * (1 - TAIL)]
    whole, late = mean.iloc[0] - mean.iloc[-1], tail.iloc[0] - tail.iloc[-1]
    if not (math.isfinite(whole) and math.isfinite(late)) or whole == 0:
        return "n/a"
    return (f"by {-late:+.4f} nats over steps {int(tail.index[0])}–{int(last)} ({late / whole * 100:.1f} % of its "
            "fall since step 0)").replace("-", "−")


def _band(ax, table: pd.DataFrame, color: str, label: str, width: float, style: str = "-"):
    mean = table.mean(axis=1)
    ax.plot(table.index, mean, color=color, linewidth=width, linestyle=style, label=label)
    if table.shape[1] > 1:
        ax.fill_between(table.index, table.min(axis=1), table.max(axis=1), color=color, alpha=0.15)


def curves_chart(model: str, data: dict):
    """Train (smoothed) and held-out loss per precision; the loss scale with skipped steps, where there is one."""
    scaled = {p: e for p, e in data.items() if e["scale"] is not None}
    fig, axes = plt.subplots(1, 2 if scaled else 1, figsize=(12 if scaled else 7.5, 3.8), squeeze=False)
    ax = axes[0, 0]
    for precision, entry in data.items():
        color = precisions.color(precision, "#888")
        seeds = max((t.shape[1] for t in (entry["train"], entry["heldout"]) if t is not None), default=0)
        if entry["train"] is not None:
            _band(ax, entry["train"], color, f"{precision} train ({seeds} seeds)", 0.9, ":")
        if entry["heldout"] is not None:
            _band(ax, entry["heldout"], color, f"{precision} held-out", 2.0 if precision == "fp32" else 1.4)
    ax.set_xlabel("optimizer steps")
    ax.set_ylabel("cross-entropy (nats per byte)")
    ax.set_title(f"{model}: train (dotted, centred rolling mean of {SMOOTH_STEPS} steps) and held-out loss")
    if ax.lines:
        ax.legend(fontsize=7, ncol=2)
    if scaled:
        ax = axes[0, 1]
        for precision, entry in scaled.items():
            color = precisions.color(precision, "#888")
            _band(ax, entry["scale"], color, f"{precision} loss scale", 1.2)
            marks = [(s, entry["scale"].loc[s].mean()) for steps in entry["skipped"].values() for s in steps
                     if s in entry["scale"].index]
            if marks:
                ax.scatter([m[0] for m in marks], [m[1] for m in marks], marker="x", color=color, s=18,
                           label=f"{precision} skipped steps ({len(marks)}, all seeds)")
        ax.set_yscale("log", base=2)
        ax.set_xlabel("step")
        ax.set_ylabel("loss scale (log2 axis)")
        ax.set_title(f"{model}: dynamic loss scale (mean over seeds) and skipped steps")
        ax.legend(fontsize=7)
    fig.suptitle("Loss curves per precision: mean over seeds, shaded band spans min–max over seeds", fontsize=10)
    fig.set_layout_engine("tight")  # laid out when drawn, as amprepro.report.reportcharts' figures
    return fig


def finals_chart(model: str, summary: dict, judged: dict):
    """Each precision's final held-out loss (every seed, and the mean) beside FP32's mean ± the margin."""
    losses = convergence.final_losses(summary, model)
    shown = [p for p in precisions.names() if p in losses and losses[p]["values"]]
    fig, ax = plt.subplots(figsize=(7.5, 0.45 * len(shown) + 1.4))
    base, margin = judged["baseline"], judged["margin"]
    band = [base["mean"] * (1 - margin), base["mean"] * (1 + margin)] if base else None
    if band:
        ax.axvspan(band[0], band[1], color="#c9d3e6", alpha=0.6,
                   label=f"FP32 mean ± {margin * 100:g} % (the margin; verdicts are on the paired gaps)")
    for y, precision in enumerate(shown):
        values = list(losses[precision]["values"].values())
        color = precisions.color(precision, "#888")
        ax.scatter(values, [y] * len(values), color=color, s=16, alpha=0.7)
        mean = sum(values) / len(values)
        ax.scatter([mean], [y], color=color, marker="D", s=40, edgecolor="black", zorder=3)
        result = judged["precisions"].get(precision) or {}
        verdict = result.get("verdict") or ("baseline" if precision == "fp32" else "not judged")
        if result.get("stats"):
            verdict = f"gap {paired.pct(result['stats']['mean'], True)}: {verdict}"
        ax.annotate(verdict, (mean, y), textcoords="offset points", xytext=(8, 4), fontsize=7.5)
    ax.set_yticks(range(len(shown)), shown)
    ax.invert_yaxis()
    ax.set_xlabel("final held-out loss (nats per byte; lower is better); dots: seeds, diamond: mean")
    ax.set_title(f"{model}: final held-out loss per precision beside FP32's")
    if band:
        ax.legend(fontsize=7, loc="lower right")
    fig.set_layout_engine("tight")  # laid out when drawn, as amprepro.report.reportcharts' figures
    return fig


def verdict_table(model: str, summary: dict, judged: dict, data: dict) -> pd.DataFrame:
    losses = convergence.final_losses(summary, model)
    rows = []
    for precision in [p for p in precisions.names() if p in losses]:
        entry, values = losses[precision], list(losses[precision]["values"].values())
        stats = convergence.spread(values) if values else None
        result = judged["precisions"].get(precision) or {}
        gap = result.get("stats")
        skipped = sum(len(v) for v in (data.get(precision) or {}).get("skipped", {}).values())
        rows.append({
            "precision": precision,
            "seeds": f"{len(values)} ok" + (f", {len(entry['collapsed'])} collapsed" if entry["collapsed"] else "")
                     + (f", {len(entry['other'])} not run" if entry["other"] else ""),
            "final held-out loss mean ± sd": (f"{stats['mean']:.4f} ± {stats['sd']:.4f}" if stats and stats["sd"]
                                              is not None else f"{stats['mean']:.4f}" if stats else "—"),
            "min–max": f"{stats['min']:.4f}–{stats['max']:.4f}" if stats else "—",
            "paired gap vs FP32 (mean, 95 % interval)": (
                f"{paired.pct(gap['mean'], True)} ({paired.pct(gap['low'], True)} to {paired.pct(gap['high'], True)},"
                f" {gap['n']} seeds)" if gap else "—"),
            "one-sided 95 % bounds": f"{paired.pct(gap['lower'], True)} / {paired.pct(gap['upper'], True)}" if gap
                                     else "—",
            f"vs the {judged['margin'] * 100:g} % margin": "baseline" if precision == "fp32" else (
                result.get("verdict") or "not judged"),
            "lower than FP32?": paired.ZERO_WORDS[gap["zero"]] if gap else "—",
            "skipped steps": str(skipped) if (data.get(precision) or {}).get("scale") is not None else "",
            "why": "" if result.get("verdict") else result.get("reason", ""),
        })
    return pd.DataFrame(rows)


def intro(records: list[dict]) -> str:
    parts = [f"Each precision's final held-out loss against FP32's, paired by seed (every precision of a seed starts "
             f"from the same initial weights and draws the same batches): the relative gap per seed, its mean over "
             f"the seeds with the Student-t 95 % interval and one-sided 95 % bounds, judged against a "
             f"{convergence.MARGIN * 100:g} % margin (under: the upper bound below it; over: the lower bound above "
             f"it; else not settled; a collapsed seed: collapsed) and against 0 (lower or higher than FP32, or no "
             f"difference shown). amprepro.analysis.convergence and amprepro.analysis.paired say why."]
    for record in records:
        if record.get("kind") == "python_stdlib":
            parts.append(f"Text: the {record['files']} .py files of the Python {record['python']} standard library "
                         f"at {record['root']} as bytes ({record['train_bytes']:,} bytes for training; "
                         f"{record['heldout_files']} files, {record['heldout_bytes']:,} bytes held out by file; "
                         f"{record.get('eval_windows')} held-out windows of {record.get('seq_len')} bytes); corpus "
                         f"sha256 {record['corpus_sha256'][:16]}…, file list sha256 "
                         f"{record['file_list_sha256'][:16]}…. This is not ImageNet: it tests whether the precision "
                         "changes what a small model learns, not the article's ViT result.")
    return " ".join(dict.fromkeys(parts))


def section(summary: dict, runs_dir: str) -> str:
    """The whole section as HTML (amprepro.report.reporthtml's helpers), or its one-line empty form."""
    body, records = "", []
    for model in convergence.convergence_models(summary):
        data = curves(summary, runs_dir, model)
        judged = convergence.model_verdicts(summary, model)
        records += [e["record"] for e in data.values() if e.get("record")]
        fp32 = data.get("fp32", {}).get("heldout")
        body += (reporthtml.figure_html(curves_chart(model, data), f"{model} loss curves",
                                        f"{model}: FP32's held-out loss still changed {flattening(fp32)}.")
                 + reporthtml.figure_html(finals_chart(model, summary, judged), f"{model} final held-out losses")
                 + reporthtml.kv_html(verdict_table(model, summary, judged, data), classes="kv convergence"))
    return reporthtml.section_html("Does AMP change what the model learns?", body,
                                   "nothing to show on this run: no cell recorded a held-out loss curve (the "
                                   "accuracy preset's cells do: config/presets/accuracy.yaml)", intro(records))

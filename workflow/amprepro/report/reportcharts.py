"""The report's charts: each a titled matplotlib figure with units and min-max error bars over seeds.

The notebook embeds them with amprepro.report.reporthtml.figure_html (a base64 PNG, so the report opens offline). The
data
they plot is shaped in amprepro.report.reportlib; the colours of the precisions are the registry's
(amprepro.precisions).
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from amprepro import precisions
from amprepro.analysis import claims as claims_mod
from amprepro.analysis.claimmetrics import HIGHER_IS_BETTER, claimed_band, fmt_value
from amprepro.memory import GIB
from amprepro.report.reportlib import (
    ESTIMATE_COLUMN,
    MEMORY_PARTS,
    cells_frame,
    ok_cells,
    parts_here,
    steps_by_precision,
)
from amprepro.verify.cellcompare import METRIC_LABEL

VERDICT_COLOR = {"holds": "#1a7f37", "exceeds": "#175cd3", "falls_short": "#b42318"}  # as the badges in report.css
PART_COLOR = {"mem_weights_bytes": "#30638e", "mem_gradients_bytes": "#00798c",
              "mem_optimizer_state_bytes": "#8f9bb3", "mem_master_weights_bytes": "#5b3fa6",
              "mem_activations_bytes": "#edae49"}

plt.rcParams.update({"figure.dpi": 100, "axes.grid": True, "grid.alpha": 0.3, "axes.axisbelow": True,
                     "axes.spines.top": False, "axes.spines.right": False, "font.size": 9, "axes.titlesize": 10})


def claim_points(results: list[dict] | None) -> list[tuple]:
    """(claim, baseline, model, measured) for every claim, baseline and model with a measured median."""
    points = []
    for r in results or []:
        for baseline, b in r.get("by_baseline", {}).items():
            for model, m in b["models"].items():
                if m.get("median") is not None:
                    points.append((r, baseline, model, m))
    return points


def claims_chart(results: list[dict], summary: dict):
    """Measured (median, min-max bar over seeds) against the claimed band, per claim, baseline and model."""
    points = claim_points(results)
    metrics = [mt for mt in ("speedup", "memory_reduction", "accuracy_delta")
               if any(p[0]["metric"] == mt for p in points)]
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
        for y, (r, _baseline, _model, m) in enumerate(rows):
            low, high = claimed_band(r)
            finite_low = low if low != float("-inf") else min(m["min"], high) - abs(high) * 0.25 - 0.05
            finite_high = high if high != float("inf") else max(m["max"], low) + abs(low) * 0.25 + 0.05
            ax.barh(y, (finite_high - finite_low) * scale, left=finite_low * scale, height=0.6, color="#b7dfc2",
                    alpha=0.7, label="claimed (with tolerance)" if y == 0 else None)
            color = VERDICT_COLOR.get(m["verdict"], "#475467")
            spread = [[(m["median"] - m["min"]) * scale], [(m["max"] - m["median"]) * scale]]
            ax.errorbar(m["median"] * scale, y, xerr=spread, fmt="o", color=color, capsize=4,
                        label="measured: median, min–max over seeds" if y == 0 else None)
            ax.annotate(fmt_value(metric, m["median"]), (m["median"] * scale, y), textcoords="offset points",
                        xytext=(6, 5), fontsize=8, color=color)
        ax.set_yticks(range(len(rows)), [f"{r['id']}\n{model} vs {precisions.label(b)}" for r, b, model, _ in rows],
                      fontsize=7.5)
        ax.invert_yaxis()
        better = "right" if HIGHER_IS_BETTER[metric] else "left"
        ax.set_xlabel(f"{label}; {better} of the band = better than claimed (blue: exceeds, red: falls short)")
        ax.set_title(f"Claims ({metric.replace('_', ' ')}): measured against the claimed band")
        ax.legend(fontsize=7.5, loc="lower right")
    fig.set_layout_engine("tight")  # laid out when drawn (in a figure pool's worker: amprepro.report.figurepool)
    return fig


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
        ax.set_title(f"{METRIC_LABEL.get(metric, metric)}: this run / reference median, per cell "
                     "(red = out of tolerance)")
        ax.legend(fontsize=7.5, loc="best")
    fig.set_layout_engine("tight")  # laid out when drawn (in a figure pool's worker: amprepro.report.figurepool)
    return fig


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


def _axes_per_model_or_none(frame, title: str):
    """(models, fig, axes): one axis per model in frame, or one axis saying that no cell ran."""
    models = list(dict.fromkeys(frame["model"]))
    fig, axes = _per_model_axes(models)
    if not models:
        _no_data(axes[0], "no cell ran")
        axes[0].set_title(title)
    return models, fig, axes


def throughput_chart(summary: dict):
    frame = ok_cells(summary)
    models, fig, axes = _axes_per_model_or_none(frame, "Training throughput")
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
    fig.set_layout_engine("tight")  # laid out when drawn (in a figure pool's worker: amprepro.report.figurepool)
    return fig


def memory_chart(summary: dict):
    frame = ok_cells(summary)
    on_gpu = bool(frame["peak_allocated_bytes"].notna().any()) if not frame.empty else False
    column = "peak_allocated_bytes" if on_gpu else "peak_rss_bytes"
    models, fig, axes = _axes_per_model_or_none(frame, "Peak memory")
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
    fig.set_layout_engine("tight")  # laid out when drawn (in a figure pool's worker: amprepro.report.figurepool)
    return fig


def breakdown_chart(frame: pd.DataFrame):
    """Per model, one stacked bar per cell: the parts of its allocator peak (GiB), with the peak and the estimate."""
    models = list(dict.fromkeys(frame["model"]))
    fig, axes = _per_model_axes(models, height=3.8)
    for ax, model in zip(axes, models):
        sub = frame[(frame["model"] == model) & (frame["status"] == "ok")]
        parts = parts_here(sub)
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
    fig.set_layout_engine("tight")  # laid out when drawn (in a figure pool's worker: amprepro.report.figurepool)
    return fig


SPEEDUP_BASELINES = [("speedup_vs_fp32", "strict FP32"), ("speedup_vs_tf32", "TF32")]


def speedup_baselines(summary: dict) -> list[tuple[str, str]]:
    """(column, label) of each baseline with at least one other precision measured against it on this run."""
    frame = ok_cells(summary)
    return [(column, label) for column, label in SPEEDUP_BASELINES
            if not frame[frame[column].notna()
                         & (frame["precision"].astype(str) != column.removeprefix("speedup_vs_"))].empty]


def speedup_chart(summary: dict, only_measured: bool = False):
    """Speedup against strict FP32 and against TF32, a panel each; only_measured: only the baselines that have a
    measurement on this run (a CPU run has no TF32)."""
    frame = ok_cells(summary)
    shown_baselines = speedup_baselines(summary) if only_measured else SPEEDUP_BASELINES
    shown_baselines = shown_baselines or SPEEDUP_BASELINES
    fig, axes = plt.subplots(1, len(shown_baselines), figsize=(11 if len(shown_baselines) == 2 else 6.5, 3.4),
                             squeeze=False)
    for ax, (column, baseline) in zip(axes[0], shown_baselines):
        base = column.removeprefix("speedup_vs_")
        sub = frame[frame[column].notna() & (frame["precision"].astype(str) != base)]
        if sub.empty:
            _no_data(ax, f"no {baseline} baseline ran here" if frame[column].isna().all()
                     else f"nothing but the {baseline} baseline ran here")
        else:
            by_cell = sub.groupby(["model", "precision"], observed=True)[column]
            stats = by_cell.agg(["median", "min", "max"]).reset_index()
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
    which = "both baselines" if len(shown_baselines) == 2 else shown_baselines[0][1]
    fig.suptitle(f"Speedup against {which}: median over seeds, error bars span min–max (higher is faster)",
                 fontsize=10)
    fig.set_layout_engine("tight")  # laid out when drawn (in a figure pool's worker: amprepro.report.figurepool)
    return fig


def loss_curves(summary: dict, runs_dir: str):
    frame = ok_cells(summary)
    models = list(dict.fromkeys(frame["model"]))
    fig, axes = _per_model_axes(models, height=3.4)
    if not models:
        _no_data(axes[0], "no cell ran")
        axes[0].set_title("Loss curves")
    for ax, model in zip(axes, models):
        for precision, table in steps_by_precision(summary, runs_dir, model, "loss").items():
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
    fig.set_layout_engine("tight")  # laid out when drawn (in a figure pool's worker: amprepro.report.figurepool)
    return fig


def has_loss_scale(summary: dict, runs_dir: str) -> bool:
    """Whether any cell that ran recorded a loss scale per step (the fp16 cells with GradScaler)."""
    frame = ok_cells(summary)
    return any(steps_by_precision(summary, runs_dir, model, "loss_scale") for model in dict.fromkeys(frame["model"]))


def loss_scale_chart(summary: dict, runs_dir: str):
    frame = ok_cells(summary)
    fig, ax = plt.subplots(figsize=(9, 3))
    for index, model in enumerate(dict.fromkeys(frame["model"])):
        for precision, table in steps_by_precision(summary, runs_dir, model, "loss_scale").items():
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
    fig.set_layout_engine("tight")  # laid out when drawn (in a figure pool's worker: amprepro.report.figurepool)
    return fig

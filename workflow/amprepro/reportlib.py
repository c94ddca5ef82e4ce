"""Tables and charts for notebooks/report.ipynb. The notebook only calls these, so they are tested like code."""

from __future__ import annotations

import html
import subprocess
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from amprepro.files import read_json  # noqa: E402

PRECISION_ORDER = ["fp32", "tf32", "amp_fp16", "amp_bf16", "apex_o1", "apex_o2"]
GIB = 2**30


def load(summary: str, environment: str, sanity: str, apex: str) -> dict:
    return {"summary": read_json(summary), "environment": read_json(environment), "sanity": read_json(sanity),
            "apex": read_json(apex)}


def cells_frame(summary: dict) -> pd.DataFrame:
    frame = pd.DataFrame(summary["cells"])
    frame["precision"] = pd.Categorical(frame["precision"], PRECISION_ORDER, ordered=True)
    return frame.sort_values(["model", "precision", "seed"]).reset_index(drop=True)


def headline_html(data: dict) -> str:
    summary, env, sanity, apex = data["summary"], data["environment"], data["sanity"], data["apex"]
    versions, counts = summary["versions"], summary["counts"]
    hardware = versions.get("gpu") or f"CPU only ({versions.get('cpu')})"
    isolation = env.get("isolation", {})
    warn = "" if isolation.get("isolated") else f"<p class='warn'><b>{html.escape(isolation.get('message', ''))}</b></p>"
    items = [
        f"<b>Preset:</b> {html.escape(summary['preset']['preset'])} ({html.escape(summary['preset']['reason'])})",
        f"<b>Hardware:</b> {html.escape(str(hardware))}; driver {versions.get('driver') or 'n/a'}",
        f"<b>Software:</b> torch {versions.get('torch')}, CUDA {versions.get('cuda') or 'none'}, "
        f"Python {versions.get('python')}, env: {isolation.get('mode')}",
        f"<b>Apex:</b> {apex.get('status')} ({html.escape(apex.get('reason', ''))})",
        f"<b>Cells:</b> {counts.get('ok', 0)} ran, {counts.get('skipped', 0)} skipped, "
        f"{counts.get('collapsed', 0)} collapsed (numerics), of {len(summary['cells'])}",
        f"<b>Sanity:</b> {sanity['passed']} passed, {sanity['failed']} failed, {sanity['skipped']} skipped",
    ]
    return warn + "<ul>" + "".join(f"<li>{item}</li>" for item in items) + "</ul>"


def environment_table(env: dict) -> pd.DataFrame:
    torch = env.get("torch", {})
    rows = [("Python", env["python"]["version"]), ("Platform", f"{env['platform']['system']} "
            f"{env['platform']['release']} {env['platform']['machine']}"), ("CPU cores", env["platform"]["cpu_count"]),
            ("Environment", env["isolation"]["message"]), ("torch", torch.get("version")),
            ("torch CUDA", torch.get("cuda")), ("cuDNN", torch.get("cudnn")), ("NCCL", torch.get("nccl")),
            ("Packages recorded", len(env.get("packages", {})))]
    return pd.DataFrame(rows, columns=["item", "value"])


def sanity_table(sanity: dict) -> pd.DataFrame:
    frame = pd.DataFrame(sanity["checks"])
    return frame[["name", "status", "required", "detail", "fix"]]


def results_table(summary: dict) -> pd.DataFrame:
    frame = cells_frame(summary)
    out = pd.DataFrame({
        "model": frame["model"], "precision": frame["precision"].astype(str), "seed": frame["seed"],
        "status": frame["status"],
        "throughput": frame["throughput_per_s"].map(lambda v: f"{v:,.1f}" if pd.notna(v) else ""),
        "unit": frame.get("throughput_unit", pd.Series([""] * len(frame))).fillna(""),
        "median step ms": (frame["step_time_median_s"] * 1000).map(lambda v: f"{v:.2f}" if pd.notna(v) else ""),
        "p90 step ms": (frame["step_time_p90_s"] * 1000).map(lambda v: f"{v:.2f}" if pd.notna(v) else ""),
        "peak memory": [memory_label(row) for _, row in frame.iterrows()],
        "× fp32": frame["speedup_vs_fp32"].map(lambda v: f"{v:.2f}" if pd.notna(v) else ""),
        "× tf32": frame["speedup_vs_tf32"].map(lambda v: f"{v:.2f}" if pd.notna(v) else ""),
        "final loss": frame["final_loss"].map(lambda v: f"{v:.4f}" if pd.notna(v) else ""),
        "eval acc": frame["eval_accuracy"].map(lambda v: f"{v:.3f}" if pd.notna(v) else ""),
        "skipped steps": frame["skipped_steps"].fillna("").astype(str),
        "reason": frame["reason"].fillna(""),
    })
    return out


def memory_label(row) -> str:
    if pd.notna(row.get("peak_allocated_bytes")):
        return f"{row['peak_allocated_bytes'] / GIB:.2f} GiB (allocator)"
    if pd.notna(row.get("peak_rss_bytes")):
        return f"{row['peak_rss_bytes'] / GIB:.2f} GiB (process RSS)"
    return ""


def _ok(summary: dict) -> pd.DataFrame:
    frame = cells_frame(summary)
    return frame[frame["status"] == "ok"]


def _grouped_bars(ax, frame: pd.DataFrame, column: str, scale: float = 1.0):
    """Bars of the median over seeds per model and precision, error bars spanning min to max over seeds."""
    stats = frame.groupby(["model", "precision"], observed=True)[column].agg(["median", "min", "max"]).reset_index()
    models = list(dict.fromkeys(stats["model"]))
    precisions = [p for p in PRECISION_ORDER if p in set(stats["precision"].astype(str))]
    width = 0.8 / max(len(precisions), 1)
    for i, precision in enumerate(precisions):
        sub = stats[stats["precision"].astype(str) == precision].set_index("model").reindex(models)
        x = [m + i * width for m in range(len(models))]
        err = [(sub["median"] - sub["min"]) / scale, (sub["max"] - sub["median"]) / scale]
        ax.bar(x, sub["median"] / scale, width, yerr=err, capsize=3, label=precision)
    ax.set_xticks([m + width * (len(precisions) - 1) / 2 for m in range(len(models))], models)
    ax.legend(fontsize=8)


def throughput_chart(summary: dict):
    frame = _ok(summary)
    fig, ax = plt.subplots(figsize=(8, 3.5))
    if frame.empty:
        ax.text(0.5, 0.5, "no cell ran", ha="center")
    else:
        _grouped_bars(ax, frame, "throughput_per_s")
        unit = frame["throughput_unit"].dropna().iloc[0] if "throughput_unit" in frame else "items/s"
        ax.set_ylabel(f"throughput ({unit}, per model)")
    ax.set_title("Training throughput (median over seeds, bars span min-max)")
    fig.tight_layout()
    return fig


def memory_chart(summary: dict):
    frame = _ok(summary).copy()
    frame["peak_gib"] = [(row.get("peak_allocated_bytes") if pd.notna(row.get("peak_allocated_bytes"))
                          else row.get("peak_rss_bytes")) / GIB for _, row in frame.iterrows()]
    on_gpu = frame["peak_allocated_bytes"].notna().any() if not frame.empty else False
    fig, ax = plt.subplots(figsize=(8, 3.5))
    if frame.empty:
        ax.text(0.5, 0.5, "no cell ran", ha="center")
    else:
        _grouped_bars(ax, frame, "peak_gib")
    ax.set_ylabel("peak memory (GiB)")
    ax.set_title("Peak memory: " + ("GPU allocator peak" if on_gpu else "process peak RSS (CPU: no allocator stats)"))
    fig.tight_layout()
    return fig


def speedup_chart(summary: dict):
    frame = _ok(summary)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5), sharey=False)
    for ax, column, baseline in zip(axes, ["speedup_vs_fp32", "speedup_vs_tf32"], ["strict FP32", "TF32"]):
        sub = frame[frame[column].notna()]
        if sub.empty:
            ax.text(0.5, 0.5, f"no {baseline} baseline ran here", ha="center", transform=ax.transAxes)
        else:
            _grouped_bars(ax, sub, column)
            ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_title(f"Speedup vs {baseline} (×, higher is faster)")
        ax.set_ylabel("speedup (×)")
    fig.tight_layout()
    return fig


def read_steps(runs_dir: str, model: str, precision: str, seed: int) -> pd.DataFrame | None:
    path = Path(runs_dir) / model / precision / f"seed{seed}" / "steps.csv"
    if not path.exists() or path.stat().st_size == 0:
        return None
    frame = pd.read_csv(path)
    return frame if not frame.empty else None


def loss_curves(summary: dict, runs_dir: str):
    frame = _ok(summary)
    models = list(dict.fromkeys(frame["model"])) or ["(none)"]
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 3.5), squeeze=False)
    for ax, model in zip(axes[0], models):
        for _, row in frame[frame["model"] == model].iterrows():
            steps = read_steps(runs_dir, model, str(row["precision"]), int(row["seed"]))
            if steps is not None:
                ax.plot(steps["step"], steps["loss"], label=f"{row['precision']} s{row['seed']}",
                        linewidth=1.6 if row["precision"] == "fp32" else 1.0)
        ax.set_title(f"{model}: loss, FP32 against AMP")
        ax.set_xlabel("step")
        ax.set_ylabel("training loss")
        if ax.lines:
            ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def loss_scale_chart(summary: dict, runs_dir: str):
    frame = _ok(summary)
    fig, ax = plt.subplots(figsize=(8, 3))
    for _, row in frame.iterrows():
        steps = read_steps(runs_dir, row["model"], str(row["precision"]), int(row["seed"]))
        if steps is not None and steps["loss_scale"].notna().any():
            ax.plot(steps["step"], steps["loss_scale"], label=f"{row['model']} {row['precision']}")
    if ax.lines:
        ax.set_yscale("log", base=2)
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no loss-scaled (fp16) run here", ha="center", transform=ax.transAxes)
    ax.set_title("Dynamic loss scale per step (fp16 runs)")
    ax.set_xlabel("step")
    ax.set_ylabel("loss scale")
    fig.tight_layout()
    return fig


def pipeline_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, timeout=10).stdout.strip()
        return out.stdout.strip() + (" (with uncommitted changes)" if dirty else "") if out.returncode == 0 else "n/a"
    except OSError:
        return "n/a"


def provenance_table(data: dict) -> pd.DataFrame:
    versions, preset = data["summary"]["versions"], data["summary"]["preset"]
    rows = [("pipeline commit", pipeline_commit()), ("config sha256", preset.get("config_sha256")),
            ("preset", preset.get("preset")), ("environment", versions.get("isolation")),
            ("GPU", versions.get("gpu") or "none"), ("driver", versions.get("driver") or "n/a"),
            ("CUDA", versions.get("cuda") or "none"), ("cuDNN", versions.get("cudnn")),
            ("torch", versions.get("torch")), ("apex commit", versions.get("apex_commit") or "not built")]
    rows += [(f"package {name}", version) for name, version in versions.get("packages", {}).items()]
    return pd.DataFrame(rows, columns=["item", "value"])


def figure_html(fig, alt: str) -> str:
    """The figure as an embedded PNG (base64): the HTML report opens offline with every chart inside it."""
    import base64
    import io

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    return f'<img class="chart" alt="{html.escape(alt)}" src="data:image/png;base64,{data}"/>'

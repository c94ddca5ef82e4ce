"""The data behind notebooks/report.ipynb: inputs read, claims and reference check evaluated, tables shaped.

The notebook calls this module, amprepro.report.reporthtml (the HTML) and amprepro.report.reportcharts (the matplotlib
figures),
nothing else, so everything it shows is tested like code.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import math
from pathlib import Path

import pandas as pd

from amprepro import precisions
from amprepro.analysis import claims as claims_mod
from amprepro.analysis import summary as summary_columns
from amprepro.cellid import CellId
from amprepro.files import read_json
from amprepro.gitinfo import describe_commit
from amprepro.memory import GIB
from amprepro.verify import verify as verify_mod

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


def ok_cells(summary: dict) -> pd.DataFrame:
    frame = cells_frame(summary)
    return frame[frame["status"] == "ok"].copy()


def hardware(summary: dict) -> str:
    v = summary.get("versions", {})
    if v.get("gpu"):
        count = f" ×{v['gpu_count']}" if (v.get("gpu_count") or 1) > 1 else ""
        return f"{v['gpu']}{count}, driver {v.get('driver') or 'n/a'}, CUDA {v.get('cuda') or 'n/a'}"
    return f"CPU only ({v.get('cpu') or 'unknown CPU'}): no CUDA GPU"


# ----------------------------------------------------------------------------------------------------------------------
# HTML helpers


# ----------------------------------------------------------------------------------------------------------------------
# The one-screen summary


def shorten(text: str, limit: int = 150) -> str:
    """One screen: long reasons are cut at a word boundary (the Claims section has them in full)."""
    if len(text) <= limit:
        return text
    return text[:limit].rsplit(" ", 1)[0].rstrip(",;:(") + " …"


# ----------------------------------------------------------------------------------------------------------------------
# Claims in detail


# ----------------------------------------------------------------------------------------------------------------------
# Reference check


# ----------------------------------------------------------------------------------------------------------------------
# Results table and charts


def _fmt_num(v, spec: str) -> str:
    return format(v, spec) if pd.notna(v) else ""


def _fmt_significant(v, digits: int = 3) -> str:
    """v with `digits` significant digits and at least one decimal: 0.0184, 1.53, 12.3, 400.0 (as .1f, a CPU cell's
    0.02 TFLOP/s read 0.0)."""
    if not pd.notna(v):
        return ""
    if v == 0:
        return "0.0"
    decimals = max(1, digits - 1 - math.floor(math.log10(abs(v))))
    return f"{v:,.{decimals}f}"


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


def sharing_note(row) -> str:
    """The Results table's mark on a throughput measured while the cell shared its GPU."""
    shared = row.get("gpu_shared_cells_per_gpu")
    if row.get("status") != "ok" or not pd.notna(shared) or not shared:
        return ""
    return (f"throughput measured on a GPU shared with up to {int(shared) - 1} other untimed cells (no claim reads "
            "it; verify does not compare it)")


def results_table(summary: dict) -> pd.DataFrame:
    frame = cells_frame(summary)
    reasons = ["; ".join(part for part in (row["reason"] if isinstance(row["reason"], str) else "", timing_note(row),
                                           sharing_note(row))
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
        "TFLOP/s": _column(frame, "achieved_tflops").map(_fmt_significant),
        "MFU measured peak": _column(frame, "mfu_vs_measured_peak").map(lambda v: _fmt_num(v, ".1%")),
        "MFU datasheet": _column(frame, "mfu_vs_datasheet").map(lambda v: _fmt_num(v, ".1%")),
        "reason": reasons,
    })


def _column(frame: pd.DataFrame, name: str) -> pd.Series:
    """A summary column, or an empty one for summaries written before it existed (older fixtures, references)."""
    return frame[name] if name in frame else pd.Series([None] * len(frame), index=frame.index, dtype=float)


# ----------------------------------------------------------------------------------------------------------------------
# Where the allocator peak goes (the 7B cells), and their derived epoch time

# summary.csv columns of a cell that records how its allocator peak splits (the 7B cells do), in stacking order.
MEMORY_PARTS = {"mem_weights_bytes": "weights", "mem_gradients_bytes": "gradients",
                "mem_optimizer_state_bytes": "optimizer state", "mem_master_weights_bytes": "FP32 master weights",
                "mem_activations_bytes": "activations and workspace"}
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
    path = CellId(str(row["model"]), str(row["precision"]), int(row["seed"])).under(runs_dir or "") / "metrics.json"
    if runs_dir and path.exists():
        value = read_json(str(path)).get("epoch_tokens")
        return int(value) if value else None
    return None


def breakdown_frame(table: str, runs_dir: str | None = None) -> pd.DataFrame:
    """The cells of the models that estimate their memory before allocating and record how the allocator's peak split
    (the 7B cells on a GPU), one row each, with the token count of their derived epoch time. A CPU run's cells make
    the estimate but have no allocator peak to split: their rows were empty tables and charts (issue 41)."""
    frame = pd.read_csv(table)
    if ESTIMATE_COLUMN not in frame:
        return pd.DataFrame()
    split = frame[[c for c in MEMORY_PARTS if c in frame]].notna().any(axis=1)
    estimating = set(frame.loc[frame[ESTIMATE_COLUMN].notna() & split, "model"])
    frame = frame[frame["model"].isin(estimating)].copy()
    if frame.empty:
        return frame
    frame["epoch_tokens"] = [_epoch_tokens(row, runs_dir) for _, row in frame.iterrows()]
    frame["precision"] = pd.Categorical(frame["precision"], precisions.names(), ordered=True)
    return frame.sort_values(["model", "precision", "seed"]).reset_index(drop=True)


def gib_cell(value) -> str:
    """A table cell in GiB under a header that names the unit (amprepro.memory.gib writes a value with its unit)."""
    return f"{value / GIB:,.1f}" if pd.notna(value) else ""


def parts_here(frame: pd.DataFrame) -> list[str]:
    return [c for c in MEMORY_PARTS if c in frame and frame[c].notna().any()]


def epoch_header(frame: pd.DataFrame) -> tuple[str, bool]:
    """The epoch column's title, and whether it states the one token count every row shares."""
    counts = set(frame.loc[frame[EPOCH_COLUMN].notna(), "epoch_tokens"].dropna()) if EPOCH_COLUMN in frame else set()
    if len(counts) == 1:
        return f"epoch time (h), derived from tokens/s for {int(next(iter(counts))):,} tokens", True
    return "epoch time (h), derived from tokens/s", False


def epoch_cell(row, shared: bool) -> str:
    hours = row.get(EPOCH_COLUMN)
    if pd.isna(hours):
        return ""
    if pd.isna(row.get("epoch_tokens")):
        return ""  # an epoch time whose token count is not recorded cannot be labelled: left out (the reason says so)
    return f"{hours:,.2f}" if shared else f"{hours:,.2f} for {int(row['epoch_tokens']):,} tokens"


def breakdown_reason(row) -> str:
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
    text = (f"In strict FP32 here, {named} take {gib_cell(fixed)} GiB of the "
            f"{gib_cell(row['peak_allocated_bytes'])} GiB allocator peak ({fixed / row['peak_allocated_bytes']:.0%})")
    if pd.notna(row.get("mem_activations_bytes")):
        text += f"; activations and workspace {gib_cell(row['mem_activations_bytes'])} GiB"
    return text + "."


def read_steps(runs_dir: str, model: str, precision: str, seed: int) -> pd.DataFrame | None:
    path = CellId(model, precision, seed).under(runs_dir) / "steps.csv"
    if not path.exists() or path.stat().st_size == 0:
        return None
    frame = pd.read_csv(path)
    return frame if not frame.empty else None


def steps_by_precision(summary: dict, runs_dir: str, model: str, column: str) -> dict:
    """precision -> DataFrame(step x seed) of one column of steps.csv, for the ok cells of one model."""
    frame = ok_cells(summary)
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


def breakdown_table(sub: pd.DataFrame) -> dict:
    """One model's breakdown table: its columns (key, header), a row of text per cell, and which columns are numbers."""
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
                     "row_class": f"status-{row['status']}",
                     "peak": gib_cell(row.get("peak_allocated_bytes")), **{c: gib_cell(row[c]) for c in parts},
                     "estimate": gib_cell(row.get(ESTIMATE_COLUMN)),
                     "throughput": (f"{row['throughput_per_s']:,.0f} {unit}".strip()
                                    if pd.notna(row.get("throughput_per_s")) else ""),
                     "epoch": epoch_cell(row, shared), "reason": breakdown_reason(row)})
    return {"columns": columns, "rows": rows, "numeric": {"seed", "peak", "estimate", "throughput", "epoch", *parts}}


# ----------------------------------------------------------------------------------------------------------------------
# Sanity, environment, provenance


def sanity_table(sanity: dict) -> pd.DataFrame:
    frame = pd.DataFrame(sanity["checks"])
    return frame[["name", "status", "required", "detail", "fix"]]


def environment_table(env: dict) -> pd.DataFrame:
    """The environment record as item / value rows; what a CPU-only torch build lacks is said, not left blank."""
    torch = env.get("torch", {})
    platform = env.get("platform", {})
    isolation = env.get("isolation", {})
    if not isolation.get("isolated", True) and isolation.get("project_venv"):
        route = (f"the project's venv ({isolation.get('prefix')}: the pinned requirements*.txt, installed by make), "
                 "not a pinned conda env")
    else:
        route = isolation.get("message")
    no_gpu = "none (no CUDA GPU)" if torch.get("cuda") else "none (a CPU-only torch build)"
    version = torch.get("version") or f"not importable ({torch.get('error') or 'no torch'})"
    rows = [("Python", env.get("python", {}).get("version")),
            ("Platform", f"{platform.get('system')} {platform.get('release')} {platform.get('machine')}"),
            ("CPU cores", platform.get("cpu_count")), ("Environment", route),
            ("torch", version), ("torch CUDA", torch.get("cuda") or "none (a CPU-only torch build)"),
            ("cuDNN", torch.get("cudnn") or no_gpu), ("NCCL", torch.get("nccl") or no_gpu),
            ("Packages recorded", len(env.get("packages", {})))]
    return pd.DataFrame(rows, columns=["item", "value"])


def _sha256(path: str | None) -> str:
    if not path or not Path(path).exists():
        return "n/a"
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def provenance_table(data: dict) -> pd.DataFrame:
    versions, preset = data["summary"]["versions"], data["summary"]["preset"]
    env = data["environment"]
    verify = data.get("verify") or {}
    reference = verify.get("reference") or {}
    rows = [("pipeline commit", describe_commit()), ("config sha256", preset.get("config_sha256")),
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

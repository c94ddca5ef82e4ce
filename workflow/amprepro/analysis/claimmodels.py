"""One claim on one model against one baseline: the per-seed values, their median and spread and the verdict
(evaluate_model); the verdict over several models (aggregate: the worst of theirs); and the words both are said in.
amprepro.analysis.claims evaluates whole claims with these."""

from __future__ import annotations

import statistics

from amprepro.analysis.claimmetrics import (
    band_side,
    claimed_text,
    decided_value,
    fmt_range,
    fmt_value,
    metric_bounds,
    verdict_for,
)
from amprepro.cellid import CellId

# not_settled: the cells ran and the paired statistics were computed, but the 95 % interval straddles the claim's
# margin (more seeds would settle it). nothing_to_rescue: a remedy claim whose risk cells ran and were not harmed here,
# so the remedy had nothing to rescue. Both differ from not_measurable: that one means the cells could not run here.
VERDICT_TEXT = {"holds": "holds", "exceeds": "exceeds the claim", "falls_short": "falls short",
                "depends_on_baseline": "depends on the baseline", "not_settled": "not settled by these seeds",
                "nothing_to_rescue": "nothing to rescue here", "not_measurable": "not measurable here"}
# A generic claim's verdict over several models is the worst of theirs, in this order (first = worst).
WORST_FIRST = ["falls_short", "exceeds", "holds"]

def run_context(summary: dict) -> str:
    """'smoke preset on CPU' / 'paper preset on NVIDIA H200'."""
    preset = summary.get("preset", {}).get("preset", "?")
    gpu = summary.get("versions", {}).get("gpu")
    return f"{preset} preset on {gpu or 'CPU'}"


def _index(summary: dict) -> dict:
    return {CellId.of(c): c for c in summary.get("cells", [])}


def _has(cells: dict, model: str, precision: str) -> bool:
    """The summary has a row (of any status) of this model at this precision."""
    return any(c.model == model and c.precision == precision for c in cells)


def _stats(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n_seeds": len(values)}


def evaluate_model(claim: dict, cells: dict, model: str, baseline: str) -> dict:
    """One model against one baseline: the per-seed values, their median and spread, and the verdict."""
    variant, metric = claim["variant"], claim["metric"]
    seeds = sorted({c.seed for c in cells if c.model == model and c.precision in (variant, baseline)})
    out = {"model": model, "baseline": baseline, "variant": variant, "values": {}, "verdict": "not_measurable",
           "reason": ""}
    var = {s: cells.get(CellId(model, variant, s)) for s in seeds}
    base = {s: cells.get(CellId(model, baseline, s)) for s in seeds}
    var_rows = [r for r in var.values() if r]
    base_rows = [r for r in base.values() if r]
    if not var_rows:
        out["reason"] = f"no {model}/{variant} cell in this run"
        return out
    collapsed = [r for r in var_rows if r["status"] == "collapsed"]
    if collapsed:
        step = collapsed[0].get("first_nonfinite_step")
        out.update(verdict="falls_short", reason=f"{model}/{variant} collapsed (non-finite loss"
                   + (f" at step {step}" if step is not None else "") + f", seed {collapsed[0]['seed']})")
        return out
    if not base_rows:
        out["reason"] = f"no {model}/{baseline} cell in this run"
        return out
    for rows, name in ((var_rows, variant), (base_rows, baseline)):
        if all(r["status"] != "ok" for r in rows):
            bad = rows[0]
            out["reason"] = f"{model}/{name} {bad['status']}: {bad.get('reason') or 'no reason recorded'}"
            return out
    shared = [r for r in var_rows + base_rows if r.get("gpu_shared_cells_per_gpu")]
    if metric == "speedup" and shared:  # amprepro.plan.resources.shares_gpu keeps every judged speed off these
        out["reason"] = (f"{shared[0]['model']}/{shared[0]['precision']} ran on a GPU shared with other untimed cells: "
                         "its throughput is not a speed measurement")
        return out
    why = ""
    for seed in seeds:
        v, b = var.get(seed), base.get(seed)
        if v and b and v["status"] == "ok" and b["status"] == "ok":
            low, high, why_not = metric_bounds(metric, v, b)
            value = None if low is None else decided_value(claim, low, high)
            if low is not None and value is None:
                why_not = (f"from {fmt_range(metric, low, high)} (seed {seed}), which straddles the claim's "
                           f"{claimed_text(claim)}: the searches did not narrow it enough")
            if value is None:
                why = why or why_not
            else:
                out["values"][seed] = value
                if low != high:
                    out.setdefault("bounds", {})[seed] = [low, high]
    if not out["values"]:
        out["reason"] = why or f"no seed where both {model}/{variant} and {model}/{baseline} ran"
        return out
    stats = _stats(list(out["values"].values()))
    out.update(stats)
    out["verdict"] = verdict_for(claim, stats["median"])
    out["borderline"] = len({verdict_for(claim, stats[k]) for k in ("min", "median", "max")}) > 1
    out["setting"] = setting_text(var_rows[0])
    out["measured_text"] = (measured_text(metric, stats) + bounds_text(metric, out.get("bounds"))
                            + (f" [{out['setting']}]" if out["setting"] else ""))
    out["reason"] = (f"{model}: {out['measured_text']}"
                     + ("" if out["verdict"] == "holds" else f", {band_side(claim, stats['median'])}")
                     + (" (the spread straddles the band edge)" if out["borderline"] else ""))
    return out


def setting_text(row: dict) -> str:
    """Where the memory plan ran this model at another batch or LLaMA shape than the preset's, which and why
    (amprepro.plan.memplan); empty where it ran as the preset says."""
    note = row.get("plan_note") or ""
    if row.get("shape_name"):  # the plan's note names the shape and its parameters
        return f"at the {note}" if note else f"at the {row['shape_name']} shape"
    batch, preset = row.get("batch_size"), row.get("preset_batch_size")
    if batch is not None and preset is not None and batch != preset:
        return f"at batch {batch}: {note}"
    return ""


def bounds_text(metric: str, bounds: dict | None) -> str:
    """' (bounded: 1.41× to unbounded)' where a seed's value stands for an interval its searches left
    (claimmetrics.decided_value)."""
    if not bounds:
        return ""
    return " (bounded: " + "; ".join(f"{fmt_range(metric, low, high)}" for low, high in bounds.values()) + ")"


def measured_text(metric: str, stats: dict) -> str:
    text = fmt_value(metric, stats["median"])
    if stats["n_seeds"] > 1:
        text += (f" (min–max {fmt_value(metric, stats['min'])} to {fmt_value(metric, stats['max'])}, "
                 f"{stats['n_seeds']} seeds)")
    else:
        text += " (1 seed)"
    return text


def _grouped_reasons(rows: list[dict]) -> str:
    """'amp_fp16 skipped: no CUDA GPU here (cnn, transformer)' rather than the same reason once per model."""
    groups: dict[str, list[str]] = {}
    for r in rows:
        why = r["reason"].removeprefix(f"{r['model']}/")
        groups.setdefault(why, []).append(r["model"])
    if len(groups) == 1 and len(rows) == 1:
        return rows[0]["reason"]
    return "; ".join(f"{why} ({', '.join(models)})" for why, models in groups.items())


def aggregate(per_model: list[dict]) -> dict:
    measurable = [r for r in per_model if r["verdict"] != "not_measurable"]
    if not measurable:
        return {"verdict": "not_measurable", "reason": _grouped_reasons(per_model)}
    verdicts = {r["verdict"] for r in measurable}
    verdict = next(v for v in WORST_FIRST if v in verdicts)
    reason = "; ".join(r["reason"] for r in measurable)
    if len(verdicts) > 1:
        split = "; ".join(f"{VERDICT_TEXT[v]} for {', '.join(r['model'] for r in measurable if r['verdict'] == v)}"
                          for v in reversed(WORST_FIRST) if v in verdicts)
        reason = f"{split} (of {len(measurable)} models): " + reason
    missing = [r for r in per_model if r["verdict"] == "not_measurable"]
    if missing:
        reason += "; not measured: " + _grouped_reasons(missing)
    return {"verdict": verdict, "reason": reason}

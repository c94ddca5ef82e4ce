"""One cell of this run against the reference's aggregate: each metric against its band, the cell's verdict, and the
counts and warnings over all cells (amprepro.verify.verify runs the whole check and writes it)."""

from __future__ import annotations

from amprepro.cellid import CellId
from amprepro.cellspec import PLANNED_KEYS  # what the memory plan may change
from amprepro.verify.reference import STEP_COUNT_FREE, band, band_for, counts_key, differs_only_in_step_counts

METRIC_LABEL = {"throughput_per_s": "throughput", "peak_allocated_bytes": "peak GPU memory",
                "peak_reserved_bytes": "peak reserved GPU memory", "final_loss": "final loss",
                "eval_accuracy": "eval accuracy", "step_time_median_s": "median step time",
                "speedup_vs_fp32": "speedup vs strict FP32", "speedup_vs_tf32": "speedup vs TF32",
                "memory_ratio_vs_fp32": "memory ratio vs FP32"}
VERDICTS = ("pass", "fail", "not_comparable_here", "not_comparable", "not_in_reference", "not_run_here")


def _spec_diff(here: dict, ref: dict, prefix: str = "") -> list[str]:
    diffs = []
    for key in sorted(set(here) | set(ref)):
        a, b = here.get(key), ref.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            diffs += _spec_diff(a, b, f"{prefix}{key}.")
        elif a != b:
            diffs.append(f"{prefix}{key} {b!r} in the reference, {a!r} here")
    return diffs



def planned_difference(spec_here: dict, spec_ref: dict, plan: dict | None) -> str | None:
    """'planned batch 64, reference 256' when the memory plan, not the user, made this cell differ from the reference
    (the preset's batch or shape lowered to fit this GPU); None when the settings differ otherwise."""
    if not plan or plan.get("source") != "preset":
        return None
    here, ref = dict(spec_here.get("model_config") or {}), dict(spec_ref.get("model_config") or {})
    changed = [k for k in PLANNED_KEYS if here.get(k) != ref.get(k)]
    for key in PLANNED_KEYS:
        here.pop(key, None)
        ref.pop(key, None)
    if not changed or here != ref or {k: v for k, v in spec_here.items() if k != "model_config"} != {
            k: v for k, v in spec_ref.items() if k != "model_config"}:
        return None
    parts = []
    if "shape" in changed:
        parts.append(f"planned shape {plan.get('shape_name') or spec_here['model_config'].get('shape')}, reference "
                     f"{spec_ref['model_config'].get('shape') or 'the 7B'}")
    if "batch_size" in changed:
        parts.append(f"planned batch {spec_here['model_config'].get('batch_size')}, reference "
                     f"{spec_ref['model_config'].get('batch_size')}")
    return ", ".join(parts)


def summary_difference(row_here: dict, spec_ref: dict) -> list[str]:
    """Where this run's settings are not at hand (no runs folder given), the planned settings its summary row records
    (batch_size, shape) against the reference's, so a lowered batch or a smaller shape is not compared as if equal."""
    here = {key: row_here[key] or None for key in PLANNED_KEYS if key in row_here}
    if here.get("batch_size") is not None:
        here["batch_size"] = int(here["batch_size"])  # summary.csv's text
    ref_config = spec_ref.get("model_config") or {}
    return _spec_diff({"model_config": here}, {"model_config": {key: ref_config.get(key) for key in here}})


def _fmt(metric: str, value) -> str:
    if value is None:
        return "n/a"
    if metric.endswith("_bytes"):
        return f"{value / 2**30:.2f} GiB"
    if metric == "throughput_per_s":
        return f"{value:,.1f}/s"
    if metric.endswith("_s"):
        return f"{value * 1000:.2f} ms"
    return f"{value:.4g}"


def check_metric(metric: str, rule: dict, here, stats: dict | None) -> dict:
    """This run's value against the band around the reference median (stats: median, min, max, n of the runs)."""
    ref = stats["median"] if stats else None
    out = {"metric": metric, "here": here, "reference": ref, "ratio": None, "ok": None, "allowed": "", "note": "",
           "reference_runs": stats["n"] if stats else 0}
    if here is None or ref is None:
        out["note"] = "not recorded " + ("here" if here is None else "in the reference")
        return out
    out["reference_min"], out["reference_max"] = stats["min"], stats["max"]
    width = band(rule, stats)
    out["band"] = width
    half = width["half_width"]
    if ref:
        out["ratio"] = here / ref
        out["deviation_pct"] = (here / ref - 1) * 100
    if width["kind"] == "relative":
        out["allowed"] = f"{1 - half:.3g}–{1 + half:.3g}× reference median ({width['why']})"
        if not ref:
            out.update(ok=here == ref, note="reference value is 0")
            return out
        out["band_ratio"] = [1 - half, 1 + half]
        out["ok"] = 1 - half - 1e-12 <= out["ratio"] <= 1 + half + 1e-12
        if not out["ok"]:
            edge = 1 - half if out["ratio"] < 1 - half else 1 + half
            out["outside_pct"] = (out["ratio"] - edge) / edge * 100
        return out
    diff = here - ref
    out["allowed"] = f"±{half:.4g} around the reference median ({width['why']})"
    out["deviation_abs"] = diff
    out["ok"] = abs(diff) <= half + 1e-12
    if ref:
        out["band_ratio"] = [(ref - half) / ref, (ref + half) / ref]
    return out


def describe_failure(key: str, check: dict) -> str:
    metric = check["metric"]
    label = METRIC_LABEL.get(metric, metric)
    text = f"{key}: {label} {_fmt(metric, check['here'])} vs reference median {_fmt(metric, check['reference'])}"
    if check["reference_runs"] > 1:
        text += (f" (runs {_fmt(metric, check.get('reference_min'))}–{_fmt(metric, check.get('reference_max'))}, "
                 f"n={check['reference_runs']})")
    if check.get("ratio") is not None:
        text += f" = {check['ratio']:.3f}× ({check['deviation_pct']:+.1f} %"
        if check.get("outside_pct") is not None:
            text += f", {abs(check['outside_pct']):.1f} % {'below' if check['outside_pct'] < 0 else 'above'} the band"
        text += ")"
    if check.get("deviation_abs") is not None:
        text += f" (difference {check['deviation_abs']:+.4g})"
    return text + f"; allowed {check['allowed']}"


BUSY_NOTE_CPUS = 1.0  # other processes' CPUs during a cell's timed steps from which a timing failure says so


def busy_note(busy) -> str:
    """A timing failure's context: the CPUs other processes kept busy while the cell was timed (its host_load)."""
    try:
        busy = float(busy)
    except (TypeError, ValueError):
        return ""
    if busy < BUSY_NOTE_CPUS:
        return ""
    return (f"; measured while other processes kept {busy:.1f} CPUs busy (the cell's host_load, its own ranks left "
            "out): a compile or other cells beside a host-bound cell slow it; on a quiet machine it may pass")


UNEVEN_NOTE_MARGIN = 0.05  # how far a cell's p90 over its median step time must exceed the reference's for the note


def step_spread(p90, median) -> float | None:
    """p90 over the median step time: 1.0 for identical steps; None where either is missing."""
    try:
        return float(p90) / float(median)
    except (TypeError, ValueError, ZeroDivisionError):
        return None


def uneven_note(check: dict, row: dict, row_ref: dict) -> str:
    """A slow timing failure's context: timed steps further apart than the reference runs' (the summary row's p90 over
    its median step time, against the same over the reference medians; 1.0 where the reference has none), by
    UNEVEN_NOTE_MARGIN or more. Most cells' are within 1-2 %, some models' always far apart (the launch-bound risk
    models: 1.15-1.42), hence the reference's own. llama7b/apex_o1 at 2 + 4 steps on an H100 had 1.077 against about
    1.00 (results-reference/perf/9d8afa1-h100/). Not for a cell faster than its band: slow steps did not do that."""
    slow = (check["metric"] == "throughput_per_s" and (check.get("ratio") or 1) < 1) or (
        check["metric"] == "step_time_median_s" and (check.get("ratio") or 1) > 1)
    spread = step_spread(row.get("step_time_p90_s"), row.get("step_time_median_s"))
    if not slow or spread is None:
        return ""
    metrics = (row_ref or {}).get("metrics") or {}
    usual = step_spread((metrics.get("step_time_p90_s") or {}).get("median"),
                        (metrics.get("step_time_median_s") or {}).get("median")) or 1.0
    if spread < usual + UNEVEN_NOTE_MARGIN:
        return ""
    return (f"; its timed steps were uneven (the slowest tenth {(spread - 1) * 100:.1f} % above their median, "
            f"{(usual - 1) * 100:.1f} % in the reference): not yet steady, or something else ran on its GPU; a run "
            "again may pass")


# Measured while the cell shared its GPU with other untimed cells (amprepro.plan.resources.shares_gpu): they depend on
# what else ran then, so they are not compared; the loss, accuracy and allocator peak (per process) still are.
SHARING_METRICS = ("throughput_per_s", "step_time_median_s", "energy_j_per_item")
SHARED_NOTE = "not compared: measured on a GPU shared with other untimed cells"
STEP_COUNTS_NOTE = "not compared: the reference ran"  # the start of step_counts_note's text, which the warning counts


def _machine_skip(row: dict | None) -> bool:
    return bool(row) and row.get("status") == "skipped" and row.get("skip_cause") == "machine"


def compare_cell(name: str, row_here: dict | None, row_ref: dict | None, rules: dict, spec_here, spec_ref,
                 plan_here: dict | None = None) -> dict:
    """One cell's verdict and checks; the verdicts are VERDICTS."""
    statuses = (row_ref or {}).get("statuses") or {}
    cell = {"model": (row_here or row_ref)["model"], "precision": (row_here or row_ref)["precision"],
            "seed": int((row_here or row_ref)["seed"]), "cell": name,
            "status_here": row_here and row_here["status"], "status_reference": row_ref and row_ref["status"],
            "reference_runs": (row_ref or {}).get("n_runs", 0),
            "reference_machines": (row_ref or {}).get("n_machines", 0),
            "checks": [], "verdict": "pass", "note": ""}
    if row_ref is None:
        return {**cell, "verdict": "not_in_reference", "note": "the reference has no such cell"}
    if row_here is None:
        return {**cell, "verdict": "not_run_here", "note": "in the reference, not in this run's matrix"}
    if not row_ref.get("n_runs") and row_ref.get("status") == "failed":
        if row_here["status"] == "failed":  # raised here too: still a bug, whatever the reference says
            return {**cell, "verdict": "fail",
                    "note": f"failed here and in every reference run: {row_here.get('reason')}"}
        return {**cell, "verdict": "not_in_reference",
                "note": "every reference run failed this cell, so there is nothing to compare: "
                        f"{row_ref.get('reason')}"}
    # Only the number of steps differs (this run's spec, else its summary row's step columns): speed and memory are
    # compared, the loss after the last step is not.
    counts_here = step_counts_of(spec_here) if spec_here else summary_step_counts(row_here)
    counts_differ = bool(spec_ref and counts_here and counts_here != step_counts_of(spec_ref)
                         and (not spec_here or differs_only_in_step_counts(spec_here, spec_ref)))
    if spec_here and spec_ref and spec_here != spec_ref and not counts_differ:
        planned = planned_difference(spec_here, spec_ref, plan_here)
        if planned:
            return {**cell, "verdict": "not_comparable_here",
                    "note": f"not comparable here ({planned}): {plan_here.get('why')}"}
        return {**cell, "verdict": "not_comparable", "note": "settings differ: " + "; ".join(_spec_diff(spec_here,
                                                                                                       spec_ref))}
    differs = summary_difference(row_here, spec_ref) if not spec_here and spec_ref else []
    if differs:
        return {**cell, "verdict": "not_comparable", "note": "settings differ (this run's summary; give its runs "
                "folder for every setting): " + "; ".join(differs)}
    # A machine skip on either side is never a compared cell, whatever the other side did: were "skipped" on both
    # sides a status match (a pass), a capped card whose reference skipped the same cells would get a PASS about
    # nothing.
    if _machine_skip(row_here):
        return {**cell, "verdict": "not_comparable_here",
                "note": f"this machine cannot run it: {row_here.get('reason') or row_here.get('skip_needs')}"}
    if _machine_skip(row_ref):
        return {**cell, "verdict": "not_comparable_here",
                "note": f"no reference machine could run it: {row_ref.get('reason')}"}
    if row_here["status"] not in (statuses or {row_ref["status"]: 1}):
        why = row_here.get("reason") or row_ref.get("reason") or ""
        observed = ", ".join(f"{n} {status}" for status, n in statuses.items()) or row_ref["status"]
        return {**cell, "verdict": "fail", "note": f"status {row_here['status']} here, {observed} in the reference"
                + (f" ({why})" if why else "")}
    if row_here["status"] != "ok":
        return {**cell, "note": f"{row_here['status']} here and in the reference"}
    if len(statuses) > 1:
        cell["note"] = "the reference runs disagree on this cell's status: " + ", ".join(
            f"{n} {status}" for status, n in statuses.items())
    for metric, rule in rules.items():
        if metric in SHARING_METRICS and row_here.get("gpu_shared_cells_per_gpu"):
            cell["checks"].append({"metric": metric, "here": row_here.get(metric), "reference": None, "ratio": None,
                                   "ok": None, "allowed": "", "note": SHARED_NOTE, "reference_runs": 0})
            continue
        stats, at_counts = row_ref.get("metrics", {}).get(metric), None
        if counts_differ and metric not in STEP_COUNT_FREE:
            at_counts = (row_ref.get("by_step_counts") or {}).get(counts_key(*counts_here))
            if at_counts is None:  # no reference run ran this run's counts
                cell["checks"].append({"metric": metric, "here": row_here.get(metric), "reference": None,
                                       "ratio": None, "ok": None, "allowed": "",
                                       "note": step_counts_note(counts_here, step_counts_of(spec_ref)),
                                       "reference_runs": 0})
                continue
            stats = at_counts["metrics"].get(metric)
        check = check_metric(metric, rule, row_here.get(metric), stats)
        if at_counts is not None:
            where = (f"the reference's {len(at_counts['runs'])} run(s) at this run's step counts "
                     f"({counts_key(*counts_here)}), not its newest runs'")
            check["note"] = f"{check['note']} ({where})" if check["note"] else f"against {where}"
        cell["checks"].append(check)
        if check["ok"] is False:
            cell["verdict"] = "fail"
    return cell


def step_counts_of(spec: dict) -> tuple:
    train = spec.get("train") or {}
    return train.get("steps"), train.get("warmup_steps")


def summary_step_counts(row: dict | None) -> tuple | None:
    """(steps, warm-up steps) a summary row says its cell ran; None for a row without them (summaries before
    2026-12-04's steps columns) or without a cell."""
    if not row or row.get("steps") in (None, "") or row.get("warmup_steps") in (None, ""):
        return None
    return int(row["steps"]), int(row["warmup_steps"])


def step_counts_note(here: tuple, ref: tuple) -> str:
    """Why a step-count-bound metric (the loss after the last step, the accuracy) is not compared: the reference's
    newest runs ran this cell for another number of steps, and none of its runs for this run's; speed and memory are
    compared (reference.STEP_COUNT_FREE)."""
    def counts(steps, warmup):
        return f"{warmup} warm-up + {steps - warmup} timed"

    return (f"{STEP_COUNTS_NOTE} {counts(*ref)} steps, this run {counts(*here)}, which none of its runs ran (speed and "
            "memory are compared)")


def compare(summary: dict, aggregate: dict, tolerances: dict, specs_here: dict | None = None,
            plans_here: dict | None = None) -> dict:
    """Per-cell comparison with the aggregate. Returns cells, failures (the cells out of tolerance) and warnings."""
    specs_here, plans_here = specs_here or {}, plans_here or {}
    # keyed as the reference's files key cells (CellId.reference_key), which the aggregate and the specs are
    here = {CellId.of(c).reference_key: c for c in summary.get("cells", [])}
    ref = aggregate.get("cells", {})
    cells, failures = [], []
    for key in list(here) + [k for k in ref if k not in here]:
        cell_id = CellId.from_key(key)
        name = cell_id.key
        rules = band_for(tolerances, {"model": cell_id.model, "precision": cell_id.precision, "seed": cell_id.seed})
        cell = compare_cell(name, here.get(key), ref.get(key), rules, specs_here.get(key),
                            (ref.get(key) or {}).get("spec"), plans_here.get(key))
        cells.append(cell)
        if cell["verdict"] == "fail":
            row = here.get(key) or {}
            busy = busy_note(row.get("host_busy_cpus"))
            failed = [describe_failure(name, ch) + (busy + uneven_note(ch, row, ref.get(key))
                                                    if ch["metric"] in SHARING_METRICS else "")
                      for ch in cell["checks"] if ch["ok"] is False]
            failures += failed or [f"{name}: {cell['note']}"]
    counts = {v: sum(c["verdict"] == v for c in cells) for v in VERDICTS}
    return {"cells": cells, "failures": failures, "warnings": comparison_warnings(cells, counts), "counts": counts}


def comparison_warnings(cells: list[dict], counts: dict) -> list[str]:
    warnings = []
    if counts["not_comparable_here"]:
        listed = "; ".join(f"{c['cell']} ({c['note']})" for c in cells if c["verdict"] == "not_comparable_here")
        warnings.append(f"{counts['not_comparable_here']} cell(s) not comparable here, not counted as failures: "
                        + listed)
    if counts["not_comparable"]:
        warnings.append(f"{counts['not_comparable']} cell(s) not compared: their settings differ from the reference's")
    by_counts = sum(any(ch.get("note", "").startswith(STEP_COUNTS_NOTE)
                        for ch in c.get("checks", ())) for c in cells)
    if by_counts:
        warnings.append(f"{by_counts} cell(s) compared on speed and memory only: the reference has no run at their "
                        "step counts, so their final loss is not compared (promote this run to add it)")
    if counts["not_in_reference"]:
        warnings.append(f"{counts['not_in_reference']} cell(s) of this run are not in the reference")
    if counts["not_run_here"]:
        warnings.append(f"{counts['not_run_here']} reference cell(s) did not run here")
    return warnings

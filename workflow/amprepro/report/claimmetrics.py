"""A claim's metric and band: the value one seed's pair of cells gives, the claimed band, the verdict for a value
and how values and bands are written (speedups as 1.23×, memory as a change in %, accuracy in percentage points)."""

from __future__ import annotations

# Which side of the claimed band is better for the variant, per metric: more speed, a bigger memory saving and a
# higher accuracy are all better, so a value above the band exceeds the claim and one below it falls short.
HIGHER_IS_BETTER = {"speedup": True, "memory_reduction": True, "accuracy_delta": True, "batch_ratio": True}
EPS = 1e-9



def _peak_gpu(row):
    return row.get("peak_allocated_bytes")


def metric_value(metric: str, variant: dict, baseline: dict) -> tuple[float | None, str]:
    """(value, why-not) for one seed's pair of cells."""
    if metric == "speedup":
        v, b = variant.get("throughput_per_s"), baseline.get("throughput_per_s")
        if not v or not b:
            return None, "no throughput recorded"
        return v / b, ""
    if metric == "memory_reduction":
        v, b = _peak_gpu(variant), _peak_gpu(baseline)
        if not v or not b:
            if variant.get("peak_rss_bytes") or baseline.get("peak_rss_bytes"):
                return None, ("peak memory here is the CPU process RSS, not the GPU allocator peak the claim is "
                              "about")
            return None, "no peak memory recorded"
        return 1.0 - v / b, ""
    if metric == "accuracy_delta":
        v, b = variant.get("eval_accuracy"), baseline.get("eval_accuracy")
        if v is None or b is None:
            return None, f"no eval accuracy: {variant['model']} trains on synthetic tensors here (throughput only)"
        return v - b, ""
    if metric == "batch_ratio":
        return batch_ratio(variant, baseline)
    raise ValueError(f"unknown metric {metric}")


def batch_ratio(variant: dict, baseline: dict) -> tuple[float | None, str]:
    """Largest batch (amprepro.train.batchsearch) of the variant over the baseline's. The baseline's must be exact;
    the variant's may be capped (it fits at the search's cap: the ratio is then a lower bound)."""
    v, b = variant.get("largest_batch"), baseline.get("largest_batch")
    if not v or not b:
        return None, (f"no largest-batch search for {variant['model']} here (runs.largest_batch.models; it runs on "
                      "a GPU, after the cells)")
    if baseline.get("largest_batch_bound") != "exact":
        return None, (f"the {baseline['precision']} search ended {baseline.get('largest_batch_bound')} at {b}: its "
                      "largest batch is not known, so no ratio")
    if variant.get("largest_batch_bound") not in ("exact", "capped"):
        return None, (f"the {variant['precision']} search ended {variant.get('largest_batch_bound')} at {v} (its "
                      "time ran out): no ratio")
    return v / b, ""


def fmt_value(metric: str, value: float | None) -> str:
    if value is None:
        return "n/a"
    if metric == "speedup":
        return f"{value:.2f}×"
    if metric == "memory_reduction":
        return f"{-value * 100:+.1f} %".replace("-", "−")
    if metric == "accuracy_delta":
        return f"{value * 100:+.2f} pp".replace("-", "−")
    if metric == "batch_ratio":
        return f"{value:.2f}× the batch"
    return f"{value:.3g}"


def fmt_range(metric: str, low: float, high: float) -> str:
    """A band in display order (memory reductions shown as negative changes, smaller magnitude first)."""
    return f"{fmt_value(metric, low)} to {fmt_value(metric, high)}"


def claimed_band(claim: dict) -> tuple[float, float]:
    """The accepted interval [low, high] for the measured value (infinite where the claim is one-sided)."""
    c, tol = claim["claimed"], claim["tolerance"]
    if "about" in c:
        return c["about"] - tol, c["about"] + tol
    if "at_least" in c:
        return c["at_least"] - tol, float("inf")
    if "at_most" in c:
        return float("-inf"), c["at_most"] + tol
    low, high = c["between"]
    return low - tol, high + tol


def claimed_text(claim: dict) -> str:
    c, metric, tol = claim["claimed"], claim["metric"], claim["tolerance"]
    low, high = claimed_band(claim)
    if "about" in c:
        return f"about {fmt_value(metric, c['about'])} (accepted {fmt_range(metric, low, high)})"
    if "at_least" in c:
        return (f"at least {fmt_value(metric, c['at_least'])}"
                + (f" (accepted from {fmt_value(metric, low)})" if tol else ""))
    if "at_most" in c:
        return (f"at most {fmt_value(metric, c['at_most'])}"
                + (f" (accepted to {fmt_value(metric, high)})" if tol else ""))
    return (f"{fmt_range(metric, *c['between'])}"
            + (f" (accepted {fmt_range(metric, low, high)})" if tol else ""))


def in_band(claim: dict, value: float) -> bool:
    low, high = claimed_band(claim)
    return low - EPS <= value <= high + EPS


def verdict_for(claim: dict, value: float) -> str:
    """holds (in the band), exceeds (outside it on the better side) or falls_short (outside it on the worse side)."""
    if in_band(claim, value):
        return "holds"
    above = value > claimed_band(claim)[1]
    return "exceeds" if above == HIGHER_IS_BETTER[claim["metric"]] else "falls_short"


def band_side(claim: dict, value: float) -> str:
    low, high = claimed_band(claim)
    return "above the claimed band" if value > high else "below the claimed band" if value < low else "in the band"

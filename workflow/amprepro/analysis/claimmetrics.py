"""A claim's metric and band: the value one seed's pair of cells gives, the claimed band, the verdict for a value
and how values and bands are written (speedups as 1.23×, memory as a change in %, accuracy in percentage points)."""

from __future__ import annotations

# Which side of the claimed band is better for the variant, per metric: more speed, a bigger memory saving and a
# higher accuracy are all better, so a value above the band exceeds the claim and one below it falls short.
# python_speedup: a step time under 3.10 over the one under 3.11 (amprepro.analysis.pythonclaim), from committed
# evidence.
HIGHER_IS_BETTER = {"speedup": True, "memory_reduction": True, "accuracy_delta": True, "batch_ratio": True,
                    "heldout_loss_gap": False,  # final held-out loss (variant) - (baseline), nats: lower is better
                    "lora_parameters": True,  # judged by amprepro.analysis.loraclaim
                    "python_speedup": True}
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
        low, high, why = batch_ratio(variant, baseline)
        return (low, why) if low == high else (None, why or "the searches leave an interval: metric_bounds")
    if metric == "heldout_loss_gap":
        v, b = variant.get("heldout_loss_final"), baseline.get("heldout_loss_final")
        if v is None or b is None:
            return None, f"no held-out loss: {variant['model']} records none (model_config eval_every)"
        return v - b, ""
    if metric == "lora_parameters":  # a largest shape over cells, not a pair's value: amprepro.analysis.loraclaim
        return None, "judged over the LoRA cells by amprepro.analysis.loraclaim"
    raise ValueError(f"unknown metric {metric}")


def largest_batch_fields(record: dict | None) -> dict:
    """A search's answer (amprepro.train.batchsearch's record) as the summary row's largest_batch columns."""
    return {"largest_batch": record and record["largest_batch"], "largest_batch_bound": record and record["bound"],
            "largest_batch_failing": record and record.get("smallest_failing_batch"),
            "largest_batch_grid": record and record.get("grid_step")}


def largest_batch_bounds(row: dict) -> tuple[int | None, float | None]:
    """Where the true largest batch on the search's grid lies, [low, high] (amprepro.train.batchsearch): exact, one
    batch; capped (fits at the search's cap), at least the cap; at_least (the time ran out), from the largest that
    fitted up to one grid step under the smallest that failed, or unbounded where none failed."""
    largest, bound = row.get("largest_batch"), row.get("largest_batch_bound")
    if not largest:
        return None, None
    if bound == "exact":
        return largest, largest
    failing = row.get("largest_batch_failing")
    if bound == "at_least" and failing:
        return largest, failing - (row.get("largest_batch_grid") or 1)
    return largest, float("inf")


def batch_ratio(variant: dict, baseline: dict) -> tuple[float | None, float | None, str]:
    """(low, high, why-not): the variant's largest batch over the baseline's, as the interval their searches leave
    (largest_batch_bounds): the variant's lowest over the baseline's highest, up to the other way round. A search
    cut short by its time still bounds the ratio where the baseline's found a batch that fails."""
    (v_low, v_high), (b_low, b_high) = largest_batch_bounds(variant), largest_batch_bounds(baseline)
    if not v_low or not b_low:
        return None, None, (f"no largest-batch search for {variant['model']} here (runs.largest_batch.models; it "
                            "runs on a GPU, after the cells)")
    return v_low / b_high, v_high / b_low, ""


def search_text(row: dict) -> str:
    """'fp32: at least 616, fails at 640' for a reason that says why a ratio is undecided."""
    low, high = largest_batch_bounds(row)
    if low == high:
        return f"{row['precision']}: {low}"
    failing = row.get("largest_batch_failing")
    return (f"{row['precision']}: {row.get('largest_batch_bound')} at {low}"
            + (f", fails at {failing}" if failing else ", nothing larger tried"))


def metric_bounds(metric: str, variant: dict, baseline: dict) -> tuple[float | None, float | None, str]:
    """(low, high, why-not) for one seed's pair of cells: a point (low == high) for every metric but batch_ratio,
    whose searches may leave an interval."""
    if metric == "batch_ratio":
        low, high, why = batch_ratio(variant, baseline)
        if low is not None and low != high and high == float("inf") and low == 0:
            why = (f"neither search bounds the ratio ({search_text(variant)}; {search_text(baseline)}): the "
                   f"{baseline['precision']} search found no batch that fails, so no ratio")
            return None, None, why
        return low, high, why
    value, why = metric_value(metric, variant, baseline)
    return value, value, why


def decided_value(claim: dict, low: float, high: float) -> float | None:
    """The value that stands for [low, high] when every value in it gets one verdict (the band is an interval, so
    both ends agreeing is enough): the end nearer the band, so a positive verdict is the least favourable reading and
    a falls_short the most favourable one. None where the ends' verdicts differ."""
    if low == high:
        return low
    v_low, v_high = verdict_for(claim, low), verdict_for(claim, high)
    if v_low != v_high:
        return None
    lower_is_nearer = (v_low == "falls_short") != HIGHER_IS_BETTER[claim["metric"]]
    return low if lower_is_nearer else high


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
        return "unbounded" if value == float("inf") else f"{value:.2f}× the batch"
    if metric == "heldout_loss_gap":
        return f"{value:+.3f} nats".replace("-", "−")
    if metric == "lora_parameters":
        return f"{value / 1e9:.2f} B parameters"
    if metric == "python_speedup":  # 1.25 = 25 % more steps per second: the article's "快 25%"
        return f"{(value - 1) * 100:+.1f} %".replace("-", "−")
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

"""Paired gaps over seeds: one implementation of the statistics the FP8 section (amprepro.analysis.fp8) and the accuracy
and opt-level claims (amprepro.analysis.convergence, amprepro.analysis.optlevels) judge a loss gap with.

Two cells of one seed start from the same initial weights and draw the same batches (amprepro.train.train seeds the
model's initialisation, the text data has its own generator from the seed), so the seed's noise is shared by both:
their gap, not each loss, is the unit of evidence. Over n seeds' gaps:

    mean, sample sd (n - 1), se = sd / sqrt(n)
    two-sided 95 % Student-t interval of the mean: mean ± t(0.975, n - 1)·se  (low, high)
    one-sided 95 % bounds:                         mean ± t(0.95, n - 1)·se   (lower, upper)

and two one-sided questions, each at 95 %:

- against a margin (margin_verdict): **under** when the upper bound is below the margin (the variant's loss is, at
  95 %, not more than the margin above the baseline's), **over** when the lower bound is above it, else **not
  settled** by that many seeds;
- against zero (zero_verdict): **lower** when the upper bound is below 0 (the variant's loss is lower), **higher**
  when the lower bound is above 0, **includes 0** otherwise (no difference shown either way).

The report env has no scipy, so the t quantiles are a table (1-30 degrees of freedom, each rounded up at the third
decimal: a slightly wider interval, never a narrower one; beyond 30 the 30th, wider again). Torch-free: the report
imports it.
"""

from __future__ import annotations

import math
import statistics

T_TWO_SIDED_95 = (12.707, 4.303, 3.183, 2.777, 2.571, 2.447, 2.365, 2.307, 2.263, 2.229, 2.201, 2.179, 2.161, 2.145,
                  2.132, 2.120, 2.110, 2.101, 2.094, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.049,
                  2.046, 2.043)
T_ONE_SIDED_95 = (6.314, 2.920, 2.354, 2.132, 2.016, 1.944, 1.895, 1.860, 1.834, 1.813, 1.796, 1.783, 1.771, 1.762,
                  1.754, 1.746, 1.740, 1.735, 1.730, 1.725, 1.721, 1.718, 1.714, 1.711, 1.709, 1.706, 1.704, 1.702,
                  1.700, 1.698)
ZERO_WORDS = {"lower": "lower", "higher": "higher", "includes 0": "no difference shown (the interval includes 0)"}


def t_quantile(table: tuple, df: int) -> float:
    return table[min(df, len(table)) - 1]


def margin_verdict(lower: float, upper: float, margin: float) -> str:
    """under / over / not settled: the one-sided bounds against the margin (module docstring)."""
    return "under" if upper < margin else "over" if lower > margin else "not settled"


def zero_verdict(lower: float, upper: float) -> str:
    """lower / higher / includes 0: the one-sided bounds against zero (module docstring)."""
    return "lower" if upper < 0 else "higher" if lower > 0 else "includes 0"


def interval(values: list[float], margin: float) -> dict | None:
    """n, mean, sample sd, se, the two-sided 95 % interval (low, high), the one-sided 95 % bounds (lower, upper) and
    both verdicts (verdict against the margin, zero against 0) of some seeds' paired gaps; None for fewer than two."""
    n = len(values)
    if n < 2:
        return None
    mean, sd = statistics.fmean(values), statistics.stdev(values)
    se = sd / math.sqrt(n)
    two, one = t_quantile(T_TWO_SIDED_95, n - 1) * se, t_quantile(T_ONE_SIDED_95, n - 1) * se
    lower, upper = mean - one, mean + one
    return {"n": n, "mean": mean, "sd": sd, "se": se, "low": mean - two, "high": mean + two, "lower": lower,
            "upper": upper, "margin": margin, "verdict": margin_verdict(lower, upper, margin),
            "zero": zero_verdict(lower, upper)}


def paired_gaps(variant: dict, baseline: dict, relative: bool = True) -> dict:
    """seed -> the variant's value minus the baseline's (relative: over |baseline|), for the seeds both have with a
    finite value (and, relative, a non-zero baseline), in seed order."""
    gaps = {}
    for seed in sorted(set(variant) & set(baseline)):
        v, b = variant[seed], baseline[seed]
        if v is None or b is None or not (math.isfinite(v) and math.isfinite(b)) or (relative and b == 0):
            continue
        gaps[seed] = (v - b) / abs(b) if relative else v - b
    return gaps


def pct(value: float | None, signed: bool = False) -> str:
    """A fraction as a percentage with two decimals ('' for None)."""
    if value is None:
        return ""
    return f"{value * 100:+.2f} %" if signed else f"{value * 100:.2f} %"


def interval_text(s: dict, both: bool = False) -> str:
    """'+0.26 % over 6 seeds (sd 0.67 %, 95 % interval -0.45 % to +0.96 %, one-sided 95 % upper bound +0.81 %)';
    both: '..., one-sided 95 % bounds -0.29 % and +0.81 %)'."""
    bounds = (f"one-sided 95 % bounds {pct(s['lower'], True)} and {pct(s['upper'], True)}" if both
              else f"one-sided 95 % upper bound {pct(s['upper'], True)}")
    return (f"{pct(s['mean'], True)} over {s['n']} seeds (sd {pct(s['sd'])}, 95 % interval {pct(s['low'], True)} to "
            f"{pct(s['high'], True)}, {bounds})")

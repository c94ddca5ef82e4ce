"""The paired statistics over seeds (amprepro.analysis.paired) against scipy, and by exact output."""

import math

import pytest

from amprepro.analysis import paired

GAPS = [0.004, -0.002, 0.001, 0.006, -0.001, 0.003, 0.002, 0.0]  # 8 seeds' relative gaps


@pytest.mark.parametrize("values", [GAPS, [0.02, 0.04, 0.03], [0.001, 0.003], [x * 3 for x in GAPS[:5]],
                                    [0.01 * math.sin(i) for i in range(31)]])
def test_the_interval_and_bounds_agree_with_scipy_and_are_never_narrower(values):
    stats = pytest.importorskip("scipy.stats")
    n = len(values)
    mean, se = float(sum(values) / n), float(stats.sem(values))
    got = paired.interval(values, 0.01)
    assert got["mean"] == pytest.approx(mean, abs=1e-15) and got["se"] == pytest.approx(se)
    assert got["sd"] == pytest.approx(float(stats.tstd(values)))
    low, high = stats.t.interval(0.95, n - 1, loc=mean, scale=se)
    upper = mean + float(stats.t.ppf(0.95, n - 1)) * se
    lower = mean - float(stats.t.ppf(0.95, n - 1)) * se
    slack = 0.001 * se if n <= 31 else 0.02 * se  # the table rounds up at the third decimal; beyond 30 df, the 30th
    assert high - 1e-15 <= got["high"] <= high + slack
    assert low - slack <= got["low"] <= low + 1e-15
    assert upper - 1e-15 <= got["upper"] <= upper + slack and lower - slack <= got["lower"] <= lower + 1e-15


def test_the_one_sided_bound_matches_scipys_one_sided_t_test():
    """The verdict 'under' is scipy's one-sided t test of mean < margin rejecting at 5 %, and back."""
    stats = pytest.importorskip("scipy.stats")
    for values, margin in [(GAPS, 0.01), (GAPS, 0.004), (GAPS, 0.0045), (GAPS, 0.0)]:
        p_less = float(stats.ttest_1samp(values, margin, alternative="less").pvalue)
        got = paired.interval(values, margin)
        assert (got["verdict"] == "under") == (p_less < 0.05), (margin, p_less, got["upper"])
    p_greater = float(stats.ttest_1samp([0.02, 0.04, 0.03], 0.01, alternative="greater").pvalue)
    assert p_greater < 0.05 and paired.interval([0.02, 0.04, 0.03], 0.01)["verdict"] == "over"


def test_exact_numbers_of_eight_seeds():
    got = paired.interval(GAPS, 0.01)
    assert got["n"] == 8 and got["mean"] == pytest.approx(0.0016250)
    se = got["sd"] / math.sqrt(8)
    assert got["sd"] == pytest.approx(0.0026693, abs=1e-7)
    mean = 0.0016250
    assert got["high"] == pytest.approx(mean + 2.365 * se) and got["upper"] == pytest.approx(mean + 1.895 * se)
    assert got["lower"] == pytest.approx(mean - 1.895 * se) and got["low"] == pytest.approx(mean - 2.365 * se)
    assert (got["verdict"], got["zero"], got["margin"]) == ("under", "includes 0", 0.01)
    assert paired.interval_text(got) == ("+0.16 % over 8 seeds (sd 0.27 %, 95 % interval -0.06 % to +0.39 %, "
                                         "one-sided 95 % upper bound +0.34 %)")
    assert paired.interval_text(got, both=True) == ("+0.16 % over 8 seeds (sd 0.27 %, 95 % interval -0.06 % to "
                                                    "+0.39 %, one-sided 95 % bounds -0.02 % and +0.34 %)")


def test_each_verdict_on_both_questions():
    assert paired.interval([], 0.01) is None and paired.interval([0.5], 0.01) is None
    assert paired.interval([-0.02, -0.03, -0.025], 0.01)["zero"] == "lower"
    assert paired.interval([0.002, 0.003, 0.0025], 0.01)["zero"] == "higher"  # higher, yet under the margin
    assert paired.interval([0.002, 0.003, 0.0025], 0.01)["verdict"] == "under"
    assert paired.interval([0.02, 0.04, 0.03], 0.01)["verdict"] == "over"
    assert paired.interval([0.0, 0.02], 0.01)["verdict"] == "not settled"
    assert paired.interval([0.01, 0.01], 0.01)["verdict"] == "not settled"  # at the margin exactly: neither side
    assert paired.interval([0.0, 0.0], 0.01)["zero"] == "includes 0"
    assert paired.margin_verdict(-0.1, 0.0099, 0.01) == "under" and paired.margin_verdict(0.0101, 0.2, 0.01) == "over"
    assert paired.zero_verdict(-0.2, -1e-9) == "lower" and paired.zero_verdict(1e-9, 0.2) == "higher"


def test_paired_gaps_take_the_seeds_both_have_with_finite_values():
    variant = {0: 1.01, 1: 2.0, 2: float("nan"), 3: 1.5, 5: 1.0}
    baseline = {0: 1.0, 1: 2.0, 2: 1.0, 3: None, 4: 1.0, 5: 0.0}
    assert paired.paired_gaps(variant, baseline) == pytest.approx({0: 0.01, 1: 0.0})
    assert paired.paired_gaps(variant, baseline, relative=False) == pytest.approx({0: 0.01, 1: 0.0, 5: 1.0})
    assert list(paired.paired_gaps({3: 1.0, 1: 1.0}, {1: 1.0, 3: 2.0})) == [1, 3]
    assert paired.pct(None) == "" and paired.pct(-0.0123, True) == "-1.23 %" and paired.pct(0.5) == "50.00 %"

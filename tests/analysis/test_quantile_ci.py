"""Quantile confidence intervals and the regression rule against known truth: synthetic HDR
histograms (lognormal latencies, fixed seeds), one row per 1-s interval.

Tolerances come from the binomial noise of the Monte Carlo itself: with S simulations a rate p is
measured with standard error sqrt(p(1-p)/S), e.g. 0.95 over 1,000 runs ± 0.0069, so the ±2-point
coverage band is about three standard errors wide at 1,000 runs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from latscope.analysis.gate import FAIL, INCONCLUSIVE, PASS, decide
from latscope.analysis.quantile_ci import QuantileCI, binomial_ranks, block_length, quantile_ci, ratio_ci, t_quantile
from latscope.recorder import bucket_bounds, bucket_indices, counts_from_values, new_histogram, values_at

LOWEST, HIGHEST = bucket_bounds(new_histogram())
WIDTH = len(LOWEST)
MEDIAN_US, SIGMA = 20_000.0, 0.5  # lognormal latency: median 20 ms, p99 ≈ 64 ms
Z99 = 2.3263478740408408
TRUE_P99 = MEDIAN_US * math.exp(SIGMA * Z99)
TOL, MIN_EFFECT = 0.10, 0.02
ALPHA = 0.02  # one gated percentile: the whole false-failure budget on it
CONF = 1 - 2 * ALPHA  # each run's two-sided interval; the ratio's lower bound is then one-sided 1 - ALPHA


def run(rng: np.random.Generator, n: int, k: int, scale: float = 1.0, ar: tuple[float, float] | None = None) -> np.ndarray:
    """k intervals × buckets of n lognormal latencies; with ar=(phi, sd) the latency level of each
    interval follows a stationary AR(1) in log space (a server whose speed wanders over seconds)."""
    x = rng.lognormal(math.log(MEDIAN_US), SIGMA, size=(k, n // k)) * scale
    if ar is not None:
        phi, sd = ar
        s = np.empty(k)
        s[0] = rng.normal(0, sd)
        for t in range(1, k):
            s[t] = phi * s[t - 1] + rng.normal(0, sd * math.sqrt(1 - phi * phi))
        x *= np.exp(s)[:, None]
    return interval_counts(x)


def interval_counts(x: np.ndarray) -> np.ndarray:
    """k × buckets counts of a k × m array of latencies (µs), with one bincount for all rows."""
    k, m = x.shape
    rows = np.repeat(np.arange(k), m)
    return np.bincount(rows * WIDTH + bucket_indices(x.ravel()), minlength=k * WIDTH).reshape(k, WIDTH)


def gate_p99(a: np.ndarray, b: np.ndarray, bootstrap: bool = True) -> str:
    qa = quantile_ci(a, LOWEST, HIGHEST, 99, CONF, bootstrap=bootstrap)
    qb = quantile_ci(b, LOWEST, HIGHEST, 99, CONF, bootstrap=bootstrap)
    return decide(qb, qa, TOL, MIN_EFFECT)[0]


def test_binomial_ranks_match_scipy_exactly():
    stats = pytest.importorskip("scipy.stats")  # a dev dependency: the reference, not used at run time
    for n, q, conf in ((20_000, 0.99, 0.95), (1_000, 0.99, 0.98), (50, 0.5, 0.95), (100_000, 0.999, 0.96)):
        lo, hi = binomial_ranks(n, q, conf)
        a = (1 - conf) / 2
        assert stats.binom.cdf(lo - 1, n, q) <= a < stats.binom.cdf(lo, n, q)
        assert stats.binom.cdf(hi - 2, n, q) < 1 - a <= stats.binom.cdf(hi - 1, n, q)


def test_t_quantile_matches_tables():
    assert t_quantile(0.975, 10) == pytest.approx(2.2281, abs=1e-3)
    assert t_quantile(0.99, 3) == pytest.approx(4.5407, abs=1e-3)
    assert t_quantile(0.99, 1000) == pytest.approx(2.3301, abs=1e-3)
    assert t_quantile(0.99, 1) == pytest.approx(31.8205, abs=1e-3) and t_quantile(0.99, 2) == pytest.approx(6.9646, abs=1e-3)


def test_synthetic_counts_are_what_the_histogram_records():
    rng = np.random.default_rng(2)
    x = rng.lognormal(math.log(MEDIAN_US), 2.0, size=(3, 2000))
    hists = [new_histogram() for _ in range(3)]
    for h, row in zip(hists, x):
        for v in row.tolist():
            h.record_value(int(round(v)))
    assert (interval_counts(x) == np.stack([np.ctypeslib.as_array(h.counts) for h in hists])).all()


def test_point_estimate_is_the_hdr_percentile():
    rng = np.random.default_rng(3)
    values = rng.lognormal(math.log(MEDIAN_US), SIGMA, 5000).astype(np.int64)
    h = new_histogram()
    for v in values.tolist():
        h.record_value(v)
    q = quantile_ci(counts_from_values(values)[None, :], LOWEST, HIGHEST, 99, 0.95)
    assert q.value_us == values_at(h, [99.0])[99.0]
    assert q.n == 5000 and q.bootstrap is None  # one interval: nothing to resample


def test_quantile_ci_coverage_is_nominal_over_1000_runs():
    rng = np.random.default_rng(11)
    hits = np.array([(lambda q: q.low_us <= TRUE_P99 <= q.high_us)(quantile_ci(run(rng, 20_000, 1), LOWEST, HIGHEST, 99, 0.95))
                     for _ in range(1000)])
    coverage = hits.mean()
    print(f"binomial p99 CI coverage at 95 %: {coverage:.3f}")
    assert 0.93 <= coverage <= 0.97


def test_combined_ci_with_bootstrap_covers_at_least_nominally():
    rng = np.random.default_rng(12)
    hits = [(lambda q: q.low_us <= TRUE_P99 <= q.high_us)(quantile_ci(run(rng, 20_000, 20), LOWEST, HIGHEST, 99, 0.95))
            for _ in range(200)]
    coverage = float(np.mean(hits))
    print(f"combined p99 CI coverage at 95 %: {coverage:.3f}")
    assert 0.93 <= coverage <= 0.995  # never under nominal beyond Monte Carlo noise; a little wider is the price


def test_a_a_false_failure_rate_is_at_most_2_percent_over_200_pairs():
    rng = np.random.default_rng(21)
    verdicts = [gate_p99(run(rng, 20_000, 20), run(rng, 20_000, 20)) for _ in range(200)]
    fails = verdicts.count(FAIL)
    print(f"A/A iid: {fails}/200 fail, {verdicts.count(INCONCLUSIVE)}/200 inconclusive")
    assert fails <= 4
    assert verdicts.count(PASS) >= 190  # and the gate decides: 200 tail samples are plenty


def test_a_20_percent_p99_shift_at_n_20000_is_caught_95_percent_of_the_time():
    rng = np.random.default_rng(31)
    verdicts = [gate_p99(run(rng, 20_000, 20), run(rng, 20_000, 20, scale=1.2)) for _ in range(200)]
    caught = verdicts.count(FAIL)
    print(f"20 % shift: caught {caught}/200")
    assert caught >= 190


def test_a_shift_within_the_budget_passes():
    rng = np.random.default_rng(32)
    verdicts = [gate_p99(run(rng, 20_000, 20), run(rng, 20_000, 20, scale=1.05)) for _ in range(50)]
    assert verdicts.count(FAIL) == 0


def test_block_bootstrap_keeps_a_a_honest_under_autocorrelation():
    """Per-interval level AR(1), phi 0.8, sd 0.15: the binomial interval alone (independence) fails
    same-build pairs often; with the block bootstrap the false failures stay within budget and the
    gate says 'inconclusive' where the run is too noisy to judge a 10 % budget."""
    rng = np.random.default_rng(41)
    pairs = [(run(rng, 30_000, 40, ar=(0.8, 0.15)), run(rng, 30_000, 40, ar=(0.8, 0.15))) for _ in range(200)]
    with_boot = [gate_p99(a, b) for a, b in pairs]
    binomial_only = [gate_p99(a, b, bootstrap=False) for a, b in pairs]
    print(f"A/A AR(1): block bootstrap {with_boot.count(FAIL)}/200 fail ({with_boot.count(INCONCLUSIVE)} inconclusive); "
          f"binomial only {binomial_only.count(FAIL)}/200 fail")
    assert with_boot.count(FAIL) <= 4
    assert binomial_only.count(FAIL) >= 16


def test_block_length_grows_with_autocorrelation():
    rng = np.random.default_rng(5)
    assert block_length(*_compact(run(rng, 30_000, 60))) == 1
    assert block_length(*_compact(run(rng, 30_000, 60, ar=(0.9, 0.3)))) >= 5


def _compact(counts: np.ndarray):
    used = np.flatnonzero(counts.sum(axis=0))
    return np.cumsum(counts[:, used], axis=1), HIGHEST[used].astype(float)


def test_too_few_samples_beyond_the_percentile_is_inconclusive():
    rng = np.random.default_rng(6)
    small, big = run(rng, 900, 9), run(rng, 20_000, 20)  # 900 · 1 % = 9 < 10
    status, ratio, why = decide(quantile_ci(small, LOWEST, HIGHEST, 99), quantile_ci(big, LOWEST, HIGHEST, 99), TOL, MIN_EFFECT)
    assert status == INCONCLUSIVE and ratio is None
    assert "n = 900, 9.0 expected beyond it (need ≥ 10: n ≥ 1,000)" in why


def test_ratio_interval_is_mover():
    rng = np.random.default_rng(7)
    a = quantile_ci(run(rng, 20_000, 20), LOWEST, HIGHEST, 99, 0.95)
    b = quantile_ci(run(rng, 20_000, 20, scale=1.3), LOWEST, HIGHEST, 99, 0.95)
    r = ratio_ci(b, a)
    down = math.hypot(math.log(b.value_us / b.low_us), math.log(a.high_us / a.value_us))
    assert r.ratio == pytest.approx(b.value_us / a.value_us)
    assert r.low == pytest.approx(r.ratio * math.exp(-down))
    assert r.low < 1.3 < r.high


def test_inconclusive_factor_sets_how_wide_is_too_wide():
    def ci(value: float, low: float, high: float) -> QuantileCI:
        return QuantileCI(99, 20_000, value, low, high, (low, high), None, 1, 0.96)

    new, base = ci(100.0, 85.0, 125.0), ci(100.0, 85.0, 125.0)  # ratio 1, upper ≈ 1 + hypot(.22, .16) → +32 %
    assert decide(new, base, TOL, MIN_EFFECT)[0] == INCONCLUSIVE  # 2 × 10 % cannot be ruled out
    assert decide(new, base, TOL, MIN_EFFECT, inconclusive_factor=4)[0] == PASS


def test_bootstrap_interval_stays_within_the_values_recorded():
    rng = np.random.default_rng(8)
    x = rng.lognormal(math.log(MEDIAN_US), SIGMA, size=(10, 300))
    x[3] *= 200  # one interval of a 4-second stall
    q = quantile_ci(interval_counts(x), LOWEST, HIGHEST, 99, 0.98)
    assert q.bootstrap is not None
    assert q.bootstrap[0] >= x.min() * 0.999 and q.bootstrap[1] <= x.max() * 1.001

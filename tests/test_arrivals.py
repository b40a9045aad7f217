"""Tests for latscope.arrivals.

Statistical checks use fixed seeds, so each is deterministic; the bounds still come from the
math (not fitted to the seed) so a wrong rate, shape or spacing makes them fail:

* a Poisson count with mean m has σ = sqrt(m); ±4σ is exceeded with probability ~6e-5;
* Kolmogorov-Smirnov of gaps against the exponential law they must follow, at p > 0.001;
* even spacing puts the k-th arrival exactly where Λ(t) = k, so a window [a, b) holds
  ceil(Λ(b)) - ceil(Λ(a)) arrivals, i.e. Λ(b) - Λ(a) up to ±1.
"""

from __future__ import annotations

import math
import time
from datetime import datetime, timezone

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from conftest import DATA
from latscope import arrivals
from latscope.errors import ScenarioError

AZURE_TRACE = DATA / "azure_llm_conv_trace.csv"
KS_MIN_P = 1e-3


def rng(seed: int = 12345) -> np.random.Generator:
    return np.random.default_rng(seed)


def big_lambda(t, breaks, rates_start, rates_end) -> np.ndarray:
    """Λ(t) = ∫₀ᵗ λ for a piecewise-linear λ, written independently of the module under test."""
    t = np.asarray(t, dtype=float)[..., None]
    b = np.asarray(breaks, dtype=float)
    r0 = np.asarray(rates_start, dtype=float)
    r1 = np.asarray(rates_end, dtype=float)
    length = np.diff(b)
    slope = np.divide(r1 - r0, length, out=np.zeros_like(r0), where=length > 0)
    tau = np.clip(t - b[:-1], 0.0, length)  # time spent in each segment before t
    return (r0 * tau + 0.5 * slope * tau**2).sum(axis=-1)


def counts(x: np.ndarray, edges) -> np.ndarray:
    """Arrivals in each window [edges[i], edges[i+1])."""
    return np.diff(np.searchsorted(x, edges, side="left"))


def assert_valid(x: np.ndarray, duration: float) -> None:
    """The contract of every generator: sorted float64 offsets in [0, duration)."""
    assert x.dtype == np.float64 and x.ndim == 1
    assert np.all(np.diff(x) >= 0)
    if len(x):
        assert x[0] >= 0.0 and x[-1] < duration


def assert_poisson_counts(x: np.ndarray, edges, expected) -> None:
    """Counts in disjoint windows of a Poisson process are independent Poisson(expected)."""
    got = counts(x, edges)
    expected = np.asarray(expected, dtype=float)
    assert np.all(np.abs(got - expected) <= 4 * np.sqrt(expected)), (got, expected)


def assert_exponential(gaps: np.ndarray, rate: float) -> None:
    result = stats.kstest(gaps, "expon", args=(0.0, 1.0 / rate))
    assert result.pvalue > KS_MIN_P, result


def gaps_within(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Gaps between consecutive arrivals inside [lo, hi), plus the wait from lo to the first.

    By memorylessness these are i.i.d. Exp(rate) in a constant-rate stretch; only the censored
    gap that crosses hi is not, and it is left out.
    """
    inside = x[(x >= lo) & (x < hi)]
    return np.diff(np.concatenate(([lo], inside)))


# ---------------------------------------------------------------------------------------------
# constant and poisson
# ---------------------------------------------------------------------------------------------


def test_constant_exact_spacing_and_count():
    x = arrivals.constant(10.0, 1.0)
    # Λ⁻¹(k) = k/rate; the only error is float rounding of one division (~1e-16 relative).
    np.testing.assert_allclose(x, np.arange(10) / 10.0, rtol=0, atol=1e-12)

    x = arrivals.constant(7.0, 1.05)  # 7.35 expected -> ceil = 8, the last one at exactly 1.0
    assert len(x) == 8
    np.testing.assert_allclose(np.diff(x), 1 / 7.0, rtol=1e-12)
    assert x[-1] == pytest.approx(1.0)

    x = arrivals.constant(1000.0, 3.0)
    assert len(x) == 3000
    assert x[0] == 0.0
    np.testing.assert_allclose(np.diff(x), 1e-3, rtol=1e-9)
    assert_valid(x, 3.0)

    assert len(arrivals.constant(0.0, 5.0)) == 0
    assert len(arrivals.constant(100.0, 0.0)) == 0


def test_poisson_count_and_exponential_gaps():
    rate, duration = 2000.0, 20.0
    x = arrivals.poisson(rate, duration, rng())
    assert_valid(x, duration)
    mean = rate * duration  # N ~ Poisson(λD): σ = sqrt(40000) = 200
    assert abs(len(x) - mean) <= 4 * math.sqrt(mean)
    # The wait from 0 to the first arrival is Exp(rate) too, so include it.
    assert_exponential(np.diff(np.concatenate(([0.0], x))), rate)


def test_poisson_gaps_in_constant_stretch_of_steps():
    x = arrivals.steps([100.0, 1000.0, 0.0, 300.0], 10.0, 40.0, "poisson", rng(7))
    assert_exponential(gaps_within(x, 10.0, 20.0), 1000.0)  # ~10,000 gaps at 1000/s
    assert_exponential(gaps_within(x, 30.0, 40.0), 300.0)


def test_poisson_draws_in_chunks_give_the_same_process(monkeypatch):
    """Chunked Exp(1) draws (a long phase) must give the same arrivals as one big draw: the
    generator's stream does not depend on how it is split, only the running sum's rounding does."""
    whole = arrivals.poisson(1000.0, 20.0, rng(3))
    monkeypatch.setattr(arrivals, "_MAX_CHUNK", 1000)  # ~20 chunks instead of 1
    chunked = arrivals.poisson(1000.0, 20.0, rng(3))
    assert len(chunked) == len(whole)
    np.testing.assert_allclose(chunked, whole, rtol=1e-12)


def test_blockwise_inversion_matches_whole(monkeypatch):
    """Λ⁻¹ is evaluated in blocks; block edges (mid-segment, odd sizes) must not change a bit."""
    args = ([0.0, 2.0, 3.0, 3.0, 6.0], [50.0, 0.0, 7.0, 400.0], [300.0, 0.0, 9.0, 10.0], "poisson")
    whole = arrivals.piecewise(*args, rng(11))
    monkeypatch.setattr(arrivals, "_BLOCK", 7)
    np.testing.assert_array_equal(arrivals.piecewise(*args, rng(11)), whole)


# ---------------------------------------------------------------------------------------------
# burst
# ---------------------------------------------------------------------------------------------

BASE, BURST, BURST_LEN, PERIOD, BURST_D = 100.0, 1000.0, 0.5, 2.0, 21.0  # D not a multiple of period


def burst_windows() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Edges of alternating burst/base windows for the burst tests, their rates, is-burst flags."""
    on = np.arange(0.0, BURST_D, PERIOD)
    edges = np.append(np.column_stack([on, on + BURST_LEN]).ravel(), BURST_D)  # ends at 20.5, 21
    is_burst = np.arange(len(edges) - 1) % 2 == 0
    return edges, np.where(is_burst, BURST, BASE), is_burst


def test_burst_even_counts_per_window():
    x = arrivals.burst(BASE, BURST, BURST_LEN, PERIOD, BURST_D, "even", None)
    assert_valid(x, BURST_D)
    edges, rates, _ = burst_windows()
    expected = rates * np.diff(edges)  # 500 per burst, 150 per base stretch, 50 in the last one
    assert np.all(np.abs(counts(x, edges) - expected) <= 1)
    assert abs(len(x) - 7050) <= 1  # 11 bursts * 500 + 10 * 150 + 50
    assert x[0] == 0.0


def test_burst_poisson_inside_vs_outside():
    x = arrivals.burst(BASE, BURST, BURST_LEN, PERIOD, BURST_D, "poisson", rng(21))
    assert_valid(x, BURST_D)
    edges, rates, is_burst = burst_windows()
    got = counts(x, edges)
    expected = rates * np.diff(edges)
    # Sums of independent Poisson counts are Poisson: inside 5500 (σ≈74), outside 1550 (σ≈39).
    for part in (is_burst, ~is_burst):
        assert abs(got[part].sum() - expected[part].sum()) <= 4 * math.sqrt(expected[part].sum())
    burst_gaps = np.concatenate([gaps_within(x, lo, hi) for lo, hi in zip(edges[:-1:2], edges[1::2])])
    assert_exponential(burst_gaps, BURST)


def test_burst_longer_than_period_is_always_on():
    x = arrivals.burst(10.0, 200.0, 5.0, 1.0, 3.0, "even", None)
    assert abs(len(x) - 600) <= 1
    np.testing.assert_allclose(np.diff(x), 1 / 200.0, rtol=1e-9)


# ---------------------------------------------------------------------------------------------
# ramp
# ---------------------------------------------------------------------------------------------

RAMP_D = 20.0
RAMPS = [(100.0, 1100.0), (1100.0, 100.0), (0.0, 1000.0), (1000.0, 0.0)]  # up, down, from 0, to 0


@pytest.mark.parametrize("from_rate,to_rate", RAMPS)
def test_ramp_even_follows_linear_rate(from_rate, to_rate):
    x = arrivals.ramp(from_rate, to_rate, RAMP_D, "even", None)
    assert_valid(x, RAMP_D)
    lam = big_lambda(x, [0.0, RAMP_D], [from_rate], [to_rate])
    # Even spacing means Λ(t_k) == k exactly; only float rounding (~1e-16 · Λ ≈ 1e-12) remains.
    np.testing.assert_allclose(lam, np.arange(len(x)), rtol=0, atol=1e-6)
    edges = np.arange(0.0, RAMP_D + 0.5, 1.0)
    expected = np.diff(big_lambda(edges, [0.0, RAMP_D], [from_rate], [to_rate]))
    assert np.all(np.abs(counts(x, edges) - expected) <= 1)
    assert x[0] == 0.0  # even spacing starts at t = 0, even where the rate starts at 0


@pytest.mark.parametrize("from_rate,to_rate", RAMPS)
def test_ramp_poisson_counts_and_rescaled_gaps(from_rate, to_rate):
    x = arrivals.ramp(from_rate, to_rate, RAMP_D, "poisson", rng(5))
    assert_valid(x, RAMP_D)
    edges = np.arange(0.0, RAMP_D + 0.5, 2.0)
    expected = np.diff(big_lambda(edges, [0.0, RAMP_D], [from_rate], [to_rate]))
    assert_poisson_counts(x, edges, expected)
    # Time-rescaling theorem: Λ(t_k) are the points of a unit-rate Poisson process.
    lam = big_lambda(x, [0.0, RAMP_D], [from_rate], [to_rate])
    assert_exponential(np.diff(np.concatenate(([0.0], lam))), 1.0)


# ---------------------------------------------------------------------------------------------
# steps and spike
# ---------------------------------------------------------------------------------------------

STEP_RATES = [100.0, 0.0, 1000.0, 300.0]
STEP_EDGES = [0.0, 5.0, 10.0, 15.0, 23.0]  # the last rate runs past 4 * step to the duration
STEP_EXPECTED = [500.0, 0.0, 5000.0, 2400.0]


def test_steps_even_counts_and_zero_step():
    x = arrivals.steps(STEP_RATES, 5.0, 23.0, "even", None)
    assert_valid(x, 23.0)
    got = counts(x, STEP_EDGES)
    assert got[1] == 0  # rate 0: not a single arrival, not even at the boundary
    assert np.all(np.abs(got - STEP_EXPECTED) <= 1)
    assert x[500] == pytest.approx(10.0)  # arrival 500 waits out the zero step, lands at its end


def test_steps_poisson_counts_and_zero_step():
    x = arrivals.steps(STEP_RATES, 5.0, 23.0, "poisson", rng(8))
    assert_valid(x, 23.0)
    got = counts(x, STEP_EDGES)
    assert got[1] == 0
    assert_poisson_counts(x, STEP_EDGES, STEP_EXPECTED)


def test_steps_leading_zero_and_truncation():
    x = arrivals.steps([0.0, 100.0], 5.0, 10.0, "even", None)
    assert len(x) == 500 and x[0] == 5.0  # nothing during the silent first step
    x = arrivals.steps([10.0, 20.0, 30.0], 10.0, 15.0, "even", None)  # third step never reached
    assert np.all(np.abs(counts(x, [0.0, 10.0, 15.0]) - [100, 100]) <= 1)
    assert len(x) == 200


def test_spike_even_and_poisson():
    edges, expected = [0.0, 3.0, 3.5, 10.0], [300.0, 1000.0, 650.0]
    x = arrivals.spike(100.0, 2000.0, 3.0, 0.5, 10.0, "even", None)
    assert_valid(x, 10.0)
    assert np.all(np.abs(counts(x, edges) - expected) <= 1)
    x = arrivals.spike(100.0, 2000.0, 3.0, 0.5, 10.0, "poisson", rng(9))
    assert_valid(x, 10.0)
    assert_poisson_counts(x, edges, expected)
    # A spike running past the end is cut at the duration.
    x = arrivals.spike(100.0, 2000.0, 9.0, 5.0, 10.0, "even", None)
    assert_valid(x, 10.0)
    assert np.all(np.abs(counts(x, [0.0, 9.0, 10.0]) - [900, 2000]) <= 1)


# ---------------------------------------------------------------------------------------------
# mmpp
# ---------------------------------------------------------------------------------------------


def test_mmpp_mean_rate_and_overdispersion():
    base, burst, mean_burst, mean_gap, duration = 50.0, 500.0, 0.05, 0.2, 600.0
    x = arrivals.mmpp(base, burst, mean_burst, mean_gap, duration, rng(13))
    assert_valid(x, duration)

    # Stationary mean rate: the chain is in burst a fraction p = burst_len / (gap + burst_len).
    p = mean_burst / (mean_gap + mean_burst)  # 0.2
    mean_rate = (base * mean_gap + burst * mean_burst) / (mean_gap + mean_burst)  # 140/s
    # Switching rate s = 1/gap + 1/burst_len = 25/s. Starting in base lowers E[N] by
    # (burst - base)·p/s (3.6 arrivals). Var N(D) ≈ D·(mean_rate + 2p(1-p)(burst - base)²/s):
    # the Poisson part plus the integral of the rate's autocovariance p(1-p)Δ²·e^{-s|τ|}.
    # That gives σ ≈ 1280 (vs 290 for a Poisson count): ±4σ is ~6% of the 84,000 expected,
    # while e.g. swapped sojourn means (p = 0.8, 410/s) would be off by ~190%.
    s = 1 / mean_gap + 1 / mean_burst
    expected = mean_rate * duration - (burst - base) * p / s
    sigma = math.sqrt(duration * (mean_rate + 2 * p * (1 - p) * (burst - base) ** 2 / s))
    assert abs(len(x) - expected) <= 4 * sigma

    # Gaps are roughly a mix of Exp(50) (28.6% of arrivals fall in base) and Exp(500) (71.4%):
    # a hyperexponential with CV = sqrt(2·E[m²]/E[m]² - 1) ≈ 1.89 (m = 1/rate). Poisson has CV 1,
    # estimated from ~84,000 gaps with standard error ≈ 0.005.
    gaps = np.diff(x)
    assert gaps.std() / gaps.mean() > 1.5
    poisson_gaps = np.diff(arrivals.poisson(mean_rate, duration, rng(13)))
    assert abs(poisson_gaps.std() / poisson_gaps.mean() - 1.0) < 0.05


def test_mmpp_starts_in_base_state():
    # Base sojourns of mean 1e6 s: the first switch comes before 10 s with probability 1e-5,
    # so a process that starts in base (rate 0) sends nothing.
    assert len(arrivals.mmpp(0.0, 1000.0, 1.0, 1e6, 10.0, rng())) == 0
    # Base lasting ~1 ns, then a burst of rate 0 lasting ~1e6 s: expected 100/s · 1e-9 s ≈ 0.
    assert len(arrivals.mmpp(100.0, 0.0, 1e6, 1e-9, 10.0, rng())) == 0


# ---------------------------------------------------------------------------------------------
# piecewise, expected_count, reproducibility, validation
# ---------------------------------------------------------------------------------------------


def test_expected_count_and_piecewise_even_count():
    breaks, r0, r1 = [0.0, 5.0, 5.0, 10.0, 12.0], [100.0, 1e6, 0.0, 30.0], [100.0, 1e6, 200.0, 0.0]
    # 100·5 + (zero-length segment: 0) + (0 + 200)/2·5 + (30 + 0)/2·2 = 500 + 500 + 30
    assert arrivals.expected_count(breaks, r0, r1) == pytest.approx(1030.0)
    x = arrivals.piecewise(breaks, r0, r1, "even", None)
    assert_valid(x, 12.0)
    assert abs(len(x) - 1030) <= 1
    assert arrivals.expected_count([0.0, 3.0], [0.0], [0.0]) == 0.0
    assert len(arrivals.piecewise([0.0, 3.0], [0.0], [0.0], "poisson", rng())) == 0


GENERATORS = {
    "poisson": lambda g: arrivals.poisson(500.0, 5.0, g),
    "burst": lambda g: arrivals.burst(50.0, 500.0, 0.2, 1.0, 5.0, "poisson", g),
    "mmpp": lambda g: arrivals.mmpp(50.0, 500.0, 0.1, 0.4, 5.0, g),
    "ramp": lambda g: arrivals.ramp(0.0, 500.0, 5.0, "poisson", g),
    "steps": lambda g: arrivals.steps([100.0, 300.0], 2.0, 5.0, "poisson", g),
    "spike": lambda g: arrivals.spike(100.0, 900.0, 1.0, 0.5, 5.0, "poisson", g),
}


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_same_seed_same_arrivals_different_seed_different(name):
    make = GENERATORS[name]
    a, b, c = make(rng(1)), make(rng(1)), make(rng(2))
    np.testing.assert_array_equal(a, b)
    assert len(a) != len(c) or not np.array_equal(a, c)


def test_even_spacing_ignores_rng():
    with_rng = arrivals.burst(50.0, 500.0, 0.2, 1.0, 5.0, "even", rng(1))
    np.testing.assert_array_equal(with_rng, arrivals.burst(50.0, 500.0, 0.2, 1.0, 5.0, "even", None))


@pytest.mark.parametrize(
    "breaks,r0,r1,spacing",
    [
        ([0.0, 1.0], [1.0, 2.0], [1.0, 2.0], "even"),  # more rates than segments
        ([1.0, 2.0], [1.0], [1.0], "even"),  # does not start at 0
        ([0.0, 2.0, 1.0], [1.0, 1.0], [1.0, 1.0], "even"),  # decreasing breaks
        ([0.0, 1.0], [-1.0], [1.0], "even"),  # negative rate
        ([0.0, 1.0], [1.0], [1.0], "uniform"),  # unknown spacing
        ([0.0, 1.0], [1.0], [1.0], "poisson"),  # poisson without an rng
    ],
)
def test_piecewise_rejects_bad_arguments(breaks, r0, r1, spacing):
    with pytest.raises(ValueError):
        arrivals.piecewise(breaks, r0, r1, spacing, None)


def test_performance_one_million_poisson_arrivals():
    started = time.perf_counter()
    x = arrivals.poisson(1_000_000.0, 1.0, rng())
    elapsed = time.perf_counter() - started
    assert abs(len(x) - 1_000_000) <= 4_000  # 4σ, σ = 1000
    assert elapsed < 2.0, f"1M poisson arrivals took {elapsed:.2f} s"


# ---------------------------------------------------------------------------------------------
# traces
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def azure() -> pd.DataFrame:
    return arrivals.read_trace(AZURE_TRACE)


def _azure_seconds(stamp: str) -> float:
    """'2023-11-16 18:15:46.6805900' -> seconds, parsed without pandas (all 7 digits kept)."""
    whole, frac = stamp.split(".")
    moment = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc)
    return moment.timestamp() + int(frac) / 10 ** len(frac)


def test_read_trace_azure(azure):
    lines = AZURE_TRACE.read_text().splitlines()
    first, last = lines[1].split(",")[0], lines[-1].split(",")[0]
    span = _azure_seconds(last) - _azure_seconds(first)  # ≈ 3501.72 s
    assert len(azure) == 19_366
    assert list(azure.columns) == ["TIMESTAMP", "ContextTokens", "GeneratedTokens", "offset_s"]
    assert azure["offset_s"].dtype == np.float64
    assert azure["offset_s"].iloc[0] == 0.0
    assert azure["TIMESTAMP"].iloc[0] == first and azure["ContextTokens"].iloc[0] == 374
    assert azure["offset_s"].is_monotonic_increasing
    # Timestamps have 100 ns resolution; float64 at 3500 s is good to ~1e-12 s.
    assert azure["offset_s"].iloc[-1] == pytest.approx(span, abs=1e-6)
    assert azure["offset_s"].iloc[1] == pytest.approx(4.3145790, abs=1e-9)


def test_trace_offsets_speedup_and_window(azure):
    o = azure["offset_s"].to_numpy()
    fast = arrivals.trace_offsets(azure, speedup=10.0)
    assert len(fast) == len(azure)
    assert fast[-1] == pytest.approx(o[-1] / 10.0, rel=1e-12)
    assert_valid(fast, o[-1] / 10.0 + 1.0)

    window = arrivals.trace_offsets(azure, speedup=2.0, start=600.0, duration=300.0)
    # Kept: 600 <= o and (o - 600)/2 < 300, i.e. trace times in [600, 1200).
    expected = (o[(o >= 600.0) & (o < 1200.0)] - 600.0) / 2.0
    assert len(expected) > 1000  # the window is not trivially empty
    np.testing.assert_array_equal(window, expected)
    assert window[0] >= 0.0 and window[-1] < 300.0

    rest = arrivals.trace_offsets(azure, start=3000.0)
    np.testing.assert_array_equal(rest, o[o >= 3000.0] - 3000.0)


def test_read_trace_numeric_seconds_detection_and_stable_sort(tmp_path):
    path = tmp_path / "numeric.csv"
    path.write_text("request_id,Arrival_Time,tokens\n1,12.5,10\n2,10.0,20\n3,12.5,30\n4,11,40\n")
    df = arrivals.read_trace(path)  # picks Arrival_Time: its name contains "time"
    np.testing.assert_array_equal(df["offset_s"], [0.0, 1.0, 2.5, 2.5])
    assert list(df["request_id"]) == [2, 4, 1, 3]  # equal times keep file order
    assert list(df.index) == [0, 1, 2, 3]

    by_name = arrivals.read_trace(path, time_column="tokens")
    np.testing.assert_array_equal(by_name["offset_s"], [0.0, 10.0, 20.0, 30.0])

    plain = tmp_path / "plain.csv"
    plain.write_text("sent,tokens\n100.0,5\n103.5,6\n")
    np.testing.assert_array_equal(arrivals.read_trace(plain)["offset_s"], [0.0, 3.5])  # first column


def test_read_trace_datetime_keeps_seven_digits(tmp_path):
    path = tmp_path / "azure_like.csv"
    path.write_text(
        "TIMESTAMP,x\n"
        "2023-11-16 18:15:46.6805901,1\n"
        "2023-11-16 18:15:46.6805900,2\n"
        "2023-11-16 18:15:47.6805900,3\n"
    )
    df = arrivals.read_trace(path)
    assert list(df["x"]) == [2, 1, 3]
    np.testing.assert_allclose(df["offset_s"], [0.0, 1e-7, 1.0], rtol=0, atol=1e-12)  # 100 ns kept


def _scenario_error(path, **kwargs) -> str:
    with pytest.raises(ScenarioError) as info:
        arrivals.read_trace(path, **kwargs)
    message = str(info.value)
    assert str(path) in message
    return message


def test_read_trace_errors_name_the_file(tmp_path):
    _scenario_error(tmp_path / "missing.csv")

    empty = tmp_path / "empty.csv"
    empty.write_text("")
    _scenario_error(empty)

    header_only = tmp_path / "header_only.csv"
    header_only.write_text("timestamp,tokens\n")
    _scenario_error(header_only)

    good = tmp_path / "good.csv"
    good.write_text("timestamp,tokens\n2023-11-16 18:15:46.6805900,3\n")
    assert "when" in _scenario_error(good, time_column="when")

    bad_time = tmp_path / "bad_time.csv"
    bad_time.write_text(
        "timestamp,tokens\n"
        "2023-11-16 18:15:46.6805900,3\n"
        "2023-11-16 18:15:47.0000000,4\n"
        "yesterday at noon,5\n"
    )
    message = _scenario_error(bad_time)
    assert "row 3" in message and "timestamp" in message

    bad_number = tmp_path / "bad_number.csv"
    bad_number.write_text("t,tokens\n0.5,1\n1.5,2\nsoon,3\n")
    assert "row 3" in _scenario_error(bad_number)

"""Confidence intervals for a percentile computed from HDR histograms, and for the ratio of two.

Everything works on histogram *counts* (no raw samples exist), as a matrix of per-interval counts:
one row per reporting interval of a run (histograms.hlog), one column per HDR bucket.

Two sources of uncertainty, one interval each
---------------------------------------------
1. **Order-statistic (binomial) interval — distribution-free.** For n independent samples the number
   B of them at or below the true p-quantile ξ is Binomial(n, p), so the r-th smallest sample X_(r)
   satisfies P(X_(r) > ξ) = P(B ≤ r − 1). The lower rank l is the largest r with
   P(B ≤ r − 1) ≤ a/2 and the upper rank u the smallest with P(B ≤ u − 1) ≥ 1 − a/2, so
   [X_(l), X_(u)] covers ξ with probability ≥ 1 − a whatever the distribution. The binomial CDF is
   computed *exactly* with log-gamma (numpy + math.lgamma over a window of ±(10σ + 10) ranks
   around np; the mass outside it is < 1e-20), not with the normal approximation: exact ranks cost
   microseconds and stay right in the far tail (p99.9 of a short run) where the normal
   approximation does not. With HDR histograms X_(r) is known only up to its bucket, so the interval
   is widened to the lowest equivalent value of X_(l)'s bucket and the highest of X_(u)'s
   (at most 1/1024 relative): it stays conservative.
2. **Moving block bootstrap over per-interval histograms — for autocorrelation.** Load-test
   latencies are not independent: a GC pause, a batch that filled up, a noisy neighbour move the
   whole level for seconds, and then the binomial interval is too narrow. Resampling whole blocks of
   consecutive intervals (Künsch 1989) keeps that dependence. Block length: the AR(1) plug-in rule
   l = (3k/2)^(1/3) · (2ρ / (1 − ρ²))^(2/3) for the moving block bootstrap (Carlstein 1986,
   Bühlmann & Künsch 1999), with k intervals and ρ the lag-1 autocorrelation of the log per-interval
   medians (bias-corrected, Kendall 1954: + (1 + 3ρ)/k), clipped to [1, k/3]; ρ ≤ 0 gives l = 1 (intervals independent). B = 2000 resamples
   from a fixed seed, so a verdict is reproducible. Each resample's quantile is found with a
   vectorised binary search over the per-interval cumulative counts, so no resampled histogram is
   ever materialised. The interval is log q ± t(ν) · sd(log q*), with ν = k/l − 1 the independent
   blocks less one, clipped to the range of values recorded: with a strongly autocorrelated run there are only a handful of independent
   blocks, a plain percentile bootstrap is then too narrow (same-build pairs with an AR(1) level,
   60 intervals, one-sided α = 1 %: 4.5 % failed), and the Student-t multiplier is the usual
   small-sample correction (same pairs: 1 % failed; tests/analysis/test_quantile_ci.py).

The interval reported for a run is, on each side, the wider of the two: the binomial interval is
exact for independent samples, the bootstrap captures dependence (and, with few intervals, can be
too narrow on its own).

Ratio of two runs (new / baseline)
----------------------------------
Given each run's interval, the interval for log(q_new / q_base) is built with the MOVER method
(Zou & Donner 2008: "method of variance estimates recovery"), which combines two independent
intervals without assuming symmetry:

    lower = log r − sqrt((log q_new − log L_new)² + (log U_base − log q_base)²)
    upper = log r + sqrt((log U_new − log q_new)² + (log q_base − log L_base)²)

With each run's interval at two-sided level 1 − 2a, [lower, upper] is a two-sided 1 − 2a
interval for the ratio, so its lower end is a one-sided 1 − a lower confidence bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

N_BOOT = 2000
SEED = 20261123


@dataclass(frozen=True)
class QuantileCI:
    """A percentile of one run with its confidence interval (values in µs)."""

    p: float  # percentile, 0 < p < 100
    n: int  # samples
    value_us: float  # point estimate, HDR semantics (equal to summary.json's pXX_ms)
    low_us: float  # combined interval: the wider of binomial and bootstrap on each side
    high_us: float  # math.inf when the upper rank is past n (too few samples)
    binomial: tuple[float, float]
    bootstrap: tuple[float, float] | None  # None with fewer than 2 intervals
    block_len: int
    confidence: float

    @property
    def tail_count(self) -> float:
        """Expected samples beyond the percentile, n·(1 − p): below ~10 the tail is not measured."""
        return self.n * (1 - self.p / 100)


@dataclass(frozen=True)
class RatioCI:
    """new / base with a MOVER interval (ratio, low, high)."""

    ratio: float
    low: float
    high: float


# --------------------------------------------------------------------------------------------------
# Binomial order-statistic ranks
# --------------------------------------------------------------------------------------------------


def binomial_ranks(n: int, q: float, confidence: float) -> tuple[int, int]:
    """(l, u): 1-based ranks such that [X_(l), X_(u)] covers the q-quantile (0 < q < 1) of n
    independent samples with probability ≥ confidence. l may be 0 (no lower bound) and u may be
    n + 1 (no upper bound) when n is too small for the requested confidence."""
    if n <= 0:
        return 0, 1
    a = (1 - confidence) / 2
    mu, sigma = n * q, math.sqrt(n * q * (1 - q))
    half = int(10 * sigma + 10)
    k = np.arange(max(0, int(mu) - half), min(n, int(mu) + half) + 1)
    lg = np.array([math.lgamma(x + 1) for x in k.tolist()])
    lg_rest = np.array([math.lgamma(n - x + 1) for x in k.tolist()])
    log_pmf = math.lgamma(n + 1) - lg - lg_rest + k * math.log(q) + (n - k) * math.log1p(-q)
    cdf = np.cumsum(np.exp(log_pmf))  # P(B <= k[i]); the mass below the window is < 1e-20
    # l = max{r : P(B <= r-1) <= a}  ->  r - 1 = the last k with cdf <= a
    below = np.flatnonzero(cdf <= a)
    lower = int(k[below[-1]]) + 1 if len(below) else int(k[0])  # k[0] = 0 when the window reaches 0
    # u = min{r : P(B <= r-1) >= 1 - a}  ->  r - 1 = the first k with cdf >= 1 - a
    above = np.flatnonzero(cdf >= 1 - a)
    upper = int(k[above[0]]) + 1 if len(above) else n + 1
    return lower, upper


# --------------------------------------------------------------------------------------------------
# One run
# --------------------------------------------------------------------------------------------------


def hdr_rank(n: int | np.ndarray, p: float):
    """The HDR target rank of percentile p among n values: max(1, int(p·n/100 + 0.5))."""
    return np.maximum(1, np.floor(np.asarray(n) * p / 100 + 0.5).astype(np.int64))


def compact(interval_counts: np.ndarray, lowest: np.ndarray, highest: np.ndarray):
    """(k × m counts over the buckets that hold any value, their lowest and highest values)."""
    counts = np.atleast_2d(np.asarray(interval_counts, dtype=np.int64))
    used = np.flatnonzero(counts.sum(axis=0))
    return counts[:, used], lowest[used].astype(np.float64), highest[used].astype(np.float64)


def block_length(cum: np.ndarray, highest: np.ndarray) -> int:
    """Moving-block length from the lag-1 autocorrelation of the log per-interval medians (AR(1)
    plug-in rule, see the module docstring), given per-interval cumulative counts `cum` (k × m);
    intervals with no values are left out of ρ."""
    k = cum.shape[0]
    if k < 6:
        return 1
    n = cum[:, -1]
    ok = n > 0
    if ok.sum() < 6:
        return 1
    med_idx = np.array([np.searchsorted(c, max(1, (t + 1) // 2)) for c, t in zip(cum[ok], n[ok])])
    x = np.log(np.maximum(highest[med_idx], 1.0))
    x = x - x.mean()
    denom = float((x * x).sum())
    if denom == 0:
        return 1
    rho = float((x[1:] * x[:-1]).sum() / denom)
    rho += (1 + 3 * rho) / k  # Kendall's first-order correction: the sample ρ is biased low by ~(1 + 3ρ)/k
    if rho <= 0:
        return 1
    rho = min(rho, 0.95)
    length = (1.5 * k) ** (1 / 3) * (2 * rho / (1 - rho * rho)) ** (2 / 3)
    return int(min(max(1, round(length)), max(1, k // 3)))


def block_weights(k: int, block_len: int, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """n_boot × k: how many times each interval is drawn by one moving-block resample of length k."""
    n_blocks = -(-k // block_len)
    starts = rng.integers(0, k - block_len + 1, size=(n_boot, n_blocks))
    idx = (starts[:, :, None] + np.arange(block_len)).reshape(n_boot, -1)[:, :k]
    rows = np.repeat(np.arange(n_boot), k)
    return np.bincount(rows * k + idx.ravel(), minlength=n_boot * k).reshape(n_boot, k)


def resampled_quantiles(cum: np.ndarray, weights: np.ndarray, p: float, highest: np.ndarray) -> np.ndarray:
    """The p-quantile (HDR semantics) of each resample: weights (B × k) over per-interval cumulative
    counts `cum` (k × m). Binary search on the bucket index, all resamples at once."""
    n_star = weights @ cum[:, -1]
    target = hdr_rank(n_star, p)
    lo = np.zeros(len(weights), dtype=np.int64)
    hi = np.full(len(weights), cum.shape[1] - 1, dtype=np.int64)
    while True:
        active = lo < hi
        if not active.any():
            break
        mid = (lo + hi) // 2
        reached = np.einsum("bk,kb->b", weights, cum[:, mid]) >= target
        hi = np.where(active & reached, mid, hi)
        lo = np.where(active & ~reached, mid + 1, lo)
    return highest[lo]


def quantile_ci(interval_counts: np.ndarray, lowest: np.ndarray, highest: np.ndarray, p: float,
                confidence: float = 0.95, n_boot: int = N_BOOT, seed: int = SEED,
                bootstrap: bool = True) -> QuantileCI:
    """The p-th percentile (0 < p < 100) of a run given as per-interval counts (k × buckets, or one
    counts array) with `lowest`/`highest` the bucket value tables (recorder.bucket_bounds), and its
    two-sided `confidence` interval: binomial, moving block bootstrap, and their union."""
    if not 0 < p < 100:
        raise ValueError(f"percentile {p!r} must be strictly between 0 and 100")
    counts, low_v, high_v = compact(interval_counts, lowest, highest)
    pooled = np.cumsum(counts.sum(axis=0))
    n = int(pooled[-1]) if pooled.size else 0
    if n == 0:
        return QuantileCI(p, 0, math.nan, 0.0, math.inf, (0.0, math.inf), None, 1, confidence)
    value = float(high_v[np.searchsorted(pooled, hdr_rank(n, p))])
    l_rank, u_rank = binomial_ranks(n, p / 100, confidence)
    b_low = float(low_v[np.searchsorted(pooled, l_rank)]) if l_rank >= 1 else 0.0
    b_high = float(high_v[np.searchsorted(pooled, u_rank)]) if u_rank <= n else math.inf
    boot, length = None, 1
    if bootstrap and counts.shape[0] >= 2:
        cum = np.cumsum(counts, axis=1)
        length = block_length(cum, high_v)
        rng = np.random.default_rng(seed)
        w = block_weights(counts.shape[0], length, n_boot, rng)
        qs = resampled_quantiles(cum, w, p, high_v)
        spread = float(np.std(np.log(np.maximum(qs, 1.0)), ddof=1)) * t_quantile(1 - (1 - confidence) / 2, dof(counts.shape[0], length))
        # within the values recorded, as the binomial interval is (a stall-ridden run's t-interval can
        # otherwise reach microseconds and hours, which says no more than "anything seen")
        boot = (max(value * math.exp(-spread), float(low_v[0])), min(value * math.exp(spread), float(high_v[-1])))
    low = min(b_low, boot[0]) if boot else b_low
    high = max(b_high, boot[1]) if boot else b_high
    return QuantileCI(p, n, value, low, high, (b_low, b_high), boot, length, confidence)


def dof(k: int, block_len: int) -> int:
    """Degrees of freedom of the bootstrap spread: independent blocks in the run, less one."""
    return max(1, k // block_len - 1)


@lru_cache(maxsize=256)
def t_quantile(q: float, nu: int) -> float:
    """Student's t quantile for 0.5 < q ≤ 0.9999 (scipy is not a runtime dependency): closed forms
    for nu = 1, 2; otherwise the density integrated on a fine grid (accurate to ~1e-6)."""
    if nu == 1:
        return math.tan(math.pi * (q - 0.5))
    if nu == 2:
        return (2 * q - 1) / math.sqrt(2 * q * (1 - q))
    x = np.linspace(0.0, 60.0, 240_001)  # t(3) at 0.9999 is 22.2
    log_c = math.lgamma((nu + 1) / 2) - math.lgamma(nu / 2) - 0.5 * math.log(nu * math.pi)
    pdf = np.exp(log_c - (nu + 1) / 2 * np.log1p(x * x / nu))
    cdf = 0.5 + np.concatenate(([0.0], np.cumsum((pdf[1:] + pdf[:-1]) / 2) * (x[1] - x[0])))
    return float(np.interp(q, cdf, x))


# --------------------------------------------------------------------------------------------------
# Two runs
# --------------------------------------------------------------------------------------------------


def _log(x: float) -> float:
    return math.log(x) if x > 0 else -math.inf


def ratio_ci(new: QuantileCI, base: QuantileCI) -> RatioCI:
    """MOVER interval for new / base from the two runs' intervals (see the module docstring)."""
    if not (new.value_us > 0 and base.value_us > 0):
        return RatioCI(math.nan, 0.0, math.inf)
    log_r = math.log(new.value_us / base.value_us)
    down = math.hypot(math.log(new.value_us) - _log(new.low_us), _log(base.high_us) - math.log(base.value_us))
    up = math.hypot(_log(new.high_us) - math.log(new.value_us), math.log(base.value_us) - _log(base.low_us))
    return RatioCI(math.exp(log_r), math.exp(log_r - down) if math.isfinite(down) else 0.0,
                   math.exp(log_r + up) if math.isfinite(up) else math.inf)

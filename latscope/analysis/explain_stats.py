"""The few tests `latscope explain` needs, in numpy alone (scipy is not a dependency): an exact
binomial tail, Mann–Whitney's U with its normal approximation, ranks with ties, Spearman's rho.

Why these: a cause is a group of requests over-represented in the tail (a replica, a time bin, the
longest prompts) or a quantity larger in the tail than in the body (send lag, queue depth at send
time). The first is a count against a base rate: under "being in the tail has nothing to do with
the group", the tail's count in the group is hypergeometric, which the binomial with the group's
share of all requests bounds from above (same mean, more variance), so its p-value is conservative.
It must be exact: tail counts are small (a p99 of 3,000 requests is 30) and the normal
approximation of a count of 3 against an expected 0.3 is off by many orders of magnitude. The second
is a comparison of two samples without assuming a shape (latencies have heavy tails): Mann–Whitney,
whose normal approximation is good from about ten values a side (explain needs ten in the tail).
"""

from __future__ import annotations

import math

import numpy as np

_LOG_FACT: np.ndarray = np.zeros(1)


def _log_factorial(n: int) -> np.ndarray:
    """log(k!) for k = 0..n, cached and grown as needed (cumulative sums of logs: exact to ~1e-9 up to 1e7)."""
    global _LOG_FACT
    if len(_LOG_FACT) <= n:
        size = max(n + 1, 2 * len(_LOG_FACT))
        _LOG_FACT = np.concatenate(([0.0], np.cumsum(np.log(np.arange(1, size, dtype=float)))))
    return _LOG_FACT


def binomial_sf(k: int, n: int, p: float) -> float:
    """P(X ≥ k) for X ~ Binomial(n, p), exact (summed in log space, so 1e-300 stays 1e-300)."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    if p <= 0:
        return 0.0
    if p >= 1:
        return 1.0
    lf = _log_factorial(n)
    j = np.arange(k, n + 1)
    log_pmf = lf[n] - lf[j] - lf[n - j] + j * math.log(p) + (n - j) * math.log1p(-p)
    top = float(log_pmf.max())
    return float(min(1.0, math.exp(top) * np.exp(log_pmf - top).sum()))


def top_share_p(x: np.ndarray, y: np.ndarray) -> float:
    """One-sided p of how many of `x` are among the len(x) largest of x and y together, exact: with
    both from one distribution, that count is hypergeometric (N = len(x) + len(y), len(x) marked,
    len(x) drawn). Ties rank y first (conservative). Where x is a few values (a signal's readings in
    the tail's moments), Mann–Whitney's normal approximation cannot go below about Φ(−√(3·len(x))),
    however clear the separation; this exact count can (5 of 5 above 100 others: 1/C(105, 5))."""
    n1, n2 = len(x), len(y)
    if not n1 or not n2:
        return 1.0
    order = np.lexsort((np.r_[np.ones(n1), np.zeros(n2)], -np.r_[x, y]))  # by value, descending; y first in a tie
    hits = int((order[:n1] < n1).sum())
    if hits == 0:
        return 1.0
    n = n1 + n2
    lf = _log_factorial(n)
    k = np.arange(hits, n1 + 1)
    log_pmf = (lf[n1] - lf[k] - lf[n1 - k]) + (lf[n2] - lf[n1 - k] - lf[n2 - n1 + k]) - (lf[n] - lf[n1] - lf[n - n1])
    ok = n2 - n1 + k >= 0
    log_pmf = log_pmf[ok]
    if not len(log_pmf):
        return 1.0
    top = float(log_pmf.max())
    return float(min(1.0, math.exp(top) * np.exp(log_pmf - top).sum()))


def ranks(values: np.ndarray) -> tuple[np.ndarray, float]:
    """(1-based ranks with ties averaged, Σ(t³ − t) over the groups of ties: the variance correction)."""
    values = np.asarray(values)
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
    sizes = np.diff(np.concatenate((starts, [len(values)])))
    mid = starts + (sizes + 1) / 2.0  # average rank of each group of ties
    out = np.empty(len(values), float)
    out[order] = np.repeat(mid, sizes)
    return out, float(np.sum(sizes.astype(float) ** 3 - sizes))


def normal_sf(z: float) -> float:
    """P(Z ≥ z) for a standard normal."""
    return 0.5 * math.erfc(z / math.sqrt(2))


MAX_SIDE = 20_000  # values a side Mann–Whitney ranks: a uniform sample of the rest (see mann_whitney)


def mann_whitney(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(AUC, one-sided p): AUC = P(X > Y) + P(X = Y)/2 for a value X of `x` and Y of `y`; p = the
    normal approximation (tie-corrected, with continuity correction) of P(AUC this high or higher)
    when both samples come from one distribution. (0.5, 1.0) when either is empty or all are tied.
    A side of more than MAX_SIDE values is sampled down to MAX_SIDE first."""
    x, y = _sample(np.asarray(x, float)), _sample(np.asarray(y, float))
    n1, n2 = len(x), len(y)
    if not n1 or not n2:
        return 0.5, 1.0
    r, ties = ranks(np.concatenate((x, y)))
    u = float(r[:n1].sum()) - n1 * (n1 + 1) / 2.0
    n = n1 + n2
    var = n1 * n2 / 12.0 * ((n + 1) - ties / (n * (n - 1)))
    if var <= 0:
        return 0.5, 1.0
    z = (u - n1 * n2 / 2.0 - 0.5) / math.sqrt(var)
    return u / (n1 * n2), normal_sf(z)


def _sample(x: np.ndarray) -> np.ndarray:
    """At most MAX_SIDE values of x, a seeded uniform sample: a body of 500,000 requests ranks in a
    second per signal, 20,000 in milliseconds, and a random sample keeps the test valid (only less
    powerful, at sizes where power is no concern: the tail side is never that large below p99 of 2M)."""
    if len(x) <= MAX_SIDE:
        return x
    return x[np.random.default_rng(len(x)).choice(len(x), MAX_SIDE, replace=False)]


def spearman(a: np.ndarray, b: np.ndarray) -> float | None:
    """Spearman's rank correlation of paired values (NaN pairs dropped); None with < 3 pairs or a constant side."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    keep = np.isfinite(a) & np.isfinite(b)
    if keep.sum() < 3:
        return None
    ra, _ = ranks(a[keep])
    rb, _ = ranks(b[keep])
    ra -= ra.mean()
    rb -= rb.mean()
    den = math.sqrt(float((ra * ra).sum() * (rb * rb).sum()))
    return None if den == 0 else float((ra * rb).sum() / den)


def excess_share(tail_share: float, all_share: float) -> float:
    """How much of the tail a group explains beyond its share of everyone: (P(g|tail) − P(g|all)) /
    (1 − P(g|all)), 0 when the tail holds it as often as everyone does, 1 when the whole tail is in it."""
    if all_share >= 1:
        return 0.0
    return max(0.0, (tail_share - all_share) / (1 - all_share))

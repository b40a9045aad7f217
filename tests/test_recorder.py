"""Recorder and histogram statistics: HDR semantics, accuracy, lossless merge, clamping, speed."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hdrh.histogram import HdrHistogram

from latscope.recorder import (
    HIGHEST_US,
    PERCENTILES,
    Recorder,
    from_sparse,
    merge,
    new_histogram,
    summarize,
    values_at,
)

N = 200_000


def counts(h: HdrHistogram) -> np.ndarray:
    return np.ctypeslib.as_array(h.counts).copy()


def lognormal_us(n: int, seed: int) -> list[int]:
    """Latency-like µs values: median 20 ms, long right tail (sigma 1 gives ~p99.9 in the seconds)."""
    rng = np.random.default_rng(seed)
    return rng.lognormal(np.log(20_000), 1.0, n).astype(np.int64).tolist()


def reference(values) -> HdrHistogram:
    """The same values recorded by hdrh itself (independent of Recorder's inlined index math)."""
    h = new_histogram()
    for v in values:
        assert h.record_value(v)
    return h


def recorded(values, metric="latency", cls="all") -> HdrHistogram:
    r = Recorder()
    for v in values:
        r.record(metric, cls, v)
    blobs, clamped = r.snapshot()
    assert clamped == {}
    return from_sparse(*blobs[(metric, cls, False)])


@pytest.fixture(scope="module")
def big() -> tuple[list[int], HdrHistogram]:
    values = lognormal_us(N, seed=1)
    return values, recorded(values)


def test_values_at_equals_hdrh_exactly(big):
    ps = [0, 1, 25, 50, 90, 99, 99.9, 99.99, 100]
    values, h = big
    assert values_at(h, ps) == h.get_percentile_to_value_dict(ps)
    # Small counts exercise the rank rounding int(p*N/100 + 0.5) and the p == 0 lowest-value rule.
    for n, seed in ((1, 2), (7, 3), (1000, 4)):
        small = reference(lognormal_us(n, seed))
        assert values_at(small, ps) == small.get_percentile_to_value_dict(ps)
    # Another layout (unit magnitude 14, 2 significant figures, as in a Java ns log) uses its own tables.
    other = HdrHistogram(20_000, 3_600_000_000_000, 2)
    for v in lognormal_us(500, seed=5):
        other.record_value(v * 1000)
    assert values_at(other, ps) == other.get_percentile_to_value_dict(ps)
    assert values_at(new_histogram(), ps) == {} == new_histogram().get_percentile_to_value_dict(ps)
    with pytest.raises(ValueError):
        values_at(h, [100.1])


def test_percentiles_within_one_bucket_of_the_exact_sample(big):
    values, h = big
    ordered = np.sort(np.array(values))
    got = values_at(h, PERCENTILES)
    for p in PERCENTILES:
        # HDR reports the highest value of the bucket holding the sample of rank int(p*N/100 + 0.5).
        # With 3 significant figures the sub-bucket count is 2048: values < 2048 µs are exact and a
        # bucket holding v >= 2048 is 2**b wide with v >= 2**(b + 10), so its width is <= v / 1024.
        # Hence 0 <= reported - exact <= exact / 1024 (≈ 0.098 %).
        exact = int(ordered[max(1, int(p * N / 100 + 0.5)) - 1])
        assert 0 <= got[p] - exact <= exact / 1024, p
        # Same against numpy. method="lower" (index floor(p/100 * (N-1))) picks that same rank for
        # these p at N = 200k; "inverted_cdf" does not at 99.9: ceil(0.999 * 200000) is 199801 in
        # floating point, and two neighbouring samples that deep in the tail are ~0.5 % apart.
        ref = float(np.percentile(ordered, p, method="lower"))
        assert ref == exact and 0 <= (got[p] - ref) / ref <= 2**-10 < 1e-3, p


def test_inlined_index_matches_hdrh_at_bucket_edges():
    edges = {0, 1, 2, 1023, 1024, 2047, 2048, 2049, 2050, 4095, 4096, 4097, HIGHEST_US - 1, HIGHEST_US}
    edges |= {(1 << k) + d for k in range(11, 32) for d in (-1, 0, 1)}
    edges = sorted(v for v in edges if 0 <= v <= HIGHEST_US)
    r = Recorder()
    for v in edges:
        r.record("m", "c", v)
    (sparse,) = r.snapshot()[0].values()
    assert np.array_equal(counts(from_sparse(*sparse)), counts(reference(edges)))


def test_merge_of_four_workers_equals_one_histogram():
    values = np.array(lognormal_us(30_000, seed=6))
    worker = np.random.default_rng(7).integers(0, 4, len(values))
    parts = [recorded(values[worker == w].tolist()) for w in range(4)]
    assert all(p.get_total_count() > 0 for p in parts)
    merged = merge(parts)
    one = reference(values.tolist())
    assert np.array_equal(counts(merged), counts(one))
    assert summarize(merged) == summarize(one)
    # The tracking fields hdrh's getters and encoder use are consistent too.
    assert (merged.get_total_count(), merged.get_min_value(), merged.get_max_value()) == (
        one.get_total_count(),
        one.get_min_value(),
        one.get_max_value(),
    )
    assert sum(p.get_total_count() for p in parts) == 30_000  # inputs untouched


def test_recorder_round_trip_separates_keys_and_starts_empty():
    r = Recorder()
    data = {
        ("latency", "chat", False): lognormal_us(3000, seed=8),
        ("latency", "chat", True): lognormal_us(500, seed=9),
        ("latency", "embed", False): lognormal_us(2000, seed=10),
        ("service_time", "chat", False): lognormal_us(3000, seed=11),
    }
    for (metric, cls, warm), vals in data.items():
        for v in vals:
            r.record(metric, cls, v, warm)
    blobs, clamped = r.snapshot()
    assert set(blobs) == set(data) and clamped == {}
    for key, vals in data.items():
        assert np.array_equal(counts(from_sparse(*blobs[key])), counts(reference(vals))), key
    assert r.snapshot() == ({}, {})
    # The next interval holds only its own values (pooled histograms are really zeroed).
    r.record("latency", "embed", 1234)
    r.record("latency", "embed", 987_654)
    blobs, _ = r.snapshot()
    assert list(blobs) == [("latency", "embed", False)]
    h = from_sparse(*blobs[("latency", "embed", False)])
    assert np.array_equal(counts(h), counts(reference([1234, 987_654])))
    assert h.get_total_count() == 2


def test_clamping_is_counted_per_metric():
    r = Recorder()
    for v in (-5, -1, HIGHEST_US + 1, 10**12, float("inf")):  # clamped
        r.record("send_lag", "all", v)
    r.record("latency", "all", -3)  # clamped, another metric
    # in range, not counted; a float rounds to the nearest µs, a numpy integer is taken as is
    for v in (0, 1, 2047, HIGHEST_US, 1500.4, np.int64(3000)):
        r.record("send_lag", "all", v)
    blobs, clamped = r.snapshot()
    assert clamped == {"send_lag": 5, "latency": 1}
    h = from_sparse(*blobs[("send_lag", "all", False)])
    c = counts(h)
    assert c.sum() == 11
    assert c[h._counts_index_for(3000)] == 1
    assert c[0] == 3  # -5, -1 clamped to 0, plus the 0 itself
    assert c[h._counts_index_for(HIGHEST_US)] == 4  # three clamped to HIGHEST_US plus HIGHEST_US itself
    assert c[1500] == 1
    assert r.snapshot()[1] == {}  # counts are per interval


def test_summarize_known_data_and_merge_into_empty():
    h = reference(range(1000, 2001))  # below 2048 µs every bucket is 1 µs wide: all exact
    expected = {
        "count": 1001,
        "min_ms": 1.0,
        "mean_ms": 1.5,
        "p50_ms": 1.5,  # rank int(500.5 + 0.5) = 501 -> 1500
        "p90_ms": 1.9,  # rank int(900.9 + 0.5) = 901 -> 1900
        "p95_ms": 1.95,  # rank 951 -> 1950
        "p99_ms": 1.99,  # rank 991 -> 1990
        "p99.9_ms": 1.999,  # rank int(999.999 + 0.5) = 1000 -> 1999
        "max_ms": 2.0,
    }
    assert summarize(h) == expected
    # hdrh's add() takes min(self.get_min_value(), other.get_min_value()), and get_min_value() is 0
    # for an empty histogram: adding an empty one (here first, into an empty accumulator) leaves
    # min_value at 0 for good. Statistics come from the counts, so they must not care.
    naive = new_histogram()
    naive.add(new_histogram())
    naive.add(h)
    assert summarize(naive) == expected
    for parts in ([new_histogram(), h], [h, new_histogram()]):
        merged = merge(parts)
        assert summarize(merged) == expected and merged.get_min_value() == 1000
    # 5000 µs lies in a 4 µs wide bucket [5000, 5003]: min = lowest, max = highest, mean = median (5002).
    one = reference([5000])
    assert summarize(one) == {
        "count": 1,
        "min_ms": 5.0,
        "mean_ms": 5.002,
        **{f"p{p:g}_ms": 5.003 for p in PERCENTILES},
        "max_ms": 5.003,
    }
    assert one.get_mean_value() == 5002
    assert summarize(new_histogram()) == {"count": 0}


def test_mean_matches_hdrh(big):
    _, h = big
    # Same bucket-median weighting as hdrh; only the rounding to 3 decimals (0.5 µs) can differ.
    assert abs(summarize(h)["mean_ms"] - h.get_mean_value() / 1000) <= 0.0005


def test_recording_200k_values_is_fast(big):
    values, _ = big
    r = Recorder()
    record = r.record
    t0 = time.perf_counter()
    for v in values:
        record("latency", "chat", v)
    elapsed = time.perf_counter() - t0
    assert elapsed < 3.0, f"{elapsed / N * 1e6:.2f} µs per record"
    blobs, _ = r.snapshot()
    assert from_sparse(*blobs[("latency", "chat", False)]).get_total_count() == N

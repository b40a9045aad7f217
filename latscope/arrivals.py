"""Arrival processes: *when* an open-loop load generator sends each request of a phase.

Every function returns a sorted 1-D float64 array of intended send offsets, in seconds from the
start of the phase, all in ``[0, duration)``. Nothing here sends anything or knows about HTTP.

Design: one engine, many shapes. Every load shape (constant, burst, ramp, steps, spike, MMPP) is
described as a rate function λ(t) made of piecewise-*linear* segments, and a single function,
`piecewise`, turns any such λ into arrivals with the time-rescaling theorem: with the cumulative
rate Λ(t) = ∫₀ᵗ λ, the k-th arrival is at Λ⁻¹(u_k), where

* ``"even"`` spacing:    u_k = 0, 1, 2, ...  (deterministic; the first arrival is at t = 0), and
* ``"poisson"`` spacing: u_k = running sum of Exp(1) draws, which makes the arrivals a
  (non-homogeneous) Poisson process with intensity λ(t).

Only arrivals with Λ⁻¹(u) < duration are kept. Λ is quadratic within a linear segment, so Λ⁻¹ has
a closed form (see `_invert`); segments are found with one `np.searchsorted` over Λ at the
segment boundaries, so generation is fully vectorized (tens of millions of arrivals in seconds).
Segments with rate 0 have flat Λ and simply receive no arrivals.

Randomness comes only from the `rng` argument (a seeded `numpy.random.Generator`), so the same
seed always gives the same schedule. Even spacing never touches `rng`; it may be None there.

Recorded traces (`read_trace`, `trace_offsets`) bypass the rate machinery: their timestamps are
the arrivals. `phase_offsets`, at the end, is where a scenario's arrival model (latscope/scenario/
phases.py) meets its shape here: the plan calls it for every phase.

Invalid arguments (negative rates, mismatched lengths, ...) raise ValueError: scenario validation
is expected to have caught them earlier, so reaching one is a programming error. Problems with a
trace *file* raise `ScenarioError`, since the user can fix them.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

if TYPE_CHECKING:  # pandas is imported only where a trace is read: workers start faster without it
    import pandas as pd

    from latscope.scenario import Arrival, Spacing  # the scenario's models are the one home of both

from latscope.agent_trace import read_trace as read_agent_trace
from latscope.errors import ScenarioError
from latscope.mooncake import (BLOCK_SIZE, ReplayLimits, check_replay, mooncake_offsets, mooncake_rows, read_mooncake,
                               scaled_block, scaled_lengths)

# Poisson spacing draws Exp(1) variates in chunks of at most this many (32 MiB of float64), so a
# very long phase does not need a second full-size temporary array while drawing.
_MAX_CHUNK = 1 << 22

# Λ⁻¹ is evaluated this many arrivals at a time: the temporaries then stay in the CPU cache, which
# is several times faster than whole-array passes once a phase has tens of millions of arrivals.
_BLOCK = 1 << 16


# --------------------------------------------------------------------------------------------
# The engine: piecewise-linear rate -> arrivals
# --------------------------------------------------------------------------------------------


def _segments(
    breaks: Sequence[float], rates_start: Sequence[float], rates_end: Sequence[float]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Validated float64 arrays (breaks, r0, r1)."""
    b = np.asarray(breaks, dtype=np.float64)
    r0 = np.asarray(rates_start, dtype=np.float64)
    r1 = np.asarray(rates_end, dtype=np.float64)
    if b.ndim != 1 or r0.ndim != 1 or r1.ndim != 1:
        raise ValueError("breaks and rates must be 1-D sequences")
    if len(r0) != len(r1) or len(b) != len(r0) + 1:
        raise ValueError(
            f"need len(breaks) == len(rates) + 1, got {len(b)} breaks, "
            f"{len(r0)} start rates and {len(r1)} end rates"
        )
    if b[0] != 0.0:
        raise ValueError(f"breaks must start at 0, got {b[0]}")
    if not np.all(np.isfinite(b)) or np.any(np.diff(b) < 0):
        raise ValueError("breaks must be finite and non-decreasing")
    if not (np.all(np.isfinite(r0)) and np.all(np.isfinite(r1))) or np.any(r0 < 0) or np.any(r1 < 0):
        raise ValueError("rates must be finite and >= 0")
    return b, r0, r1


def _cumulative(b: np.ndarray, r0: np.ndarray, r1: np.ndarray) -> np.ndarray:
    """Λ at every break: Λ(b[0]) = 0, then the running sum of the trapezoid areas."""
    areas = 0.5 * (r0 + r1) * np.diff(b)
    return np.concatenate(([0.0], np.cumsum(areas)))


def expected_count(
    breaks: Sequence[float], rates_start: Sequence[float], rates_end: Sequence[float]
) -> float:
    """Λ(duration): the expected number of arrivals (the exact count, up to ±1, for even spacing)."""
    b, r0, r1 = _segments(breaks, rates_start, rates_end)
    return float(_cumulative(b, r0, r1)[-1])


def _poisson_marks(total: float, rng: np.random.Generator) -> np.ndarray:
    """Points of a unit-rate Poisson process on [0, total): running sums of Exp(1) draws.

    Drawn in chunks until the running sum passes `total`, so the count is never guessed: the
    first chunk is sized to cover `total` with high probability and the loop tops it up when not.
    """
    chunk = min(int(total + 4.0 * math.sqrt(total)) + 16, _MAX_CHUNK)
    parts = []
    last = 0.0
    while last < total:
        marks = last + np.cumsum(rng.standard_exponential(chunk))
        parts.append(marks)
        last = float(marks[-1])
    marks = np.concatenate(parts) if parts else np.empty(0)
    return marks[: np.searchsorted(marks, total)]  # sorted: everything before the first >= total


def _invert(u: np.ndarray, b: np.ndarray, r0: np.ndarray, r1: np.ndarray, cum: np.ndarray) -> np.ndarray:
    """Λ⁻¹(u) for sorted u in [0, Λ(duration)).

    Within segment i (start b[i], length L, rate r0 -> r1) the offset τ of the point where the
    cumulative rate has grown by u' = u - Λ(b[i]) solves r0·τ + (r1 - r0)·τ²/(2L) = u'. The
    textbook root (-r0 + sqrt(...)) / slope cancels catastrophically when the slope is small and
    divides by zero when it is 0; multiplying through by the conjugate gives the stable form
        τ = 2u' / (r0 + sqrt(r0² + 2(r1 - r0)·u'/L)),
    which is exactly u'/r0 for a constant segment.
    """
    # Per-segment constants, once. Zero-length segments get slope 0 (they are never used, below).
    length = np.diff(b)
    with np.errstate(divide="ignore", invalid="ignore"):
        slope2 = np.where(length > 0, 2.0 * (r1 - r0) / length, 0.0)  # 2(r1 - r0)/L
    r0_squared = r0 * r0

    t = np.empty_like(u)
    for lo in range(0, len(u), _BLOCK):
        uu = u[lo : lo + _BLOCK]
        # side="right" picks the *last* boundary with Λ <= u: zero-area segments (rate 0 or zero
        # length) have flat Λ, so they are skipped and never receive an arrival.
        seg = np.searchsorted(cum, uu, side="right") - 1
        du = uu - cum[seg]
        # The radicand is >= r1² >= 0 in exact arithmetic (u' < segment area): clip rounding noise.
        root = np.sqrt(np.maximum(r0_squared[seg] + slope2[seg] * du, 0.0))
        # The denominator is 0 only when r0 == 0 and u' == 0 (an arrival exactly at the start of
        # a ramp from 0); flooring it at the smallest positive float turns that 0/0 into 0.
        denom = np.maximum(r0[seg] + root, np.finfo(np.float64).tiny)
        # Rounding may push a point a hair past its segment's end; clamping keeps segments ordered.
        t[lo : lo + _BLOCK] = np.minimum(b[seg] + 2.0 * du / denom, b[seg + 1])
    return t


def piecewise(
    breaks: Sequence[float],
    rates_start: Sequence[float],
    rates_end: Sequence[float],
    spacing: Spacing,
    rng: np.random.Generator | None,
) -> np.ndarray:
    """Arrivals for a piecewise-linear rate.

    Segment i covers [breaks[i], breaks[i+1]) with a rate going linearly from rates_start[i] to
    rates_end[i] (requests/s). breaks[0] must be 0; the last break is the phase duration.
    `rng` is only used (and required) for poisson spacing.
    """
    b, r0, r1 = _segments(breaks, rates_start, rates_end)
    if spacing not in ("even", "poisson"):
        raise ValueError(f"unknown spacing {spacing!r}: expected 'even' or 'poisson'")
    if spacing == "poisson" and rng is None:
        raise ValueError("poisson spacing needs an rng")
    duration = float(b[-1])
    cum = _cumulative(b, r0, r1)
    total = float(cum[-1])
    if total <= 0.0:
        return np.empty(0, dtype=np.float64)

    if spacing == "even":
        u = np.arange(math.ceil(total), dtype=np.float64)  # 0, 1, ..., all < total
    else:
        u = _poisson_marks(total, rng)

    t = _invert(u, b, r0, r1, cum)
    # Λ⁻¹ is non-decreasing, but two nearly equal u can come out one ulp in the wrong order;
    # a running maximum restores the sorted contract in O(n) without a sort.
    t = np.maximum.accumulate(t)
    return t[: np.searchsorted(t, duration)]  # sorted: keep t < duration


# --------------------------------------------------------------------------------------------
# Shapes: each builds breaks and rates and hands them to `piecewise`
# --------------------------------------------------------------------------------------------


def _check_duration(duration: float) -> None:
    if not (duration >= 0 and math.isfinite(duration)):
        raise ValueError(f"duration must be finite and >= 0, got {duration}")


def _flat(
    breaks: np.ndarray, rates: np.ndarray, spacing: Spacing, rng: np.random.Generator | None
) -> np.ndarray:
    """Piecewise-constant rates (every shape except ramp)."""
    return piecewise(breaks, rates, rates, spacing, rng)


def constant(rate: float, duration: float) -> np.ndarray:
    """Evenly spaced: 0, 1/rate, 2/rate, ... below duration (ceil(rate·duration) requests)."""
    _check_duration(duration)
    return _flat(np.array([0.0, duration]), np.array([rate]), "even", None)


def poisson(rate: float, duration: float, rng: np.random.Generator) -> np.ndarray:
    """Homogeneous Poisson arrivals: independent Exp(rate) gaps (the classic open-loop model)."""
    _check_duration(duration)
    return _flat(np.array([0.0, duration]), np.array([rate]), "poisson", rng)


def burst(
    base_rate: float,
    burst_rate: float,
    burst_length: float,
    period: float,
    duration: float,
    spacing: Spacing,
    rng: np.random.Generator | None,
) -> np.ndarray:
    """On/off load: burst_rate during [k·period, k·period + burst_length), base_rate otherwise."""
    _check_duration(duration)
    if not period > 0:
        raise ValueError(f"period must be > 0, got {period}")
    if not burst_length >= 0:
        raise ValueError(f"burst_length must be >= 0, got {burst_length}")
    cycles = math.ceil(duration / period)
    on = np.arange(cycles) * period
    off = on + min(burst_length, period)
    # [0, off0, on1, off1, on2, ...] then the duration; breaks beyond it collapse onto it,
    # leaving zero-length segments that carry no arrivals.
    breaks = np.minimum(np.append(np.column_stack([on, off]).ravel(), duration), duration)
    rates = np.tile([burst_rate, base_rate], cycles).astype(np.float64)
    return _flat(breaks, rates, spacing, rng)


def mmpp(
    base_rate: float,
    burst_rate: float,
    mean_burst_length: float,
    mean_gap: float,
    duration: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """Two-state Markov-modulated Poisson process: bursts at random times, of random lengths.

    The state starts in "base" and alternates base/burst; each sojourn is exponential with mean
    `mean_gap` (base) or `mean_burst_length` (burst). Within a state arrivals are Poisson at that
    state's rate. Unlike `burst`, nothing is periodic, and the counts are over-dispersed
    (variance > mean), which is how real bursty traffic tends to look.
    """
    _check_duration(duration)
    if not (mean_burst_length > 0 and mean_gap > 0):
        raise ValueError("mean_burst_length and mean_gap must be > 0")
    # State switch times: running sums of (gap, burst) sojourn pairs, drawn in chunks until they
    # pass the duration.
    pairs_per_chunk = int(duration / (mean_gap + mean_burst_length)) + 16
    parts = []
    covered = 0.0
    while covered < duration:
        sojourns = np.column_stack(
            [
                rng.exponential(mean_gap, pairs_per_chunk),
                rng.exponential(mean_burst_length, pairs_per_chunk),
            ]
        ).ravel()  # gap, burst, gap, burst, ...
        switches = covered + np.cumsum(sojourns)
        parts.append(switches)
        covered = float(switches[-1])
    switches = np.concatenate(parts) if parts else np.empty(0)
    breaks = np.concatenate(([0.0], switches[switches < duration], [duration]))
    in_base = np.arange(len(breaks) - 1) % 2 == 0  # segments alternate, starting in base
    rates = np.where(in_base, float(base_rate), float(burst_rate))
    return _flat(breaks, rates, "poisson", rng)


def ramp(
    from_rate: float,
    to_rate: float,
    duration: float,
    spacing: Spacing,
    rng: np.random.Generator | None,
) -> np.ndarray:
    """Rate linear from from_rate to to_rate over the whole duration (scale-up / scale-down)."""
    _check_duration(duration)
    return piecewise([0.0, duration], [from_rate], [to_rate], spacing, rng)


def steps(
    rates: Sequence[float],
    step: float,
    duration: float,
    spacing: Spacing,
    rng: np.random.Generator | None,
) -> np.ndarray:
    """Staircase: rates[i] during [i·step, (i+1)·step); the last rate continues to the end."""
    _check_duration(duration)
    if not step > 0:
        raise ValueError(f"step must be > 0, got {step}")
    if len(rates) == 0:
        raise ValueError("steps needs at least one rate")
    inner = np.arange(1, len(rates)) * step
    breaks = np.minimum(np.concatenate(([0.0], inner, [duration])), duration)
    return _flat(breaks, np.asarray(rates, dtype=np.float64), spacing, rng)


def spike(
    base_rate: float,
    spike_rate: float,
    at: float,
    length: float,
    duration: float,
    spacing: Spacing,
    rng: np.random.Generator | None,
) -> np.ndarray:
    """base_rate, except spike_rate during [at, at + length)."""
    _check_duration(duration)
    if not (at >= 0 and length >= 0):
        raise ValueError("spike needs at >= 0 and length >= 0")
    breaks = np.minimum([0.0, at, at + length, duration], duration)
    return _flat(breaks, np.array([base_rate, spike_rate, base_rate], dtype=np.float64), spacing, rng)


# --------------------------------------------------------------------------------------------
# Recorded traces
# --------------------------------------------------------------------------------------------


def _pick_time_column(columns: Sequence[str], wanted: str | None, path: Path) -> str:
    """The named column, else the first one with "time" in its name, else the first one."""
    if wanted is not None:
        if wanted not in columns:
            raise ScenarioError(
                f"trace file {path}: no column {wanted!r} (columns: {', '.join(map(str, columns))})"
            )
        return wanted
    for name in columns:
        if "time" in str(name).lower():
            return name
    return columns[0]


def _row(i: int) -> str:
    """Where 0-based row i of the frame is in the file, for error messages (header = line 1)."""
    return f"data row {i + 1} (line {i + 2})"


def _seconds(values: pd.Series, column: str, path: Path) -> np.ndarray:
    """Times as float64 seconds since the earliest one: numbers are seconds already, strings are
    ISO 8601 datetimes (this covers the Azure trace format with 7 fractional digits)."""
    import pandas as pd

    numbers = pd.to_numeric(values, errors="coerce")
    if pd.notna(numbers.iloc[0]):  # the first row decides: a number means seconds throughout
        secs = numbers.to_numpy(dtype=np.float64)
        bad = ~np.isfinite(secs)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ScenarioError(
                f"trace file {path}: column {column!r}: time {values.iloc[i]!r} on "
                f"{_row(i)} is not a finite number of seconds like the first row's"
            )
        return secs - secs.min()
    # utc=True puts timezone-aware values on one clock; naive ones are taken as UTC, which keeps
    # their differences (all we use) intact.
    stamps = pd.to_datetime(values, format="ISO8601", errors="coerce", utc=True)
    bad = stamps.isna().to_numpy()
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ScenarioError(
            f"trace file {path}: column {column!r}: cannot parse time {values.iloc[i]!r} on "
            f"{_row(i)}; expected seconds or an ISO 8601 datetime"
        )
    return (stamps - stamps.min()).dt.total_seconds().to_numpy(dtype=np.float64)


def read_trace(path: str | Path, time_column: str | None = None) -> pd.DataFrame:
    """Load a request trace (CSV with a header) and add "offset_s", seconds since its first request.

    The time column is `time_column`, else the first column whose name contains "time"
    (case-insensitive), else the first column. Its values are numbers (seconds) or datetimes.
    Returns every original column plus "offset_s" (float64), sorted by offset_s (stable, so rows
    with equal times keep file order), index reset. Other columns (token counts, ...) ride along
    for workloads that want them.
    """
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise ScenarioError(f"trace file {path}: not found")
    try:
        frame = pd.read_csv(path)
    except pd.errors.EmptyDataError:
        raise ScenarioError(f"trace file {path}: file is empty") from None
    except (pd.errors.ParserError, UnicodeDecodeError, OSError) as exc:
        raise ScenarioError(f"trace file {path}: cannot read it as CSV ({exc})") from None
    if frame.empty:
        raise ScenarioError(f"trace file {path}: no rows after the header")

    column = _pick_time_column(list(frame.columns), time_column, path)
    frame["offset_s"] = _seconds(frame[column], column, path)
    return frame.sort_values("offset_s", kind="stable").reset_index(drop=True)


def trace_offsets(
    trace: pd.DataFrame, speedup: float = 1.0, start: float = 0.0, duration: float | None = None
) -> np.ndarray:
    """Send offsets that replay a trace from `read_trace`.

    `start` is in trace time: rows before it are skipped and the rest re-based so `start` maps to
    0. Offsets are then divided by `speedup` (10 = replay ten times faster), and, when `duration`
    (phase time, i.e. after speedup) is given, only those below it are kept.
    """
    if not speedup > 0:
        raise ValueError(f"speedup must be > 0, got {speedup}")
    if "offset_s" not in trace.columns:
        raise ValueError("trace has no 'offset_s' column; load it with read_trace()")
    offsets = trace["offset_s"].to_numpy(dtype=np.float64)
    return (offsets[trace_rows(trace, speedup, start, duration)] - start) / speedup


def trace_rows(trace: pd.DataFrame, speedup: float = 1.0, start: float = 0.0, duration: float | None = None) -> np.ndarray:
    """Positions of the rows `trace_offsets` replays, in replay order."""
    order = np.argsort(trace["offset_s"].to_numpy(dtype=np.float64), kind="stable")
    offsets = trace["offset_s"].to_numpy(dtype=np.float64)[order]
    keep = offsets >= start
    if duration is not None:
        keep &= (offsets - start) / speedup < duration
    return order[keep]


def trace_lengths(trace: pd.DataFrame, column: str, path: str | Path) -> np.ndarray:
    """A trace column of token counts (e.g. the Azure trace's ContextTokens) as int32; missing or
    non-positive values become 0 ("let the workload class decide")."""
    import pandas as pd

    if column not in trace.columns:
        known = ", ".join(str(c) for c in trace.columns if c != "offset_s")
        raise ScenarioError(f"trace file {path}: no column {column!r} (columns: {known})")
    values = pd.to_numeric(trace[column], errors="coerce").to_numpy(dtype=np.float64)
    return np.where(np.isfinite(values) & (values >= 1), np.rint(values), 0).astype(np.int32)


# --------------------------------------------------------------------------------------------
# The scenario's arrival models -> offsets
# --------------------------------------------------------------------------------------------


def phase_offsets(a: Arrival, d: float | None, rng: np.random.Generator, resolve: Callable[[str], Path],
                  limits: ReplayLimits | None = None) -> tuple[np.ndarray, float, dict[str, np.ndarray]]:
    """A scenario phase's intended offsets for its arrival model `a` and duration `d` (None: a trace
    phase that lasts as long as its trace), the phase's duration, and the per-request lengths its
    arrivals bring along ({"prompt_tokens"/"output_tokens": int32 array}, from a trace's columns).
    `resolve` turns a file name of the scenario into a path; `limits` (the scenario's, from
    plan.build_plan) are checked on a trace (None: a scenario already checked). A new arrival
    process is a model in latscope/scenario/phases.py and a shape function above plus its `case` here."""
    match a.type:
        case "constant":
            return constant(a.rate, d), d, {}
        case "poisson":
            return poisson(a.rate, d, rng), d, {}
        case "burst":
            return burst(a.base_rate, a.burst_rate, a.burst_length, a.period, d, a.spacing, rng), d, {}
        case "mmpp":
            return mmpp(a.base_rate, a.burst_rate, a.mean_burst_length, a.mean_gap, d, rng), d, {}
        case "ramp":
            return ramp(a.from_rate, a.to_rate, d, a.spacing, rng), d, {}
        case "steps":
            return steps(a.rates, a.step, d, a.spacing, rng), d, {}
        case "spike":
            return spike(a.base_rate, a.spike_rate, a.at, a.length, d, a.spacing, rng), d, {}
        case "idle":
            return np.empty(0, dtype=np.float64), d, {}
        case "users":  # one row per closed-loop user, at its start: evenly over the ramp (within the phase)
            return np.arange(a.users) * (min(a.ramp, d) / a.users), d, {}
        case "trace" if a.format == "mooncake":
            return _mooncake_phase(a, d, resolve(a.file), limits)
        case "trace" if a.format == "agents":
            return _agents_phase(a, d, resolve(a.file), limits)
        case "trace":
            path = resolve(a.file)
            trace = read_trace(path, a.time_column)
            offsets = trace_offsets(trace, a.speedup, a.start, d)
            if limits is not None and len(offsets) and offsets[-1] > limits.max_duration_s:
                raise ScenarioError(f"trace file {path}: its replay would last {offsets[-1]:.6g} s; a phase lasts at most "
                                    f"{limits.max_duration_s:,.0f} s: give the phase a duration, or a start or speedup")
            if d is None:  # the phase lasts as long as the (sped-up) trace
                d = float(offsets[-1]) + 1e-6 if len(offsets) else 0.0
            lengths = {}
            if (spec := a.lengths) is not None:
                rows = trace_rows(trace, a.speedup, a.start, d)  # the rows behind `offsets`, in order
                for key, column, cap in (("prompt_tokens", spec.prompt_column, spec.max_prompt),
                                         ("output_tokens", spec.output_column, spec.max_output)):
                    if column is not None:
                        values = trace_lengths(trace, column, path)[rows]
                        scaled = np.maximum(1, np.rint(values * spec.scale)) if spec.scale != 1 else values
                        lengths[key] = np.where(values > 0, np.minimum(scaled, cap or np.iinfo(np.int32).max), 0).astype(np.int32)
            return offsets, d, lengths
    raise AssertionError(f"unhandled arrival type {a.type}")


def _agents_phase(a: Arrival, d: float | None, path: Path,
                  limits: ReplayLimits | None) -> tuple[np.ndarray, float, dict[str, np.ndarray]]:
    """An agent trace phase (agent_trace.py): its jobs' starts (from `start`, sped up, within `d`) as the
    offsets, and each one's place in the trace ("agent_job"), from which the plan takes its rounds."""
    trace = read_agent_trace(path, limits.max_requests if limits is not None else 1 << 62)
    starts = np.array([job.start_s for job in trace.jobs], np.float64)  # sorted
    keep = np.flatnonzero(starts >= a.start)
    offsets = (starts[keep] - a.start) / a.speedup
    if d is not None:
        keep, offsets = keep[offsets < d], offsets[offsets < d]
    elif limits is not None and len(offsets) and offsets[-1] > limits.max_duration_s:
        raise ScenarioError(f"agent trace {path}: its replay would last {offsets[-1]:.6g} s; a phase lasts at most "
                            f"{limits.max_duration_s:,.0f} s: give the phase a duration, or a start or speedup")
    if d is None:
        d = float(offsets[-1]) + 1e-6 if len(offsets) else 0.0
    return offsets, d, {"agent_job": keep.astype(np.int64)}


def _mooncake_phase(a: Arrival, d: float | None, path: Path,
                    limits: ReplayLimits | None) -> tuple[np.ndarray, float, dict[str, np.ndarray]]:
    """A Mooncake trace phase: offsets, duration, and besides the lengths (scaled) each request's block
    ids as CSR ("hash_ids", "hash_start") and "block_tokens" (see latscope/mooncake.py)."""
    block_tokens = scaled_block(BLOCK_SIZE, a.scale)
    trace = read_mooncake(path, max_ids=limits.max_ids(block_tokens) if limits is not None else None)
    rows = mooncake_rows(trace, a.speedup, a.start, d)
    offsets = mooncake_offsets(trace, a.speedup, a.start, d)
    if d is None:
        d = float(offsets[-1]) + 1e-6 if len(offsets) else 0.0
    prompt, output, block_tokens = scaled_lengths(trace, rows, a.scale)
    top = np.iinfo(np.int32).max
    if a.lengths is not None:  # caps: a capped prompt keeps its first blocks, cut short
        prompt, output = np.minimum(prompt, a.lengths.max_prompt or top), np.minimum(output, a.lengths.max_output or top)
    if limits is not None:
        check_replay(trace, rows, offsets, prompt, block_tokens, limits)
    prompt, output = np.minimum(prompt, top).astype(np.int32), np.minimum(output, top).astype(np.int32)
    counts = trace.hash_start[rows + 1] - trace.hash_start[rows]
    ids = np.concatenate([trace.hash_ids[trace.hash_start[r]:trace.hash_start[r + 1]] for r in rows]) if len(rows) else \
        np.empty(0, np.int64)
    return offsets, d, {"prompt_tokens": prompt, "output_tokens": output, "hash_ids": ids,
                        "hash_start": np.concatenate(([0], np.cumsum(counts))).astype(np.int64),
                        "block_tokens": np.full(len(rows), block_tokens, np.int32)}


def expected_arrivals(a: Arrival, d: float | None, resolve: Callable[[str], Path],
                      limits: ReplayLimits | None = None) -> float:
    """Λ(d): the expected number of arrivals of a scenario phase (arrival model `a`, duration `d`),
    what its rates promise rather than what one seeded draw gave. `latscope capacity` scales a
    scenario's traffic by one factor and calls the measured phases' Λ / duration its offered rate,
    so the rate of a step is exact, not a Poisson count. Closed forms per shape (an MMPP's is its
    stationary mean, (base·gap + burst·length) / (gap + length) per second); a trace's is its count
    (its file read, and checked against `limits` as phase_offsets does)."""
    def overlap(start: float, length: float) -> float:  # of [start, start + length) with [0, d)
        return max(0.0, min(start + length, d) - min(start, d))

    match a.type:
        case "constant" | "poisson":
            return a.rate * d
        case "burst":  # whole cycles, then what the last one's burst gets of the rest
            cycles, rest = divmod(d, a.period)
            on = cycles * a.burst_length + min(a.burst_length, rest)
            return a.burst_rate * on + a.base_rate * (d - on)
        case "mmpp":
            return (a.base_rate * a.mean_gap + a.burst_rate * a.mean_burst_length) / (a.mean_gap + a.mean_burst_length) * d
        case "ramp":
            return (a.from_rate + a.to_rate) / 2 * d
        case "steps":
            lasts = [overlap(i * a.step, a.step) for i in range(len(a.rates) - 1)]
            return sum(r * t for r, t in zip(a.rates, lasts)) + a.rates[-1] * max(0.0, d - (len(a.rates) - 1) * a.step)
        case "spike":
            return a.base_rate * d + (a.spike_rate - a.base_rate) * overlap(a.at, a.length)
        case "idle":
            return 0.0
        case "users":  # a row per user; what each sends is the server's doing
            return float(a.users)
        case "trace":
            return float(len(phase_offsets(a, d, np.random.default_rng(0), resolve, limits)[0]))
    raise AssertionError(f"unhandled arrival type {a.type}")

"""What every cause of `latscope explain` is judged on: the measured requests split into the tail
and the body, and the record of one candidate cause.

- *Measured*: not warm-up, succeeded, and has a value of the metric (a stream's ttft).
- *Tail*: measured requests whose value is above the metric's quantile q (the lower order
  statistic at q, so a p99 of 1,000 requests leaves the 10 largest).
- *Body*: the middle half, p25..p75: the ordinary request, against which "what grew" is measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from latscope.analysis.explain_data import Records
from latscope.analysis.run_data import RunData


@dataclass
class Split:
    records: Records
    run: RunData
    metric: str
    rows: np.ndarray  # int, the measured rows of records
    value: np.ndarray  # float µs, the metric of each measured row
    tail: np.ndarray  # bool over measured
    body: np.ndarray  # bool over measured
    threshold_us: float
    low_us: float  # body p25
    high_us: float  # body p75

    @property
    def n(self) -> int:
        return len(self.rows)

    @property
    def n_tail(self) -> int:
        return int(self.tail.sum())

    @property
    def excess_us(self) -> float:
        return float(self.value[self.tail].mean() - self.value[self.body].mean())

    def column(self, name: str) -> np.ndarray:
        """A numeric column of the measured rows (float, NaN where null)."""
        return self.records.number(name)[self.rows]


def split(records: Records, run: RunData, metric: str, values_us: np.ndarray, quantile: float) -> Split | None:
    """The measured requests, tail and body; None when nothing was measured."""
    ok = ~records.warmup & np.isfinite(values_us)
    error = records.codes.get("error")
    if error is not None:
        ok &= error < 0
    rows = np.flatnonzero(ok)
    if not len(rows):
        return None
    value = values_us[rows]
    low, high, threshold = np.quantile(value, [0.25, 0.75, quantile], method="lower")
    tail = value > threshold
    body = (value >= low) & (value <= high)
    return Split(records, run, metric, rows, value, tail, body, float(threshold), float(low), float(high))


@dataclass
class Candidate:
    """One possible cause, tested: see explain.py for how effect and p_value are judged."""

    kind: str  # generator | time | where | what | server_state
    name: str  # a stable id (explain_format: `replica=r2`, `prompt_tokens`, `queue_depth`, ...)
    label: str  # for people
    effect: float  # 0..1: the share of the tail it explains
    p_value: float  # one-sided, before the correction for the candidates tested
    evidence: str  # one sentence, numbers in it
    detail: dict = field(default_factory=dict)
    family: str = ""  # candidates of one family (a column's groups) compete: the table shows the best
    # False: not a pattern however large and significant (the tail in one or two moments of time: a
    # one-off, which on a busy machine any run may have); the evidence says why
    eligible: bool = True

    def doc(self) -> dict:
        return {"kind": self.kind, "name": self.name, "label": self.label, "effect": round(float(self.effect), 4),
                "p_value": float(f"{self.p_value:.3g}") if math.isfinite(self.p_value) else 1.0,
                "evidence": self.evidence, "detail": self.detail}


def pct(x: float) -> str:
    """A share in words: 0.873 -> '87 %' (one decimal under 10 %)."""
    return f"{x * 100:.1f} %" if x < 0.1 else f"{x * 100:.0f} %"


def ms(us: float) -> str:
    """µs as ms in words: 3 significant digits under 100 ms."""
    value = us / 1000
    return f"{value:.3g} ms" if abs(value) < 100 else f"{value:,.0f} ms"


def round_ms(us: float) -> float | None:
    return None if us is None or not math.isfinite(us) else round(us / 1000, 3)

"""A capacity directory as `latscope capacity` writes it (capacity.json and one directory per step),
made up so the page's tests need no run: eight steps of an M/M/1-like target (service rate about
493 req/s, so p99 latency crosses 40 ms between 375 and 387.5 req/s) with a fail, an undecided step
rerun longer, an invalid one, goodput on some, and hostile strings from the scenario and the target
in every place a string can come from.

`sample_capacity(tmp_path)` is the one place the tests get their data from: it can later be swapped
for a real `latscope capacity` run against a local target without touching the tests.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

# Each would run script or make an element if it reached the page as markup.
SCRIPT = "<script>alert(1)</script>"
IMG = '"><img src=x onerror=alert(1)>'
SCENARIO = f"mm1{SCRIPT}"
HOSTILE_SLO = f"ttft/all p99{IMG}"
HOSTILE_CLASS = f"chat{IMG}"
HOSTILE_DIR = f"steps/008-387.5{IMG}"
PAYLOADS = (SCRIPT, IMG)

SERVICE_RPS = 493.0  # M/M/1: the p-quantile of time in system is -ln(1 - p) / (mu - lambda)


def _quantile_ms(rate: float, p: float) -> float:
    return -math.log(1 - p) / (SERVICE_RPS - rate) * 1000


def _percentiles(rate: float, scale: float = 1.0, offset: float = 0.0, width: float = 1.0,
                 no_tail_ci: bool = False) -> dict:
    out = {}
    for stat, p, half in (("p50", 0.5, 0.03), ("p99", 0.99, 0.04), ("p99.9", 0.999, 0.2)):
        v = _quantile_ms(rate, p) * scale + offset
        # A wide interval (width > 1) widens upward mostly, so no bound goes below zero.
        ci = None if (no_tail_ci and stat == "p99.9") else (round(v * (1 - half * min(width, 3.0)), 2), round(v * (1 + min(half * width, 0.9)), 2))
        out[stat] = {"value_ms": round(v, 2), "low_ms": ci and ci[0], "high_ms": ci and ci[1]}
    return out


def _step(index: int, rate: float, verdict: str, counted_as: str | None, *, achieved: float | None = None,
          offered: float | None = None, duration: float = 4.0, longer: bool = False, validity: str = "valid",
          reasons: list[str] | None = None, note: str = "", goodput: bool = True, width: float = 1.0,
          dir_name: str | None = None, report: bool = True, hostile_class: bool = True) -> dict:
    offered = offered if offered is not None else round(rate * 0.993, 1)
    achieved = achieved if achieved is not None else round(offered * 0.998, 1)
    latency = _percentiles(achieved, width=width, no_tail_ci=index == 1)
    percentiles = {"latency/all": latency, "ttft/all": _percentiles(achieved, scale=0.3, offset=4.0, width=width)}
    if hostile_class:
        percentiles[f"latency/{HOSTILE_CLASS}"] = _percentiles(achieved, scale=1.1, width=width)
    p99, ttft99 = latency["p99"], percentiles["ttft/all"]["p99"]
    sent = int(rate * duration)
    errors = 1 if index % 3 == 0 else 0
    fraction = math.exp(-(p99["value_ms"] / 60.0) ** 4)  # good: within a per-request objective the tail crosses
    directory = dir_name or f"steps/{index:03d}-{rate:g}"

    def slo_verdict(result: dict, limit: float) -> str:
        if verdict in ("invalid", "partial"):
            return verdict
        if verdict == "undecided" and result["low_ms"] <= limit <= result["high_ms"]:
            return "undecided"
        return "pass" if result["high_ms"] < limit else "fail" if result["low_ms"] > limit else "undecided"

    return {
        "index": index, "dir": directory, "rate_rps": rate, "factor": rate / 100.0, "duration_s": duration, "longer": longer,
        "offered_rps": offered, "achieved_rps": achieved, "validity": validity, "validity_reasons": reasons or [],
        "partial": False, "requests": {"sent": sent, "completed": sent - errors, "errors": errors},
        "verdict": verdict, "counted_as": counted_as, "note": note,
        "slos": [
            {"name": "latency/all p99", "value": p99["value_ms"], "low": p99["low_ms"], "high": p99["high_ms"], "limit": 40.0,
             "bound": "max", "unit": "ms", "verdict": slo_verdict(p99, 40.0)},
            {"name": HOSTILE_SLO, "value": ttft99["value_ms"], "low": ttft99["low_ms"], "high": ttft99["high_ms"], "limit": 30.0,
             "bound": "max", "unit": "ms", "verdict": slo_verdict(ttft99, 30.0)},
        ],
        "percentiles": percentiles,
        "goodput": ({"good": round(sent * fraction), "total": sent, "fraction": round(fraction, 4),
                     "rps": round(offered * fraction, 1), "output_tokens_per_s": 0.0} if goodput else None),
        "output_tokens_per_s": round(achieved * 2.1, 1),
        "report": f"{directory}/report.html" if report else None,
    }


def capacity_dict() -> dict:
    """The capacity.json of the sample, as a dict."""
    steps = [
        _step(1, 100.0, "pass", "pass"),
        _step(2, 200.0, "pass", "pass"),
        _step(3, 400.0, "fail", "fail"),
        _step(4, 300.0, "undecided", None, width=20.0, goodput=False, report=False, hostile_class=False,
              note=f"undecided: rerun for 8 s {SCRIPT}"),
        _step(5, 300.0, "pass", "pass", duration=8.0, longer=True, note="the longer rerun of step 4"),
        _step(6, 350.0, "invalid", None, offered=318.0, achieved=310.0, validity="invalid", goodput=False, hostile_class=False,
              reasons=[f"send lag p99 41 ms > 10 ms: the generator fell behind {IMG}"], note="invalid: not counted"),
        _step(7, 375.0, "pass", "pass"),
        _step(8, 387.5, "fail", "fail", dir_name=HOSTILE_DIR, note=f"failed latency/all p99 {SCRIPT}"),
    ]
    return {
        "schema_version": 1, "scenario": SCENARIO, "started_at": "2026-11-24T07:00:00Z", "duration_s": 61.2,
        "precision": 0.05, "confidence": 0.95,
        "options": {"min_rate": None, "max_rate": None, "max_steps": 12, "step_duration_s": 4.0, "price_per_hour": 3.5},
        "base_rate_rps": 100.0, "max_rate_rps": 375.0, "bracket": {"low_rps": 375.0, "high_rps": 387.5},
        "limiting_slo": "latency/all p99", "stopped": "precision",
        "message": f"capacity 375 req/s: every SLO held with 95 % confidence; 387.5 req/s failed latency/all p99 {IMG}",
        "exit_code": 0,
        "slos": [
            {"name": "latency/all p99", "metric": "latency", "class": "all", "stat": "p99", "limit": 40.0, "unit": "ms", "bound": "max"},
            {"name": HOSTILE_SLO, "metric": "ttft", "class": "all", "stat": "p99", "limit": 30.0, "unit": "ms", "bound": "max"},
        ],
        "cost": {"price_per_hour": 3.5, "at_rate_rps": 375.0, "per_1k_requests": round(3.5 / 3600 / 375 * 1000, 6),
                 "per_1m_output_tokens": round(3.5 / 3600 / 790 * 1e6, 4)},
        "steps": steps,
    }


def sample_capacity(tmp_path: Path) -> Path:
    """A capacity directory under tmp_path: capacity.json plus each step's (empty) directory."""
    directory = tmp_path / "capacity-sample"
    directory.mkdir(parents=True, exist_ok=True)
    capacity = capacity_dict()
    for step in capacity["steps"]:
        (directory / step["dir"]).mkdir(parents=True, exist_ok=True)
    (directory / "capacity.json").write_text(json.dumps(capacity, indent=1))
    return directory

"""A capacity search judged by what the generator's lateness can change (analysis/verdicts.py), with a
CPU hog beside the generator: real `latscope capacity` processes against the M/M/1 queue target.

With the coarse timer and a busy-looping process on the generator's core, the generator sends
1–5 ms late at the p99: over the fixed 1 ms floor, which alone would stop any search ("the load
generator fell behind"). Against a 100 ms SLO at 50–100 req/s (10–20 ms apart) that lateness is under
5 % of the limit and half the spacing, so the steps stay valid and the search ends on its own terms
(--max-rate). Against a 5 ms SLO, 5 % of the limit is 0.25 ms, the 1 ms floor holds, and the same
lateness stops the search at its first step. The test asserts on the send lag each step measured: a
setup that did not make the generator late enough (≤ 1 ms: the point is not shown) or made it too
late (past the relative threshold: the loose search is rightly stopped too) is tried once more with
a harsher or gentler hog, then fails with the numbers (printed on a pass too: pytest -rP).

Measured on the 2-core box shared with other test runs (send-lag p99 per step, ms): no hog 1.2–2.4,
one hog at nice 19 1.5–6.5, at nice 10 2.5–11; while the box ran at a load of 7–9 even no hog gave
4–16 ms, and no setup fits under 5 ms: then this test fails, saying so, and it is the box.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import yaml

from conftest import REPO, target_process

RATE = 50  # req/s of the first step; --max-rate 100 makes the loose search two steps, 50 and 100
LOOSE_MS, TIGHT_MS = 100, 5
# The generator (the search and its worker) and the hogs share one core, so that the contention does
# not depend on how many cores the machine has. (hogs, niceness), gentlest first; the first try is
# FIRST, the retry one gentler or harsher as the first measured (the module docstring: what each did).
CORE = max(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
SETUPS = [(0, 0), (1, 19), (1, 10), (1, 0)]
FIRST = 1


def on_the_core() -> None:
    if CORE is not None:
        os.sched_setaffinity(0, {CORE})


def latscope(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "latscope.cli", *args], cwd=REPO, env={**os.environ, "NO_COLOR": "1"},
                          capture_output=True, text=True, timeout=120, preexec_fn=on_the_core)


@contextmanager
def cpu_hogs(count: int, niceness: int) -> Iterator[None]:
    """`count` processes spinning on the generator's core at `niceness`, killed (by their own ids) on the way out."""
    procs = [subprocess.Popen([sys.executable, "-c", f"import os; os.nice({niceness})\nwhile True: pass"],
                              preexec_fn=on_the_core) for _ in range(count)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(10)


def search(url: str, limit_ms: float, out: Path) -> tuple[subprocess.CompletedProcess, dict, list[dict]]:
    """A short search (2 s steps) with a p90 SLO of `limit_ms`: (the process, capacity.json, each
    step's summary.json)."""
    scenario = out.with_suffix(".yaml")
    scenario.write_text(yaml.safe_dump({
        "name": "lateness", "seed": 5,
        "target": {"url": url, "method": "POST", "path": "/infer", "timeout": "5s"},
        "phases": [{"name": "warm", "duration": "1s", "warmup": True, "arrival": {"type": "poisson", "rate": RATE}},
                   {"name": "measure", "duration": "2s", "arrival": {"type": "poisson", "rate": RATE}}],
        "slos": [{"metric": "latency", "stat": "p90", "limit_ms": limit_ms}],
        "output": {"dir": str(out.parent / "results"), "report": False, "save_schedule": False},
        "telemetry": {"nvml": False, "host": False},
        "limits": {"timer": "coarse"},  # ~1 ms late at the p99 on its own; no `validity:`: the defaults
    }))
    res = latscope("capacity", str(scenario), "--out", str(out), "--workers", "1", "--max-rate", str(2 * RATE),
                   "--max-steps", "3", "--quiet")
    cap = json.loads((out / "capacity.json").read_text())
    return res, cap, [json.loads((out / s["dir"] / "summary.json").read_text()) for s in cap["steps"]]


def lags(summaries: list[dict]) -> list[tuple[float, float, float, float]]:
    """Per step: (send-lag p99, its degraded threshold, loop-lag p99, its degraded threshold), ms."""
    return [(s["metrics"]["send_lag"]["all"]["p99_ms"], s["validity_thresholds"]["send_lag_p99_ms"]["degraded"],
             s["metrics"]["loop_lag"]["all"]["p99_ms"], s["validity_thresholds"]["loop_lag_p99_ms"]["degraded"])
            for s in summaries]


def test_lateness_stops_a_search_only_where_it_can_change_the_verdict(tmp_path):
    tried = []
    level = FIRST
    with target_process("queue", "--service-ms", "0.5", "--seed", "1") as url:
        for attempt in range(2):
            with cpu_hogs(*SETUPS[level]):
                loose = search(url, LOOSE_MS, tmp_path / f"loose-{attempt}")
                tight = search(url, TIGHT_MS, tmp_path / f"tight-{attempt}")
            loose_lags, tight_lags = lags(loose[2]), lags(tight[2][:1])
            tried.append(f"{SETUPS[level]} hogs: 100 ms search (send p99, threshold, loop p99, threshold) {loose_lags}, "
                         f"5 ms search {tight_lags}")
            too_low = min(lag[0] for lag in loose_lags + tight_lags) <= 1.0
            too_high = any(send > send_max or loop > loop_max for send, send_max, loop, loop_max in loose_lags)
            if not too_low and not too_high:
                break
            level = min(level + 1, len(SETUPS) - 1) if too_low else max(level - 1, 0)
        else:
            raise AssertionError("the setup did not make the generator 1 ms to the relative threshold late; measured:\n"
                                 + "\n".join(tried))
    measured = "\n".join(tried)
    print(measured)  # pytest -rP shows what the hogs did

    res, cap, summaries = loose
    # Every step of the loose search was over the 1 ms that alone would have stopped it, and valid:
    assert res.returncode == 0 and cap["stopped"] == "max_rate", measured + "\n" + res.stdout + res.stderr
    assert [s["rate_rps"] for s in cap["steps"]] == [RATE, 2 * RATE], measured
    for step, summary in zip(cap["steps"], summaries):
        assert summary["metrics"]["send_lag"]["all"]["p99_ms"] > 1.0 and step["validity"] == "valid", measured
        assert step["counted_as"] == "pass", measured
    # At 50 req/s (20 ms apart) the threshold is 5 % of 100 ms; at 100 (the Poisson plan's ~100) it is
    # that or half the spacing, whichever is less: ~5 ms either way.
    first = summaries[0]["validity_thresholds"]["send_lag_p99_ms"]
    assert first["degraded"] == 5.0 and first["basis"]["degraded"] == "5 % of the SLO latency/all p90 ≤ 100 ms"
    assert 4.5 < summaries[1]["validity_thresholds"]["send_lag_p99_ms"]["degraded"] <= 5.0

    res, cap, summaries = tight
    # The same lateness against a 5 ms SLO: the 1 ms floor holds, and the first step ends the search.
    assert res.returncode == 4 and cap["stopped"] == "generator_limit", measured + "\n" + res.stdout + res.stderr
    assert len(cap["steps"]) == 1 and cap["steps"][0]["validity"] in ("degraded", "invalid"), measured
    send_lag = summaries[0]["metrics"]["send_lag"]["all"]["p99_ms"]
    assert send_lag > 1.0 and summaries[0]["validity_thresholds"]["send_lag_p99_ms"]["degraded"] == 1.0, measured
    assert any(reason.startswith(f"send lag p99 {send_lag:.3f} ms > 1 ms (validity.degraded_send_lag_p99_ms, the floor")
               for reason in cap["steps"][0]["validity_reasons"]), (measured, cap["steps"][0]["validity_reasons"])
    assert "the load generator fell behind" in res.stdout

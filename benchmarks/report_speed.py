"""How long does `latscope report` take on a long run, and how big is the page?

    python benchmarks/report_speed.py            # synthesize (~1-2 min), then time the report 3 times each way
    python benchmarks/report_speed.py --keep DIR # keep (or reuse) the synthesized results directory in DIR

1. **Synthesize** a results directory of ~1,000,000 requests: 1 h at 280 req/s (a 60 s warm-up
   phase, then 59 min measured), two classes (chat 2/3, embed 1/3), lognormal latencies with a slow
   period (minutes 30-35: 3x slower and a second replica added), 0.1 % 503 errors, and 4 Hz GPU
   telemetry. Nothing is sent: the samples are drawn with numpy, but everything after that is
   latscope's own code — the worker-side `Recorder`, the parent's `Collector` (interval merge, hlog
   lines, time-series rows), `HlogWriter`, and `run.summary.write_results` for summary.json and
   timeseries.parquet — so the files are what a real run of that length writes.
2. **Time** `latscope report DIR -o FILE` as a subprocess, wall clock, best of 3, with plotly.js
   embedded and with --cdn; the HTML sizes. Targets: < 10 s, < 8 MB embedded.
3. **Where the time goes**: the same steps in this process, once each (load_run, each analysis
   function the report calls, figure building and page assembly).

Writes benchmarks/results/report_speed.json and the "report speed" section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO))

from common import fmt, machine_facts, machine_line, markdown_table, update_results_md  # noqa: E402
import numpy as np  # noqa: E402

from latscope import results  # noqa: E402
from latscope.plan import build_plan  # noqa: E402
from latscope.records import IntervalReport  # noqa: E402
from latscope.recorder import Recorder  # noqa: E402
from latscope.results.hlog import HlogWriter  # noqa: E402
from latscope.results.schema import COMPLETED, COUNTERS, ERROR_INDEX, SENT  # noqa: E402
from latscope.run.collector import Collector  # noqa: E402
from latscope.run.summary import RunFacts, write_results  # noqa: E402
from latscope.scenario import scenario_from_dict  # noqa: E402

SECTION_TITLE = "## report speed (benchmarks/report_speed.py)"
RESULTS_JSON = REPO / "benchmarks" / "results" / "report_speed.json"
PACKAGES = ("latscope", "plotly", "pandas", "pyarrow", "hdrhistogram", "numpy")
RATE, DURATION_S, WARMUP_S = 280.0, 3600.0, 60.0
SLOW = (1800.0, 2100.0)  # the slow period, run clock
REPLICA_1_S = 1820.0  # when the target adds a second replica (a scale action in the slow period)
TELEMETRY_HZ = 4
TARGET_S, TARGET_MB = 10.0, 8.0
MEDIAN_MS = {"chat": 60.0, "embed": 18.0}


def scenario():
    return scenario_from_dict({
        "name": "report_speed",
        "seed": 42,
        "target": {"url": "http://127.0.0.1:9", "method": "POST", "path": "/infer"},  # never contacted
        "workload": {"classes": [{"name": "chat", "weight": 2}, {"name": "embed", "weight": 1}]},
        "phases": [
            {"name": "warmup", "duration": WARMUP_S, "warmup": True, "arrival": {"type": "poisson", "rate": RATE}},
            {"name": "steady", "duration": DURATION_S - WARMUP_S, "arrival": {"type": "poisson", "rate": RATE}},
        ],
        "slos": [{"metric": "latency", "class": "all", "stat": "p99", "limit_ms": 250},
                 {"metric": "latency", "class": "embed", "stat": "p50", "limit_ms": 25}],
        "output": {"interval": 1},
    })


def synthesize(run_dir: Path) -> dict:
    """Write a results directory of a 1 h run at RATE into run_dir (see the module docstring)."""
    s = scenario()
    plan = build_plan(s)
    rng = np.random.default_rng(7)
    run_dir.mkdir(parents=True, exist_ok=True)
    results.write_text(run_dir / results.SCENARIO, "# synthesized by benchmarks/report_speed.py\nname: report_speed\n")
    events = results.EventLog(run_dir / results.EVENTS)
    t0_wall, t0_ns = time.time() - DURATION_S, time.perf_counter_ns() - int(DURATION_S * 1e9)
    events.t0_ns = t0_ns
    hlog_file = open(run_dir / results.HLOG, "w")
    collector = Collector(1, plan, 1.0, HlogWriter(hlog_file, t0_wall))
    events.emit("run_start", at_ns=t0_ns, planned_requests=len(plan), workers=1)
    for p in plan.phases:
        events.emit("phase_start", at_ns=t0_ns + int(p.start_s * 1e9), phase=p.name, planned_at_s=p.start_s, warmup=p.warmup)

    offsets, cls, warm = plan.offsets_s, plan.cls, plan.warmup
    medians = np.array([MEDIAN_MS[name] for name in plan.class_names])[cls]
    slow = (offsets >= SLOW[0]) & (offsets < SLOW[1])
    latency_ms = medians * np.exp(rng.normal(0.0, 0.45, len(plan))) * np.where(slow, 3.0, 1.0)
    send_lag_us = rng.exponential(60.0, len(plan)).astype(np.int64)
    failed = rng.random(len(plan)) < 0.001
    recorder = Recorder()
    bounds = np.searchsorted(offsets, np.arange(int(DURATION_S) + 1, dtype=float))
    in_flight = 0
    for k in range(int(DURATION_S)):
        lo, hi = bounds[k], bounds[k + 1]
        counters: dict[tuple[int, bool], np.ndarray] = {}
        for i in range(lo, hi):
            name, w, c = plan.class_names[cls[i]], bool(warm[i]), int(cls[i])
            row = counters.get((c, w))
            if row is None:
                row = counters[(c, w)] = np.zeros(len(COUNTERS), np.int64)
            row[SENT] += 1
            recorder.record("send_lag", name, int(send_lag_us[i]), w)
            if failed[i]:
                row[ERROR_INDEX["http_5xx"]] += 1
                continue
            row[COMPLETED] += 1
            us = int(latency_ms[i] * 1000)
            recorder.record("latency", name, us, w)
            recorder.record("service_time", name, us - int(send_lag_us[i]), w)
            # The engine's per-replica latency: a second replica takes half the requests once it is up.
            replica = "replica-1" if offsets[i] >= REPLICA_1_S and i % 2 else "replica-0"
            recorder.record("replica_latency", replica, us, w)
        for _ in range(100):  # the engine's loop-lag watcher samples every 10 ms
            recorder.record("loop_lag", "all", int(rng.exponential(80.0)), k < WARMUP_S)
        histograms, clamped = recorder.snapshot()
        in_flight = int((hi - lo) * float(np.mean(latency_ms[lo:hi])) / 1000) if hi > lo else 0
        # each replica's first response: (end ns, latency µs)
        replicas = {"replica-0": (t0_ns + 50_000_000, 40_000)} if k == 0 else {}
        if k == int(REPLICA_1_S):
            replicas = {"replica-1": (t0_ns + int(REPLICA_1_S * 1e9), 400_000)}
        collector.add(IntervalReport(k, histograms, clamped, counters, in_flight, replicas, [], None, worker=0))
        for replica, first_ns, latency_us in collector.new_replicas:
            events.emit("replica_first_seen", at_ns=first_ns, replica=replica, latency_ms=latency_us / 1000)
        collector.new_replicas.clear()
    collector.finish()
    hlog_file.close()
    write_telemetry(run_dir, rng)
    facts = RunFacts(s, plan, 1, collector, t0_wall, t0_ns=t0_ns, t0_wall=t0_wall, end_ns=t0_ns + int(DURATION_S * 1e9),
                     error_examples={"http_5xx": ["HTTP 503 Service Unavailable: overloaded, retry later"]})
    summary = write_results(run_dir, facts, events)
    return {"requests": len(plan), "measured_completed": summary["requests"]["completed"],
            "hlog_mb": round((run_dir / results.HLOG).stat().st_size / 1e6, 1)}


def write_telemetry(run_dir: Path, rng: np.random.Generator) -> None:
    """4 Hz samples of one GPU for the whole hour (utilization follows the slow period)."""
    t = np.arange(0, DURATION_S, 1 / TELEMETRY_HZ)
    busy = np.where((t >= SLOW[0]) & (t < SLOW[1]), 95.0, 55.0)
    series = {
        "gpu_util_pct": np.clip(busy + rng.normal(0, 6, len(t)), 0, 100),
        "mem_bw_util_pct": np.clip(busy * 0.6 + rng.normal(0, 4, len(t)), 0, 100),
        "mem_used_bytes": 30e9 + np.where(t >= REPLICA_1_S, 8e9, 0) + rng.normal(0, 1e7, len(t)),
        "power_w": 250 + busy * 3 + rng.normal(0, 10, len(t)),
    }
    columns: dict[str, list | np.ndarray] = {"t_s": [], "source": [], "device": [], "metric": [], "value": []}
    for metric, values in series.items():
        columns["t_s"].append(t)
        columns["value"].append(values)
        columns["source"] += ["nvml"] * len(t)
        columns["device"] += ["0"] * len(t)
        columns["metric"] += [metric] * len(t)
    results.write_table(run_dir / results.TELEMETRY, {
        "t_s": np.concatenate(columns["t_s"]), "source": columns["source"], "device": columns["device"],
        "metric": columns["metric"], "value": np.concatenate(columns["value"])})


def time_report(run_dir: Path, out: Path, cdn: bool, repeats: int) -> tuple[float, list[float], int]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "latscope.cli", "report", str(run_dir), "-o", str(out), *(["--cdn"] if cdn else [])],
                       check=True, capture_output=True, cwd=REPO)
        times.append(time.perf_counter() - start)
    return min(times), times, out.stat().st_size


def steps(run_dir: Path) -> dict[str, float]:
    """Seconds per step of the report, in this process (imports excluded), one pass each."""
    import warnings

    from latscope.analysis import coldstart, correlation, percentiles, serialization
    from latscope.analysis.run_data import load_run
    from latscope.report import html as report_html

    out: dict[str, float] = {}

    def timed(name, fn):
        start = time.perf_counter()
        value = fn()
        out[name] = round(time.perf_counter() - start, 3)
        return value

    run = timed("load_run", lambda: load_run(run_dir))
    timed("spectrum(latency)", lambda: percentiles.spectrum(run, "latency"))
    timed("interval_percentiles(latency, each class)",
          lambda: [percentiles.interval_percentiles(run, "latency", c) for c in run.summary["metrics"]["latency"]])
    timed("cold_starts", lambda: coldstart.cold_starts(run))
    timed("breakdown", lambda: serialization.breakdown(run))
    timed("correlations", lambda: correlation.correlations(run))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        timed("whole page (report_html, analysis included)", lambda: report_html.report_html(run))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", type=Path, help="results directory to reuse (synthesized there when absent)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    facts = machine_facts(PACKAGES)
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = args.keep or Path(tmp) / "report_speed-run"
        synth: dict = {}
        if not (run_dir / results.SUMMARY).exists():
            start = time.perf_counter()
            synth = synthesize(run_dir)
            synth["synthesize_s"] = round(time.perf_counter() - start, 1)
            print(f"synthesized {synth['requests']:,} requests in {synth['synthesize_s']} s -> {run_dir}", flush=True)
        embedded = time_report(run_dir, Path(tmp) / "embedded.html", cdn=False, repeats=args.repeats)
        cdn = time_report(run_dir, Path(tmp) / "cdn.html", cdn=True, repeats=args.repeats)
        breakdown = steps(run_dir)
    rows = [["plotly.js embedded", fmt(embedded[0]), ", ".join(fmt(t) for t in embedded[1]), fmt(embedded[2] / 1e6)],
            ["--cdn", fmt(cdn[0]), ", ".join(fmt(t) for t in cdn[1]), fmt(cdn[2] / 1e6)]]
    table = markdown_table(["report", "best s", "all runs s", "HTML MB"], rows)
    step_table = markdown_table(["step (in process, once)", "s"], [[k, fmt(v)] for k, v in breakdown.items()])
    ok = embedded[0] < TARGET_S and cdn[0] < TARGET_S and embedded[2] / 1e6 < TARGET_MB
    print(table + "\n\n" + step_table)
    print(f"targets (< {TARGET_S:g} s, < {TARGET_MB:g} MB embedded): {'met' if ok else 'NOT met'}")
    report = {
        "what": "latscope report on a synthesized 1 h, ~1M-request results directory",
        "synthesized": synth or {"reused": str(run_dir)},
        "embedded": {"best_s": round(embedded[0], 3), "runs_s": [round(t, 3) for t in embedded[1]], "html_bytes": embedded[2]},
        "cdn": {"best_s": round(cdn[0], 3), "runs_s": [round(t, 3) for t in cdn[1]], "html_bytes": cdn[2]},
        "steps_s": breakdown,
        "targets": {"seconds": TARGET_S, "embedded_mb": TARGET_MB, "met": ok},
        "machine": facts,
    }
    RESULTS_JSON.parent.mkdir(parents=True, exist_ok=True)
    RESULTS_JSON.write_text(json.dumps(report, indent=2, default=str) + "\n")
    update_results_md(
        f"{SECTION_TITLE}\n\n`latscope report` on a synthesized results directory of ~1,000,000 requests (1 h at 280 req/s, "
        f"2 classes, 60 s warm-up, a 5-minute slow period, 4 Hz GPU telemetry), as a subprocess, wall clock, best of "
        f"{args.repeats}. Targets: < {TARGET_S:g} s and < {TARGET_MB:g} MB with plotly.js embedded: "
        f"**{'met' if ok else 'not met'}**.\n\n{table}\n\n{step_table}\n\nMachine: {machine_line(facts)}. "
        f"Raw numbers: `{RESULTS_JSON.relative_to(REPO)}`.\n", SECTION_TITLE)


if __name__ == "__main__":
    main()

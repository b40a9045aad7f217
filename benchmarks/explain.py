"""How long does `latscope explain` take on a big run, and how much memory? (issue 31's budget:
1M requests in under 10 s and under 1 GB.)

    python benchmarks/explain.py              # 1M requests (about a minute with the writing)
    python benchmarks/explain.py --rows 200000

A synthetic results directory is written first (not timed): requests.parquet with Contract 1's
columns (results/schema.py REQUEST_COLUMNS) and two Server-Timing parts, 1,000 req/s for 1,000 s over
16 workers × 32 connections, 4 replicas (one slow, so there is a cause to find), 3 classes,
prompt and output lengths, prefix-cache counts; 1 Hz telemetry of four server signals and
latscope's host rows; a timeseries.parquet of the latency p99 per interval; events. Then
`latscope explain DIR` runs in a fresh process, the thing measured: its wall time and its peak
RSS (resource.getrusage of the child: the whole process, interpreter and imports included).
Prints a table and rewrites the "explain" section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parent.parent
RESULTS_MD = REPO / "benchmarks" / "RESULTS.md"
RATE = 1000.0


def write_run(path: Path, n: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    intended = np.cumsum(rng.exponential(1e6 / RATE, n)).astype(np.int64)
    lag = rng.integers(5, 80, n)
    replica_code = rng.integers(0, 4, n)
    queue = rng.exponential(300, n) + np.where(replica_code == 3, 6000, 0)
    compute = rng.lognormal(np.log(8000), 0.35, n)
    network = rng.integers(80, 200, n)
    decode = rng.integers(10, 40, n)
    service = (queue + compute + network + decode).astype(np.int64)
    sent = intended + lag
    end = sent + service
    prompt = rng.integers(10, 4000, n).astype(np.int32)
    none_i64 = pa.nulls(n, pa.int64())
    columns = {
        "row": pa.array(np.arange(n, dtype=np.int64)),
        "class": pa.DictionaryArray.from_arrays(rng.integers(0, 3, n).astype(np.int32), ["chat", "embed", "rag"]).cast(pa.string()),
        "phase": pa.array(np.where(np.arange(n) < n // 20, "warmup", "steady")),
        "warmup": pa.array(np.arange(n) < n // 20),
        "worker": pa.array((np.arange(n) % 16).astype(np.int32)),
        "node": pa.nulls(n, pa.string()), "session": none_i64, "turn": pa.array(np.zeros(n, np.int32)),
        "intended_us": pa.array(intended), "sent_us": pa.array(sent), "first_byte_us": pa.array(end - decode),
        "first_token_us": none_i64, "end_us": pa.array(end), "error": pa.nulls(n, pa.string()),
        "status": pa.array(np.full(n, 200, np.int32)), "latency_us": pa.array(end - intended),
        "service_us": pa.array(service), "send_lag_us": pa.array(lag.astype(np.int64)),
        "encode_us": pa.array(rng.integers(5, 20, n)), "decode_us": pa.array(decode.astype(np.int64)),
        "network_us": pa.array(network.astype(np.int64)), "ttft_us": none_i64, "tpot_us": none_i64,
        "itl_max_us": none_i64, "client_inclusive_us": pa.array(end - intended),
        "prompt_tokens": pa.array(prompt), "output_tokens": pa.array(rng.integers(1, 500, n).astype(np.int32)),
        "cached_tokens": pa.array((prompt * rng.integers(0, 2, n) // 2).astype(np.int32)),
        "replica": pa.DictionaryArray.from_arrays(replica_code.astype(np.int32), ["r0", "r1", "r2", "r3"]).cast(pa.string()),
        "bytes_in": pa.array(np.full(n, 600, np.int64)), "bytes_out": pa.array(np.full(n, 900, np.int64)),
        "stall_us": pa.array(np.zeros(n, np.int64)),
        "connection": pa.array(rng.integers(0, 32, n).astype(np.int32)),
        "server.queue": pa.array(queue / 1000), "server.compute": pa.array(compute / 1000),
    }
    path.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path / "requests.parquet", compression="zstd")
    duration = int(intended[-1] / 1e6) + 1
    (path / "summary.json").write_text(json.dumps({"schema_version": 1, "phases": [
        {"name": "warmup", "start_s": 0, "duration_s": float(intended[n // 20] / 1e6), "warmup": True},
        {"name": "steady", "start_s": float(intended[n // 20] / 1e6), "duration_s": duration, "warmup": False}],
        "generator": {"interval_s": 1.0}}))
    t = np.arange(duration, dtype=float)
    rows = []
    for metric, values in (("queue_depth", rng.poisson(3, duration)), ("kv_cache_usage_pct", rng.uniform(20, 60, duration)),
                           ("requests_running", rng.poisson(8, duration)), ("gpu_util_pct", rng.uniform(50, 90, duration))):
        rows.append(pd.DataFrame({"t_s": t, "source": "prometheus", "device": "server", "metric": metric,
                                  "value": values.astype(float)}))
    for device in ("system", "parent", "worker-0", "worker-1"):
        rows.append(pd.DataFrame({"t_s": t, "source": "host", "device": device, "metric": "cpu_pct",
                                  "value": rng.uniform(10, 90, duration)}))
    pd.concat(rows).to_parquet(path / "telemetry.parquet", index=False)
    pd.DataFrame({"interval_start_s": t, "interval_s": 1.0, "phase": "steady", "metric": "latency", "class": "all",
                  "p99_ms": rng.uniform(20, 40, duration)}).to_parquet(path / "timeseries.parquet", index=False)
    (path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in (
        {"event": "action_start", "t_s": 100.0, "name": "poke", "kind": "command"},
        {"event": "action_end", "t_s": 101.0, "name": "poke", "kind": "command", "ok": True})))


def measure(path: Path) -> dict:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    before, cpu_before = usage.ru_maxrss, usage.ru_utime + usage.ru_stime
    started = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "latscope.cli", "explain", str(path), "--json"], capture_output=True,
                         text=True, cwd=REPO)
    wall = time.perf_counter() - started
    if run.returncode:
        raise SystemExit(f"latscope explain failed ({run.returncode}): {run.stderr}")
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    doc = json.loads(run.stdout)
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime - cpu_before,
            "peak_rss_mb": max(usage.ru_maxrss, before) / 1024, "verdict": doc["verdict"],
            "top": doc["causes"][0]["name"] if doc["causes"] else None, "tested": doc["tested"],
            "measured": doc["requests"]["measured"]}


def write_results(rows: int, size_mb: float, m: dict) -> None:
    section = (
        "## explain (benchmarks/explain.py, issue 31)\n\n"
        f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {os.cpu_count()} cores, Python "
        f"{platform.python_version()}: `python benchmarks/explain.py --rows {rows}`. A synthetic results directory "
        f"({rows:,} requests, requests.parquet {size_mb:.0f} MB zstd, 16 workers × 32 connections, 4 replicas one of "
        "them slow, 1 Hz telemetry), then `latscope explain DIR --json` in a fresh process: wall time and peak RSS "
        "of that whole process (interpreter and imports included). Budget: 1M requests under 10 s and 1 GB.\n\n"
        "| requests | measured | candidates tested | wall s | CPU s | peak RSS MB | verdict | top cause |\n"
        "| ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |\n"
        f"| {rows:,} | {m['measured']:,} | {m['tested']} | {m['wall_s']:.2f} | {m['cpu_s']:.2f} | {m['peak_rss_mb']:.0f} | "
        f"{m['verdict']} | {m['top']} |\n"
        f"\nThe box's load average was {os.getloadavg()[0]:.1f} at the start: work sharing its cores shows in the wall time, "
        "which counts the waiting, not in the CPU time (user + system of the explain process).\n")
    text = RESULTS_MD.read_text() if RESULTS_MD.exists() else "# Benchmark results\n"
    pattern = re.compile(r"## explain \(benchmarks/explain\.py.*?(?=\n## |\Z)", re.S)
    text = pattern.sub(section.rstrip("\n") + "\n", text) if pattern.search(text) else text.rstrip("\n") + "\n\n" + section
    RESULTS_MD.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--no-write", action="store_true", help="Do not rewrite benchmarks/RESULTS.md.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "run"
        write_run(path, args.rows)
        size_mb = (path / "requests.parquet").stat().st_size / 1e6
        m = measure(path)
    print(f"{'requests':>10} {'measured':>10} {'tested':>7} {'wall s':>7} {'CPU s':>6} {'peak RSS MB':>12}  verdict / top cause")
    print(f"{args.rows:>10,} {m['measured']:>10,} {m['tested']:>7} {m['wall_s']:>7.2f} {m['cpu_s']:>6.2f} "
          f"{m['peak_rss_mb']:>12.0f}  {m['verdict']} / {m['top']}   (load average {os.getloadavg()[0]:.1f})")
    ok = m["wall_s"] < 10 and m["peak_rss_mb"] < 1024
    print("within budget (< 10 s, < 1 GB)" if ok else "OVER BUDGET (10 s, 1 GB)")
    if not args.no_write:
        write_results(args.rows, size_mb, m)


if __name__ == "__main__":
    main()

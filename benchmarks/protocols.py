"""What each protocol costs the client, and how many SSE streams one latscope worker holds.

    python benchmarks/protocols.py            # ~4 min
    python benchmarks/protocols.py --quick    # ~1 min, fewer and shorter runs

1. **Serialization.** The same FP32 tensors (1x384 and 32x384) sent by one latscope worker over
   KServe v2 REST with JSON tensors, REST with the binary extension, and gRPC, to the reference
   server's identity model (scenarios/serialization.yaml, at a low rate so nothing queues). Medians
   of latscope's own `encode` and `decode` metrics (the client's work per request), the server's
   `deser`/`ser` (Server-Timing) and the round trip.
2. **OpenAI streaming.** latscope's client against `latscope.stream_target` (tokens at known times):
   `encode` per request, and SSE parsing per token = `decode` (all the events of one response) / tokens.
3. **Concurrent streams.** One worker holding N streams at once (each 40 tokens, 50 ms apart, so about
   2 s long; requests arrive evenly at N/2 s⁻¹ for 14 s), N = 250 … 2,000. ITL measurement error is
   max(p99 − 50 ms, 50 ms − p1) of every gap the client measured: it includes the server's own timer
   jitter, so it is an upper bound on the client's error. The target: ≥ 1,000 streams at ≤ 1 ms.
   The server (one process, timerfd-driven) gets one core and latscope the other where there are two.

Writes benchmarks/results/protocols.json and its section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO))

from common import (  # noqa: E402
    fmt, free_port, machine_facts, machine_line, markdown_table, update_results_md, wait_until_up, write_report_json,
)
from latscope.hlog import read_hlog  # noqa: E402
from latscope.recorder import merge, values_at  # noqa: E402
from latscope.run import run_scenario  # noqa: E402
from latscope.scenario import load_scenario, scenario_from_dict  # noqa: E402

SECTION_TITLE = "## protocols (benchmarks/protocols.py)"
PACKAGES = ("latscope", "httptools", "uvloop", "grpcio", "protobuf", "numpy")
ITL_MS = 50.0
TOKENS = 40


def pin(cpu: int | None) -> None:
    """Run this process (and the latscope workers it spawns) on one CPU, when there is more than one."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})


def cpus() -> tuple[int | None, int | None]:
    """(CPU for latscope, CPU for the server), or (None, None) on a one-CPU machine."""
    available = sorted(os.sched_getaffinity(0))
    return (available[0], available[1]) if len(available) > 1 else (None, None)


def start(command: list[str], ready_url: str, cpu: int | None, log: Path) -> subprocess.Popen:
    prefix = ["taskset", "-c", str(cpu)] if cpu is not None and shutil.which("taskset") else []
    process = subprocess.Popen(prefix + command, cwd=REPO, stdout=log.open("w"), stderr=subprocess.STDOUT)
    wait_until_up(ready_url, process, 90)
    return process


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()


def run(scenario, out: Path) -> tuple[dict, Path]:
    result = run_scenario(scenario, out=out, workers=1)
    return result.summary, result.run_dir


def p50(summary: dict, metric: str, cls: str = "all") -> float | None:
    return summary["metrics"].get(metric, {}).get(cls, {}).get("p50_ms")


# -- 1. serialization -------------------------------------------------------------------------


def serialization(quick: bool, work: Path, server_cpu: int | None) -> list[dict]:
    port, grpc_port = free_port(), free_port()
    server = start([sys.executable, "-m", "reference_server", "serve", "--builtin", "identity", "--model-name", "identity",
                    "--no-generator", "--http-port", str(port), "--grpc-port", str(grpc_port),
                    "--max-queue-delay-us", "0", "--cache-dir", str(work / "cache")],
                   f"http://127.0.0.1:{port}/v2/health/ready", server_cpu, work / "identity.log")
    rows = []
    try:
        for n in (1, 32):
            overrides = [f"target.url=http://127.0.0.1:{port}", "target.launch=null",
                         f"workload.classes.2.url=grpc://127.0.0.1:{grpc_port}",
                         f"phases.1.duration={5 if quick else 15}", "phases.1.arrival.rate=20"]
            overrides += [f"workload.classes.{c}.tensors.0.shape=[{n},384]" for c in range(3)]
            summary, _ = run(load_scenario(REPO / "scenarios" / "serialization.yaml", overrides), work / f"ser-{n}")
            for cls in ("json", "binary", "grpc"):
                rows.append({"tensor": f"{n}x384 FP32", "transport": cls, "requests": summary["requests_by_class"][cls]["completed"],
                             **{m: p50(summary, m, cls) for m in ("encode", "decode", "server.deser", "server.ser", "network", "service_time")}})
    finally:
        stop(server)
    return rows


# -- 2. and 3. OpenAI streaming ---------------------------------------------------------------


def stream_scenario(url: str, streams: int, seconds: float, out: Path) -> dict:
    length_s = (TOKENS - 1) * ITL_MS / 1000 + 0.05  # ttft 50 ms, then 39 gaps
    rate = streams / length_s
    return {
        "name": f"streams-{streams}",
        "seed": 1,
        "target": {"url": url, "protocol": "openai", "model": "bench", "timeout": 30,
                   "openai": {"api": "completions", "stream": True, "include_usage": True,
                              "extra_body": {"ttft_ms": 50, "itl_ms": ITL_MS}}},
        "workload": {"classes": [{"name": "stream", "prompt_tokens": 64, "output_tokens": TOKENS}]},
        "phases": [{"name": "fill", "duration": length_s, "warmup": True, "arrival": {"type": "constant", "rate": rate}},
                   {"name": "hold", "duration": seconds, "arrival": {"type": "constant", "rate": rate}}],
        "limits": {"max_in_flight": streams * 2, "timer": "coarse"},
        "output": {"dir": str(out)},
    }


def itl_error_ms(run_dir: Path) -> tuple[float, float, float]:
    """(p1, p99, error) of every gap measured once the streams are all running, in ms (the interval
    log keeps the warm-up "fill" phase too: its intervals, and the next 2 s, are left out)."""
    fill_s = (TOKENS - 1) * ITL_MS / 1000 + 0.05
    h = merge(h for tag, start, _, h in read_hlog(run_dir / "histograms.hlog") if tag == "itl/all" and start >= fill_s + 2)
    p = values_at(h, [1.0, 99.0])
    low, high = p[1.0] / 1000, p[99.0] / 1000
    return low, high, max(high - ITL_MS, ITL_MS - low)


def streaming(quick: bool, work: Path, server_cpu: int | None) -> tuple[dict, list[dict]]:
    port = free_port()
    server = start([sys.executable, "-m", "latscope.stream_target", "--port", str(port)],
                   f"http://127.0.0.1:{port}/health", server_cpu, work / "stream_target.log")
    url = f"http://127.0.0.1:{port}"
    try:
        summary, _ = run(scenario_from_dict(stream_scenario(url, 50, 5, work)), work / "openai-cost")
        tokens = summary["tokens"]["all"]["output_tokens"] / max(1, summary["requests"]["completed"])
        cost = {"encode_us": p50(summary, "encode") * 1000, "decode_us_per_request": p50(summary, "decode") * 1000,
                "tokens_per_request": tokens, "sse_parse_us_per_token": p50(summary, "decode") * 1000 / tokens}
        sweep = []
        for streams in ((250, 1000) if quick else (250, 500, 1000, 1500, 2000)):
            summary, run_dir = run(scenario_from_dict(stream_scenario(url, streams, 6 if quick else 14, work)), work / f"s{streams}")
            low, high, error = itl_error_ms(run_dir)
            sweep.append({"streams": streams, "completed": summary["requests"]["completed"], "errors": summary["requests"]["errors"],
                          "itl_p1_ms": low, "itl_p50_ms": p50(summary, "itl"), "itl_p99_ms": high, "itl_error_ms": error,
                          "send_lag_p99_ms": summary["metrics"]["send_lag"]["all"]["p99_ms"],
                          "loop_lag_p99_ms": summary["metrics"].get("loop_lag", {}).get("all", {}).get("p99_ms"),
                          "validity": summary["validity"]})
            print(f"  {streams:5d} streams: ITL p1 {low:.2f} / p99 {high:.2f} ms, error {error:.2f} ms, "
                  f"{summary['requests']['errors']} errors", flush=True)
            shutil.rmtree(run_dir, ignore_errors=True)
    finally:
        stop(server)
    return cost, sweep


def report_md(report: dict) -> str:
    ser = markdown_table(
        ["tensor", "transport", "client encode ms", "client decode ms", "server deser ms", "server ser ms", "network ms", "service time ms"],
        [[r["tensor"], r["transport"], fmt(r["encode"], 3), fmt(r["decode"], 3), fmt(r["server.deser"], 3),
          fmt(r["server.ser"], 3), fmt(r["network"], 3), fmt(r["service_time"], 3)] for r in report["serialization"]])
    cost = report["openai_cost"]
    held = [r["streams"] for r in report["streams"] if r["itl_error_ms"] <= 1.0 and r["errors"] == 0]
    streams = markdown_table(
        ["streams", "completed", "errors", "ITL p1 ms", "ITL p50 ms", "ITL p99 ms", "ITL error ms", "send lag p99 ms", "loop lag p99 ms"],
        [[str(r["streams"]), str(r["completed"]), str(r["errors"]), fmt(r["itl_p1_ms"]), fmt(r["itl_p50_ms"]),
          fmt(r["itl_p99_ms"]), fmt(r["itl_error_ms"]), fmt(r["send_lag_p99_ms"]), fmt(r["loop_lag_p99_ms"])] for r in report["streams"]])
    return f"""{SECTION_TITLE}

Machine: {machine_line(report['machine'])}

**Serialization** (medians over a run at 20 req/s per class, one worker, reference server's identity model):

{ser}

**OpenAI streaming client**: encode {cost['encode_us']:.0f} µs per request; SSE parsing {cost['sse_parse_us_per_token']:.1f} µs
per token ({cost['decode_us_per_request']:.0f} µs for a {cost['tokens_per_request']:.0f}-token response).

**Concurrent SSE streams, one worker** (40 tokens 50 ms apart; error = max(p99 − 50, 50 − p1) of every measured gap,
server jitter included): highest N with error ≤ 1 ms and no errors: **{max(held) if held else 'none'}**.

{streams}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument("--no-results-md", action="store_true")
    args = parser.parse_args()
    client_cpu, server_cpu = cpus()
    pin(client_cpu)
    report = {"machine": machine_facts(PACKAGES), "quick": args.quick}
    with tempfile.TemporaryDirectory(prefix="latscope-protocols-") as tmp:
        work = Path(tmp)
        print("serialization …", flush=True)
        report["serialization"] = serialization(args.quick, work, server_cpu)
        print("openai streaming …", flush=True)
        report["openai_cost"], report["streams"] = streaming(args.quick, work, server_cpu)
    text = report_md(report)
    print(text)
    write_report_json(report, args.out, "protocols")
    if not args.no_results_md:
        update_results_md(text, SECTION_TITLE)


if __name__ == "__main__":
    main()

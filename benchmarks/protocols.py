"""What each protocol costs the client, and how many SSE streams one latscope worker holds.

    python benchmarks/protocols.py            # ~4 min
    python benchmarks/protocols.py --quick    # ~1 min, fewer and shorter runs

1. **Serialization.** The same FP32 tensors (1x384 and 32x384) sent by one latscope worker over
   KServe v2 REST with JSON tensors, REST with the binary extension, and gRPC, to the reference
   server's identity model (scenarios/serialization.yaml, at a low rate so nothing queues). Medians
   of latscope's own `encode` and `decode` metrics (the client's work per request), the server's
   `deser`/`ser` (Server-Timing) and the round trip.
2. **OpenAI streaming.** latscope's client against `latscope.targets.stream` (tokens at known times):
   `encode` per request, and SSE parsing per token = `decode` (all the events of one response) / tokens.
3. **Concurrent streams.** One worker holding N streams at once (each 40 tokens, 50 or 100 ms apart;
   requests arrive evenly so that N are in flight after one stream's length, then for 12 s more), through latscope's real
   Engine and OpenAI client run in this process as a worker runs them, with one spy: each token's
   read time is paired with the `t_ns` the stream target stamped in the chunk right before writing
   it (same monotonic clock), so the ITL measurement error of every gap is exact:
   |gap latscope measured − gap between the server's writes|. The target: ≥ 1,000 streams at ≤ 1 ms.
   The server (one process, timerfd-driven) gets one core and latscope the other where there are two.

Writes benchmarks/out/protocols-<time>.json and its section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO))

from common import (  # noqa: E402
    cpus, fmt, free_port, machine_facts, machine_line, markdown_table, server_process, update_results_md, write_report_json,
)
import numpy as np  # noqa: E402
import uvloop  # noqa: E402

from latscope.engine import Engine, settle_gc  # noqa: E402
from latscope.plan import build_plan  # noqa: E402
from latscope.protocols import make_client  # noqa: E402
from latscope.protocols import openai as openai_protocol  # noqa: E402
from latscope.run import run_scenario  # noqa: E402
from latscope.scenario import load_scenario, scenario_from_dict  # noqa: E402

SECTION_TITLE = "## protocols (benchmarks/protocols.py)"
PACKAGES = ("latscope", "httptools", "uvloop", "grpcio", "protobuf", "numpy")
TOKENS = 40
SWEEP = {50.0: (250, 500, 750, 1000, 1500), 100.0: (500, 1000, 1500, 2000)}  # ITL ms -> numbers of streams
QUICK_SWEEP = {50.0: (250, 1000), 100.0: (1000,)}


def fill_s(itl_ms: float) -> float:
    """One stream's length (ttft 50 ms, then 39 gaps): N streams are in flight after it."""
    return (TOKENS - 1) * itl_ms / 1000 + 0.05


def pin(cpu: int | None) -> None:
    """Run this process (and the latscope workers it spawns) on one CPU, when there is more than one."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})


def run(scenario, out: Path) -> tuple[dict, Path]:
    result = run_scenario(scenario, out=out, workers=1)
    return result.summary, result.run_dir


def p50(summary: dict, metric: str, cls: str = "all") -> float | None:
    return summary["metrics"].get(metric, {}).get(cls, {}).get("p50_ms")


# -- 1. serialization -------------------------------------------------------------------------


def serialization(quick: bool, work: Path, server_cpu: int | None) -> list[dict]:
    port, grpc_port = free_port(), free_port()
    rows = []
    with server_process([sys.executable, "-m", "reference_server", "serve", "--builtin", "identity", "--model-name", "identity",
                         "--no-generator", "--http-port", str(port), "--grpc-port", str(grpc_port),
                         "--max-queue-delay-us", "0", "--cache-dir", str(work / "cache")],
                        f"http://127.0.0.1:{port}/v2/health/ready", work / "identity.log", server_cpu):
        for n in (1, 32):
            overrides = [f"target.url=http://127.0.0.1:{port}", "target.launch=null",
                         f"workload.classes.2.url=grpc://127.0.0.1:{grpc_port}"]
            overrides += [f"phases.{i}.{field}" for i in (1, 2, 3) for field in (f"duration={5 if quick else 10}", "arrival.rate=10")]
            overrides += [f"workload.classes.{c}.tensors.0.shape=[{n},384]" for c in range(3)]
            summary, _ = run(load_scenario(REPO / "scenarios" / "serialization.yaml", overrides), work / f"ser-{n}")
            for cls in ("json", "binary", "grpc"):
                rows.append({"tensor": f"{n}x384 FP32", "transport": cls, "requests": summary["requests_by_class"][cls]["completed"],
                             **{m: p50(summary, m, cls) for m in ("encode", "decode", "server.deser", "server.ser", "network", "service_time")}})
    return rows


# -- 2. and 3. OpenAI streaming ---------------------------------------------------------------


def stream_scenario(url: str, streams: int, seconds: float, out: Path, itl_ms: float = 50.0) -> dict:
    rate = streams / fill_s(itl_ms)
    return {
        "name": f"streams-{streams}",
        "seed": 1,
        "target": {"url": url, "protocol": "openai", "model": "bench", "timeout": 30,
                   "openai": {"api": "completions", "stream": True, "include_usage": True,
                              "extra_body": {"ttft_ms": 50, "itl_ms": itl_ms}}},
        "workload": {"classes": [{"name": "stream", "prompt_tokens": 64, "output_tokens": TOKENS}]},
        "phases": [{"name": "fill", "duration": fill_s(itl_ms), "warmup": True, "arrival": {"type": "constant", "rate": rate}},
                   {"name": "hold", "duration": seconds, "arrival": {"type": "constant", "rate": rate}}],
        "limits": {"max_in_flight": streams * 2, "timer": "coarse"},
        "output": {"dir": str(out)},
    }


class _SpyStream(openai_protocol._Stream):
    """latscope's SSE sink, also pairing each token's read time with the `t_ns` the stream target
    wrote into that chunk (a bytes search, no second JSON parse), for one stream in SAMPLE_EVERY so
    the spy's own cost stays small."""

    __slots__ = ("pairs",)

    def __init__(self) -> None:
        super().__init__()
        self.pairs: list[tuple[int, int]] | None = None
        if next(_COUNT) % SAMPLE_EVERY == 0:
            self.pairs = []
            PAIRS.append(self.pairs)

    def _events(self, events, read_ns: int) -> None:
        before = len(self.token_ns)
        super()._events(events, read_ns)
        if self.pairs is None:
            return
        stamps = [int(data[at + 7 : data.index(b"}", at)]) for _, data in events if (at := data.find(b'"t_ns":')) >= 0]
        self.pairs += zip(stamps[: len(self.token_ns) - before], self.token_ns[before:])


PAIRS: list[list[tuple[int, int]]] = []
SAMPLE_EVERY = 8
_COUNT = itertools.count()


async def _hold(scenario) -> tuple[dict, float, int]:
    """Run the scenario's plan through one real Engine in this process (as a worker would); returns
    the engine's final report, its CPU seconds per wall second, and its start (perf_counter_ns)."""
    plan = build_plan(scenario)
    client = make_client(scenario)
    await client.open()
    t0 = time.perf_counter_ns() + 300_000_000
    windows = [(t0 + int(p.start_s * 1e9), t0 + int((p.start_s + p.duration_s) * 1e9)) for p in plan.phases if p.warmup]
    engine = Engine(client, t0 + (plan.offsets_s * 1e9).astype(np.int64), np.arange(len(plan)), plan.cls, plan.warmup,
                    (plan.prompt_tokens, plan.output_tokens, plan.item), plan.class_names, windows, t0_ns=t0, interval_s=1.0,
                    max_in_flight=scenario.limits.max_in_flight, overflow="queue", drain_timeout_s=10.0,
                    report=lambda message: None, should_stop=lambda: False, precise_timer=False)
    settle_gc()  # as in a worker
    cpu, wall = time.process_time(), time.perf_counter()
    try:
        final = await engine.run()
    finally:
        await client.close()
    return final, (time.process_time() - cpu) / (time.perf_counter() - wall), t0


def hold_streams(url: str, streams: int, itl_ms: float, seconds: float, work: Path) -> dict:
    """N streams through one engine; the error of every inter-token gap it measured against the gap
    the server really left between its writes, once all streams run (after the fill phase + 2 s)."""
    PAIRS.clear()
    openai_protocol._Stream = _SpyStream
    try:
        final, cpu, t0 = uvloop.run(_hold(scenario_from_dict(stream_scenario(url, streams, seconds, work, itl_ms))))
    finally:
        openai_protocol._Stream = _SpyStream.__mro__[1]
    settled = t0 + int((fill_s(itl_ms) + 2) * 1e9)
    errors = [abs((r - r_prev) - (t - t_prev)) / 1e6 for pairs in PAIRS
              for (t_prev, r_prev), (t, r) in zip(pairs, pairs[1:]) if r_prev >= settled]
    errors = np.array(errors)
    delay = np.array([(r - t) / 1e6 for pairs in PAIRS for t, r in pairs])
    return {"itl_ms": itl_ms, "streams": streams, "tokens_per_s": streams * 1000 / itl_ms, "gaps": len(errors), "not_sent": final[0],
            "errors_seen": sum(len(v) for v in final[1].values()),
            "itl_error_p50_ms": float(np.percentile(errors, 50)), "itl_error_p99_ms": float(np.percentile(errors, 99)),
            "itl_error_p999_ms": float(np.percentile(errors, 99.9)), "itl_error_max_ms": float(errors.max()),
            "read_delay_p99_ms": float(np.percentile(delay, 99)), "client_cpu": cpu}


def streaming(quick: bool, work: Path, server_cpu: int | None) -> tuple[dict, list[dict]]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with server_process([sys.executable, "-m", "latscope.targets.stream", "--port", str(port)],
                        f"{url}/health", work / "stream_target.log", server_cpu):
        summary, _ = run(scenario_from_dict(stream_scenario(url, 50, 5, work)), work / "openai-cost")
        tokens = summary["tokens"]["all"]["output_tokens"] / max(1, summary["requests"]["completed"])
        cost = {"encode_us": p50(summary, "encode") * 1000, "decode_us_per_request": p50(summary, "decode") * 1000,
                "tokens_per_request": tokens, "sse_parse_us_per_token": p50(summary, "decode") * 1000 / tokens}
        sweep = []
        for itl_ms, streams in [(itl, n) for itl, counts in (QUICK_SWEEP if quick else SWEEP).items() for n in counts]:
            row = hold_streams(url, streams, itl_ms, 6 if quick else 12, work)
            sweep.append(row)
            print(f"  {streams:5d} streams x {1000 / itl_ms:.0f} tokens/s: ITL error p50 {row['itl_error_p50_ms']:.3f} / "
                  f"p99 {row['itl_error_p99_ms']:.3f} / max {row['itl_error_max_ms']:.2f} ms over {row['gaps']} gaps, "
                  f"client CPU {row['client_cpu']:.0%}", flush=True)
    return cost, sweep


def report_md(report: dict) -> str:
    ser = markdown_table(
        ["tensor", "transport", "client encode ms", "client decode ms", "server deser ms", "server ser ms", "network ms", "service time ms"],
        [[r["tensor"], r["transport"], fmt(r["encode"], 3), fmt(r["decode"], 3), fmt(r["server.deser"], 3),
          fmt(r["server.ser"], 3), fmt(r["network"], 3), fmt(r["service_time"], 3)] for r in report["serialization"]])
    cost = report["openai_cost"]
    held = {}
    for r in report["streams"]:
        if r["itl_error_p99_ms"] <= 1.0 and r["errors_seen"] == 0:
            held[r["itl_ms"]] = max(held.get(r["itl_ms"], 0), r["streams"])
    held_text = "; ".join(f"{n:,} streams at {1000 / itl:.0f} tokens/s each" for itl, n in sorted(held.items())) or "none"
    streams = markdown_table(
        ["streams", "tokens/s each", "gaps checked", "ITL error p50 ms", "p99 ms", "p99.9 ms", "max ms", "read delay p99 ms", "client CPU"],
        [[str(r["streams"]), f"{1000 / r['itl_ms']:.0f}", f"{r['gaps']:,}", fmt(r["itl_error_p50_ms"], 3), fmt(r["itl_error_p99_ms"], 3),
          fmt(r["itl_error_p999_ms"], 3), fmt(r["itl_error_max_ms"]), fmt(r["read_delay_p99_ms"]), f"{r['client_cpu']:.0%}"]
         for r in report["streams"]])
    return f"""{SECTION_TITLE}

Machine: {machine_line(report['machine'])}

**Serialization** (medians, one worker, reference server's identity model, each transport in its own phase at 10 req/s):

{ser}

**OpenAI streaming client**: encode {cost['encode_us']:.0f} µs per request; SSE parsing {cost['sse_parse_us_per_token']:.1f} µs
per token ({cost['decode_us_per_request']:.0f} µs for a {cost['tokens_per_request']:.0f}-token response).

**Concurrent SSE streams, one worker's engine** (40 tokens each; error = |gap latscope measured − gap between the
server's writes| for every token once all streams run; read delay = read time − write time): highest N with
p99 error ≤ 1 ms and no errors: **{held_text}**.

{streams}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "out")
    parser.add_argument("--no-results-md", action="store_true")
    args = parser.parse_args()
    report = {"machine": machine_facts(PACKAGES), "quick": args.quick}
    client_cpu, server_cpu = cpus()
    pin(client_cpu)
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

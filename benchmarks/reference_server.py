"""reference_server on CPU: what dynamic batching buys, what serialization costs, how cold a start is.

    python benchmarks/reference_server.py            # ~15 min
    python benchmarks/reference_server.py --quick    # ~3 min, to check the script works

1. **Capacity.** The highest Poisson arrival rate each server sustains with latency p99 <= 50 ms and no
   errors, for the built-in encoder (6 layers, hidden 384) on 8- and 32-token inputs, driven open loop by
   latscope itself (1 worker, `timer: coarse` so the generator leaves the CPU to the server):
   the reference server with dynamic batching (max batch 32, max queue delay 2 ms), the same with
   `--max-batch-size 1`, and a naive baseline (benchmarks/naive_server.py: one ONNX Runtime call
   per request in a plain aiohttp handler). Search: doubling from 25 req/s, then bisection to ~5 %.
2. **Serialization.** FP32 tensors of 1x384 and 32x384 sent to an identity model over KServe v2 REST
   with JSON tensors, REST with binary tensors, and gRPC: client encode and decode (timed here), server
   deserialize and serialize (its Server-Timing), and the round trip; medians of sequential requests.
3. **Cold start.** Process start -> `ready` line, and the first request's latency, with an empty model
   cache and with a warm one (median of 3 starts each).

Everything runs on this machine, traffic to 127.0.0.1 only. Results: a table on stdout, JSON under
benchmarks/out/, and the "reference_server" section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import http.client
import json
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterator

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO))  # first: this script's own name must not shadow the reference_server package

import numpy as np  # noqa: E402

from common import (  # noqa: E402
    fmt, free_port, machine_facts, machine_line, markdown_table, server_process, update_results_md, write_report_json,
)
from latscope.run import run_scenario  # noqa: E402
from latscope.scenario import scenario_from_dict  # noqa: E402
from reference_server.model import EncoderConfig, cached_encoder  # noqa: E402

SECTION_TITLE = "## reference_server (benchmarks/reference_server.py)"
PACKAGES = ("onnxruntime", "onnx", "numpy", "aiohttp", "grpcio", "protobuf", "latscope")
P99_LIMIT_MS = 50.0
SEQUENCE = 32  # tokens per request for the cold-start requests
CAPACITY_SEQUENCES = (8, 32)  # short queries (where batching pays most on a CPU) and longer passages
SERVER_THREADS = "1"  # ONNX Runtime threads for every server: the other core is the load generator's
START_RATE = 25.0
PRECISION = 0.05
HIDDEN = 384


@dataclass(frozen=True)
class Mode:
    name: str
    warmup_s: float
    measure_s: float
    max_runs: int
    serialization_requests: int
    cold_starts: int


FULL = Mode("full", warmup_s=3, measure_s=10, max_runs=9, serialization_requests=300, cold_starts=3)
QUICK = Mode("quick", warmup_s=2, measure_s=4, max_runs=5, serialization_requests=50, cold_starts=1)


# -- servers ------------------------------------------------------------------------------------


@dataclass
class Server:
    name: str
    url: str
    process: subprocess.Popen
    grpc: str | None = None  # host:port


def reference_command(cache: Path, port: int, *flags: str) -> list[str]:
    return [sys.executable, "-m", "reference_server", "serve", "--http-port", str(port), "--cache-dir", str(cache), *flags]


@contextmanager
def started(name: str, command: list[str], port: int, log: Path) -> Iterator[Server]:
    url = f"http://127.0.0.1:{port}"
    with server_process(command, url + "/v2/health/ready", log) as process:
        yield Server(name, url, process)


# -- 1. capacity ----------------------------------------------------------------------------------


def infer_body(batch: int, sequence: int) -> dict:
    ids = (np.arange(batch * sequence) % 8000 + 1).tolist()
    return {"inputs": [
        {"name": "input_ids", "shape": [batch, sequence], "datatype": "INT64", "data": ids},
        {"name": "attention_mask", "shape": [batch, sequence], "datatype": "INT64", "data": [1] * (batch * sequence)},
    ]}


@dataclass
class RateRun:
    rate: float
    achieved_rps: float
    errors: int
    latency_p50_ms: float | None
    latency_p99_ms: float | None
    service_p99_ms: float | None
    validity: str
    sustained: bool


def measure_rate(url: str, rate: float, sequence: int, mode: Mode, runs_dir: Path) -> RateRun:
    arrival = {"type": "poisson", "rate": rate}
    scenario = scenario_from_dict({
        "name": f"capacity-{rate:g}", "seed": 3,
        "target": {"url": url, "method": "POST", "path": "/v2/models/encoder/infer", "timeout": 10},
        "workload": {"body": infer_body(1, sequence)},
        "phases": [{"name": "warm", "duration": mode.warmup_s, "warmup": True, "arrival": arrival},
                   {"name": "measure", "duration": mode.measure_s, "arrival": arrival}],
        "limits": {"timer": "coarse"},
        "output": {"dir": str(runs_dir)},
    })
    out = runs_dir / f"rate-{rate:g}"
    try:
        summary = run_scenario(scenario, out=out, workers=1).summary
    finally:
        shutil.rmtree(out, ignore_errors=True)
    latency = summary["metrics"].get("latency", {}).get("all", {})
    service = summary["metrics"].get("service_time", {}).get("all", {})
    errors = summary["requests"]["errors"]
    p99 = latency.get("p99_ms")
    sustained = errors == 0 and p99 is not None and p99 <= P99_LIMIT_MS and not summary["partial"]
    return RateRun(rate, summary["throughput"]["achieved_rps"], errors, latency.get("p50_ms"), p99,
                   service.get("p99_ms"), summary["validity"], sustained)


def max_rate(url: str, sequence: int, mode: Mode, runs_dir: Path, label: str) -> tuple[float | None, list[RateRun]]:
    """Double until a rate fails, then bisect; at most mode.max_runs runs."""
    best, failed, runs, rate = None, None, [], START_RATE
    while rate is not None and len(runs) < mode.max_runs:
        run = measure_rate(url, rate, sequence, mode, runs_dir)
        runs.append(run)
        print(f"  {label:28s} {rate:7.1f}/s: p99 {fmt(run.latency_p99_ms, 1)} ms, errors {run.errors} -> "
              f"{'ok' if run.sustained else 'over'}", flush=True)
        if run.sustained:
            best = max(rate, best or 0.0)
        else:
            failed = min(rate, failed or float("inf"))
        if failed is None:
            rate = rate * 2
        elif best is None:
            rate = rate / 2
        elif (failed - best) / best <= PRECISION:
            rate = None
        else:
            rate = round((best + failed) / 2, 1)
    return best, runs


def capacity(mode: Mode, work: Path) -> dict:
    """{sequence: {server: {max_rps, runs}}}: each server is started once and searched at every length."""
    cache = work / "cache"
    model, _ = cached_encoder(EncoderConfig(), cache)
    threads = ("--threads", SERVER_THREADS)
    configs: list[tuple[str, Callable[[int], list[str]]]] = [
        ("reference, dynamic batching", lambda port: reference_command(
            cache, port, *threads, "--max-batch-size", "32", "--max-queue-delay-us", "2000", "--no-generator")),
        ("reference, max batch 1", lambda port: reference_command(
            cache, port, *threads, "--max-batch-size", "1", "--no-generator")),
        ("naive aiohttp + ORT", lambda port: [sys.executable, str(REPO / "benchmarks" / "naive_server.py"),
                                              "--model", str(model), "--port", str(port), *threads]),
    ]
    results: dict = {str(seq): {} for seq in CAPACITY_SEQUENCES}
    for name, command in configs:
        port = free_port()
        with started(name, command(port), port, work / "servers.log") as server:
            for seq in CAPACITY_SEQUENCES:
                best, runs = max_rate(server.url, seq, mode, work / "runs", f"{name}, {seq} tokens")
                results[str(seq)][name] = {"max_rps": best, "runs": [asdict(r) for r in runs]}
    return results


# -- 2. serialization ----------------------------------------------------------------------------


def server_timing(header: str) -> dict[str, float]:
    parts = {}
    for part in header.split(","):
        name, _, params = part.strip().partition(";")
        for param in params.split(";"):
            key, _, value = param.strip().partition("=")
            if key == "dur":
                parts[name] = float(value)
    return parts


def rest_exchange(conn: http.client.HTTPConnection, array: np.ndarray, binary: bool) -> dict[str, float]:
    """One request; returns client encode/decode, server deser/ser and round trip, in ms."""
    t0 = time.perf_counter()
    tensor = {"name": "x", "shape": list(array.shape), "datatype": "FP32"}
    if binary:
        raw = array.tobytes()
        header = json.dumps({"inputs": [{**tensor, "parameters": {"binary_data_size": len(raw)}}],
                             "parameters": {"binary_data_output": True}}).encode()
        body, headers = header + raw, {"Inference-Header-Content-Length": str(len(header))}
    else:
        body, headers = json.dumps({"inputs": [{**tensor, "data": array.ravel().tolist()}]}).encode(), {}
    t1 = time.perf_counter()
    conn.request("POST", "/v2/models/ident/infer", body=body, headers={"Content-Type": "application/json", **headers})
    response = conn.getresponse()
    payload = response.read()
    t2 = time.perf_counter()
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status}: {payload[:200]!r}")
    length = response.getheader("Inference-Header-Content-Length")
    if length is not None:
        out = np.frombuffer(payload[int(length):], dtype="<f4").reshape(array.shape)
    else:
        out = np.asarray(json.loads(payload)["outputs"][0]["data"], dtype=np.float32).reshape(array.shape)
    t3 = time.perf_counter()
    assert np.array_equal(out, array)
    timing = server_timing(response.getheader("Server-Timing") or "")
    return {"encode": (t1 - t0) * 1e3, "decode": (t3 - t2) * 1e3, "round_trip": (t3 - t0) * 1e3,
            "server_deser": timing.get("deser", float("nan")), "server_ser": timing.get("ser", float("nan"))}


def grpc_exchange(target: str) -> Callable[[np.ndarray], dict[str, float]]:
    import grpc

    from reference_server import proto

    # The serializers run inside the call: time them here, not as part of the round trip's network share.
    infer = grpc.insecure_channel(target).unary_unary(proto.method_path("ModelInfer"))

    def exchange(array: np.ndarray) -> dict[str, float]:
        t0 = time.perf_counter()
        request = proto.ModelInferRequest(model_name="ident", inputs=[
            proto.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=list(array.shape))])
        request.raw_input_contents.append(array.tobytes())
        body = request.SerializeToString()
        t1 = time.perf_counter()
        raw, call = infer.with_call(body)
        t2 = time.perf_counter()
        response = proto.ModelInferResponse.FromString(raw)
        out = np.frombuffer(response.raw_output_contents[0], dtype="<f4").reshape(array.shape)
        t3 = time.perf_counter()
        assert np.array_equal(out, array)
        timing = server_timing(dict(call.trailing_metadata()).get("server-timing", ""))
        return {"encode": (t1 - t0) * 1e3, "decode": (t3 - t2) * 1e3, "round_trip": (t3 - t0) * 1e3,
                "server_deser": timing.get("deser", float("nan")), "server_ser": timing.get("ser", float("nan"))}

    return exchange


def serialization(mode: Mode, work: Path) -> list[dict]:
    port, grpc_port = free_port(), free_port()
    command = reference_command(work / "cache", port, "--builtin", "identity", "--model-name", "ident",
                                "--max-queue-delay-us", "0", "--grpc-port", str(grpc_port))
    rows = []
    with started("identity", command, port, work / "servers.log"):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        transports: dict[str, Callable[[np.ndarray], dict[str, float]]] = {
            "REST JSON": lambda a: rest_exchange(conn, a, binary=False),
            "REST binary": lambda a: rest_exchange(conn, a, binary=True),
            "gRPC raw": grpc_exchange(f"127.0.0.1:{grpc_port}"),
        }
        for rows_n in (1, 32):
            array = np.random.default_rng(0).standard_normal((rows_n, HIDDEN)).astype(np.float32)
            for name, exchange in transports.items():
                for _ in range(10):  # warm connections and caches
                    exchange(array)
                samples = [exchange(array) for _ in range(mode.serialization_requests)]
                medians = {k: round(statistics.median(s[k] for s in samples), 4) for k in samples[0]}
                rows.append({"tensor": f"{rows_n}x{HIDDEN} FP32", "transport": name, **medians})
                print(f"  {rows[-1]}", flush=True)
    return rows


# -- 3. cold start ------------------------------------------------------------------------------


def one_start(cache: Path, log: Path) -> dict[str, float]:
    port = free_port()
    body = json.dumps(infer_body(1, SEQUENCE)).encode()
    started_at = time.perf_counter()
    process = subprocess.Popen(reference_command(cache, port), stdout=subprocess.PIPE, stderr=log.open("ab"),
                               start_new_session=True, cwd=REPO, text=True)
    try:
        for line in process.stdout:
            if line.startswith("ready "):
                break
        ready = time.perf_counter()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request("POST", "/v2/models/encoder/infer", body=body, headers={"Content-Type": "application/json"})
        conn.getresponse().read()
        first = time.perf_counter()
        conn.request("POST", "/v2/models/encoder/infer", body=body, headers={"Content-Type": "application/json"})
        conn.getresponse().read()
        second = time.perf_counter()
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
    return {"start_to_ready_s": round(ready - started_at, 3), "first_request_ms": round((first - ready) * 1e3, 1),
            "second_request_ms": round((second - first) * 1e3, 1)}


def cold_start(mode: Mode, work: Path) -> dict:
    results = {}
    for label, warm in (("empty model cache", False), ("warm model cache", True)):
        cache = work / "cold-cache"
        runs = []
        for _ in range(mode.cold_starts):
            if not warm:
                shutil.rmtree(cache, ignore_errors=True)
            elif not cache.exists():
                one_start(cache, work / "servers.log")  # fill it
            runs.append(one_start(cache, work / "servers.log"))
        results[label] = {k: statistics.median(r[k] for r in runs) for k in runs[0]} | {"runs": runs}
        print(f"  {label}: {results[label]}", flush=True)
    return results


# -- report -------------------------------------------------------------------------------------


def results_section(report: dict) -> str:
    cap_rows, run_rows = [], []
    for seq, servers in report["capacity"].items():
        naive = servers["naive aiohttp + ORT"]["max_rps"]
        for name, r in servers.items():
            ratio = f"{r['max_rps'] / naive:.1f}x" if r["max_rps"] and naive else "–"
            cap_rows.append([seq, name, fmt(r["max_rps"], 1), ratio])
            run_rows += [[seq, name, f"{run['rate']:g}", f"{run['achieved_rps']:.1f}", fmt(run["latency_p50_ms"], 1),
                          fmt(run["latency_p99_ms"], 1), fmt(run["service_p99_ms"], 1), str(run["errors"]),
                          "yes" if run["sustained"] else "no"] for run in r["runs"]]
    ratios = [servers["reference, dynamic batching"]["max_rps"] / servers["naive aiohttp + ORT"]["max_rps"]
              for servers in report["capacity"].values()
              if servers["reference, dynamic batching"]["max_rps"] and servers["naive aiohttp + ORT"]["max_rps"]]
    verdict = (f"**Target {'met' if ratios and max(ratios) >= 3 else 'NOT met'}**: best batching / naive ratio "
               f"{max(ratios):.1f}x." if ratios else "**Target not judged** (a server sustained no rate).")
    ser_rows = [[r["tensor"], r["transport"], fmt(r["encode"], 3), fmt(r["server_deser"], 3), fmt(r["server_ser"], 3),
                 fmt(r["decode"], 3), fmt(r["round_trip"], 3)] for r in report["serialization"]]
    cold_rows = [[label, f"{r['start_to_ready_s']:.2f}", f"{r['first_request_ms']:.1f}", f"{r['second_request_ms']:.1f}"]
                 for label, r in report["cold_start"].items()]
    return f"""{SECTION_TITLE}

Run {report['finished_at']} with `python benchmarks/reference_server.py{' --quick' if report['mode'] == 'quick' else ''}` \
on {machine_line(report['machine'])}. CPU only (ONNX Runtime); no GPU was available to this run.

**Capacity**: highest Poisson rate with latency p99 <= {P99_LIMIT_MS:g} ms and no errors, built-in encoder
(6 layers, hidden 384), requests of 8 and of 32 tokens (batch 1 each), KServe v2 JSON, driven open loop by
latscope on the same 2-CPU machine (1 worker, coarse timer). Every server runs ONNX Runtime with
{SERVER_THREADS} intra-op thread, leaving the other core to the load generator. Target: dynamic batching >= 3x
the naive baseline.

{markdown_table(["tokens", "server", "max rate (req/s)", "vs naive"], cap_rows)}

{verdict}

{markdown_table(["tokens", "server", "rate", "achieved", "p50 ms", "p99 ms", "service p99 ms", "errors", "ok"], run_rows)}

**Serialization** (identity model, medians of {report['mode_settings']['serialization_requests']} sequential requests,
ms): client encode, server deserialize and serialize (its Server-Timing / gRPC trailing metadata), client
decode, and the whole round trip.

{markdown_table(["tensor", "transport", "encode", "server deser", "server ser", "decode", "round trip"], ser_rows)}

**Cold start** (median of {report['mode_settings']['cold_starts']}): process start -> `ready` line, then the first
and second request (32 tokens, JSON) on a new connection.

{markdown_table(["model cache", "start -> ready (s)", "first request (ms)", "second request (ms)"], cold_rows)}

Raw numbers: `{report['json_file']}` (git-ignored).
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "out")
    parser.add_argument("--only", choices=("capacity", "serialization", "cold_start"), action="append")
    parser.add_argument("--no-results-md", action="store_true")
    args = parser.parse_args(argv)
    mode = QUICK if args.quick else FULL
    parts = args.only or ["capacity", "serialization", "cold_start"]
    facts = machine_facts(PACKAGES)
    print(f"machine: {machine_line(facts)}", flush=True)
    report: dict = {"mode": mode.name, "mode_settings": asdict(mode), "machine": facts,
                    "capacity": {}, "serialization": [], "cold_start": {}}
    with tempfile.TemporaryDirectory(prefix="latscope-bench-ref-") as tmp:
        work = Path(tmp)
        for part in parts:
            print(f"{part}:", flush=True)
            report[part] = {"capacity": capacity, "serialization": serialization, "cold_start": cold_start}[part](mode, work)
    report["finished_at"] = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    json_file = write_report_json(report, args.out, f"reference_server-{mode.name}")
    if set(parts) == {"capacity", "serialization", "cold_start"}:
        section = results_section(report)
        print("\n" + section)
        if not args.no_results_md:
            update_results_md(section, SECTION_TITLE)
    print(f"wrote {json_file}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""reference_server on CPU: how close it gets to the model's own ceiling, what serialization costs, how cold
a start is.

    python benchmarks/reference_server.py                         # ~75 min
    python benchmarks/reference_server.py --before ../old-checkout  # also an older server, same sitting
    python benchmarks/reference_server.py --quick                 # ~8 min, to check the script works

1. **Ceiling and capacity.** For the built-in encoder (6 layers, hidden 384) on 8- and 32-token inputs:
   - the ceiling: ONNX Runtime alone (1 thread, on the core the servers get), every batch size up to 32,
     and the best rows/s of a batch size whose compute still fits the p99 <= 50 ms SLO (`encoder_ceiling`); and
     what a server with no overhead at all would sustain under the same Poisson traffic (`ideal_capacity`), judged
     on its p99 as measured and, as `latscope capacity` judges a server, on its p99's confidence bound;
   - `latscope capacity` on each server (the highest Poisson rate with p99 <= 50 ms at 95 % confidence and
     no errors), every server launched by the scenario on a core of its own (`target.launch.cpus: 1`, so
     latscope's one worker has the other): the reference server with dynamic batching, the same with
     `--max-batch-size 1`, and a naive baseline (benchmarks/naive_server.py: one ONNX Runtime call per
     request in a plain aiohttp handler), all with 1 ONNX Runtime thread;
   - p50 / p99 of each at fixed rates, to compare them load by load: 3 runs a rate, the servers taking turns,
     and the median of each compared (one 10-s run's p99 rests on its ~10 slowest requests).
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
    ceiling, fmt, free_port, git_commit, machine_facts, machine_line, markdown_table, model_alone_ms, server_process,
    update_results_md, write_report_json,
)
from latscope.analysis.quantile_ci import quantile_ci  # noqa: E402
from latscope.analysis.slo_confidence import LOOKS, look_confidence  # noqa: E402
from latscope.capacity import CapacityOptions, find_capacity  # noqa: E402
from latscope.capacity.shape import scaled  # noqa: E402
from latscope.plan import build_plan  # noqa: E402
from latscope.recorder import bucket_bounds, bucket_indices, new_histogram  # noqa: E402
from latscope.run import run_scenario  # noqa: E402
from latscope.scenario import Scenario, scenario_from_dict  # noqa: E402
from reference_server.model import DEFAULT_CACHE, EncoderConfig, cached_encoder  # noqa: E402

SECTION_TITLE = "## reference_server (benchmarks/reference_server.py)"
PACKAGES = ("onnxruntime", "onnx", "numpy", "aiohttp", "grpcio", "protobuf", "latscope")
P99_LIMIT_MS = 50.0
SEQUENCE = 32  # tokens per request for the cold-start requests
CAPACITY_SEQUENCES = (8, 32)  # short queries (where batching pays most on a CPU) and longer passages
SERVER_THREADS = "1"  # ONNX Runtime threads for every server: the other core is the load generator's
MAX_BATCH = 32  # the reference server's --max-batch-size, and the largest batch the ceiling considers
SWEEP_RATES = {8: (25.0, 100.0, 200.0, 300.0, 400.0), 32: (10.0, 25.0, 50.0, 75.0, 100.0)}
SWEEP_SERVERS = ("reference, dynamic batching", "reference, max batch 1", "naive aiohttp + ORT")
# The rate the overhead-free server's arrivals are scaled from (any: a step's plan depends on its rate and the seed).
BASE_RATE = {8: 100.0, 32: 25.0}
# The first step of each search, as a share of the overhead-free server's capacity (as measured): below every
# server's capacity (a search only doubles up from it, then bisects; the naive server has reached 0.31-0.43 of
# it), and near enough that a search bracketed at 2-4x the start has its steps left to bisect to 5 %.
START_SHARE = 0.3
BUCKETS = bucket_bounds(new_histogram())  # (lowest, highest) µs of every HDR bucket, as latscope records latency
COUNTS_LEN = len(BUCKETS[0])
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
    curve_seconds: float  # per batch size, when measuring the model alone
    sweep_s: float  # measured seconds of each fixed-rate run
    sweep_repeats: int  # fixed-rate runs per server and rate, interleaved across the servers


# A capacity step of 20 s gets 1-s reporting intervals (`latscope capacity` wants >= 20 per step); at 8 s they
# were 0.4 s, and the one worker, sharing its core with latscope's parent, then ran its send lag p99 to 1.5-2.3 ms:
# a "degraded" generator, which ends a search. 12 steps: 8 were used up by undecided looks before a search had
# bisected to 5 % (2026-11-27). One 10-s fixed-rate run's p99 rests on its ~10 slowest requests and moved 29 -> 53 ms
# between two runs of one server here, so each rate is run 3 times and the median p99 compared.
FULL = Mode("full", warmup_s=2, measure_s=20, max_runs=12, serialization_requests=300, cold_starts=3,
            curve_seconds=1.0, sweep_s=10, sweep_repeats=3)
# --quick checks that the script runs. Its steps are too short for the judged yardstick to bound a p99 (it reads low).
QUICK = Mode("quick", warmup_s=1, measure_s=3, max_runs=3, serialization_requests=50, cold_starts=1,
             curve_seconds=0.05, sweep_s=3, sweep_repeats=1)


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


# -- 1. the ceiling, and capacity against it ------------------------------------------------------


def infer_body(batch: int, sequence: int) -> dict:
    ids = (np.arange(batch * sequence) % 8000 + 1).tolist()
    return {"inputs": [
        {"name": "input_ids", "shape": [batch, sequence], "datatype": "INT64", "data": ids},
        {"name": "attention_mask", "shape": [batch, sequence], "datatype": "INT64", "data": [1] * (batch * sequence)},
    ]}


def compute_curve(sequence: int, max_batch: int, min_seconds: float) -> dict[int, float]:
    """{batch size: median ms of one run} of the encoder alone (common.model_alone_ms)."""
    model, _ = cached_encoder(EncoderConfig(), DEFAULT_CACHE.expanduser())
    feeds = []
    for batch in range(1, max_batch + 1):
        ids = (np.arange(batch * sequence).reshape(batch, sequence) % 8000 + 1).astype(np.int64)
        feeds.append({"input_ids": ids, "attention_mask": np.ones_like(ids)})
    return dict(zip(range(1, max_batch + 1), model_alone_ms(model, feeds, min_seconds)))


def encoder_ceiling(curve: dict[int, float]) -> dict:
    """The best rows per second of a batch whose compute fits the SLO: max b / c(b) with c(b) <= SLO."""
    b, ms, rps = ceiling(curve, P99_LIMIT_MS)
    return {"batch": b, "compute_ms": round(ms, 3), "rps": round(rps, 1)}


def step_arrivals(base: Scenario, rate: float, measure_s: float) -> tuple[np.ndarray, np.ndarray]:
    """(send offsets in s, warm-up flags) of a capacity step at `rate`: the plan `latscope capacity` sends, the
    scenario scaled as its search scales it (same seed), so the overhead-free server below meets the very arrivals
    the servers meet."""
    plan = build_plan(scaled(base, rate / base_rate(base), measure_s))
    return plan.offsets_s, plan.warmup


def base_rate(scenario: Scenario) -> float:
    return next(p.arrival.rate for p in scenario.phases if not p.warmup)


def ideal_latencies_ms(arrivals: np.ndarray, curve: dict[int, float], max_batch: int) -> np.ndarray:
    """Every request's latency (ms) at a server with no overhead at all: whenever the model is free it runs every
    request waiting (up to `max_batch`) as one batch of c(b) ms."""
    n = len(arrivals)
    done = np.empty(n)
    t, i = 0.0, 0
    while i < n:
        t = max(t, arrivals[i])
        j = min(int(np.searchsorted(arrivals, t, side="right")), i + max_batch)
        t += curve[j - i] / 1e3
        done[i:j] = t
        i = j
    return (done - arrivals) * 1e3


def ideal_p99_ok(base: Scenario, rate: float, curve: dict[int, float], max_batch: int, measure_s: float) -> bool:
    """Whether that server's p99 over the measured requests of a capacity step at `rate` is within the SLO."""
    arrivals, warmup = step_arrivals(base, rate, measure_s)
    return float(np.percentile(ideal_latencies_ms(arrivals, curve, max_batch)[~warmup], 99)) <= P99_LIMIT_MS


def ideal_judged_ok(base: Scenario, rate: float, curve: dict[int, float], max_batch: int, measure_s: float) -> bool:
    """Whether that server passes a capacity step at `rate` as `latscope capacity` judges a real one: the upper
    bound of its p99's confidence interval (latscope's own `quantile_ci` on 1-s interval histograms, at a look's
    level) within the SLO, over a step's longest evidence (its LOOKS looks pooled, each as long as all before it:
    2^(LOOKS - 1) x `measure_s`, one seed's arrivals)."""
    arrivals, warmup = step_arrivals(base, rate, 2 ** (LOOKS - 1) * measure_s)
    latency_us = ideal_latencies_ms(arrivals, curve, max_batch)[~warmup] * 1e3
    second = (arrivals[~warmup] - arrivals[~warmup][0]).astype(np.int64)
    k = int(second[-1]) + 1
    counts = np.bincount(second * COUNTS_LEN + bucket_indices(latency_us), minlength=k * COUNTS_LEN)
    q = quantile_ci(counts.reshape(k, COUNTS_LEN), *BUCKETS, 99, look_confidence(CapacityOptions().confidence))
    return q.high_us / 1e3 <= P99_LIMIT_MS


def ideal_capacity(ok: Callable[..., bool], base: Scenario, curve: dict[int, float], max_batch: int,
                   measure_s: float) -> float:
    """The highest rate at which the overhead-free server passes `ok` on a capacity step's own arrivals (bisection
    to 0.1 %): what the model can serve within the SLO under the traffic the servers get. Queueing, not the
    server, is why it sits below `ceiling`: at 80 % busy, Poisson bursts alone push a 50 ms p99 over."""
    low, high = base_rate(base) / 4, 2 * 1e3 * max_batch / curve[max_batch]
    while (high - low) / low > 0.001:
        mid = (low + high) / 2
        low, high = (mid, high) if ok(base, mid, curve, max_batch, measure_s) else (low, mid)
    return round(low, 1)


@dataclass(frozen=True)
class ServerUnderTest:
    name: str
    command: list[str]  # `python ...`, {port} filled in
    cwd: Path = REPO
    pythonpath: Path | None = None


def server_configs(before: Path | None) -> list[ServerUnderTest]:
    reference = ["python", "-m", "reference_server", "serve", "--http-port", "{port}", "--grpc-port", "-1",
                 "--threads", SERVER_THREADS, "--no-generator"]
    configs = [ServerUnderTest("reference, dynamic batching", reference + ["--max-batch-size", "32"]),
               ServerUnderTest("reference, max batch 1", reference + ["--max-batch-size", "1"]),
               ServerUnderTest("naive aiohttp + ORT", ["python", str(REPO / "benchmarks" / "naive_server.py"), "--model",
                                                    "{model}", "--port", "{port}", "--threads", SERVER_THREADS])]
    if before is not None:
        configs.append(ServerUnderTest(f"reference before ({git_commit(before)}), dynamic batching",
                                    reference + ["--max-batch-size", "32"], cwd=before, pythonpath=before))
    return configs


def server_scenario(config: ServerUnderTest, sequence: int, rate: float, warmup_s: float, measure_s: float,
                    runs_dir: Path) -> dict:
    """One latscope scenario per server and input length: it launches the server on a core of its own
    (`cpus: 1`, latscope's one worker on the other), Poisson traffic at `rate`, SLO p99 <= 50 ms and no errors."""
    port = free_port()
    model, _ = cached_encoder(EncoderConfig(), DEFAULT_CACHE.expanduser())
    command = [part.format(port=port, model=model) for part in config.command]
    arrival = {"type": "poisson", "rate": rate}
    launch = {"command": command, "ready_url": f"http://127.0.0.1:{port}/v2/health/ready", "ready_timeout": "120s",
              "cwd": str(config.cwd), "cpus": 1}
    if config.pythonpath:
        launch["env"] = {"PYTHONPATH": str(config.pythonpath)}
    return {
        "name": f"encoder-{sequence}", "seed": 3,
        "target": {"url": f"http://127.0.0.1:{port}", "method": "POST", "path": "/v2/models/encoder/infer",
                   "timeout": "10s", "launch": launch},
        "workload": {"body": infer_body(1, sequence)},
        "phases": [{"name": "warm", "duration": warmup_s, "warmup": True, "arrival": arrival},
                   {"name": "measure", "duration": measure_s, "arrival": arrival}],
        "slos": [{"metric": "latency", "stat": "p99", "limit_ms": P99_LIMIT_MS},
                 {"stat": "error_rate", "max": 0.01}],
        "telemetry": {"nvml": False, "host": False},
        # latscope's parent and its one worker share a core here, and the worker's send lag p99 sits near the
        # default 1 ms mark (0.4-2.3 ms measured): a "degraded" stamp would end a search at random. A late send
        # only adds to the latency measured from the intended time, so it can make a server look slower,
        # never faster; each step's send lag p99 is kept in the JSON.
        "validity": {"degraded_send_lag_p99_ms": 3},
        "output": {"dir": str(runs_dir), "report": False, "save_schedule": False},
    }


def search_capacity(config: ServerUnderTest, sequence: int, start: float, mode: Mode, work: Path,
                    tries: int = 2) -> dict:
    """`latscope capacity` on this server: double from `start` until a step fails, then bisect to 5 %. A search
    that latscope ends with `generator_limit` (a step's send lag over its mark: on this 2-core box a moment of
    the box's own, seen once at 100 req/s where the same step's send lag p99 is 0.4-0.7 ms otherwise) is run
    again, once; the first one's steps stay in the record."""
    out = Path(tempfile.mkdtemp(prefix=f"capacity-{sequence}-", dir=work))
    scenario = scenario_from_dict(server_scenario(config, sequence, start, mode.warmup_s, mode.measure_s, work / "runs"))
    found = find_capacity(scenario, out, CapacityOptions(precision=PRECISION, max_steps=mode.max_runs, workers=1))
    steps = [{"rate": s["rate_rps"], "achieved_rps": s.get("achieved_rps"), "verdict": s["verdict"],
              "counted_as": s["counted_as"], "p99_ms": _step_p99(s), "note": s.get("note"),
              "send_lag_p99_ms": _send_lag_p99(out / s["dir"])} for s in found["steps"]]
    shutil.rmtree(out, ignore_errors=True)
    result = {"max_rps": found["max_rate_rps"], "stopped": found["stopped"], "steps": steps}
    if found["stopped"] == "generator_limit" and tries > 1:
        print(f"    {config.name}: the generator fell behind ({steps[-1]['note']}); searching again", flush=True)
        again = search_capacity(config, sequence, start, mode, work, tries - 1)
        return {**again, "earlier_search": result}
    return result


def _send_lag_p99(run_dir: Path) -> float | None:
    try:
        return json.loads((run_dir / "summary.json").read_text())["metrics"]["send_lag"]["all"]["p99_ms"]
    except (OSError, KeyError, ValueError):
        return None


def _step_p99(step: dict) -> float | None:
    """The step's latency p99 (its first SLO), when it was judged."""
    return step["slos"][0]["value"] if step.get("slos") else None


def fixed_rate(config: ServerUnderTest, sequence: int, rate: float, mode: Mode, work: Path) -> dict:
    """p50 and p99 of one short run at a fixed Poisson rate."""
    scenario = scenario_from_dict(server_scenario(config, sequence, rate, mode.warmup_s, mode.sweep_s, work / "runs"))
    out = work / "sweep"
    try:
        summary = run_scenario(scenario, out=out, workers=1).summary
    finally:
        shutil.rmtree(out, ignore_errors=True)
    latency = summary["metrics"].get("latency", {}).get("all", {})
    row = {"achieved_rps": summary["throughput"]["achieved_rps"], "errors": summary["requests"]["errors"],
           "p50_ms": latency.get("p50_ms"), "p99_ms": latency.get("p99_ms"), "validity": summary["validity"]}
    print(f"    {config.name}, {sequence} tokens, {rate:g}/s: p50 {fmt(row['p50_ms'], 2)} ms, "
          f"p99 {fmt(row['p99_ms'], 2)} ms, errors {row['errors']}", flush=True)
    return row


def sweep(configs: list[ServerUnderTest], sequence: int, rates: tuple[float, ...], mode: Mode,
          work: Path) -> dict[str, list[dict]]:
    """{server: [per rate: {"rate", "runs", and the median run's p50_ms, p99_ms, errors}]}: `mode.sweep_repeats`
    runs of each server at each rate, the servers taking turns (A B C A B C ...) so that a slow minute of the box
    falls on all of them, not on one."""
    runs: dict[str, list[list[dict]]] = {c.name: [[] for _ in rates] for c in configs}
    for i, rate in enumerate(rates):
        for _ in range(mode.sweep_repeats):
            for config in configs:
                runs[config.name][i].append(fixed_rate(config, sequence, rate, mode, work))
    return {name: [median_run(rate, rows) for rate, rows in zip(rates, by_rate)] for name, by_rate in runs.items()}


def median_run(rate: float, runs: list[dict]) -> dict:
    """The repeats of one server at one rate: the median p50, p99 and errors of the runs, and the runs."""
    def median(key: str) -> float | None:
        values = [r[key] for r in runs if r[key] is not None]
        return statistics.median(values) if values else None
    return {"rate": rate, "p50_ms": median("p50_ms"), "p99_ms": median("p99_ms"), "errors": median("errors"),
            "runs": runs}


def yardsticks(base: Scenario, curve: dict[int, float], measure_s: float) -> dict[str, float]:
    """The overhead-free server's capacity with and without batching, judged on its p99 as measured and as
    `latscope capacity` judges (its confidence bound)."""
    return {f"{name}{suffix}": ideal_capacity(ok, base, curve, size, measure_s)
            for name, size in (("batching", MAX_BATCH), ("batch_1", 1))
            for suffix, ok in (("", ideal_p99_ok), ("_judged", ideal_judged_ok))}


def capacity(mode: Mode, work: Path, before: Path | None = None) -> dict:
    """{sequence: {"curve", "ceiling", "servers": {name: {"capacity", "sweep"}}}}, all in one sitting."""
    results: dict = {}
    for sequence in CAPACITY_SEQUENCES:
        curve = compute_curve(sequence, MAX_BATCH, mode.curve_seconds)
        bound = encoder_ceiling(curve)
        base = scenario_from_dict(server_scenario(server_configs(None)[0], sequence, BASE_RATE[sequence],
                                                  mode.warmup_s, mode.measure_s, work / "runs"))
        ideal = yardsticks(base, curve, mode.measure_s)
        start = float(round(START_SHARE * ideal["batching"]))
        print(f"  {sequence} tokens: ceiling {bound['rps']} req/s at batch {bound['batch']} ({bound['compute_ms']} ms); "
              f"an overhead-free server under Poisson arrivals: {ideal['batching']} req/s, {ideal['batching_judged']} "
              f"judged as latscope capacity judges ({ideal['batch_1']} / {ideal['batch_1_judged']} without batching); "
              f"searches start at {start:g} req/s", flush=True)
        configs = server_configs(before)
        sweeps = sweep([c for c in configs if c.name in SWEEP_SERVERS], sequence, SWEEP_RATES[sequence], mode, work)
        servers = {}
        for config in configs:
            found = search_capacity(config, sequence, start, mode, work)
            print(f"    {config.name}: capacity {fmt(found['max_rps'], 1)} req/s ({found['stopped']})", flush=True)
            servers[config.name] = {"capacity": found, "sweep": sweeps.get(config.name, [])}
        results[str(sequence)] = {"curve_ms": {str(b): round(ms, 3) for b, ms in curve.items()}, "ceiling": bound,
                                  "ideal_rps": ideal, "search_start_rps": start, "servers": servers}
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


def capacity_section(report: dict) -> str:
    """The ceiling, each server's capacity as fractions of it, and the load-by-load comparison."""
    sizes = ("1", "2", "4", "8", "12", "16", "24", "32")
    curve_rows, bound_rows, cap_rows, sweep_rows, verdicts = [], [], [], [], []
    for seq, r in report["capacity"].items():
        curve, bound, ideal, servers = r["curve_ms"], r["ceiling"], r["ideal_rps"], r["servers"]
        curve_rows.append([seq] + [f"{curve[b]:.1f} ({int(b) / curve[b] * 1e3:.0f}/s)" if b in curve else "–"
                                   for b in sizes])
        judged = ideal.get("batching_judged")  # reports before 2026-11-27 have only the yardstick as measured
        bound_rows.append([seq, f"**{bound['rps']}** (batch {bound['batch']}, {bound['compute_ms']:.1f} ms)",
                           f"**{ideal['batching']}** / {fmt(judged, 1)}",
                           f"{ideal['batch_1']} / {fmt(ideal.get('batch_1_judged'), 1)}"])
        naive = servers["naive aiohttp + ORT"]["capacity"]["max_rps"]
        for name, srv in servers.items():
            got = srv["capacity"]["max_rps"]
            failed = [step["rate"] for step in srv["capacity"]["steps"] if step["counted_as"] == "fail"]
            cap_rows.append([seq, name, fmt(got, 1), fmt(min(failed), 1) if failed else "–",
                             f"{got / bound['rps']:.0%}" if got else "–",
                             f"{got / ideal['batching']:.0%} / {got / judged:.0%}" if got and judged else "–",
                             f"{got / naive:.2f}x" if got and naive else "–", srv["capacity"]["stopped"] or ""])
        columns = [servers[name]["sweep"] for name in SWEEP_SERVERS]
        above = []  # (server, rate) where a reference server's p99 is above the naive server's
        for runs in zip(*columns):
            naive_p99 = runs[-1]["p99_ms"]
            row = [seq, f"{runs[0]['rate']:g}"]
            for name, x in zip(SWEEP_SERVERS, runs):
                worse = name != "naive aiohttp + ORT" and None not in (x["p99_ms"], naive_p99) and x["p99_ms"] > naive_p99
                above += [f"{name.removeprefix('reference, ')} at {runs[0]['rate']:g}/s"] if worse else []
                p99s = sorted(r["p99_ms"] for r in x.get("runs", []) if r["p99_ms"] is not None)
                row.append(f"{fmt(x['p50_ms'], 1)} / {fmt(x['p99_ms'], 1)}" + (" ▲" if worse else "")
                           + (f" ({fmt(p99s[0], 0)}–{fmt(p99s[-1], 0)})" if len(p99s) > 1 else "")
                           + (f" ({x['errors']:g} err)" if x["errors"] else ""))
            sweep_rows.append(row)
        ref = servers["reference, dynamic batching"]["capacity"]["max_rps"] or 0
        verdicts.append(f"{seq} tokens: the reference server reaches {ref / bound['rps']:.0%} of the ceiling and "
                        f"**{ref / ideal['batching']:.0%} of the overhead-free server** as measured"
                        + (f", **{ref / judged:.0%}** judged as latscope capacity judges" if judged else "")
                        + f" ({fmt(ref, 1)} req/s; naive {fmt(naive, 1)}); median p99 above the naive server's: "
                        + (", ".join(above) or "nowhere"))
    return f"""**The ceiling** — the model alone: ONNX Runtime, 1 intra-op thread, on the core the servers get, no
server. Median ms per run (rows/s) by batch size:

{markdown_table(["tokens"] + [f"batch {b}" for b in sizes], curve_rows)}

- *ceiling*: the best rows/s of a batch whose compute fits the SLO, max b / c(b) with c(b) <= {P99_LIMIT_MS:g} ms.
  A throughput bound: no server serves more.
- *overhead-free server, Poisson*: the highest Poisson rate at which a server with no overhead at all (the
  model runs every waiting request, up to 32, as one batch whenever it is free; simulated on the very arrivals
  a capacity step sends, same seed) keeps p99 <= {P99_LIMIT_MS:g} ms. This is what the model can serve within the SLO under the
  traffic below; it sits under the ceiling because of queueing alone (Poisson bursts), not overhead. Judged two
  ways: on one step's p99 as measured (the issue's yardstick), and as `latscope capacity` judges the servers
  (the upper bound of the p99's confidence interval within the SLO, over a step's longest evidence: {2 ** (LOOKS - 1)} x
  {report['mode_settings']['measure_s']:g} s), which needs a margin below the SLO that the first does not.

{markdown_table(["tokens", "ceiling, req/s", "overhead-free server, Poisson, req/s: as measured / judged",
                 "same, no batching"], bound_rows)}

**Capacity** — `latscope capacity` (p99 <= {P99_LIMIT_MS:g} ms judged with 95 % confidence, error rate <= 1 %,
precision {PRECISION:.0%}) on each server, launched by the scenario on a core of its own (`target.launch.cpus: 1`,
ONNX Runtime with {SERVER_THREADS} thread), latscope's one worker on the other core; Poisson arrivals of single
requests (KServe v2 JSON), {report['mode_settings']['warmup_s']:g} s warm-up + {report['mode_settings']['measure_s']:g} s
per step, in one sitting. Every step counted was stamped `valid` by latscope (a search ends at the first that is not).

{markdown_table(["tokens", "server", "capacity, req/s", "lowest failing rate", "of ceiling",
                 "of overhead-free server (as measured / judged)", "vs naive", "search stopped"], cap_rows)}

{"; ".join(verdicts)}.

**Load by load** — latency p50 / p99 ms at fixed Poisson rates: the medians of
{report['mode_settings'].get('sweep_repeats', 1)} runs of {report['mode_settings']['sweep_s']:g} s each (the servers taking turns), the
p99s' range in brackets, same setup; ▲: a median p99 above the naive server's at that rate:

{markdown_table(["tokens", "rate"] + list(SWEEP_SERVERS), sweep_rows)}
"""


def results_section(report: dict) -> str:
    ser_rows = [[r["tensor"], r["transport"], fmt(r["encode"], 3), fmt(r["server_deser"], 3), fmt(r["server_ser"], 3),
                 fmt(r["decode"], 3), fmt(r["round_trip"], 3)] for r in report["serialization"]]
    cold_rows = [[label, f"{r['start_to_ready_s']:.2f}", f"{r['first_request_ms']:.1f}", f"{r['second_request_ms']:.1f}"]
                 for label, r in report["cold_start"].items()]
    return f"""{SECTION_TITLE}

Run {report['finished_at']} with `python benchmarks/reference_server.py{' --quick' if report['mode'] == 'quick' else ''}` \
on {machine_line(report['machine'])}. CPU only (ONNX Runtime); no GPU was available to this run. Built-in
encoder (6 layers, hidden 384), requests of 8 and of 32 tokens.

{capacity_section(report)}
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
    parser.add_argument("--render", type=Path, metavar="JSON", help="only write the RESULTS.md section again from a "
                                                                     "report this script saved")
    parser.add_argument("--before", type=Path, help="also measure the reference server of this checkout (e.g. a "
                                                     "`git worktree` of an older commit) in the same sitting")
    args = parser.parse_args(argv)
    if args.render:
        report = json.loads(args.render.read_text())
        update_results_md(results_section(report), SECTION_TITLE)
        return 0
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
            run = {"capacity": lambda m, w: capacity(m, w, args.before), "serialization": serialization,
                   "cold_start": cold_start}[part]
            report[part] = run(mode, work)
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

"""Where a request's time goes inside the reference server, step by step, under open-loop load.

    python benchmarks/handoff.py                    # this checkout: 8 tokens at 25/150/300/400 req/s, ~1 min
    python benchmarks/handoff.py --before ../old    # an older checkout first, then this one; into RESULTS.md

The server runs on one core of its own (`target.launch.cpus: 1`, ONNX Runtime with 1 thread), latscope
on the other, Poisson arrivals of KServe v2 JSON requests for the built-in encoder. Inside the server,
benchmarks/probe/sitecustomize.py stamps each request at the edges of the steps every version of the
server has, so the same probe times any checkout (`--before`, e.g. a `git worktree` of an older
commit). Per step, the median and p99 in ms:

    outside handler   client latency − time in the handler: HTTP parse, the loop reaching the request, write
    body, decode      reading the body; JSON decode + validation against the model signature
    queue wait        enqueued -> its batch taken by the inference side (waiting for the batch ahead, the
                      batching delay, and the wake-up of the inference thread)
    assembly          padding and concatenation of the batch
    compute           the backend call (ONNX Runtime), for the whole batch
    deliver           splitting the outputs, then handing this request its result
    hand back         result handed over -> the handler running again on the event loop
    encode            the response built (JSON, Server-Timing)

Results: tables on stdout, JSON under benchmarks/out/, and with --before the "hand-off" section of
benchmarks/RESULTS.md. Traffic to 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO))

from common import (  # noqa: E402
    fmt, free_port, git_commit, machine_facts, machine_line, markdown_table, update_results_md, write_report_json,
)
from latscope.run import run_scenario  # noqa: E402
from latscope.scenario import scenario_from_dict  # noqa: E402

TITLE = "## reference_server hand-off (benchmarks/handoff.py)"
PROBE = REPO / "benchmarks" / "probe"
WARMUP_S = 3.0
STEPS = (  # (name, from stamp, to stamp)
    ("body", "handler", "body"),
    ("decode", "body", "decoded"),
    ("queue wait", "enqueued", "taken"),
    ("assembly", "taken", "compute0"),
    ("compute", "compute0", "compute1"),
    ("deliver", "compute1", "delivered"),
    ("hand back", "delivered", "resumed"),
    ("encode", "resumed", "returned"),
)


def token_body(tokens: int) -> dict:
    ids = [(101 + 37 * i) % 8000 for i in range(tokens)]
    return {"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, tokens], "data": ids},
                       {"name": "attention_mask", "datatype": "INT64", "shape": [1, tokens], "data": [1] * tokens}]}


def server_scenario(checkout: Path, port: int, rate: float, tokens: int, seconds: float, out_dir: Path,
                    probe_file: Path, flags: list[str]) -> dict:
    arrival = {"type": "poisson", "rate": rate}
    return {
        "name": f"handoff-{rate:g}", "seed": 5,
        "target": {"url": f"http://127.0.0.1:{port}", "method": "POST", "path": "/v2/models/encoder/infer",
                   "timeout": "10s",
                   "launch": {"command": ["python", "-m", "reference_server", "serve", "--http-port", str(port),
                                          "--grpc-port", "-1", "--threads", "1", "--no-generator", *flags],
                              "ready_url": f"http://127.0.0.1:{port}/v2/health/ready", "ready_timeout": "90s",
                              "cwd": str(checkout), "cpus": 1,
                              "env": {"PYTHONPATH": f"{PROBE}:{checkout}", "LATSCOPE_PROBE_OUT": str(probe_file)}}},
        "workload": {"body": token_body(tokens)},
        "phases": [{"name": "warm", "duration": WARMUP_S, "warmup": True, "arrival": arrival},
                   {"name": "measure", "duration": seconds, "arrival": arrival}],
        "output": {"dir": str(out_dir), "report": False, "save_schedule": False},
    }


def quantiles(values: list[float]) -> tuple[float, float]:
    values = sorted(values)
    return statistics.median(values), values[min(len(values) - 1, int(0.99 * len(values)))]


def measure(checkout: Path, rate: float, tokens: int, seconds: float, work: Path, flags: list[str]) -> dict:
    probe_file = work / f"probe-{rate:g}.jsonl"
    probe_file.unlink(missing_ok=True)
    scenario = scenario_from_dict(server_scenario(checkout, free_port(), rate, tokens, seconds, work,
                                                  probe_file, flags))
    summary = run_scenario(scenario, out=work / f"run-{rate:g}", workers=1).summary
    records = [json.loads(line) for line in probe_file.read_text().splitlines()]
    start = min(r["handler"] for r in records)
    records = [r for r in records if r["handler"] - start > WARMUP_S * 1e9 and "resumed" in r]
    steps = {name: quantiles([(r[b] - r[a]) / 1e6 for r in records if a in r and b in r]) for name, a, b in STEPS}
    handler = quantiles([(r["returned"] - r["handler"]) / 1e6 for r in records])
    latency = summary["metrics"]["latency"]["all"]
    return {"rate": rate, "achieved_rps": summary["throughput"]["achieved_rps"], "validity": summary["validity"],
            "errors": summary["requests"]["errors"], "requests_probed": len(records),
            "latency_ms": [latency["p50_ms"], latency["p99_ms"]], "handler_ms": list(handler),
            "outside_handler_p50_ms": latency["p50_ms"] - handler[0],
            "steps_ms": {name: list(q) for name, q in steps.items()}}


def table(rows: list[dict]) -> str:
    header = ["rate", "latency p50 / p99", "outside handler p50"] + [f"{name} p50 / p99" for name, _, _ in STEPS]
    body = [[f"{r['rate']:g}", f"{fmt(r['latency_ms'][0], 2)} / {fmt(r['latency_ms'][1], 2)}",
             fmt(r["outside_handler_p50_ms"], 2)]
            + [f"{fmt(r['steps_ms'][name][0], 2)} / {fmt(r['steps_ms'][name][1], 2)}" for name, _, _ in STEPS]
            for r in rows]
    return markdown_table(header, body)


def section(facts: dict, tokens: int, seconds: float, measured: list[tuple[str, list[dict]]]) -> str:
    tables = "\n\n".join(f"**{label}** (ms):\n\n{table(rows)}" for label, rows in measured)
    return f"""{TITLE}

Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} with `python benchmarks/handoff.py --before DIR` on \
{machine_line(facts)}. The server on one core of its own (`cpus: 1`, ONNX Runtime with 1 thread, its default
flags otherwise), latscope's one worker on the other; Poisson arrivals of one {tokens}-token KServe v2 JSON
request, {WARMUP_S:g} s warm-up + {seconds:g} s measured per rate. Each step's p50 / p99 from the probe inside
the server (benchmarks/probe/sitecustomize.py); "outside handler" is the client's latency p50 less the
handler's: HTTP parsing and writing, and the event loop reaching the request.

{tables}
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="also time the reference_server of this checkout (e.g. a `git "
                                                     "worktree` of an older commit), first, and record both")
    parser.add_argument("--rates", default="25,150,300,400")
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--server-flag", action="append", default=[], help="extra `serve` flag (repeatable)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "out")
    parser.add_argument("--no-results-md", action="store_true")
    args = parser.parse_args(argv)
    facts = machine_facts(("onnxruntime", "numpy", "aiohttp", "orjson", "latscope"))
    print(f"machine: {machine_line(facts)}", flush=True)
    checkouts = ([(f"before ({git_commit(args.before)})", args.before.resolve())] if args.before else []) + \
        [(f"after ({git_commit(REPO)}{', uncommitted changes' if dirty(REPO) else ''})", REPO)]
    measured = []
    with tempfile.TemporaryDirectory(prefix="latscope-handoff-") as tmp:
        for index, (label, checkout) in enumerate(checkouts):
            rows, work = [], Path(tmp) / str(index)
            work.mkdir()
            for rate in (float(r) for r in args.rates.split(",")):
                rows.append(measure(checkout, rate, args.tokens, args.seconds, work, args.server_flag))
                print(f"  {label}, {rate:g} req/s: latency p50 {rows[-1]['latency_ms'][0]:.2f} ms, "
                      f"p99 {rows[-1]['latency_ms'][1]:.2f} ms", flush=True)
            measured.append((label, rows))
            print(f"\n{label}, {args.tokens} tokens, ms:\n\n{table(rows)}\n", flush=True)
    path = write_report_json({"tokens": args.tokens, "machine": facts, "flags": args.server_flag,
                              "measured": dict(measured)}, args.out, "handoff")
    if args.before and not args.no_results_md:
        update_results_md(section(facts, args.tokens, args.seconds, measured), TITLE)
    print(f"wrote {path}")
    return 0


def dirty(checkout: Path) -> bool:
    return bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=checkout,
                               capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    sys.exit(main())

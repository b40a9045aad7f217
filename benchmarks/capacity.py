"""How close and how fast does `latscope capacity` find a capacity at p99, against a uniform scan of rates?

    python benchmarks/capacity.py                      # p99 ≤ 40 ms on an M/M/1 with μ = 500/s: ~6 min
    python benchmarks/capacity.py --repeats 2 --step-duration 15

The target is latscope.targets.queue (one FIFO server, exponential service of mean 1/μ) on
127.0.0.1, whose capacity under a p99 limit L is known: λ* = μ − ln(100)/L (the M/M/1 time in system
is exponential with rate μ − λ). Both methods judge every rate the same way (a `latscope capacity`
step: warm-up, then `--step-duration` s of Poisson traffic; pass or fail when the p99's confidence
interval clears the limit, else extended twice — T, then 2T, then 4T pooled — at the Bonferroni
level 1 − 0.05/3 per look; still undecided, the rate is undecided, neither a pass nor a fail):

* **search** — `latscope capacity --precision P`: from `--start` req/s double until a step fails with
  confidence, then bisect the gaps beside the undecided band until the confident ends are within P;
* **uniform scan** — the approach vLLM's benchmark moved to: rates s, s + δ, s + 2δ, … from the same
  start s, with δ = P·λ* (the spacing that gives the same precision at the answer, which a real scan
  could only guess), stopping at the first rate that fails with confidence (a full grid would cost
  more). Its lower end is the highest rate that passed below that fail.

Per method: runs (extensions included), wall time, the confident lower end (the highest rate that
passed with confidence), the confident upper end (the lowest that failed with confidence), each as
its distance from λ*, and the undecided rates. Results: a table on stdout,
benchmarks/results/capacity-<UTC time>.json, and the "capacity" section of RESULTS.md.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, fmt, machine_facts, machine_line, markdown_table, update_results_md, write_report_json  # noqa: E402

from latscope.capacity import CapacityOptions, find_capacity  # noqa: E402
from latscope.scenario import load_scenario  # noqa: E402

TITLE = "## capacity (benchmarks/capacity.py)"


def start_queue(service_ms: float) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "latscope.targets.queue", "--port", "0", "--service-ms", str(service_ms),
                             "--seed", "1"], cwd=REPO, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line.startswith("ready http://"):
        raise RuntimeError(f"the queue target did not start: {line!r}")
    return proc, line.split()[1]


def scenario_file(d: Path, url: str, limit_ms: float, rate: float, seed: int) -> Path:
    data = {
        "name": "mm1", "seed": seed,
        "target": {"url": url, "method": "POST", "path": "/infer", "timeout": "10s"},
        "phases": [{"name": "warm", "duration": "2s", "warmup": True, "arrival": {"type": "poisson", "rate": rate}},
                   {"name": "measure", "duration": "8s", "arrival": {"type": "poisson", "rate": rate}}],
        "slos": [{"metric": "latency", "stat": "p99", "limit_ms": limit_ms}],
        "output": {"dir": str(d / "results"), "report": False, "save_schedule": False},
        "telemetry": {"nvml": False, "host": False},
        "limits": {"timer": "coarse"},  # generator and target share the machine: no CPU spent spinning
        "validity": {"degraded_send_lag_p99_ms": 5, "degraded_loop_lag_p99_ms": 20},
    }
    path = d / f"mm1-{seed}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def search(file: Path, out: Path, args: argparse.Namespace) -> dict:
    started = time.monotonic()
    cap = find_capacity(load_scenario(file), out, CapacityOptions(precision=args.precision, min_rate=args.start,
                                                                   max_rate=args.max_rate, step_duration_s=args.step_duration,
                                                                   workers=1, max_steps=args.max_steps))
    return {"steps": len(cap["steps"]), "wall_s": time.monotonic() - started, "low_rps": cap["bracket"]["low_rps"],
            "high_rps": cap["bracket"]["high_rps"], "undecided_rps": cap["undecided_rps"], "stopped": cap["stopped"],
            "tried": _tried(cap)}


def _tried(cap: dict) -> list[str]:
    """Each look as "rate verdict", e.g. "400 fail", "375 undecided (look 2)", for the record."""
    return [f"{s['rate_rps']:.4g} {s['verdict']}" + (f" (look {s['look']})" if s.get("look", 1) > 1 else "")
            for s in cap["steps"]]


def scan(file: Path, out: Path, args: argparse.Namespace, spacing: float) -> dict:
    started, steps, passed, undecided, high, k, tried = time.monotonic(), 0, [], [], None, 0, []
    while args.start + k * spacing <= 2 * args.mu:
        rate = args.start + k * spacing
        cap = find_capacity(load_scenario(file), out / f"{k:03d}", CapacityOptions(
            precision=args.precision, min_rate=rate, max_rate=rate, max_steps=3, step_duration_s=args.step_duration, workers=1))
        steps += len(cap["steps"])
        tried += _tried(cap)
        verdict = {"max_rate": "pass", "slo_fails_at_lowest_rate": "fail", "inconclusive": "undecided"}.get(cap["stopped"])
        if verdict is None:
            return {"steps": steps, "wall_s": time.monotonic() - started, "low_rps": max(passed, default=None),
                    "high_rps": None, "undecided_rps": undecided, "stopped": cap["stopped"], "tried": tried}
        if verdict == "fail":
            high = rate
            break
        (passed if verdict == "pass" else undecided).append(rate)
        k += 1
    return {"steps": steps, "wall_s": time.monotonic() - started, "low_rps": max(passed, default=None), "high_rps": high,
            "undecided_rps": undecided, "stopped": "first fail" if high else "2μ reached", "tried": tried}


def _vs(x: float | None, truth: float) -> str:
    return "–" if x is None else f"{(x - truth) / truth:+.1%}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--service-ms", type=float, default=2.0, help="mean service time of the M/M/1 target")
    ap.add_argument("--limit-ms", type=float, default=40.0, help="the p99 SLO")
    ap.add_argument("--precision", type=float, default=0.05)
    ap.add_argument("--start", type=float, default=300.0, help="the first rate of both, req/s (p99 needs ~1,000 values a step)")
    ap.add_argument("--step-duration", type=float, default=10.0, help="measured seconds of a step's first look")
    ap.add_argument("--max-steps", type=int, default=13, help="the search's --max-steps (runs, extensions included)")
    ap.add_argument("--max-rate", type=float, default=450.0,
                    help="the search's --max-rate (450: 1.17 λ*, a sure fail; spares one worker a 600 req/s doubling step)")
    ap.add_argument("--repeats", type=int, default=1, help="searches and scans, each with its own seed")
    ap.add_argument("--no-record", action="store_true", help="print only; leave RESULTS.md alone")
    args = ap.parse_args()
    args.mu = 1000 / args.service_ms
    truth = args.mu - math.log(100) / (args.limit_ms / 1000)
    facts = machine_facts(("numpy", "aiohttp", "uvloop", "hdrhistogram"))
    proc, url = start_queue(args.service_ms)
    rows, runs = [], []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            d = Path(tmp)
            for seed in range(1, args.repeats + 1):
                file = scenario_file(d, url, args.limit_ms, args.start, seed)
                for method, run in (("search (double, then bisect)", lambda: search(file, d / f"search-{seed}", args)),
                                    ("uniform scan (δ = P·λ*)", lambda: scan(file, d / f"scan-{seed}", args, args.precision * truth))):
                    r = {"method": method, "seed": seed, **run()}
                    runs.append(r)
                    rows.append([method, str(seed), str(r["steps"]), f"{r['wall_s']:.0f} s", fmt(r["low_rps"], 1),
                                 _vs(r["low_rps"], truth), fmt(r["high_rps"], 1), _vs(r["high_rps"], truth),
                                 ", ".join(f"{u:.4g}" for u in r["undecided_rps"]) or "–", r["stopped"]])
                    print(" | ".join(rows[-1]), flush=True)
    finally:
        proc.terminate()
        proc.wait(10)
    table = markdown_table(["method", "seed", "runs", "wall time", "confident low, req/s", "low vs λ*",
                            "confident high, req/s", "high vs λ*", "undecided, req/s", "stopped"], rows)
    print(table)
    report = {"machine": facts, "mu": args.mu, "limit_ms": args.limit_ms, "lambda_star": truth, "precision": args.precision,
              "step_duration_s": args.step_duration, "start_rps": args.start, "runs": runs}
    if args.no_record:
        return
    write_report_json(report, REPO / "benchmarks" / "results", "capacity")
    update_results_md(
        f"{TITLE}\n\nRun {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} with `python benchmarks/capacity.py` on "
        f"{machine_line(facts)}.\n\nTarget: `latscope.targets.queue`, an M/M/1 queue with μ = {args.mu:g}/s "
        f"(mean service {args.service_ms:g} ms); SLO latency p99 ≤ {args.limit_ms:g} ms, so λ* = μ − ln(100)/L = "
        f"**{truth:.1f} req/s**. Precision {args.precision:.0%}; every step {args.step_duration:g} s measured after 2 s of "
        f"warm-up, judged by the p99's confidence interval at 1 − 0.05/3 per look, extended twice when undecided (T, 2T, "
        f"4T pooled); a rate still undecided is neither a pass nor a fail. The search starts at {args.start:g} req/s "
        f"(at most {args.max_steps} runs, --max-rate {args.max_rate:g}); the scan steps up from there by δ = {args.precision:.0%} of λ* = "
        f"{args.precision * truth:.1f} req/s, stopping at its first confident fail. The confident low must be at or "
        f"below λ*, the confident high at or above it.\n\n{table}\n\nThe looks each ran, in order:\n\n"
        + "".join(f"- {r['method']}, seed {r['seed']}: {', '.join(r['tried'])}\n" for r in runs)
        + f"\nRaw numbers: `{report['json_file']}`.\n",
        TITLE)


if __name__ == "__main__":
    main()

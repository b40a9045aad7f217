"""What a distributed run costs and gives on one machine: the rate 1 node vs 2 nodes sustains, the
clock error, and the bytes per second each node sends the master.

    python benchmarks/distributed.py            # ~6 min
    python benchmarks/distributed.py --quick    # ~2 min: fewer rates, shorter runs

Everything runs here, on 127.0.0.1: nginx (1 worker, `return 200`; latscope's echo target if nginx
is missing) as the target, a Locust master (`latscope run --distributed --bind 127.0.0.1:0`) with its
coordinator, and 1 or 2 Locust workers (`latscope worker --engines 1`), each with its node and one
engine — all on this machine's CPUs, which is the point: where the cores run out shows.

1. **Rate.** For 1 node and for 2 nodes (1 engine each), a constant-rate scenario (2 s warm-up, then
   `measure` s) at rising rates; a rate is sustained as in benchmarks/generator.py (send_lag p99 ≤
   1 ms, achieved ≥ 99.5 % of offered, no errors, not partial) and the run's validity is not invalid.
   The ladder stops at the first rate not sustained. Twice: with the `precise` timer (the default: an
   engine spins the last millisecond before each send, so it holds a whole core at any rate) and the
   `coarse` one (event-loop timers: an engine uses only the CPU its requests cost). Per run: each
   node's engine CPU (its max over intervals, % of one core, from summary.json generator.nodes).
2. **Clock.** One 2-node run at a low rate with the second worker in a time namespace of its own whose
   CLOCK_MONOTONIC reads 1000 s ahead (`unshare --user --map-root-user --time --fork --monotonic
   1000`): each node's offset as measured, its stated bound, and the true error |offset − truth|
   (truth: 0 and exactly 1000 s).
3. **Wire.** Bytes per second each node sent the coordinator (summary.json generator.nodes[].frame_bytes
   over the run; Locust's own envelope adds ~60 B a message and its heartbeats ~100 B/s), at each rate.

Writes benchmarks/out/distributed-<time>.json and the "distributed (benchmarks/distributed.py)" section
of benchmarks/RESULTS.md (other sections are kept).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, fmt, machine_facts, machine_line, markdown_table, update_results_md, write_report_json  # noqa: E402
from generator import constant_rate_scenario, judge, running_target, stat  # noqa: E402

LATSCOPE = [sys.executable, "-m", "latscope"]
UNSHARE = ["unshare", "--user", "--map-root-user", "--time", "--fork", "--monotonic", "1000"]
TITLE = "## distributed (benchmarks/distributed.py)"


def distributed_run(scenario: dict, workdir: Path, nodes: int, shift_second: bool = False) -> dict:
    """One distributed run of `scenario` with `nodes` workers of one engine each; its summary.json."""
    path = workdir / f"{scenario['name']}-{nodes}.yaml"
    path.write_text(yaml.safe_dump({**scenario, "output": {"dir": str(workdir / "runs"), "report": False}}))
    out = workdir / "runs" / f"{scenario['name']}-{nodes}{'-shifted' if shift_second else ''}"
    log = workdir / "master.log"
    master = subprocess.Popen([*LATSCOPE, "run", str(path), "--distributed", "--expect-workers", str(nodes),
                               "--bind", "127.0.0.1:0", "--quiet", "--out", str(out)],
                              stdout=open(log, "w"), stderr=subprocess.STDOUT, cwd=REPO)
    deadline = time.monotonic() + 30
    while not (found := re.search(r"listening on 127\.0\.0\.1:(\d+)", log.read_text())):
        if time.monotonic() > deadline or master.poll() is not None:
            raise RuntimeError(log.read_text())
        time.sleep(0.05)
    workers = []
    for i in range(nodes):
        command = [*LATSCOPE, "worker", "--master-host", "127.0.0.1", "--master-port", found.group(1), "--engines", "1"]
        prefix = UNSHARE if shift_second and i == 1 else []
        workers.append(subprocess.Popen(prefix + command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO))
    master.wait(timeout=300)
    for w in workers:
        w.wait(timeout=30)
    return json.loads((out / "summary.json").read_text())


def rate_row(nodes: int, rate: float, s: dict) -> dict:
    why = judge(s) or ("validity invalid: " + "; ".join(s["validity_reasons"]) if s["validity"] == "invalid" else "")
    window = s["throughput"]["measured_window_s"] or 1.0
    duration = s["duration_s"] or 1.0
    per_node = s["generator"].get("nodes", [])
    return {
        "nodes": nodes, "rate": rate, "sustained": not why, "why": why,
        "achieved_rps": s["throughput"]["achieved_rps"], "send_lag_p99_ms": stat(s, "send_lag", "p99_ms"),
        "latency_p99_ms": stat(s, "latency", "p99_ms"), "window_s": window,
        "node_cpu_max": [n["cpu_max_pct"] for n in per_node],
        "node_bytes_per_s": [round(n["frame_bytes"] / duration) for n in per_node],
        "clock_bound_ms": [n["clock"]["bound_ms"] for n in per_node],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    rates = [2000, 8000] if args.quick else [2000, 4000, 8000, 12000, 16000, 20000]
    measure_s = 4 if args.quick else 8
    facts = machine_facts(("latscope", "locust", "pyzmq", "gevent", "msgpack", "numpy", "uvloop"))
    print(machine_line(facts))
    rows, clock = [], []
    with tempfile.TemporaryDirectory(prefix="latscope-dist-bench-") as tmp, running_target() as target:
        workdir = Path(tmp)
        for timer in ("precise", "coarse"):
            for nodes in (1, 2):
                for rate in rates:
                    scenario = constant_rate_scenario(target.url, rate, 2, measure_s, workdir / "runs")
                    s = distributed_run({**scenario, "name": f"{scenario['name']}-{timer}", "limits": {"timer": timer}},
                                        workdir, nodes)
                    row = {"timer": timer, **rate_row(nodes, rate, s)}
                    rows.append(row)
                    print(f"{timer} {nodes} node(s) {rate:>6} req/s: {'sustained' if row['sustained'] else 'NOT: ' + row['why']}; "
                      f"achieved {row['achieved_rps']:.0f}, send_lag p99 {fmt(row['send_lag_p99_ms'], 3)} ms, "
                          f"engine CPU max {row['node_cpu_max']} %, {row['node_bytes_per_s']} B/s per node", flush=True)
                    if not row["sustained"]:
                        break
        s = distributed_run(constant_rate_scenario(target.url, 200, 0, 10, workdir / "runs"), workdir, 2, shift_second=True)
        for n in s["generator"]["nodes"]:
            truth = 1e6 if abs(n["clock"]["offset_ms"]) > 1e5 else 0.0
            clock.append({"node": n["node"], "truth_ms": truth, **n["clock"],
                          "true_error_ms": round(abs(n["clock"]["offset_ms"] - truth), 4)})
        target_name = target.name
    for c in clock:
        print(f"clock node {c['node']}: offset {c['offset_ms']:.4f} ms (truth {c['truth_ms']:g}), bound ±{c['bound_ms']:.3f} ms, "
              f"true error {c['true_error_ms']:.4f} ms, drift {c['drift_ppm']} ppm, rtt min {c['rtt_min_ms']:.3f} ms")
    best = {f"{t}, {n} node(s)": max((r["rate"] for r in rows if r["nodes"] == n and r["timer"] == t and r["sustained"]),
                                     default=None) for t in ("precise", "coarse") for n in (1, 2)}
    report = {"facts": facts, "target": target_name, "rates": rows, "clock": clock, "best": best, "quick": args.quick}
    path = write_report_json(report, REPO / "benchmarks" / "out", "distributed")
    table = markdown_table(
        ["timer", "nodes × engines", "rate req/s", "sustained", "achieved req/s", "send_lag p99 ms", "latency p99 ms",
         "engine CPU max % (per node)", "B/s to the master (per node)"],
        [[r["timer"], f"{r['nodes']} × 1", f"{r['rate']:g}", "yes" if r["sustained"] else f"no: {r['why']}", f"{r['achieved_rps']:.0f}",
          fmt(r["send_lag_p99_ms"], 3), fmt(r["latency_p99_ms"], 3), ", ".join(fmt(c, 0) for c in r["node_cpu_max"]),
          ", ".join(f"{b:,}" for b in r["node_bytes_per_s"])] for r in rows])
    clock_table = markdown_table(
        ["node", "truth", "offset measured", "stated bound ±", "true error", "rtt min", "pings"],
        [[str(c["node"]), f"{c['truth_ms']:g} ms", f"{c['offset_ms']:.4f} ms", f"{c['bound_ms']:.3f} ms",
          f"{c['true_error_ms']:.4f} ms", f"{c['rtt_min_ms']:.3f} ms", str(c["samples"])] for c in clock])
    section = (f"{TITLE}\n\nRun {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} with `python benchmarks/distributed.py"
               f"{' --quick' if args.quick else ''}` on {machine_line(facts)}. Target: {target_name} on 127.0.0.1. "
               f"Raw: `{path.relative_to(REPO)}`.\n\nHow: see the script's docstring. Highest sustained rate (ladder "
               f"{', '.join(map(str, rates))}; {measure_s} s measured per rate): "
               + ", ".join(f"{k}: **{v}**" for k, v in best.items()) + f".\n\n{table}\n\nClock (2 nodes, the second in a time namespace "
               f"1000 s ahead):\n\n{clock_table}\n")
    update_results_md(section, TITLE)
    print(table)
    print(clock_table)


if __name__ == "__main__":
    main()

"""How fast, and how steadily, can one latscope worker generate open-loop load on this machine?

    python benchmarks/generator.py            # full: ~15-20 min (includes a 10-minute memory run)
    python benchmarks/generator.py --quick    # ~3 min, for a first look or for debugging this script
    python benchmarks/generator.py --records [--quick]   # only 4. below (~4 min quick)

What is measured, all against one fast local target (nginx answering `200 ok` on 127.0.0.1, or
latscope's built-in target when nginx is not installed), so that the numbers describe the
generator and not the server:

1. **Open-loop max rate per worker.** latscope runs with one worker process, a `constant` arrival at
   rate R (a short warm-up phase first, then the measured phase). R counts as *sustained* when the
   worker kept to the schedule and the target kept up: send-lag p99 <= 1 ms, achieved >= 99.5 % of
   offered, no errors. The highest sustained R is searched for by doubling from 500 req/s, then by
   bisection to ~5 % precision, in a bounded number of runs.
2. **Locust FastHttpUser, same target, same machine.** Locust is closed loop (each user waits for
   its response before sending the next request), so its req/s is a closed-loop *throughput*, not a
   rate it can hold on a schedule. It is the reference the open-loop rate should at least match.
3. **Memory stays flat.** One long latscope run at 1,000 req/s (10 min; 60 s with --quick), with the
   RSS of the worker process and of this (parent) process sampled every 5 s from /proc.

4. **What the per-request records cost** (requests.parquet, `--records`): the rate search of 1. with
   `output.requests: off` and with records on (the default), then RECORDS_PAIRS runs at the top rate
   found without records, alternating off / on: the worker's CPU per request, send-lag p99, and the
   bytes per request of requests.parquet (plain HTTP GET, compressed as latscope writes it).

Results: a table on stdout, a JSON file under the out dir (default benchmarks/out/, git-ignored),
and the "generator" section of benchmarks/RESULTS.md, rewritten in place (other sections are kept).
Linux only (/proc). Traffic goes to 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterator

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
if str(REPO) not in sys.path:  # run as a script from a checkout: import latscope from it
    sys.path.insert(0, str(REPO))

from common import (  # noqa: E402
    RESULTS_MD, fmt, free_port, machine_facts, machine_line, markdown_table, update_results_md, wait_until_up,
    write_report_json,
)
from latscope.run import Progress, run_scenario  # noqa: E402
from latscope.scenario import scenario_from_dict  # noqa: E402

# What "sustained" means for an open-loop rate (see the docstring).
SEND_LAG_P99_LIMIT_MS = 1.0
ACHIEVED_FRACTION = 0.995
# The rate search.
START_RATE = 500.0
PRECISION = 0.05  # stop bisecting once (failed - sustained) / sustained <= this
# The memory run.
MEMORY_RATE = 1000.0
RSS_SAMPLE_S = 5.0
RSS_BASELINE_S = 30.0  # RSS "after start-up" is taken at this point of the run
MEMORY_GROWTH_LIMIT_MB = 50.0
MEMORY_TARGET_DURATION_S = 600.0

SECTION_TITLE = "## generator (benchmarks/generator.py)"
TARGET_TIMEOUT_S = 5.0  # latscope's per-request timeout


@dataclass(frozen=True)
class Mode:
    """How long and how many: full mode for the record, quick mode to check the script works."""

    name: str
    warmup_s: float
    measure_s: float
    max_rate_runs: int
    locust_users: tuple[int, ...]
    locust_seconds: int
    memory_s: float


FULL = Mode("full", warmup_s=2, measure_s=10, max_rate_runs=10, locust_users=(1, 8, 32, 64), locust_seconds=10,
            memory_s=MEMORY_TARGET_DURATION_S)
QUICK = Mode("quick", warmup_s=2, measure_s=5, max_rate_runs=5, locust_users=(1, 32), locust_seconds=5, memory_s=60)


# ------------------------------------------------------------------------------------------------
# /proc: CPU time and memory of processes (Linux only; no psutil)
# ------------------------------------------------------------------------------------------------

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (state is [0], ppid [1], utime [11])."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # the process is gone
        return None
    return text.rsplit(")", 1)[1].split()  # the name, in parentheses, may contain spaces


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time the process has used so far."""
    fields = _stat_fields(pid)
    return None if fields is None else (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def rss_mb(pid: int) -> float | None:
    """Resident set size in MB (VmRSS)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def child_pids(parent: int) -> list[int]:
    """Direct children of `parent`, found by scanning /proc."""
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields is not None and int(fields[1]) == parent:
                children.append(int(entry.name))
    return children


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def find_worker_pid() -> int | None:
    """latscope's worker: the child of this process started by multiprocessing's spawn."""
    for pid in child_pids(os.getpid()):
        if "multiprocessing" in cmdline(pid) and "spawn" in cmdline(pid):
            return pid
    return None


def total_cpu_seconds(pids: list[int]) -> float:
    return sum(cpu_seconds(pid) or 0.0 for pid in pids)


# ------------------------------------------------------------------------------------------------
# The target: nginx on a free local port, or latscope's built-in target
# ------------------------------------------------------------------------------------------------

NGINX_CONF = """\
worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
{user}
events {{ worker_connections 4096; }}
http {{
    access_log off;
    keepalive_requests 1000000000;
    keepalive_timeout 300s;
{temp_paths}
    server {{
        listen 127.0.0.1:{port};
        location / {{ return 200 "ok\\n"; }}
    }}
}}
"""
NGINX_TEMP_MODULES = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")


@dataclass
class Target:
    name: str  # what the tables call it, e.g. "nginx 1.22.1 (1 worker)"
    url: str
    process: subprocess.Popen
    workdir: Path

    def pids(self) -> list[int]:
        """The target's processes (nginx: master and worker), for CPU accounting."""
        return [self.process.pid, *child_pids(self.process.pid)]


def find_nginx() -> str | None:
    found = shutil.which("nginx")
    if found:
        return found
    for candidate in ("/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/local/nginx/sbin/nginx"):
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def nginx_version(binary: str) -> str:
    result = subprocess.run([binary, "-v"], capture_output=True, text=True, timeout=10)
    match = re.search(r"nginx/(\S+)", result.stderr)
    return match.group(1) if match else "?"


def nginx_config(binary: str, tmp: Path, port: int) -> str:
    """The temp config: every path nginx writes to lies in `tmp`."""
    build = subprocess.run([binary, "-V"], capture_output=True, text=True, timeout=10).stderr
    temp_paths = "\n".join(
        f"    {module}_temp_path {tmp}/{module};"
        for module in NGINX_TEMP_MODULES
        if f"--without-http_{module}_module" not in build
    )
    # As root, nginx would switch its worker to "nobody"; keep the current user instead.
    user = "user root;" if os.geteuid() == 0 else ""
    return NGINX_CONF.format(tmp=tmp, port=port, user=user, temp_paths=temp_paths)


def start_target(name: str, command: list[str], ready_path: str, port: int, workdir: Path) -> Target:
    log = open(workdir / "target.out", "w")
    # A session of its own: our Ctrl-C does not reach it, and we stop it ourselves on the way out.
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO)
    target = Target(name, f"http://127.0.0.1:{port}", process, workdir)
    try:
        wait_until_up(target.url + ready_path, process, timeout_s=15.0)
    except RuntimeError:
        stop_target(target)
        raise
    return target


def start_nginx(binary: str, workdir: Path) -> Target:
    port = free_port()
    conf = workdir / "nginx.conf"
    conf.write_text(nginx_config(binary, workdir, port))
    command = [binary, "-p", str(workdir), "-c", str(conf), "-e", str(workdir / "error.log")]
    return start_target(f"nginx {nginx_version(binary)} (1 worker)", command, "/", port, workdir)


def start_builtin_target(workdir: Path) -> Target:
    port = free_port()
    command = [sys.executable, "-m", "latscope.targets.echo", "--port", str(port), "--delay-ms", "0"]
    return start_target("latscope.targets.echo (delay 0)", command, "/health", port, workdir)


def stop_target(target: Target) -> None:
    if target.process.poll() is None:
        target.process.terminate()  # nginx: fast shutdown of master and worker
        try:
            target.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            target.process.kill()
            target.process.wait(timeout=5)


@contextmanager
def running_target() -> Iterator[Target]:
    """nginx if it is installed and starts, else the built-in target; stopped on the way out,
    whatever happened (Ctrl-C and exceptions included)."""
    with tempfile.TemporaryDirectory(prefix="latscope-bench-target-") as tmp:
        workdir = Path(tmp)
        binary = find_nginx()
        target = None
        if binary:
            try:
                target = start_nginx(binary, workdir)
            except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
                log = workdir / "error.log"
                print(f"nginx did not start ({exc}); {log.read_text()[-500:] if log.exists() else ''}")
        if target is None:
            print("falling back to latscope's built-in target")
            target = start_builtin_target(workdir)
        try:
            yield target
        finally:
            stop_target(target)


# ------------------------------------------------------------------------------------------------
# latscope runs
# ------------------------------------------------------------------------------------------------


def constant_rate_scenario(url: str, rate: float, warmup_s: float, measure_s: float, runs_dir: Path,
                           requests: str = "off") -> dict:
    phases = []
    if warmup_s > 0:
        phases.append({"name": "warmup", "duration": warmup_s, "warmup": True,
                       "arrival": {"type": "constant", "rate": rate}})
    phases.append({"name": "measure", "duration": measure_s, "arrival": {"type": "constant", "rate": rate}})
    return {
        "name": f"bench-{rate:g}rps",
        "seed": 1,
        "target": {"url": url, "method": "GET", "path": "/", "timeout": TARGET_TIMEOUT_S},
        "phases": phases,
        "output": {"dir": str(runs_dir), "requests": requests},  # records: off but in their own comparison (4.)
    }


def run_latscope(scenario: dict, run_dir: Path, on_progress: Callable[[Progress], None] | None = None) -> dict:
    """One latscope run with one worker; returns summary.json and deletes the results directory
    (summary["requests_parquet_bytes"]: the size of its requests.parquet, when it has one)."""
    try:
        result = run_scenario(scenario_from_dict(scenario), out=run_dir, workers=1, on_progress=on_progress)
        summary = result.summary
        records = run_dir / "requests.parquet"
        summary["requests_parquet_bytes"] = records.stat().st_size if records.exists() else None
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    if summary["partial"] and (summary["abort_reason"] or "").startswith("interrupted"):
        raise KeyboardInterrupt  # latscope turned our Ctrl-C into a polite stop; end the benchmark too
    return summary


def stat(summary: dict, metric: str, key: str) -> float | None:
    return summary["metrics"].get(metric, {}).get("all", {}).get(key)


@dataclass
class RateResult:
    rate: float
    offered_rps: float
    achieved_rps: float
    errors: int
    send_lag_p50_ms: float | None
    send_lag_p99_ms: float | None
    latency_p50_ms: float | None
    latency_p99_ms: float | None
    loop_lag_p99_ms: float | None
    worker_cpu_pct: float | None  # of one core, over the measured phase
    target_cpu_pct: float | None
    validity: str
    sustained: bool
    why_not: str  # empty when sustained
    records_bytes_per_request: float | None = None  # requests.parquet's size / its rows (records on)


class CpuMeter:
    """Reads the CPU time of the worker and of the target at each of latscope's interval reports,
    so CPU% can be computed over the measured phase (after the warm-up) only."""

    def __init__(self, target: Target, measured_from_s: float):
        self.target = target
        self.measured_from_s = measured_from_s
        self.worker_pid: int | None = None
        self.readings: list[tuple[float, float, float]] = []  # (run elapsed s, worker cpu s, target cpu s)

    def __call__(self, progress: Progress) -> None:
        if self.worker_pid is None:
            self.worker_pid = find_worker_pid()
        worker = cpu_seconds(self.worker_pid) if self.worker_pid else None
        if worker is not None and progress.elapsed_s >= self.measured_from_s - 0.5:
            self.readings.append((progress.elapsed_s, worker, total_cpu_seconds(self.target.pids())))

    def percent(self) -> tuple[float | None, float | None]:
        """(worker CPU%, target CPU%) between the first and last reading."""
        if len(self.readings) < 2:
            return None, None
        (t0, w0, s0), (t1, w1, s1) = self.readings[0], self.readings[-1]
        return round(100 * (w1 - w0) / (t1 - t0), 1), round(100 * (s1 - s0) / (t1 - t0), 1)


def judge(summary: dict) -> str:
    """Why the rate was not sustained ("" when it was)."""
    reasons = []
    throughput, requests = summary["throughput"], summary["requests"]
    send_lag_p99 = stat(summary, "send_lag", "p99_ms")
    if summary["partial"]:
        reasons.append(f"partial run ({summary['abort_reason']})")
    if send_lag_p99 is None or send_lag_p99 > SEND_LAG_P99_LIMIT_MS:
        reasons.append(f"send_lag p99 {send_lag_p99} ms > {SEND_LAG_P99_LIMIT_MS:g} ms")
    if throughput["achieved_rps"] < ACHIEVED_FRACTION * throughput["offered_rps"]:
        reasons.append(f"achieved {throughput['achieved_rps']:.0f} < {ACHIEVED_FRACTION:.1%} of offered")
    if requests["errors"]:
        reasons.append(f"{requests['errors']} errors {summary['errors']}")
    return "; ".join(reasons)


def measure_rate(target: Target, rate: float, mode: Mode, runs_dir: Path, requests: str = "off") -> RateResult:
    scenario = constant_rate_scenario(target.url, rate, mode.warmup_s, mode.measure_s, runs_dir, requests)
    meter = CpuMeter(target, measured_from_s=mode.warmup_s)
    summary = run_latscope(scenario, runs_dir / f"rate-{rate:g}", on_progress=meter)
    records = summary.get("request_records") or {}
    rows, size = records.get("rows"), summary.get("requests_parquet_bytes")
    worker_cpu, target_cpu = meter.percent()
    why_not = judge(summary)
    return RateResult(
        rate=rate,
        offered_rps=summary["throughput"]["offered_rps"],
        achieved_rps=summary["throughput"]["achieved_rps"],
        errors=summary["requests"]["errors"],
        send_lag_p50_ms=stat(summary, "send_lag", "p50_ms"),
        send_lag_p99_ms=stat(summary, "send_lag", "p99_ms"),
        latency_p50_ms=stat(summary, "latency", "p50_ms"),
        latency_p99_ms=stat(summary, "latency", "p99_ms"),
        loop_lag_p99_ms=stat(summary, "loop_lag", "p99_ms"),
        worker_cpu_pct=worker_cpu,
        target_cpu_pct=target_cpu,
        validity=summary["validity"],
        sustained=not why_not,
        why_not=why_not,
        records_bytes_per_request=round(size / rows, 2) if rows and size else None,
    )


def next_rate(sustained_max: float | None, failed_min: float | None, last: float) -> float | None:
    """Double until a rate fails, halve until one is sustained, then bisect; None when done."""
    if failed_min is None:
        return last * 2
    if sustained_max is None:
        return last / 2
    if (failed_min - sustained_max) / sustained_max <= PRECISION:
        return None
    return float(round((sustained_max + failed_min) / 2, -1))


def find_max_rate(target: Target, mode: Mode, runs_dir: Path,
                  requests: str = "off") -> tuple[float | None, float | None, list[RateResult]]:
    """(highest sustained rate, lowest failed rate, every run) in at most mode.max_rate_runs runs."""
    sustained_max: float | None = None
    failed_min: float | None = None
    tried: list[RateResult] = []
    rate: float | None = START_RATE
    while rate is not None and len(tried) < mode.max_rate_runs:
        result = measure_rate(target, rate, mode, runs_dir, requests)
        tried.append(result)
        print_rate_line(result)
        if result.sustained:
            sustained_max = max(rate, sustained_max or 0.0)
        else:
            failed_min = min(rate, failed_min or float("inf"))
        rate = next_rate(sustained_max, failed_min, rate)
    return sustained_max, failed_min, tried


def print_rate_line(r: RateResult) -> None:
    verdict = "sustained" if r.sustained else f"NOT sustained: {r.why_not}"
    print(f"  rate {r.rate:7.0f}/s: achieved {r.achieved_rps:8.1f}/s, send_lag p99 {r.send_lag_p99_ms} ms, "
          f"worker CPU {r.worker_cpu_pct}% -> {verdict}", flush=True)


# ------------------------------------------------------------------------------------------------
# Locust FastHttpUser (closed loop), as a subprocess
# ------------------------------------------------------------------------------------------------

LOCUSTFILE = '''\
from locust import FastHttpUser, task


class GetRoot(FastHttpUser):
    """No wait_time: each user sends its next request as soon as the previous response is in."""

    @task
    def get_root(self):
        self.client.get("/")
'''


@dataclass
class LocustResult:
    users: int
    requests_per_s: float
    requests: int
    failures: int
    p50_ms: float | None
    p99_ms: float | None
    cpu_pct: float | None  # of one core, over the last seconds of the run


def locust_command(host: str, users: int, seconds: int, locustfile: Path, csv_prefix: Path) -> list[str]:
    return [
        sys.executable, "-m", "locust", "-f", str(locustfile), "--headless", "-H", host,
        "-u", str(users), "-r", str(users), "-t", f"{seconds}s", "--only-summary", "--csv", str(csv_prefix),
        "--loglevel", "WARNING",
    ]


def aggregated_row(stats_csv: Path) -> dict[str, str]:
    with open(stats_csv, newline="") as f:
        for row in csv.DictReader(f):
            if row["Name"] == "Aggregated":
                return row
    raise RuntimeError(f"no Aggregated row in {stats_csv}")


def number(text: str | None) -> float | None:
    try:
        return float(text) if text not in (None, "", "N/A") else None
    except ValueError:
        return None


def run_locust(target: Target, users: int, seconds: int, workdir: Path) -> LocustResult:
    locustfile = workdir / "locustfile.py"
    locustfile.write_text(LOCUSTFILE)
    prefix = workdir / f"locust-u{users}"
    log_path = workdir / f"locust-u{users}.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(locust_command(target.url, users, seconds, locustfile, prefix),
                                   stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        cpu = sample_cpu_until_exit(process, timeout_s=seconds + 60)
    stats_csv = Path(f"{prefix}_stats.csv")
    if not stats_csv.exists():
        raise RuntimeError(f"locust wrote no {stats_csv.name}; its log ends with:\n{log_path.read_text()[-2000:]}")
    row = aggregated_row(stats_csv)
    return LocustResult(
        users=users,
        requests_per_s=round(float(row["Requests/s"]), 1),
        requests=int(row["Request Count"]),
        failures=int(row["Failure Count"]),
        p50_ms=number(row.get("50%")),
        p99_ms=number(row.get("99%")),
        cpu_pct=cpu,
    )


def sample_cpu_until_exit(process: subprocess.Popen, timeout_s: float) -> float | None:
    """Wait for `process` (killed after timeout_s), sampling its CPU time twice a second; returns
    its CPU% over a 5 s window ending 1 s before it exited (start-up and shutdown left out)."""
    samples: list[tuple[float, float]] = []
    deadline = time.monotonic() + timeout_s
    while process.poll() is None:
        if time.monotonic() > deadline:
            process.kill()
            process.wait(timeout=10)
            raise RuntimeError(f"locust did not finish within {timeout_s:g} s")
        used = cpu_seconds(process.pid)
        if used is not None:
            samples.append((time.monotonic(), used))
        time.sleep(0.5)
    if not samples:
        return None
    end = samples[-1][0] - 1.0
    window = [s for s in samples if end - 5.0 <= s[0] <= end]
    if len(window) < 2:
        return None
    (t0, c0), (t1, c1) = window[0], window[-1]
    return round(100 * (c1 - c0) / (t1 - t0), 1)


def measure_locust(target: Target, mode: Mode) -> list[LocustResult]:
    results = []
    with tempfile.TemporaryDirectory(prefix="latscope-bench-locust-") as tmp:
        for users in mode.locust_users:
            result = run_locust(target, users, mode.locust_seconds, Path(tmp))
            print(f"  locust {users:3d} users: {result.requests_per_s:8.1f} req/s, {result.failures} failures, "
                  f"CPU {result.cpu_pct}%", flush=True)
            results.append(result)
    return results


# ------------------------------------------------------------------------------------------------
# Memory over a long run
# ------------------------------------------------------------------------------------------------


@dataclass
class RssSample:
    t_s: float  # since the sampler started (≈ the run's start)
    worker_mb: float | None
    parent_mb: float | None


class RssSampler(threading.Thread):
    """Samples the RSS of the latscope worker and of this process every `period_s` seconds."""

    def __init__(self, period_s: float):
        super().__init__(name="rss-sampler", daemon=True)
        self.period_s = period_s
        self.samples: list[RssSample] = []
        self._stop_requested = threading.Event()

    def run(self) -> None:
        started = time.monotonic()
        worker_pid = None
        while not self._stop_requested.is_set():
            worker_pid = worker_pid if worker_pid and rss_mb(worker_pid) else find_worker_pid()
            self.samples.append(RssSample(
                round(time.monotonic() - started, 1),
                rss_mb(worker_pid) if worker_pid else None,
                rss_mb(os.getpid()),
            ))
            self._stop_requested.wait(self.period_s)

    def stop(self) -> None:
        self._stop_requested.set()
        self.join(timeout=self.period_s + 5)


@dataclass
class MemoryResult:
    duration_s: float
    rate: float
    achieved_rps: float
    send_lag_p99_ms: float | None
    latency_p99_ms: float | None
    validity: str
    worker_rss_at_baseline_mb: float | None
    worker_rss_end_mb: float | None
    worker_rss_peak_mb: float | None
    worker_growth_mb: float | None
    parent_rss_at_baseline_mb: float | None
    parent_rss_end_mb: float | None
    parent_growth_mb: float | None
    samples: list[RssSample] = field(default_factory=list)


def growth(samples: list[RssSample], attr: str) -> tuple[float | None, float | None, float | None]:
    """(RSS at RSS_BASELINE_S, RSS at the last sample, growth) for one process, in MB."""
    values = [(s.t_s, getattr(s, attr)) for s in samples if getattr(s, attr) is not None]
    after_startup = [v for t, v in values if t >= RSS_BASELINE_S]
    if not after_startup:
        return None, None, None
    base, end = after_startup[0], after_startup[-1]
    return round(base, 1), round(end, 1), round(end - base, 1)


def measure_memory(target: Target, mode: Mode, runs_dir: Path) -> MemoryResult:
    scenario = constant_rate_scenario(target.url, MEMORY_RATE, 0, mode.memory_s, runs_dir)
    sampler = RssSampler(RSS_SAMPLE_S)
    sampler.start()
    try:
        summary = run_latscope(scenario, runs_dir / "memory")
    finally:
        sampler.stop()
    samples = sampler.samples
    worker_base, worker_end, worker_growth = growth(samples, "worker_mb")
    parent_base, parent_end, parent_growth = growth(samples, "parent_mb")
    worker_values = [s.worker_mb for s in samples if s.worker_mb is not None]
    return MemoryResult(
        duration_s=mode.memory_s,
        rate=MEMORY_RATE,
        achieved_rps=summary["throughput"]["achieved_rps"],
        send_lag_p99_ms=stat(summary, "send_lag", "p99_ms"),
        latency_p99_ms=stat(summary, "latency", "p99_ms"),
        validity=summary["validity"],
        worker_rss_at_baseline_mb=worker_base,
        worker_rss_end_mb=worker_end,
        worker_rss_peak_mb=round(max(worker_values), 1) if worker_values else None,
        worker_growth_mb=worker_growth,
        parent_rss_at_baseline_mb=parent_base,
        parent_rss_end_mb=parent_end,
        parent_growth_mb=parent_growth,
        samples=samples,
    )


# ------------------------------------------------------------------------------------------------
# Machine facts, tables, JSON and RESULTS.md
# ------------------------------------------------------------------------------------------------

PACKAGES = ("latscope", "httptools", "aiohttp", "uvloop", "numpy", "hdrhistogram", "pydantic", "locust", "geventhttpclient")


def rate_table(tried: list[RateResult]) -> str:
    header = ["rate (req/s)", "offered", "achieved", "send_lag p50 / p99 (ms)", "latency p50 / p99 (ms)",
              "loop_lag p99 (ms)", "worker CPU %", "target CPU %", "sustained"]
    rows = [
        [f"{r.rate:.0f}", f"{r.offered_rps:.1f}", f"{r.achieved_rps:.1f}",
         f"{fmt(r.send_lag_p50_ms, 3)} / {fmt(r.send_lag_p99_ms, 3)}",
         f"{fmt(r.latency_p50_ms, 3)} / {fmt(r.latency_p99_ms, 3)}", fmt(r.loop_lag_p99_ms, 3),
         fmt(r.worker_cpu_pct, 0), fmt(r.target_cpu_pct, 0), "yes" if r.sustained else f"no: {r.why_not}"]
        for r in sorted(tried, key=lambda r: r.rate)
    ]
    return markdown_table(header, rows)


def locust_table(results: list[LocustResult]) -> str:
    header = ["users", "req/s", "requests", "failures", "p50 / p99 (ms)", "locust CPU %"]
    rows = [[str(r.users), f"{r.requests_per_s:.1f}", str(r.requests), str(r.failures),
             f"{fmt(r.p50_ms, 0)} / {fmt(r.p99_ms, 0)}", fmt(r.cpu_pct, 0)] for r in results]
    return markdown_table(header, rows)


def verdicts(report: dict) -> dict:
    """Whether each target was met."""
    best = report["open_loop"]["max_sustained_rps"]
    locust = report["locust"]["best_rps"]
    memory = report["memory"]
    rate_met = best is not None and locust is not None and best >= locust
    growth_mb = memory["worker_growth_mb"]
    long_enough = memory["duration_s"] >= MEMORY_TARGET_DURATION_S
    memory_met = growth_mb is not None and growth_mb < MEMORY_GROWTH_LIMIT_MB
    return {
        "open_loop_rate_ge_locust": rate_met,
        "memory_growth_lt_50mb": memory_met if long_enough else None,  # None: run too short to judge
    }


def summary_table(report: dict) -> str:
    open_loop, locust, memory, met = report["open_loop"], report["locust"], report["memory"], report["verdicts"]

    def yes_no(value: bool | None) -> str:
        return {True: "**met**", False: "**not met**", None: "not judged (quick mode: run shorter than 10 min)"}[value]

    bracket = f" (first failing rate {open_loop['first_failed_rps']:.0f})" if open_loop["first_failed_rps"] else ""
    best = open_loop["max_sustained_rps"]
    rows = [
        ["target", report["target"], ""],
        ["latscope open-loop max sustained rate, 1 worker",
         (f"{best:.0f} req/s" if best else "none sustained") + bracket,
         f"send_lag p99 <= {SEND_LAG_P99_LIMIT_MS:g} ms, achieved >= {ACHIEVED_FRACTION:.1%}, no errors"],
        ["Locust FastHttpUser closed-loop throughput, 1 process",
         f"{locust['best_rps']:.0f} req/s ({locust['best_users']} users)", "best of the user counts tried"],
        ["target: open-loop rate >= Locust closed-loop rate", yes_no(met["open_loop_rate_ge_locust"]), ""],
        [f"worker RSS at {RSS_BASELINE_S:.0f} s -> end of {memory['duration_s']:.0f} s at {MEMORY_RATE:.0f} req/s",
         f"{fmt(memory['worker_rss_at_baseline_mb'], 1)} -> {fmt(memory['worker_rss_end_mb'], 1)} MB "
         f"(growth {fmt(memory['worker_growth_mb'], 1)} MB, peak {fmt(memory['worker_rss_peak_mb'], 1)} MB)",
         f"run: achieved {memory['achieved_rps']:.1f} req/s, send_lag p99 {fmt(memory['send_lag_p99_ms'], 3)} ms, "
         f"{memory['validity']}"],
        ["parent (collector) RSS, same run",
         f"{fmt(memory['parent_rss_at_baseline_mb'], 1)} -> {fmt(memory['parent_rss_end_mb'], 1)} MB "
         f"(growth {fmt(memory['parent_growth_mb'], 1)} MB)", ""],
        [f"target: worker RSS growth < {MEMORY_GROWTH_LIMIT_MB:.0f} MB over 10 min at 1,000 req/s",
         yes_no(met["memory_growth_lt_50mb"]), ""],
    ]
    return markdown_table(["what", "result", "notes"], rows)


def results_section(report: dict) -> str:
    mode: Mode = report["mode_settings"]
    return f"""{SECTION_TITLE}

Run {report['finished_at']} with `python benchmarks/generator.py{' --quick' if report['mode'] == 'quick' else ''}` \
({report['mode']} mode) on {machine_line(report['machine'])}.

What is measured, and how: everything runs on this one machine against {report['target']} on 127.0.0.1,
started by the script (access log off, `return 200 "ok\\n"`), so the generator, not the server, is
the limit. The latscope worker, the latscope parent (collector), the target and Locust share the
machine's {report['machine']['nproc']} CPUs, also with whatever else runs on it.

- **latscope open loop, 1 worker**: `run_scenario(..., workers=1)` with a `constant` arrival at rate R,
  {mode['warmup_s']:g} s of warm-up (excluded), then {mode['measure_s']:g} s measured; recording as always. R is
  *sustained* when summary.json has `send_lag` p99 <= {SEND_LAG_P99_LIMIT_MS:g} ms, `achieved_rps` >=
  {ACHIEVED_FRACTION:.1%} of `offered_rps` and no errors. Search: from {START_RATE:.0f} req/s, doubling until a rate
  fails, then bisection to ~{PRECISION:.0%} (at most {mode['max_rate_runs']} runs). CPU % is of one core, over the
  measured phase (`/proc/<pid>/stat`); the worker's includes the precise timer polling the clock in the
  last millisecond before each send, so from ~1,000 req/s on it reads ~100 % and says nothing about headroom.
- **Locust FastHttpUser** (GET /, no wait_time), 1 process, headless, `-u U -r U -t {mode['locust_seconds']}s`
  for U in {', '.join(map(str, mode['locust_users']))}; req/s is the `Aggregated` row of `_stats.csv`. Locust is
  closed loop: each user waits for its response before sending again, so this is a closed-loop
  throughput, not a rate it could hold on a schedule (and it says nothing about send lag).
- **Memory**: one latscope run at {MEMORY_RATE:.0f} req/s constant, 1 worker, {mode['memory_s']:g} s; RSS (VmRSS) of
  the worker process and of the parent sampled every {RSS_SAMPLE_S:g} s; growth = RSS at the end minus RSS
  at {RSS_BASELINE_S:g} s (after start-up).

Targets: latscope's open-loop rate per worker >= Locust FastHttpUser's closed-loop rate; worker RSS
growth < {MEMORY_GROWTH_LIMIT_MB:g} MB over 10 min at 1,000 req/s.

{summary_table(report)}

latscope rate search (one row per run):

{rate_table([RateResult(**r) for r in report['open_loop']['runs']])}

Locust FastHttpUser:

{locust_table([LocustResult(**r) for r in report['locust']['runs']])}

Raw numbers: `{report['json_file']}` (git-ignored; rerun the script to regenerate).
"""


# ------------------------------------------------------------------------------------------------
# Main
# ------------------------------------------------------------------------------------------------


RECORDS_PAIRS = 3  # off / on runs at the top rate
RECORDS_SECTION_TITLE = "## requests.parquet: cost at the generator's top rate (benchmarks/generator.py --records)"
RECORDS_ON = {"max_rows": 5_000_000}  # the default output.requests


MICRO_REQUESTS = 200_000  # synthetic outcomes recorded per repetition of the in-process measurement
MICRO_REPEATS = 5


def record_cost_us() -> dict:
    """The records' own CPU per request, in process: IntervalRecorder.record of MICRO_REQUESTS plain
    HTTP outcomes without and with a RequestLog (its part files written by its thread, counted: CPU
    time of the whole process, close() included), alternating, MICRO_REPEATS times; the least of each
    (the repetition least disturbed by whatever else runs on the machine)."""
    import tempfile

    import numpy as np

    from latscope.intervals import IntervalRecorder
    from latscope.records import Outcome, Request
    from latscope.request_log import RequestLog

    t0 = 10**12
    requests = [Request(i, t0 + i * 40_000, 0, False) for i in range(MICRO_REQUESTS)]
    outcomes = [Outcome(r.intended_ns + 9_000, r.intended_ns + 60_000 + (i * 7919) % 50_000, status=200, bytes_in=3,
                        first_byte_ns=r.intended_ns + 50_000, connection=i % 4) for i, r in enumerate(requests)]
    cost: dict[str, list[float]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(MICRO_REPEATS):
            for label in ("off", "on"):
                recorder = IntervalRecorder(["default"])
                if label == "on":
                    recorder.log = RequestLog(f"{tmp}/{k}", 0, t0, ["default"], np.zeros(MICRO_REQUESTS, np.int64),
                                              ["measure"], [0.0])
                started = time.process_time()
                for request, outcome in zip(requests, outcomes):
                    recorder.record(request, outcome)
                if recorder.log is not None:
                    recorder.log.close()
                cost[label].append((time.process_time() - started) / MICRO_REQUESTS * 1e6)
    off, on = min(cost["off"]), min(cost["on"])
    return {"record_us_off": round(off, 3), "record_us_on": round(on, 3), "added_us": round(on - off, 3),
            "repeats_us": cost}


def per_request_cpu_us(r: RateResult) -> float | None:
    return None if not r.worker_cpu_pct or not r.achieved_rps else round(r.worker_cpu_pct / 100 / r.achieved_rps * 1e6, 1)


def run_records_benchmark(mode: Mode, out_dir: Path, rate: float | None = None) -> dict:
    """4. in the docstring: the top sustained rate with records off and on, then pairs at the off one;
    with `rate`, no search: the pairs at that rate (on a machine too busy for a rate search to mean
    anything, the CPU per request still does: a worker at its top rate is CPU-bound, so its top rate
    scales with 1 / CPU per request, `implied_drop_pct`)."""
    runs_dir = out_dir / "latscope-runs"
    facts = machine_facts(PACKAGES)
    print(f"machine: {machine_line(facts)}", flush=True)
    searches, pairs = {}, []
    micro = record_cost_us()
    print(f"in process: record() {micro['record_us_off']} µs a request, with records {micro['record_us_on']} µs "
          f"(+{micro['added_us']} µs)", flush=True)
    with running_target() as target:
        print(f"target: {target.name} at {target.url}", flush=True)
        for label, setting in (("off", "off"), ("on", RECORDS_ON)):
            if rate is not None:
                searches[label] = {"max_sustained_rps": None, "first_failed_rps": None, "runs": []}
                continue
            print(f"rate search, records {label}:", flush=True)
            best, failed, tried = find_max_rate(target, mode, runs_dir, setting)
            searches[label] = {"max_sustained_rps": best, "first_failed_rps": failed, "runs": [asdict(r) for r in tried]}
        top = rate or searches["off"]["max_sustained_rps"] or START_RATE
        print(f"at {top:g} req/s, alternating records off / on:", flush=True)
        for _ in range(RECORDS_PAIRS):
            for label, setting in (("off", "off"), ("on", RECORDS_ON)):
                r = measure_rate(target, top, mode, runs_dir, setting)
                print_rate_line(r)
                pairs.append({"records": label, **asdict(r), "cpu_us_per_request": per_request_cpu_us(r)})
    shutil.rmtree(runs_dir, ignore_errors=True)

    def mean(label: str, key: str) -> float | None:
        values = [p[key] for p in pairs if p["records"] == label and p[key] is not None]
        return round(sum(values) / len(values), 2) if values else None

    off, on = searches["off"]["max_sustained_rps"], searches["on"]["max_sustained_rps"]
    cpu_off, cpu_on = mean("off", "cpu_us_per_request"), mean("on", "cpu_us_per_request")
    return {
        "mode": mode.name, "mode_settings": asdict(mode), "machine": facts, "target": target.name,
        "finished_at": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "searches": searches, "top_rate": top, "pairs": pairs,
        "sustained_drop_pct": round(100 * (off - on) / off, 1) if off and on else None,
        "cpu_us_per_request": {"off": cpu_off, "on": cpu_on},
        "cpu_cost_pct": round(100 * (cpu_on - cpu_off) / cpu_off, 1) if cpu_off and cpu_on else None,
        "implied_drop_pct": round(100 * (1 - cpu_off / cpu_on), 1) if cpu_off and cpu_on else None,
        "send_lag_p99_ms": {"off": mean("off", "send_lag_p99_ms"), "on": mean("on", "send_lag_p99_ms")},
        "bytes_per_request": mean("on", "records_bytes_per_request"),
        "micro": micro,
    }


def records_section(report: dict) -> str:
    mode = report["mode_settings"]
    rows = [[p["records"], f"{p['rate']:g}", fmt(p["achieved_rps"], 1), fmt(p["send_lag_p99_ms"], 3),
             fmt(p["worker_cpu_pct"], 1), fmt(p["cpu_us_per_request"], 1), fmt(p["records_bytes_per_request"], 1)]
            for p in report["pairs"]]
    s = report["searches"]
    return f"""{RECORDS_SECTION_TITLE}

`python benchmarks/generator.py --records{' --quick' if report['mode'] == 'quick' else ''}{f" --records-rate {report['top_rate']:g}" if not s['off']['runs'] else ''}` ({report['finished_at']};
{mode['measure_s']:g} s measured per run after a {mode['warmup_s']:g} s warm-up, one worker, against {report['target']};
machine: {machine_line(report['machine'])}). Targets (issue 31): ≤ 5 % fewer requests/s sustained, ≤ 40 bytes
per plain HTTP request.

- Top sustained rate (send-lag p99 ≤ {SEND_LAG_P99_LIMIT_MS:g} ms, ≥ {ACHIEVED_FRACTION:.1%} achieved; ≤ {mode['max_rate_runs']}
  runs each, ~{PRECISION:.0%} precision): records off **{fmt(s['off']['max_sustained_rps'], 0)}** req/s, on
  **{fmt(s['on']['max_sustained_rps'], 0)}** req/s ({fmt(report['sustained_drop_pct'], 1)} % fewer; – : not searched,
  `--records-rate`).
- At {report['top_rate']:g} req/s, worker CPU per request: off {fmt(report['cpu_us_per_request']['off'], 1)} µs, on
  {fmt(report['cpu_us_per_request']['on'], 1)} µs ({fmt(report['cpu_cost_pct'], 1)} %); send-lag p99 off
  {fmt(report['send_lag_p99_ms']['off'], 3)} ms, on {fmt(report['send_lag_p99_ms']['on'], 3)} ms. A worker at its top
  rate is CPU-bound: that rate with records is {fmt(report['implied_drop_pct'], 1)} % lower (1 − CPU off / CPU on).
- In process (`record_cost_us`: {MICRO_REQUESTS:,} plain HTTP outcomes through `IntervalRecorder.record`, without and
  with a RequestLog writing its part files, process CPU time, least of {MICRO_REPEATS} alternating repetitions):
  {report['micro']['record_us_off']} µs → {report['micro']['record_us_on']} µs a request,
  **+{report['micro']['added_us']} µs**.
- requests.parquet: **{fmt(report['bytes_per_request'], 1)} bytes per request** (zstd; integers DELTA_BINARY_PACKED,
  strings dictionary-encoded).

{markdown_table(["records", "rate", "achieved req/s", "send-lag p99 ms", "worker CPU %", "CPU µs/request",
                 "bytes/request"], rows)}

JSON: `{report.get('json_file', '')}`.
"""


def run_benchmark(mode: Mode, out_dir: Path) -> dict:
    runs_dir = out_dir / "latscope-runs"
    facts = machine_facts(PACKAGES)
    print(f"machine: {machine_line(facts)}", flush=True)
    with running_target() as target:
        print(f"target: {target.name} at {target.url}", flush=True)
        print(f"latscope open-loop rate search ({mode.measure_s:g} s per rate, 1 worker):", flush=True)
        best, first_failed, tried = find_max_rate(target, mode, runs_dir)
        print("Locust FastHttpUser (closed loop, 1 process):", flush=True)
        locust = measure_locust(target, mode)
        print(f"memory: {mode.memory_s:g} s at {MEMORY_RATE:.0f} req/s, RSS every {RSS_SAMPLE_S:g} s ...", flush=True)
        memory = measure_memory(target, mode, runs_dir)
    shutil.rmtree(runs_dir, ignore_errors=True)
    best_locust = max(locust, key=lambda r: r.requests_per_s)
    facts["loadavg_at_end"] = os.getloadavg()
    report = {
        "mode": mode.name,
        "mode_settings": asdict(mode),
        "finished_at": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": facts,
        "target": target.name,
        "open_loop": {"max_sustained_rps": best, "first_failed_rps": first_failed,
                      "runs": [asdict(r) for r in tried]},
        "locust": {"best_rps": best_locust.requests_per_s, "best_users": best_locust.users,
                   "runs": [asdict(r) for r in locust]},
        "memory": asdict(memory),
    }
    report["verdicts"] = verdicts(report)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short runs (~3 min) to check the script works")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "out", help="where the JSON goes")
    parser.add_argument("--no-results-md", action="store_true", help="do not rewrite benchmarks/RESULTS.md")
    parser.add_argument("--records", action="store_true", help="only the per-request records' cost (4. above)")
    parser.add_argument("--records-rate", type=float, help="with --records: no rate search, the pairs at this rate")
    args = parser.parse_args(argv)
    mode = QUICK if args.quick else FULL
    args.out.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM cleans up like Ctrl-C

    try:
        report = run_records_benchmark(mode, args.out, args.records_rate) if args.records else run_benchmark(mode, args.out)
    except KeyboardInterrupt:
        print("interrupted; the target was stopped, nothing was written", file=sys.stderr)
        return 130
    json_file = write_report_json(report, args.out, f"generator-{'records-' if args.records else ''}{mode.name}")
    section = records_section(report) if args.records else results_section(report)
    print()
    print(section)
    if not args.no_results_md:
        update_results_md(section, RECORDS_SECTION_TITLE if args.records else SECTION_TITLE)
        print(f"wrote {json_file} and the generator section of {RESULTS_MD}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

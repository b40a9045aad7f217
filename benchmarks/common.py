"""What every benchmark script here needs: free ports, waiting for a server, machine facts, timing a model
alone on the server's core, Markdown tables and rewriting its own section of benchmarks/RESULTS.md (other
sections are kept)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import platform
import socket
import statistics
import subprocess
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parent.parent
RESULTS_MD = REPO / "benchmarks" / "RESULTS.md"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_up(url: str, process: subprocess.Popen, timeout_s: float = 30.0) -> None:
    """Poll `url` until it answers 200; fail early if `process` exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with code {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1.0) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{url} did not answer within {timeout_s:g} s")


@contextmanager
def server_process(command: list[str], ready_url: str, log: Path, cpu: int | None = None,
                   timeout_s: float = 120.0) -> Iterator[subprocess.Popen]:
    """A server started from the repository (pinned to `cpu` with taskset when given), its output
    appended to `log`; yielded once `ready_url` answers 200, stopped with SIGTERM (then SIGKILL) after."""
    prefix = ["taskset", "-c", str(cpu)] if cpu is not None and shutil.which("taskset") else []
    with log.open("ab") as out:
        process = subprocess.Popen(prefix + command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO)
    try:
        wait_until_up(ready_url, process, timeout_s)
        yield process
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def machine_facts(packages: tuple[str, ...]) -> dict:
    model = "?"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    versions = {}
    for package in packages:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "not installed"
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_model": model,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "packages": versions,
        "loadavg_at_start": os.getloadavg(),
    }


def machine_line(facts: dict) -> str:
    packages = ", ".join(f"{k} {v}" for k, v in facts["packages"].items())
    load = ", ".join(f"{x:.2f}" for x in facts["loadavg_at_start"])
    return (f"{facts['nproc']} CPUs ({facts['cpu_model']}), Linux {facts['kernel']}, Python {facts['python']}; "
            f"{packages}; load average at start {load}")


def fmt(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def median_ns(fn, reps: int) -> float:
    """The median time of `reps` calls of `fn`, ns."""
    times = []
    for _ in range(reps):
        started = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - started)
    return statistics.median(times)


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def update_results_md(section: str, title: str, path: Path = RESULTS_MD) -> None:
    """Replace the section headed `title` (up to the next `## ` heading) in RESULTS.md, or append it."""
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.rstrip() == title), None)
    if start is None:
        new_text = text.rstrip("\n") + "\n\n" + section
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        after = "".join(lines[end:])
        new_text = "".join(lines[:start]) + section + ("\n" + after if after else "")
    path.write_text(new_text)


def server_core() -> int:
    """The core a scenario's `target.launch.cpus: 1` gives the server (the last one latscope may use)."""
    return sorted(os.sched_getaffinity(0))[-1]


def cpus() -> tuple[int | None, int | None]:
    """(CPU for the client, CPU for the server: server_core()), or (None, None) on a one-CPU machine."""
    available = sorted(os.sched_getaffinity(0))
    return (available[0], server_core()) if len(available) > 1 else (None, None)


def model_alone_ms(model: Path, feeds: list[dict], min_seconds: float,
                   in_place: dict[str, str] | None = None) -> list[float]:
    """Median ms of one ONNX Runtime run of `model` for each of `feeds`: 1 intra-op thread, on the server's
    core, no server: what the model itself costs. Each runs twice untimed, then at least 5 times and for at
    least `min_seconds`. `in_place` {output: input}: those outputs are written into their input's array (io
    binding), as the decoder's decode step runs in the server."""
    import onnxruntime as ort

    from reference_server.backends.onnxruntime import io_binding

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = 1, 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {server_core()})
    try:
        session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
        medians = []
        for feed in feeds:
            run = lambda: session.run(None, feed)  # noqa: E731
            if in_place:
                binding = io_binding(session, feed, {out: feed[name] for out, name in in_place.items()})
                run = lambda: session.run_with_iobinding(binding)  # noqa: E731
            for _ in range(2):
                run()
            times: list[float] = []
            while len(times) < 5 or sum(times) < min_seconds:
                started = time.perf_counter()
                run()
                times.append(time.perf_counter() - started)
            medians.append(statistics.median(times) * 1e3)
    finally:
        os.sched_setaffinity(0, before)
    return medians


def ceiling(curve: dict[int, float], limit_ms: float) -> tuple[int, float, float]:
    """The model's ceiling from its cost curve {batch size: ms per run}: the size b whose run still fits
    `limit_ms` with the most rows per second, as (b, ms, rows/s). A throughput bound: no server does better."""
    b = max((size for size, ms in curve.items() if ms <= limit_ms), key=lambda size: size / curve[size], default=1)
    return b, curve[b], b / curve[b] * 1e3


def git_commit(checkout: Path) -> str:
    """The short commit of a checkout, "?" when it is not a git checkout."""
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=checkout, capture_output=True,
                          text=True).stdout.strip() or "?"


def write_report_json(report: dict, out_dir: Path, name: str) -> Path:
    """Write `report` to OUT_DIR/NAME-<UTC time>.json, first recording that path (relative to the repo
    when inside it) in report["json_file"] so the Markdown section can point at it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}-{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}.json"
    report["json_file"] = str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    return path

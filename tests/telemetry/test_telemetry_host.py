"""Host telemetry: real processes' CPU and memory, event-loop lag from real worker reports, and a whole
run that writes telemetry.parquet."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
import yaml

from latscope.records import IntervalReport
from latscope.recorder import Recorder
from latscope.results import EventLog, read_events
from helpers import read_summary, run_cli_until
from latscope.run import run_scenario
from latscope.scenario import Telemetry as TelemetryConfig
from latscope.scenario import scenario_from_dict
from latscope.telemetry.host import HostSampler, loop_lag_sample
from latscope.telemetry.session import TelemetrySession

from conftest import free_port, scenario_dict

BUSY = "import time\nend = time.monotonic() + 20\nwhile time.monotonic() < end: pass"
IDLE = "import time\ntime.sleep(20)"


def cpu_seconds(pid: int) -> float:
    """utime + stime of `pid` from /proc (independent of psutil)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_host_sampler_sees_each_process_by_pid_and_drops_one_that_ended():
    busy = subprocess.Popen([sys.executable, "-c", BUSY])
    idle = subprocess.Popen([sys.executable, "-c", IDLE])
    try:
        time.sleep(0.3)  # past the interpreters' start-up
        sampler = HostSampler({"parent": os.getpid(), "worker-0": busy.pid, "worker-1": idle.pid})
        first = {(d, m) for d, m, _ in sampler.sample()}
        cpu_before, wall_before = cpu_seconds(busy.pid), time.monotonic()
        assert ("system", "cpu_pct") not in first and ("worker-0", "cpu_pct") in first  # host CPU needs a start
        time.sleep(0.5)
        rows = {(d, m): v for d, m, v in sampler.sample()}
        expected = (cpu_seconds(busy.pid) - cpu_before) / (time.monotonic() - wall_before) * 100
        # % of one core, as the kernel counts it (10 ms ticks over 0.5 s: a few % of slack)
        assert rows[("worker-0", "cpu_pct")] == pytest.approx(expected, abs=8)
        assert rows[("worker-0", "cpu_pct")] > 20 and rows[("worker-1", "cpu_pct")] < 5
        assert rows[("worker-0", "rss_bytes")] > 1_000_000 and rows[("parent", "rss_bytes")] > 1_000_000
        assert rows[("system", "cpu_pct")] >= rows[("worker-0", "cpu_pct")] * 0.5  # in % of one core too
        busy.kill()
        busy.wait()
        rows = {(d, m): v for d, m, v in sampler.sample()}
        assert ("worker-0", "cpu_pct") not in rows and ("worker-1", "cpu_pct") in rows
        assert "worker-0" not in sampler.processes
    finally:
        for p in (busy, idle):
            p.kill()
            p.wait()


def _report(worker: int, interval: int, histograms: dict) -> IntervalReport:
    """A worker's interval report holding only these histograms."""
    return IntervalReport(interval, histograms, {}, {}, 0, {}, [], None, worker=worker)


def test_loop_lag_sample_is_the_p99_of_a_worker_interval_report():
    recorder = Recorder()
    for _ in range(98):
        recorder.record("loop_lag", "all", 200, warmup=False)
    for _ in range(2):
        recorder.record("loop_lag", "all", 40_000, warmup=True)  # both halves of an interval across warm-up's end
    recorder.record("latency", "default", 5_000)
    histograms, _ = recorder.snapshot()
    t_s, device, p99_ms = loop_lag_sample(_report(3, 7, histograms), 0.5)
    assert (t_s, device) == (3.5, "worker-3")
    assert p99_ms == pytest.approx(40.0, abs=0.05)  # 3 significant digits
    assert loop_lag_sample(_report(0, 0, {}), 1.0) is None


def test_a_run_writes_host_rows_and_per_worker_loop_lag(target, tmp_path):
    url = target(delay_ms=1)
    closed = f"http://127.0.0.1:{free_port()}/metrics"  # nothing listens: every scrape fails
    data = scenario_dict(url, tmp_path, [{"name": "p", "duration": 2, "arrival": {"type": "constant", "rate": 50}}],
                         telemetry={"interval": 0.1, "prometheus": [{"name": "gone", "url": closed, "timeout": 0.5}]},
                         output={"dir": str(tmp_path / "results"), "interval": 0.5})
    result = run_scenario(scenario_from_dict(data), out=tmp_path / "run", workers=2)
    assert result.summary["partial"] is False and result.summary["requests"]["completed"] == 100
    df = pd.read_parquet(tmp_path / "run" / "telemetry.parquet")
    assert list(df.columns) == ["t_s", "source", "device", "metric", "value"]
    assert df.t_s.dtype == "float64" and df.value.dtype == "float64"
    host = df[df.source == "host"]
    events = read_events(tmp_path / "run")
    run_end = next(e["t_s"] for e in events if e["event"] == "run_end")
    # On the run's clock: sampling starts when t0 is set, START_DELAY_S (0.2 s) before the first send,
    # and ends with the run (normally within [-1, duration + 1]; a loaded CI machine may drain later).
    assert -0.5 <= host.t_s.min() <= 0 and host.t_s.max() <= run_end, (host.t_s.describe(), run_end)
    assert host.t_s.between(-1, 2 + 1).mean() > 0.9
    cpu = host[host.metric == "cpu_pct"]
    assert set(cpu.device) == {"parent", "worker-0", "worker-1", "system"}
    assert (cpu.groupby("device").size() >= 10).all(), cpu.groupby("device").size()  # ~2.2 s at 10 Hz
    assert set(host[host.metric == "rss_bytes"].device) == {"parent", "worker-0", "worker-1"}
    lag = host[host.metric == "loop_lag_p99_ms"]
    assert set(lag.device) == {"worker-0", "worker-1"}
    assert {0.0, 0.5, 1.0, 1.5} <= set(lag.t_s), lag  # at interval starts: one row per worker and interval
    assert all(t % 0.5 == 0 and t <= run_end for t in lag.t_s) and not lag.duplicated(["t_s", "device"]).any()
    assert (lag.value >= 0).all() and (lag.value < 1000).all()
    gaps = [e for e in events if e["event"] == "telemetry_gap"]
    assert [g["source"] for g in gaps] == ["gone"]  # the dead endpoint: one gap, the run unaffected
    assert "gone" not in set(df.source)
    unavailable = [e for e in events if e["event"] == "telemetry_unavailable"]
    gpus = read_summary(tmp_path / "run")["environment"]["gpus"]
    assert (len(unavailable), gpus) == (1, []) or (len(unavailable) == 0 and gpus and set(df.source) >= {"nvml"})


def test_a_run_stopped_by_sigterm_still_writes_its_telemetry(target, tmp_path):
    url = target(delay_ms=1)
    data = scenario_dict(url, tmp_path, [{"name": "long", "duration": 30, "arrival": {"type": "constant", "rate": 20}}],
                         telemetry={"interval": 0.1, "nvml": False})
    path = tmp_path / "long.yaml"
    path.write_text(yaml.safe_dump(data))
    out = tmp_path / "run"
    code, output = run_cli_until(path, out, 1.5, signal.SIGTERM)
    assert code == 1, output
    assert read_summary(out)["partial"] is True
    df = pd.read_parquet(out / "telemetry.parquet")
    cpu = df[(df.device == "worker-0") & (df.metric == "cpu_pct")]
    assert len(cpu) >= 8 and cpu.t_s.max() < 5  # sampled until the stop, not for the planned 30 s
    assert not list(out.glob(".*.tmp"))


def test_rows_stop_at_max_rows_with_one_event_and_one_warning(tmp_path, caplog):
    events = EventLog(tmp_path / "events.jsonl")
    telemetry = TelemetrySession(TelemetryConfig(nvml=False), events, [], [], 1.0, max_rows=3)
    recorder = Recorder()
    with caplog.at_level("WARNING", logger="latscope.telemetry"):
        for k in range(6):
            recorder.record("loop_lag", "all", 100)
            telemetry.on_report(_report(0, k, recorder.snapshot()[0]))
    events.close()
    telemetry.write(tmp_path)
    assert list(pd.read_parquet(tmp_path / "telemetry.parquet").t_s) == [0.0, 1.0, 2.0]
    assert [e["event"] for e in read_events(tmp_path)] == ["telemetry_truncated"]
    assert len([r for r in caplog.records if r.levelname == "WARNING"]) == 1

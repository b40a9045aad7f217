"""Live Prometheus metrics (`--metrics-port`): scraped over real HTTP on 127.0.0.1 during real runs,
parsed with prometheus-client's own parser, and checked against the run's Progress and summary.json."""

from __future__ import annotations

import asyncio
import socket
import urllib.error
import urllib.request

import numpy as np
import pytest
import yaml
from aiohttp import web
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from latscope.cli import main
from latscope.errors import RunError
from latscope.plan import build_plan
from latscope.records import IntervalReport
from latscope.recorder import Recorder
from latscope.results.schema import COUNTERS, ERROR_KINDS
from latscope.run.collector import Collector
from latscope.run.live import start_live_metrics
from helpers import read_summary
from latscope.run import Progress, run_scenario
from latscope.scenario import scenario_from_dict

from conftest import free_port, scenario_dict, serve

SLEEP_S = 0.020  # what the "ok" class's endpoint sleeps before answering


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} of a /metrics page."""
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def total(samples: dict, name: str, **labels: str) -> float:
    """Sum of the samples of `name` carrying all of `labels`."""
    return sum(v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= set(ls))


def _ok_and_failing_app() -> web.Application:
    async def ok(request: web.Request) -> web.Response:
        await asyncio.sleep(SLEEP_S)
        return web.Response(text="ok")

    async def bad(request: web.Request) -> web.Response:
        return web.Response(status=500, text="boom")

    app = web.Application()
    app.router.add_post("/ok", ok)
    app.router.add_post("/bad", bad)
    return app


def test_live_endpoint_follows_a_real_run_and_is_gone_after_it(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    seen: list[tuple[Progress, dict]] = []

    def on_progress(progress: Progress) -> None:  # the parent's loop, right after the live update
        seen.append((progress, scrape(url)))

    with serve(_ok_and_failing_app()) as target:
        data = scenario_dict(target, tmp_path, [{"name": "steady", "duration": 3, "arrival": {"type": "constant", "rate": 40}}],
                             workload={"classes": [{"name": "ok", "path": "/ok"}, {"name": "bad", "path": "/bad"}]})
        data["output"]["interval"] = 0.5
        result = run_scenario(scenario_from_dict(data), out=tmp_path / "run", workers=1, on_progress=on_progress,
                              metrics_port=port)
    summary = read_summary(result.run_dir)

    assert len(seen) >= 6  # 3 s of 0.5 s intervals
    for progress, samples in seen:  # every scrape shows exactly the interval the progress line shows
        assert value(samples, "latscope_offered_rps") == progress.offered_rps
        assert value(samples, "latscope_achieved_rps") == progress.achieved_rps
        assert value(samples, "latscope_in_flight") == progress.in_flight
        assert total(samples, "latscope_requests_sent_total") == progress.sent
        assert total(samples, "latscope_requests_completed_total") == progress.completed
        assert total(samples, "latscope_request_errors_total") == progress.errors
    progress, last = seen[-1]
    assert value(last, "latscope_run_info", scenario="test", run_dir=str(result.run_dir)) == 1
    # One worker: its final interval report is the last one, so the last scrape has every request.
    by_class = summary["requests_by_class"]
    for cls in ("ok", "bad"):
        assert value(last, "latscope_requests_scheduled_total", **{"class": cls}) == by_class[cls]["scheduled"] > 0
        assert value(last, "latscope_requests_sent_total", **{"class": cls}) == by_class[cls]["sent"]
        assert value(last, "latscope_requests_completed_total", **{"class": cls}) == by_class[cls]["completed"]
        assert value(last, "latscope_requests_dropped_total", **{"class": cls}) == 0
        for kind in ERROR_KINDS:  # every kind is exported, zeros included, so rate() by kind always has data
            assert ("latscope_request_errors_total", (("class", cls), ("kind", kind))) in last
    assert total(last, "latscope_requests_scheduled_total") == summary["requests"]["scheduled"] == 120  # 40/s x 3 s
    assert (value(last, "latscope_request_errors_total", **{"class": "bad", "kind": "http_5xx"})
            == summary["errors"]["http_5xx"] == by_class["bad"]["sent"])
    assert value(last, "latscope_request_errors_total", **{"class": "ok", "kind": "http_5xx"}) == 0
    assert value(last, "latscope_requests_completed_total", **{"class": "ok"}) == by_class["ok"]["sent"]

    # Rolling quantiles of an endpoint that sleeps 20 ms: never below it; ordered; "all" included.
    q = {p: value(last, "latscope_window_latency_seconds", metric="latency", quantile=p, **{"class": "ok"})
         for p in ("0.5", "0.99", "0.999")}
    assert SLEEP_S <= q["0.5"] <= q["0.99"] <= q["0.999"], q
    assert q["0.5"] < 0.2, q  # a busy machine may stall a few requests, not half of them
    service = value(last, "latscope_window_latency_seconds", metric="service_time", quantile="0.5", **{"class": "ok"})
    assert SLEEP_S <= service <= q["0.5"]
    for metric in ("latency", "service_time", "send_lag"):
        assert ("latscope_window_latency_seconds", (("class", "all"), ("metric", metric), ("quantile", "0.99"))) in last
    # the window (10 s by default) covers every 0.5 s interval so far; its counts are the run's
    assert value(last, "latscope_window_seconds") == 0.5 * len(seen)
    assert value(last, "latscope_window_count", metric="latency", **{"class": "ok"}) == by_class["ok"]["completed"]

    with pytest.raises(urllib.error.URLError):  # closed with the run: the port is free again
        scrape(url)
    with socket.socket() as s:  # SO_REUSEADDR (as the endpoint's own server): only a listener would refuse it
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))


def _report(k: int, latency_us: int, n: int) -> IntervalReport:
    """One worker's interval report, made by the engine's real Recorder: n "a" requests of latency_us."""
    recorder = Recorder()
    for _ in range(n):
        recorder.record("latency", "a", latency_us)
    histograms, clamped = recorder.snapshot()
    row = np.zeros(len(COUNTERS), np.int64)
    row[COUNTERS.index("sent")] = row[COUNTERS.index("completed")] = n
    return IntervalReport(k, histograms, clamped, {(0, False): row}, 3, {}, [], None, worker=0)


def test_the_window_rolls_over_the_last_complete_intervals(tmp_path):
    data = scenario_dict("http://127.0.0.1:9", tmp_path, [{"name": "p", "duration": 3, "arrival": {"type": "constant", "rate": 10}}],
                         workload={"classes": [{"name": "a"}, {"name": "b"}]})
    plan = build_plan(scenario_from_dict(data))
    collector = Collector(1, plan, 0.5, None)
    live = start_live_metrics(0, scenario="w", class_names=plan.class_names, interval_s=0.5, window_s=1.0)
    url = f"http://127.0.0.1:{live.port}/metrics"
    try:
        assert live.port != 0 and live.url == url
        before = scrape(url)  # before any interval: zeros, no quantiles yet
        assert value(before, "latscope_requests_sent_total", **{"class": "a"}) == 0
        assert not [k for k in before if k[0] == "latscope_window_latency_seconds"]
        p99 = []
        for k, latency_us in enumerate((1_000, 2_000, 100_000)):  # 1 ms, then 2 ms, then 100 ms
            collector.add(_report(k, latency_us, 100))
            live.on_interval(collector, elapsed_s=(k + 1) * 0.5)
            samples = scrape(url)
            p99.append(value(samples, "latscope_window_latency_seconds", metric="latency", quantile="0.99", **{"class": "a"}))
            p50 = value(samples, "latscope_window_latency_seconds", metric="latency", quantile="0.5", **{"class": "all"})
            assert value(samples, "latscope_window_seconds") == min(k + 1, 2) * 0.5
        # window = 2 intervals: after the third, the 1 ms interval has left it
        assert p99[0] == pytest.approx(0.001) and p99[1] == pytest.approx(0.002) and p99[2] == pytest.approx(0.1, rel=1e-3)
        assert p50 == pytest.approx(0.002)
        assert value(samples, "latscope_window_count", metric="latency", **{"class": "a"}) == 200
        assert value(samples, "latscope_requests_completed_total", **{"class": "a"}) == 300
        assert value(samples, "latscope_requests_completed_total", **{"class": "b"}) == 0
        # plan: 10/s for 3 s over two classes; 3 complete 0.5 s intervals = the first 15 requests
        assert total(samples, "latscope_requests_scheduled_total") == 15
        assert value(samples, "latscope_offered_rps") == 10.0 and value(samples, "latscope_achieved_rps") == 200.0
        assert value(samples, "latscope_in_flight") == 3 and value(samples, "latscope_phase_info", phase="p") == 1
    finally:
        live.close()


def test_a_taken_port_stops_the_run_before_it_starts(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        data = scenario_dict("http://127.0.0.1:9", tmp_path, [{"name": "p", "duration": 1, "arrival": {"type": "constant", "rate": 5}}])
        with pytest.raises(RunError, match=f"cannot serve live metrics on 127.0.0.1:{port} \\(--metrics-port\\)"):
            run_scenario(scenario_from_dict(data), out=tmp_path / "run", workers=1, metrics_port=port)
        assert not (tmp_path / "run").exists()  # failed before anything was written

        path = tmp_path / "s.yaml"
        path.write_text(yaml.safe_dump(data))
        result = CliRunner().invoke(main, ["run", str(path), "--quiet", "--metrics-port", str(port), "--out", str(tmp_path / "cli")])
    assert result.exit_code == 1, result.output
    assert "cannot serve live metrics" in result.output
    assert not (tmp_path / "cli").exists()

"""Live Prometheus metrics of a running `latscope run --metrics-port N`.

The results directory is written at the end; a Grafana dashboard beside the server's own metrics
needs the numbers while the run goes on. The run's parent process feeds this module once per
complete interval (all workers reported it, see collector.py) and prometheus-client serves the
latest snapshot from its own thread. Every value is therefore as of the last complete interval:
a scrape never sees a half-merged interval, and a scrape costs nothing but rendering text.

Exported (seconds as base unit; `class` = a workload class of the scenario):

    latscope_run_info{scenario, run_dir}                         1 (the scenario's name; never a secret)
    latscope_phase_info{phase}                                   1 for the phase the run is in
    latscope_run_elapsed_seconds                                 time since the run's start (t0)
    latscope_offered_rps / latscope_achieved_rps                 scheduled / completed requests per second
                                                                 over the last complete interval, all classes
    latscope_in_flight                                           requests in flight at its end
    latscope_requests_{scheduled,sent,completed,dropped}_total{class}
    latscope_request_errors_total{class, kind}                   every kind of results.schema.ERROR_KINDS, 0 included
    latscope_window_latency_seconds{metric, class, quantile}     quantile 0.5 / 0.99 / 0.999 over the rolling
                                                                 window, per recorded metric (latency,
                                                                 service_time, send_lag, ttft, itl, ...) and
                                                                 class, class "all" included
    latscope_window_count{metric, class}                         values in the window (is a p99.9 meaningful?)
    latscope_replica_window_latency_seconds{replica, quantile}   latency per answering replica (X-Replica-Id)
    latscope_window_seconds                                      how much time the window covers now
    latscope_actions_total{action, kind, outcome}                scenario actions finished, outcome ok or
                                                                 failed (0 for each until then, so that a
                                                                 Grafana annotation sees the step to 1)

Counters include warm-up requests (they count what was sent); they carry no class "all" because
`sum()` gives it, while quantiles cannot be summed, hence the window's class "all". Replica latency
gets its own metric and label because its "classes" are replica ids, not workload classes: mixed
into `class` they would break every `class=~"$class"` selection and double the "all" latency.

Memory is bounded: the window keeps, per metric x class, the sparse counters (non-zero buckets
only) of the last N complete intervals, N = window / interval.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Iterable, Iterator

import numpy as np
from hdrh.histogram import HdrHistogram
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector as PrometheusCollector

from latscope.errors import RunError
from latscope.recorder import Sparse, from_sparse, to_sparse, values_at
from latscope.results.schema import COUNTERS, ERROR_INDEX, ERROR_KINDS, REPLICA_METRIC
from latscope.run.collector import Collector, Pace
from latscope.run.parts import RunPart

QUANTILES = (0.5, 0.99, 0.999)
DEFAULT_WINDOW_S = 10.0



class _Snapshot(PrometheusCollector):
    """Serves whatever list of metric families it was last given (swapped whole, so no lock)."""

    def __init__(self) -> None:
        self.families: list[Metric] = []

    def collect(self) -> Iterator[Metric]:
        yield from self.families


class LiveMetrics(RunPart):
    """The live endpoint of one run, a run part (parts.py): `on_interval()` after each complete
    interval; `close()` when the run is over (run_scenario owns the endpoint's lifetime)."""

    def __init__(self, server, thread: threading.Thread, registry: CollectorRegistry, host: str,
                 *, scenario: str, class_names: Iterable[str], interval_s: float, window_s: float,
                 actions: Iterable[tuple[str, str]] = ()) -> None:
        """`actions`: (name, kind) of the scenario's actions, counted by on_event."""
        self._server, self._thread, self.registry = server, thread, registry
        self.host = host
        self.port: int = server.server_port
        self.scenario, self.run_dir = scenario, ""
        self.class_names = list(class_names)
        self.interval_s = interval_s
        self.window_intervals = max(1, round(window_s / interval_s))
        self._window: deque[dict[tuple[str, str], Sparse]] = deque(maxlen=self.window_intervals)
        self._elapsed_s = 0.0
        self._pace = Pace("", 0.0, 0.0, 0)
        self._totals = np.zeros((len(self.class_names), len(COUNTERS)), np.int64)
        self._scheduled = np.zeros(len(self.class_names), np.int64)
        self._scheduled_upto = 0  # plan requests counted into _scheduled so far
        self._quantiles: dict[tuple[str, str], tuple[dict[float, int], int]] = {}
        self._actions = {(name, kind, outcome): 0 for name, kind in actions for outcome in ("ok", "failed")}
        self._actions_lock = threading.Lock()  # on_event runs on action threads too
        self._snapshot = _Snapshot()
        registry.register(self._snapshot)
        self._publish()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def set_run_dir(self, run_dir: str) -> None:
        self.run_dir = run_dir
        self._publish()

    def on_interval(self, collector: Collector, elapsed_s: float) -> None:
        """Take the collector's latest complete interval (call once per completed interval)."""
        interval_s = collector.interval_s
        self._elapsed_s, self._pace = elapsed_s, collector.pace(elapsed_s)
        totals = np.zeros_like(self._totals)
        index = {name: i for i, name in enumerate(self.class_names)}
        for (name, _warmup), row in collector.counters.items():
            totals[index[name]] += row
        self._totals = totals
        # Scheduled: the plan's requests whose intended time falls in a complete interval (the plan
        # is sorted by time, so each update only counts the newly covered slice).
        plan = collector.plan
        upto = int(np.searchsorted(plan.offsets_s, collector.completed_intervals * interval_s, side="left"))
        if upto > self._scheduled_upto:
            self._scheduled += np.bincount(plan.cls[self._scheduled_upto:upto], minlength=len(self.class_names))
            self._scheduled_upto = upto
        self._window.append(self._interval_sparse(collector.last_histograms))
        self._quantiles = self._window_quantiles()
        self._publish()

    def on_event(self, event: dict) -> None:
        """An events.jsonl record (results.EventLog listener): count finished actions. Published
        with the next interval, like every other value."""
        if event["event"] == "action_end":
            key = (str(event.get("name")), str(event.get("kind")), "ok" if event.get("ok") else "failed")
            with self._actions_lock:
                self._actions[key] = self._actions.get(key, 0) + 1

    def _interval_sparse(self, histograms: dict[str, dict[str, HdrHistogram]]) -> dict[tuple[str, str], Sparse]:
        out: dict[tuple[str, str], Sparse] = {}
        for metric, by_class in histograms.items():  # "all" included: the collector merged it
            for name, h in by_class.items():
                sparse = to_sparse(h)
                if len(sparse[0]):
                    out[(metric, name)] = sparse
        return out

    def _window_quantiles(self) -> dict[tuple[str, str], tuple[dict[float, int], int]]:
        keys = {key for interval in self._window for key in interval}
        out = {}
        for key in sorted(keys):
            parts = [interval[key] for interval in self._window if key in interval]
            h = from_sparse(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
            out[key] = (values_at(h, [q * 100 for q in QUANTILES]), int(h.total_count))
        return out

    def _publish(self) -> None:
        s = self._pace
        families: list[Metric] = []
        info = GaugeMetricFamily("latscope_run_info", "The run being measured (scenario name, results directory)",
                                 labels=["scenario", "run_dir"])
        info.add_metric([self.scenario, self.run_dir], 1)
        families.append(info)
        phase = GaugeMetricFamily("latscope_phase_info", "1 for the scenario phase the run is in", labels=["phase"])
        if s.phase:
            phase.add_metric([s.phase], 1)
        families.append(phase)
        for name, doc, value in (
            ("latscope_run_elapsed_seconds", "Time since the run's start, as of the last complete interval", self._elapsed_s),
            ("latscope_offered_rps", "Requests scheduled per second over the last complete interval (all classes)",
             s.offered_rps),
            ("latscope_achieved_rps", "Requests completed per second over the last complete interval (all classes)",
             s.achieved_rps),
            ("latscope_in_flight", "Requests in flight at the end of the last complete interval", s.in_flight),
            ("latscope_window_seconds", "Time covered by the rolling window of the latscope_window_* metrics",
             len(self._window) * self.interval_s),
        ):
            families.append(GaugeMetricFamily(name, doc, value=value))
        counter_docs = {
            "sent": "Requests sent (warm-up included)",
            "completed": "Requests that completed successfully (warm-up included)",
            "dropped": "Requests not sent because the in-flight cap was reached (overflow: drop)",
        }
        scheduled = CounterMetricFamily("latscope_requests_scheduled", "Requests the plan scheduled in the complete "
                                        "intervals so far (the offered load; warm-up included)", labels=["class"])
        for i, name in enumerate(self.class_names):
            scheduled.add_metric([name], int(self._scheduled[i]))
        families.append(scheduled)
        for counter, doc in counter_docs.items():
            family = CounterMetricFamily(f"latscope_requests_{counter}", doc, labels=["class"])
            for i, name in enumerate(self.class_names):
                family.add_metric([name], int(self._totals[i, COUNTERS.index(counter)]))
            families.append(family)
        errors = CounterMetricFamily("latscope_request_errors", "Failed requests by error kind (warm-up included)",
                                     labels=["class", "kind"])
        for i, name in enumerate(self.class_names):
            for kind in ERROR_KINDS:
                errors.add_metric([name, kind], int(self._totals[i, ERROR_INDEX[kind]]))
        families.append(errors)
        window = GaugeMetricFamily("latscope_window_latency_seconds", "Quantiles over the rolling window, per "
                                   "recorded metric and class", labels=["metric", "class", "quantile"])
        count = GaugeMetricFamily("latscope_window_count", "Values recorded in the rolling window, per metric and "
                                  "class", labels=["metric", "class"])
        replica = GaugeMetricFamily("latscope_replica_window_latency_seconds", "Latency quantiles over the rolling "
                                    "window, per replica that answered (X-Replica-Id)", labels=["replica", "quantile"])
        for (metric, name), (values, n) in self._quantiles.items():
            for q in QUANTILES:
                if metric == REPLICA_METRIC:
                    replica.add_metric([name, f"{q:g}"], values[q * 100] / 1e6)
                else:
                    window.add_metric([metric, name, f"{q:g}"], values[q * 100] / 1e6)
            if metric != REPLICA_METRIC:
                count.add_metric([metric, name], n)
        families += [window, count, replica]
        actions = CounterMetricFamily("latscope_actions", "Scenario actions finished, by outcome (ok or failed)",
                                      labels=["action", "kind", "outcome"])
        with self._actions_lock:
            for (name, kind, outcome), n in sorted(self._actions.items()):
                actions.add_metric([name, kind, outcome], n)
        families.append(actions)
        self._snapshot.families = families

    def close(self) -> None:
        """Stop serving and free the port (the endpoint is gone once this returns)."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5.0)


def start_live_metrics(port: int, host: str = "127.0.0.1", *, scenario: str = "", class_names: Iterable[str] = (),
                       interval_s: float = 1.0, window_s: float = DEFAULT_WINDOW_S,
                       actions: Iterable[tuple[str, str]] = ()) -> LiveMetrics:
    """Serve the live metrics on host:port (0: a free port, see `.port`). RunError when the port
    cannot be bound, so a taken port stops the run before it starts."""
    registry = CollectorRegistry(auto_describe=False)
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise RunError(f"cannot serve live metrics on {host}:{port} (--metrics-port): "
                       f"{exc.strerror or exc}") from None
    return LiveMetrics(server, thread, registry, host, scenario=scenario, class_names=class_names,
                       interval_s=interval_s, window_s=window_s, actions=actions)

"""Scrape a Prometheus endpoint (DCGM exporter, an inference server: vLLM, SGLang, TGI, llama.cpp,
Triton, the reference server, ...) through a mapping.

This is how GPU telemetry is gathered when the GPU is on another host, and how the server's own
view (its queue, its KV cache, its own TTFT) lands beside latscope's on the run clock. The text is
parsed by prometheus_client's own parser; a mapping (mappings.py, or one given in the scenario) says
which sample becomes which metric, with what scale, from which label the device is named, and what
two scrapes make of a counter (a per-second rate, or a mean per event of another counter) or a
histogram (the quantiles and mean of the observations between them: histograms.py).
"""

from __future__ import annotations

import time
import urllib.request
from typing import Any, Union

from prometheus_client.parser import text_string_to_metric_families

from latscope.scenario.base import split_credentials
from latscope.scenario.telemetry import PrometheusMetric
from latscope.telemetry import Sample
from latscope.telemetry.histograms import Histogram, window_value
from latscope.telemetry.mappings import DEVICE_HEADER, MAPPINGS

NO_DEVICE = "server"  # the device of a series without a device label (and no device header)
MAX_BODY = 32 * 1024 * 1024  # a /metrics page larger than this is not a metrics page


Mapping = dict[str, list[PrometheusMetric]]  # exported name -> its entries, in the mapping's order
HISTOGRAM_PARTS = ("_bucket", "_sum", "_count")


def resolve_mapping(mapping: str | dict[str, Any]) -> tuple[Mapping, str | None]:
    """({exported name: [PrometheusMetric, ...]}, device header or None) for a shipped mapping's
    name or an inline one (PrometheusMetric, the scenario's own type, or the same fields as a dict;
    one of them or a list)."""
    header = DEVICE_HEADER.get(mapping) if isinstance(mapping, str) else None
    data = MAPPINGS[mapping] if isinstance(mapping, str) else mapping
    out: Mapping = {}
    for name, entry in data.items():
        out[name] = [e if isinstance(e, PrometheusMetric) else PrometheusMetric(**e)
                     for e in (entry if isinstance(entry, list) else [entry])]
    return out, header


def _device(entry: PrometheusMetric, labels: dict[str, str], fallback: str) -> str:
    if entry.device_label is None or entry.device_label not in labels:
        return fallback
    value = labels[entry.device_label]
    return f"gpu{value}" if entry.device_label == "gpu" and value.isdigit() else value


Reading = Union[float, Histogram, tuple[float, float]]
"""One scrape's value of a mapped metric: a float (a gauge, scaled; a counter's total, scaled), a
Histogram (cumulative, series merged), or (counter total, `per` counter total)."""


def _matches(name: str, mapping: Mapping) -> list[tuple[str, str | None]]:
    """(exported name in the mapping, histogram part or None) for a sample's name: itself, itself
    without `_total` (a counter), or a histogram family's `_bucket`/`_sum`/`_count`."""
    found = []
    if name in mapping:
        found.append((name, None))
    if name.endswith("_total") and name[: -len("_total")] in mapping:
        found.append((name[: -len("_total")], None))
    for part in HISTOGRAM_PARTS:
        if name.endswith(part) and name[: -len(part)] in mapping:
            found.append((name[: -len(part)], part[1:]))
    return found


def parse(text: str, mapping: Mapping, fallback_device: str = NO_DEVICE) -> dict[tuple[str, str], tuple[PrometheusMetric, Reading]]:
    """{(device, metric): (its entry, its reading)} of one scrape. Series of one device are combined
    as the entry says (histograms: buckets added); where several exported names give one metric, the
    one listed first in the mapping wins. Counters are still totals here (PrometheusSampler compares
    scrapes)."""
    order = {name: i for i, name in enumerate(mapping)}
    samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    scalars: dict[tuple[str, str, str], list[float]] = {}  # (device, metric, exported) -> series values
    hists: dict[tuple[str, str, str], Histogram] = {}
    entries: dict[tuple[str, str, str], PrometheusMetric] = {}
    for s in samples:
        for exported, part in _matches(s.name, mapping):
            for entry in mapping[exported]:
                if entry.histogram != (part is not None):
                    continue
                key = (_device(entry, s.labels, fallback_device), entry.metric, exported)
                entries[key] = entry
                if part is None:
                    scalars.setdefault(key, []).append(float(s.value))
                else:
                    hists.setdefault(key, Histogram()).add(part, float(s.value), s.labels.get("le"))
    out: dict[tuple[str, str], tuple[PrometheusMetric, Reading]] = {}
    for key in sorted(entries, key=lambda k: order[k[2]], reverse=True):  # the first listed is written last: it wins
        device, metric, exported = key
        entry = entries[key]
        reading: Reading
        if entry.histogram:
            reading = hists[key]
        else:
            vs = scalars[key]
            agg = sum(vs) / len(vs) if entry.aggregate == "mean" else max(vs) if entry.aggregate == "max" else sum(vs)
            reading = agg * entry.scale
            if entry.per is not None:
                den = sum(float(s.value) for s in samples if s.name in (entry.per, entry.per + "_total")
                          and _device(entry, s.labels, fallback_device) == device)
                reading = (agg, den)
        out[(device, metric)] = (entry, reading)
    return out


def _zero(reading: Reading) -> Reading:
    """What a series absent from the previous scrape of its device was then: nothing counted yet."""
    return Histogram() if isinstance(reading, Histogram) else (0.0, 0.0) if isinstance(reading, tuple) else 0.0


class PrometheusSampler:
    """One endpoint. `sample()` scrapes once (at most `timeout` seconds) and maps what it finds."""

    def __init__(self, name: str, url: str, mapping: str | dict[str, Any], timeout: float = 2.0):
        self.name, self.timeout = name, timeout
        self.url, basic = split_credentials(url)  # urllib does not send a URL's userinfo by itself
        self.headers = {"Authorization": basic} if basic else {}
        self.mapping, self.device_header = resolve_mapping(mapping)
        self._last: dict[tuple[str, str], tuple[float, Reading]] = {}  # key -> (monotonic s, reading) of the last scrape
        self._devices: dict[str, float] = {}  # device -> monotonic s of the last scrape that showed it

    def scrape(self) -> tuple[str, str]:
        """(body text, device of unlabelled series). Raises OSError/URLError on failure or timeout."""
        request = urllib.request.Request(self.url, headers={"Accept": "text/plain", **self.headers})
        with urllib.request.urlopen(request, timeout=self.timeout) as response:
            body = response.read(MAX_BODY + 1)
            if len(body) > MAX_BODY:
                raise OSError(f"the answer is over {MAX_BODY} bytes; is the URL a /metrics page?")  # no URL: it may hold a password
            device = (response.headers.get(self.device_header) if self.device_header else None) or NO_DEVICE
        return body.decode("utf-8", errors="replace"), device

    def sample(self) -> list[Sample]:
        """The gauges as read; for counters and histograms, what changed since the previous scrape
        (nothing on the first scrape of a series, or after a counter went down: a restart)."""
        text, device = self.scrape()
        now = time.monotonic()
        out: list[Sample] = []
        parsed = parse(text, self.mapping, device)
        for (dev, metric), (entry, reading) in parsed.items():
            if isinstance(reading, float) and not entry.rate:
                out.append((dev, metric, reading))
                continue
            previous = self._last.get((dev, metric))
            if previous is None and dev in self._devices:
                # A labelled counter or histogram has no series until its first increment: absent from
                # the previous scrape of the same device means nothing was counted then.
                previous = (self._devices[dev], _zero(reading))
            self._last[(dev, metric)] = (now, reading)
            if previous is not None:
                value = _change(entry, previous[1], reading, now - previous[0])
                if value is not None:
                    out.append((dev, metric, value))
        self._devices.update({dev: now for dev, _ in parsed})
        return out

    def close(self) -> None:
        pass


def _change(entry: PrometheusMetric, before: Reading, now: Reading, elapsed_s: float) -> float | None:
    """The value of a rate, `per` or histogram entry between two scrapes; None when there is none
    (no time passed, no new events, or a counter went down)."""
    if isinstance(now, Histogram) and isinstance(before, Histogram):
        delta = now.since(before)
        value = None if delta is None else window_value(delta, entry.quantile)
        return None if value is None else value * entry.scale
    if isinstance(now, tuple) and isinstance(before, tuple):
        d_num, d_den = now[0] - before[0], now[1] - before[1]
        return d_num / d_den * entry.scale if d_den > 0 and d_num >= 0 else None
    if isinstance(now, float) and isinstance(before, float) and elapsed_s > 0 and now >= before:  # a drop is a reset
        return (now - before) / elapsed_s
    return None

"""Scrape a Prometheus endpoint (DCGM exporter, Triton, the reference server, ...) through a mapping.

This is how GPU telemetry is gathered when the GPU is on another host. The text is parsed by
prometheus_client's own parser; a mapping (mappings.py, or one given in the scenario) says which
sample becomes which metric, with what scale, from which label the device is named, and whether a
counter is turned into a per-second rate between two scrapes.
"""

from __future__ import annotations

import time
import urllib.request
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from latscope.scenario.base import split_credentials
from latscope.scenario.telemetry import PrometheusMetric
from latscope.telemetry import Sample
from latscope.telemetry.mappings import DEVICE_HEADER, MAPPINGS

NO_DEVICE = "server"  # the device of a series without a device label (and no device header)
MAX_BODY = 32 * 1024 * 1024  # a /metrics page larger than this is not a metrics page


def resolve_mapping(mapping: str | dict[str, Any]) -> tuple[dict[str, PrometheusMetric], str | None]:
    """({exported name: PrometheusMetric}, device header or None) for a shipped mapping's name or an
    inline one (PrometheusMetric, the scenario's own type, or the same fields as a dict)."""
    if isinstance(mapping, str):
        return {k: PrometheusMetric(**v) for k, v in MAPPINGS[mapping].items()}, DEVICE_HEADER.get(mapping)
    return {k: v if isinstance(v, PrometheusMetric) else PrometheusMetric(**v) for k, v in mapping.items()}, None


def _device(entry: PrometheusMetric, labels: dict[str, str], fallback: str) -> str:
    if entry.device_label is None or entry.device_label not in labels:
        return fallback
    value = labels[entry.device_label]
    return f"gpu{value}" if entry.device_label == "gpu" and value.isdigit() else value


def parse(text: str, mapping: dict[str, PrometheusMetric], fallback_device: str = NO_DEVICE) -> dict[tuple[str, str], float]:
    """{(device, metric): value} of the mapped samples of one scrape, scaled, series of one device
    aggregated as the mapping says. Counters are still totals here (PrometheusSampler makes rates)."""
    values: dict[tuple[str, str], list[float]] = {}
    how: dict[tuple[str, str], str] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            entry = mapping.get(s.name) or (mapping.get(s.name[: -len("_total")]) if s.name.endswith("_total") else None)
            if entry is None:
                continue
            key = (_device(entry, s.labels, fallback_device), entry.metric)
            values.setdefault(key, []).append(float(s.value) * entry.scale)
            how[key] = entry.aggregate
    out = {}
    for key, vs in values.items():
        agg = how[key]
        out[key] = sum(vs) / len(vs) if agg == "mean" else max(vs) if agg == "max" else sum(vs)
    return out


class PrometheusSampler:
    """One endpoint. `sample()` scrapes once (at most `timeout` seconds) and maps what it finds."""

    def __init__(self, name: str, url: str, mapping: str | dict[str, Any], timeout: float = 2.0):
        self.name, self.timeout = name, timeout
        self.url, basic = split_credentials(url)  # urllib does not send a URL's userinfo by itself
        self.headers = {"Authorization": basic} if basic else {}
        self.mapping, self.device_header = resolve_mapping(mapping)
        self._rated = {entry.metric for entry in self.mapping.values() if entry.rate}
        self._last: dict[tuple[str, str], tuple[float, float]] = {}  # counter key -> (monotonic s, total)
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
        text, device = self.scrape()
        now = time.monotonic()
        out: list[Sample] = []
        parsed = parse(text, self.mapping, device)
        for (dev, metric), value in parsed.items():
            if metric not in self._rated:
                out.append((dev, metric, value))
                continue
            previous = self._last.get((dev, metric))
            if previous is None and dev in self._devices:
                # A labelled counter has no series until its first increment: absent from the previous
                # scrape of the same device means it was 0 then.
                previous = (self._devices[dev], 0.0)
            self._last[(dev, metric)] = (now, value)
            if previous is not None and now > previous[0] and value >= previous[1]:  # a drop is a counter reset
                out.append((dev, metric, (value - previous[1]) / (now - previous[0])))
        self._devices.update({dev: now for dev, _ in parsed})
        return out

    def close(self) -> None:
        pass

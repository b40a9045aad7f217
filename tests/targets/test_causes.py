"""The injected-cause target (latscope/targets/causes.py): its virtual-time engine does what its switches
say, and what it tells a client (Server-Timing, replica, cached tokens, /metrics) matches it."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from prometheus_client.parser import text_string_to_metric_families

from latscope.targets.causes import Engine, Simulator

from conftest import REPO


def test_stalls_stretch_work_and_delay_starts():
    sim = Simulator(Engine(pause_every_s=1.0, pause_ms=200))
    t0 = sim.started
    assert sim._work(t0 + 0.5, 0.1) == pytest.approx(t0 + 0.6)  # clear of any stall
    assert sim._work(t0 + 0.1, 0.05) == pytest.approx(t0 + 0.25)  # starts in a stall: waits for its end
    assert sim._work(t0 + 0.9, 0.3) == pytest.approx(t0 + 1.4)  # 0.1 s, the 0.2 s stall, then 0.2 s more
    assert sim._work(t0 + 0.9, 1.2) == pytest.approx(t0 + 2.5)  # crosses two stalls


def test_fifo_slots_replicas_and_the_prefix_cache():
    sim = Simulator(Engine(slots=1, replicas=2, base_ms=10, per_prompt_token_ms=1, per_token_ms=2,
                           slow_replica=1, slow_replica_ms=50, prefix_cache_tokens=40))
    a = sim.admit(prompt=100, output=3)  # replica 0: prefill 10 + 60 uncached tokens, then 2 more tokens
    b = sim.admit(prompt=100, output=3)  # replica 1: the same, + 50 ms
    c = sim.admit(prompt=30, output=1)  # replica 0 again: one slot, so it waits for `a`
    assert (a.replica, b.replica, c.replica) == (0, 1, 0) and (a.cached, c.cached) == (40, 30)
    assert a.first - a.start == pytest.approx(0.070) and a.end - a.start == pytest.approx(0.074)
    assert b.first - b.start == pytest.approx(0.120)
    assert c.start == pytest.approx(a.end) and c.end - c.start == pytest.approx(0.010)
    missing = Simulator(Engine(prefix_cache_tokens=40, cache_miss_fraction=0.25, seed=1))
    misses = sum(missing.admit(100, 1).cached == 0 for _ in range(4000))
    assert abs(misses - 1000) < 4 * (4000 * 0.25 * 0.75) ** 0.5  # binomial(4000, 0.25): within 4 sd


def _post(url: str, body: dict) -> tuple[dict, dict]:
    request = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return dict(response.headers), json.loads(response.read())


def test_what_a_client_and_a_scraper_are_told():
    proc = subprocess.Popen([sys.executable, "-m", "latscope.targets.causes", "--port", "0", "--slots", "1",
                             "--replicas", "1", "--base-ms", "90", "--per-token-ms", "0", "--prefix-cache-tokens", "2"],
                            cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().split()[1]
        body = {"model": "m", "messages": [{"role": "user", "content": "one two three four"}], "max_tokens": 2}
        with ThreadPoolExecutor(2) as pool:  # one slot: the second waits ~90 ms in the queue
            answers = list(pool.map(lambda _: _post(url, body), range(2)))
        timings = sorted(h["Server-Timing"] for h, _ in answers)
        queue = [float(t.split("queue;dur=")[1].split(",")[0]) for t in timings]
        assert queue[0] < 20 and 70 < queue[1] < 110, timings
        assert all("compute;dur=90.000" in t for t in timings)
        headers, doc = answers[0]
        assert headers["X-Replica-Id"] == "replica-0"
        assert doc["usage"] == {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6,
                                "prompt_tokens_details": {"cached_tokens": 2}}
        # A stream's headers leave with its first token: their compute is the prefill only.
        request = urllib.request.Request(url + "/v1/chat/completions", json.dumps(
            {**body, "stream": True, "stream_options": {"include_usage": True}}).encode())
        with urllib.request.urlopen(request, timeout=10) as response:
            timing, events = response.headers["Server-Timing"], response.read().decode().split("\n\n")
        assert timing.endswith("compute;dur=90.000") and events[-2] == "data: [DONE]"
        assert [json.loads(e[6:])["choices"][0]["delta"]["content"] for e in events[:2]] == [" tok0", " tok1"]
        assert json.loads(events[2][6:])["usage"]["prompt_tokens_details"] == {"cached_tokens": 2}
        with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
            families = {f.name: f for f in text_string_to_metric_families(response.read().decode())}
        value = {f.name: f.samples[0].value for f in families.values() if f.type in ("gauge", "counter")}
        assert value["vllm:prompt_tokens"] == 12 and value["vllm:prefix_cache_hits"] == 6
        assert value["vllm:num_requests_running"] == 0 and value["vllm:num_requests_waiting"] == 0
        ttft = {s.labels.get("le"): s.value for s in families["vllm:time_to_first_token_seconds"].samples
                if s.name.endswith("_bucket")}
        assert (ttft["0.08"], ttft["0.1"], ttft["0.25"]) == (0, 2, 3)  # 90 ms exactly (virtual time) twice, ~180 ms
    finally:
        proc.terminate()
        proc.wait(10)

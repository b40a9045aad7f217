"""The shipped mappings of inference servers (vLLM, SGLang, TGI, llama.cpp, Triton) against a real
HTTP server serving each engine's exposition text (engine_metrics.py), whose values move one known
step per scrape: gauges as read, counters as rates, histograms as per-window quantiles and means
exactly as histogram_quantile interpolates them; and one real `latscope run` whose one-line
`telemetry: {prometheus: {url, mapping: vllm}}` puts them in telemetry.parquet on the run clock."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from latscope.errors import ScenarioError
from latscope.results.schema import SERVER_SIGNALS, TELEMETRY_METRICS
from latscope.scenario import load_scenario
from latscope.telemetry.histograms import Histogram, bucket_quantile
from latscope.telemetry.mappings import MAPPINGS
from latscope.telemetry.prometheus import PrometheusSampler

from conftest import MINIMAL, REPO, stream_target_process

sys.path.insert(0, str(Path(__file__).parent))
from engine_metrics import (E2E_MS, GENERATED, HITS, PREEMPT, PROMPT, QUEUE_MS, TRITON_REQUESTS, TTFT_MS,  # noqa: E402
                            VLLM_TTFT_MS, serve_engine)

# Per engine: the gauges at the j-th scrape, each counter's increase per step (a rate is that over
# the time between two scrapes), and what one window of a histogram gives (exact).
GAUGES = {
    "vllm": lambda j: {"requests_running": j + 1, "queue_depth": j % 4, "kv_cache_usage_pct": 10 * (j % 5) + 10},
    "sglang": lambda j: {"requests_running": j + 1, "queue_depth": j % 4, "kv_cache_usage_pct": 10 * (j % 5) + 10},
    "tgi": lambda j: {"requests_running": j + 1, "batch_size": j + 1, "queue_depth": j % 4},
    "llama.cpp": lambda j: {"requests_running": j + 1, "queue_depth": j % 4, "kv_cache_usage_pct": 10 * (j % 5) + 10,
                            "batch_size": 1.5},
    "triton": lambda j: {"queue_depth": j % 4},
}
# vLLM's two engines each count a step's worth; its renamed counters, exported under both names,
# are counted once (twice would be 400 queries a step).
PER_STEP = {
    "vllm": {"preemptions_s": 2 * PREEMPT, "prefix_cache_queries_s": 2 * PROMPT, "prefix_cache_hits_s": 2 * HITS,
             "prompt_tokens_s": 2 * PROMPT, "generation_tokens_s": 2 * GENERATED},
    "sglang": {"preemptions_s": PREEMPT, "prefix_cache_queries_s": PROMPT, "prefix_cache_hits_s": HITS,
               "prompt_tokens_s": PROMPT, "generation_tokens_s": GENERATED},
    "tgi": {"prompt_tokens_s": PROMPT, "generation_tokens_s": GENERATED},
    "llama.cpp": {"prompt_tokens_s": PROMPT, "generation_tokens_s": GENERATED},
    "triton": {"requests_s": TRITON_REQUESTS, "request_failures_s": 0},
}
WINDOW = {
    "vllm": {**VLLM_TTFT_MS, **QUEUE_MS, **E2E_MS},
    "sglang": {**TTFT_MS, **QUEUE_MS, **E2E_MS},
    "tgi": {**QUEUE_MS, **E2E_MS},
    "llama.cpp": {},
    # µs counters over successful requests: 1 ms queue, 5 ms compute, 7.5 ms in all, per request
    "triton": {**TTFT_MS, "server_queue_time_mean_ms": 1.0, "server_compute_mean_ms": 5.0, "server_e2e_mean_ms": 7.5},
}


def timed_sample(sampler: PrometheusSampler) -> tuple[dict[str, float], float, float]:
    before = time.monotonic()
    rows = sampler.sample()
    after = time.monotonic()
    assert {d for d, _, _ in rows} <= {"server"}  # no device label in these mappings: one "server" series
    return {m: v for _, m, v in rows}, before, after


@pytest.mark.parametrize("engine", list(GAUGES))
def test_engine_page_through_its_shipped_mapping(engine):
    with serve_engine(engine) as url:
        sampler = PrometheusSampler(engine, url, engine)
        scrapes = []
        for _ in range(3):
            scrapes.append(timed_sample(sampler))
            time.sleep(0.05)
    assert scrapes[0][0] == pytest.approx(GAUGES[engine](0))  # the first scrape: gauges only (rates and windows need two)
    for j in (1, 2):
        rows, before, after = scrapes[j]
        _, before_prev, after_prev = scrapes[j - 1]
        expected = {**GAUGES[engine](j), **WINDOW[engine]}
        assert set(rows) == set(expected) | set(PER_STEP[engine])
        for metric, value in expected.items():
            assert rows[metric] == pytest.approx(value, rel=1e-9, abs=1e-9), metric
        for metric, step in PER_STEP[engine].items():
            # the rate's clock is read after each scrape: between after_prev..after and before_prev..before
            assert step / (after - before_prev) <= rows[metric] <= step / max(before - after_prev, 1e-9), metric



def test_every_shipped_metric_is_catalogued():
    """What a shipped mapping writes is a GPU metric or a server signal, each with its sentence."""
    names = {e["metric"] for mapping in MAPPINGS.values() for entry in mapping.values()
             for e in (entry if isinstance(entry, list) else [entry])}
    assert names - set(SERVER_SIGNALS) - set(TELEMETRY_METRICS) == set()


def test_no_new_observations_no_window_and_a_restart_is_no_sample():
    """A histogram that did not move between two scrapes has no quantile (no sample, not 0); one
    that went down (the engine restarted) gives none for that window, then counts from there."""
    page = {"text": ""}

    def write(steps: int) -> None:
        from engine_metrics import Page, TTFT_OBS
        p = Page()
        p.histogram("vllm:time_to_first_token_seconds", TTFT_OBS, steps, model_name="m")
        page["text"] = p.text()

    from aiohttp import web

    from conftest import serve

    async def handler(request):
        return web.Response(text=page["text"], content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", handler)
    with serve(app) as url:
        sampler = PrometheusSampler("v", f"{url}/metrics", "vllm")
        write(5)
        assert sampler.sample() == []
        assert sampler.sample() == []  # the same 5 steps: nothing new
        write(1)
        assert sampler.sample() == []  # went down: a restart
        write(2)
        rows = {m: v for _, m, v in sampler.sample()}
    assert rows == pytest.approx(TTFT_MS)


def test_bucket_quantile_follows_histogram_quantile():
    inf = float("inf")
    # Prometheus's own documented example shape: 0 below 0.1, 10 up to 0.2, 20 up to 0.4, 20 total
    assert bucket_quantile(0.5, {0.1: 0, 0.2: 10, 0.4: 20, inf: 20}) == pytest.approx(0.2)
    assert bucket_quantile(0.75, {0.1: 0, 0.2: 10, 0.4: 20, inf: 20}) == pytest.approx(0.3)  # 0.2 + 0.2 × 5/10
    assert bucket_quantile(0.9, {0.1: 5, inf: 10}) == 0.1  # in +Inf: the highest finite bound
    assert bucket_quantile(0.5, {0.1: 5}) is None  # no +Inf bucket: not a histogram Prometheus would read
    assert bucket_quantile(0.5, {0.1: 0, inf: 0}) is None
    assert bucket_quantile(0.5, {-1.0: 4, 0.0: 6, inf: 8}) == -1.0  # first bucket with a bound ≤ 0: that bound
    assert bucket_quantile(0.5, {0.1: 6, 0.2: 5, inf: 8}) == pytest.approx(0.1 * 4 / 6)  # non-monotonic fixed up
    assert Histogram({0.1: 3, inf: 3}, 1.0, 3).since(Histogram({0.1: 4, inf: 4}, 1.2, 4)) is None


def test_the_one_line_form_and_the_mapping_names(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(MINIMAL + "telemetry: {prometheus: {url: 'http://127.0.0.1:8000/metrics', mapping: vllm}}\n")
    [source] = load_scenario(path).telemetry.prometheus
    assert (source.name, source.mapping, source.interval) == ("prometheus", "vllm", None)  # telemetry.interval: 4 Hz
    assert load_scenario(path).telemetry.interval == 0.25
    path.write_text(MINIMAL + "telemetry:\n  prometheus: {url: 'http://h/metrics', mapping: {a: {metric: x, rate: true, "
                              "quantile: 0.5}}}\n")
    with pytest.raises(ScenarioError, match="a.*choose one of rate, quantile"):
        load_scenario(path)
    for mapping in MAPPINGS.values():  # every shipped entry is a valid scenario entry
        for entry in mapping.values():
            path.write_text(MINIMAL + "telemetry:\n  prometheus: {url: 'http://h/metrics', mapping: {x: "
                            + repr(entry).replace("True", "true") + "}}\n")
            load_scenario(path)


@pytest.fixture(scope="module")
def vllm_run(tmp_path_factory) -> Path:
    """`latscope run` (a real process) of a 1.5 s stream of chat requests with the one-line vLLM source."""
    tmp_path = tmp_path_factory.mktemp("vllm-run")
    with stream_target_process(ttft_ms=5, itl_ms=2, tokens=4) as stream, serve_engine("vllm") as metrics:
        scenario = tmp_path / "s.yaml"
        scenario.write_text(f"""\
name: engine-signals
seed: 3
target: {{url: "{stream}", timeout: 5}}
workload:
  classes:
    - {{name: chat, protocol: openai, path: /v1/chat/completions, model: m, openai: {{api: chat, stream: true}},
       prompt_tokens: 8, output_tokens: 4}}
phases: [{{name: steady, duration: 1.5, arrival: {{type: constant, rate: 20}}}}]
telemetry: {{nvml: false, host: false, prometheus: {{url: "{metrics}", mapping: vllm}}}}
output: {{report: false}}
""")
        done = subprocess.run([sys.executable, "-m", "latscope.cli", "run", str(scenario), "--out", str(tmp_path / "r"),
                               "--workers", "1", "--quiet"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return tmp_path / "r"


def test_a_run_writes_the_server_signals_on_the_run_clock(vllm_run):
    """`latscope run` with the one-line vLLM source: telemetry.parquet has the server's signals at
    4 Hz (telemetry.interval's 0.25 s), on the run clock, with the values the page served: each
    window's TTFT p50 is 87.5 ms, and requests_running counts the scrapes."""
    t = pd.read_parquet(vllm_run / "telemetry.parquet")
    assert set(t["source"]) == {"prometheus"} and set(t["device"]) == {"server"}
    running = t[t["metric"] == "requests_running"].sort_values("t_s")
    # ≥ 1.5 s at 4 Hz (scrapes go on a little before t0 ends and until the run stops)
    assert len(running) >= 6
    assert running["value"].tolist() == [float(v) for v in range(int(running["value"].iloc[0]), int(running["value"].iloc[0]) + len(running))]
    assert running["t_s"].min() > -1.0 and running["t_s"].max() < 1.5 + 3.0  # the run clock: s since t0
    gaps = running["t_s"].diff().dropna()
    assert gaps.median() == pytest.approx(0.25, abs=0.05)
    p50 = t[t["metric"] == "server_ttft_p50_ms"]
    assert p50["value"].tolist() == pytest.approx([87.5] * (len(running) - 1))
    gen = t[t["metric"] == "generation_tokens_s"]["value"]
    # 100 tokens a step, a step per 0.25 s: 400/s; timing noise of a scrape on a shared box (±0.05 s)
    assert gen.median() == pytest.approx(400, rel=0.25)


def test_the_report_puts_the_servers_ttft_beside_the_clients(vllm_run):
    """The run above, through analysis and the "Server's view" panel: the
    server's p50 is the page's 87.5 ms wherever its windows cover an interval, the client's is
    latscope's own, the difference is client − server; a run without server histograms gets the
    panel's one "not measured" phrase instead of a card."""
    from latscope.analysis.run_data import load_run
    from latscope.analysis.server_signals import client_vs_server
    from latscope.report.panels import server_panel

    run = load_run(vllm_run)
    frame = client_vs_server(run, "ttft", "server_ttft")
    covered = frame.dropna(subset=["server_p50_ms"])
    assert len(covered) >= 1
    assert covered["server_p50_ms"].tolist() == pytest.approx([87.5] * len(covered))
    assert covered["server_p99_ms"].tolist() == pytest.approx([2500.0] * len(covered))
    assert covered["outside_p50_ms"].tolist() == pytest.approx((covered["client_p50_ms"] - 87.5).tolist())
    assert 5 <= covered["client_p50_ms"].min()  # the stream target's first token comes after 5 ms
    panel = server_panel(run)
    assert panel.figure is not None and not panel.not_measured
    names = {t.name for t in panel.figure.data}
    assert "outside the engine (network, proxy, client) p50" in names and "server's own p99" in names
    # e2e too: the page's end-to-end histogram (1500 ms p50) beside the client's latency
    assert len(panel.figure.data) == 12
    bare = load_run(REPO / "tests" / "data" / "run_f16f211")
    assert server_panel(bare).not_measured == "the server's own TTFT and latency"


def test_an_older_vllm_with_only_the_old_names_still_maps():
    """vLLM before the renames exports gpu_cache_usage_perc and gpu_prefix_cache_*: the same metrics."""
    from latscope.telemetry.prometheus import parse, resolve_mapping

    mapping, _ = resolve_mapping("vllm")
    text = ('# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc{model_name="m"} 0.42\n'
            '# TYPE vllm:gpu_prefix_cache_queries_total counter\nvllm:gpu_prefix_cache_queries_total{model_name="m"} 7\n')
    rows = {metric: reading for (_, metric), (_, reading) in parse(text, mapping).items()}
    assert rows == pytest.approx({"kv_cache_usage_pct": 42.0, "prefix_cache_queries_s": 7.0})  # the counter's total, before rating

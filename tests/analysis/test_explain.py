"""`latscope explain`'s analysis (analysis/explain*.py) on synthetic results directories whose
requests.parquet has Contract 1's columns (explain_runs.py): each kind of cause injected into an
otherwise i.i.d. run is found, named, and given the effect the injection implies; a clean run gets
"nothing stands out".

The false-positive bound: on an i.i.d. run every candidate's p-value is valid (an exact binomial,
conservative against the hypergeometric; Mann–Whitney's normal approximation with ≥ 10 a side), so
with the Bonferroni threshold ALPHA / tested the chance that anything stands out is ≤ ALPHA = 0.001
per explanation: over the 8 seeds of the clean test, ≤ 0.8 % (and the seeds are fixed: it is
deterministic).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from explain_runs import RATE, clean_frame, set_service, write_dir
from latscope.analysis import explain as ex
from latscope.analysis.explain import explain_or_reason, explain_run, explanation, generator_caused, write_explain
from latscope.analysis.explain_stats import binomial_sf, excess_share, mann_whitney, spearman
from latscope.analysis.run_data import load_run
from latscope.errors import ResultsError

DATA = Path(__file__).resolve().parents[1] / "data"


def top(doc: dict) -> dict:
    assert doc["verdict"] == "cause", doc["summary"]
    return doc["causes"][0]


def named(doc: dict, name: str) -> dict:
    return next(c for c in doc["causes"] if c["name"] == name)


# -- the statistics, against scipy (a dev dependency only) ------------------------------------------


def test_binomial_tail_is_exact_where_the_normal_approximation_is_not():
    stats = pytest.importorskip("scipy.stats")
    for k, n, p in ((3, 10, 0.01), (30, 60, 0.2), (0, 5, 0.5), (60, 60, 0.32), (120, 6000, 0.01), (7, 300, 1e-4)):
        assert binomial_sf(k, n, p) == pytest.approx(stats.binom.sf(k - 1, n, p), rel=1e-9, abs=1e-300)


def test_mann_whitney_and_spearman_match_scipy():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(3)
    x, y = rng.normal(0.4, 1, 40).round(1), rng.normal(0, 1, 500).round(1)  # rounded: ties
    auc, p = mann_whitney(x, y)
    ref = stats.mannwhitneyu(x, y, alternative="greater", method="asymptotic", use_continuity=True)
    assert auc == pytest.approx(ref.statistic / (len(x) * len(y)))
    assert p == pytest.approx(ref.pvalue, rel=1e-6)
    a, b = rng.normal(size=50), rng.normal(size=50)
    assert spearman(a, a + b) == pytest.approx(stats.spearmanr(a, a + b).statistic)


def test_excess_share_is_the_share_of_the_tail_beyond_the_base_rate():
    assert excess_share(0.5, 0.5) == 0 and excess_share(1.0, 0.3) == 1
    assert excess_share(0.65, 0.3) == pytest.approx(0.5)  # half the tail that is not there by chance
    assert excess_share(0.1, 0.3) == 0  # under-represented: not a cause


# -- a clean run: nothing stands out ---------------------------------------------------------------


@pytest.mark.parametrize("seed", range(8))
def test_a_clean_run_has_nothing_standing_out(tmp_path, seed):
    doc = explain_run(write_dir(tmp_path, clean_frame(6000, seed)))
    assert doc["verdict"] == "nothing_stands_out", doc["summary"]
    # above the p99 of 6,000; the middle half, both ends included (p25 and p75 are order statistics)
    assert doc["tail"]["n"] == 60 and 3000 <= doc["body"]["n"] <= 3002
    assert not any(c["stands_out"] for c in doc["causes"])
    assert doc["tested"] > 20 and "Nothing stands out" in doc["summary"]
    # where the time went still adds up: the server's compute is (nearly) all of the excess
    shares = {c["name"]: c["share"] for c in doc["components"]}
    assert sum(shares.values()) == pytest.approx(1, abs=1e-3) and shares["server.compute"] > 0.95


# -- each kind of cause ----------------------------------------------------------------------------


def test_a_slow_replica_is_the_top_cause_with_the_effect_its_share_implies(tmp_path):
    frame = clean_frame(6000, 1)
    slow = (frame["replica"] == "r2").to_numpy()
    set_service(frame, slow, 15_000)  # +15 ms: every r2 request is slower than any other's p99
    doc = explain_run(write_dir(tmp_path, frame))
    cause = top(doc)
    assert (cause["kind"], cause["name"], cause["stands_out"]) == ("where", "replica=r2", True)
    # the tail is r2's (+15 ms is 4 σ of the others' compute; at most one of them reaches r2's tail):
    # effect = (P(r2|tail) − P(r2)) / (1 − P(r2)) ≥ (59/60 − 1/3) / (2/3) = 0.975
    assert cause["detail"]["tail_share"] >= 0.98 and cause["effect"] >= 0.97
    assert cause["detail"]["all_share"] == pytest.approx(slow.mean(), abs=1e-4)
    assert "replica r2" in doc["summary"] and "Top cause" in doc["summary"]


def test_the_generator_goes_first_and_says_so(tmp_path):
    frame = clean_frame(6000, 2)
    t = frame["intended_us"].to_numpy() / 1e6
    hog = (t % 5) < 0.3  # a CPU hog on the client for 0.3 s every 5 s: sends go out 25 ms late
    lag = np.where(hog, 25_000, 0)
    for column in ("send_lag_us", "sent_us", "first_byte_us", "end_us", "latency_us", "client_inclusive_us"):
        frame[column] += lag
    doc = explain_run(write_dir(tmp_path, frame))
    cause = top(doc)
    assert cause["kind"] == "generator" and cause["name"] == "generator"
    # the tail's excess is the 25 ms lag plus its compute's own excess over the body's (the slowest of
    # the lagged requests make the tail): 25 / (25 + ~5) ms, so the generator's share is over 0.75
    assert cause["effect"] > 0.75
    assert "latscope shaped this tail, not the target" in doc["summary"]
    assert generator_caused(doc) is not None
    assert {c["name"]: c for c in doc["components"]}["send_lag"]["share"] == pytest.approx(cause["effect"], abs=0.01)
    assert named(doc, "time")["stands_out"]  # it is also concentrated in time, but ranked after the generator


def test_stalls_of_the_generator_during_requests_count_as_the_generator(tmp_path):
    frame = clean_frame(6000, 3)
    rng = np.random.default_rng(3)
    stalled = rng.random(len(frame)) < 0.02  # 2 % of requests were held by a 60 ms GC pause of the worker
    frame.loc[stalled, "stall_us"] = 60_000
    for column in ("end_us", "latency_us", "service_us", "client_inclusive_us"):
        frame.loc[stalled, column] += 60_000
    doc = explain_run(write_dir(tmp_path / "timed", frame))
    cause = top(doc)
    # the server's Server-Timing says it spent its usual ~8 ms: the rest of the flight, ~60 ms, is the
    # client's (on loopback), so the whole stall counts: ~60 of a ~63 ms excess
    assert cause["name"] == "generator" and cause["effect"] > 0.9
    assert cause["detail"]["tail_with_stall"] == 1
    # without Server-Timing the stall's expected delay is s²/2T (the answer's arrival anywhere in the
    # flight): 60² / (2 × ~68) ≈ 26 ms of the ~63 ms excess, ~0.42. It undercounts a stall that held the
    # request (about half of it), so that a long wait that merely overlapped stalls counts little.
    doc = explain_run(write_dir(tmp_path / "untimed", frame.drop(columns="server.compute")))
    cause = named(doc, "generator")
    assert cause["stands_out"] and 0.35 < cause["effect"] < 0.5


def test_periodic_server_pauses_are_a_time_cause(tmp_path):
    frame = clean_frame(6000, 4)
    sent = frame["sent_us"].to_numpy()
    period, pause = 2_000_000, 150_000  # the server stops for 150 ms every 2 s
    into = sent % period
    paused = into < pause
    set_service(frame, paused, (pause - into[paused]).astype(np.int64) + 2_000)
    doc = explain_run(write_dir(tmp_path, frame))
    cause = top(doc)
    assert (cause["kind"], cause["name"]) == ("time", "time")
    # hot bins are chosen on half the tail and the effect measured on the other half: a pause none of
    # the first half's requests fell in is missed (e^-2 ≈ 14 % of them with 2 a pause), so the
    # effect is an underestimate, here ~0.65 for a tail that is wholly in the pauses
    assert cause["effect"] > 0.5
    hot = cause["detail"]["hot_s"]
    assert len(hot) >= 10  # one stretch per pause (the run is 30 s: 15 pauses)
    assert all(a % 2 > 1.7 or a % 2 < 0.2 for a, _ in hot)  # each starts at a pause (less a bin: dilated)
    assert len(cause["detail"]["bins_s"]) == len(cause["detail"]["tail"]) == len(cause["detail"]["all"])


def test_cost_growing_with_prompt_length_is_a_what_cause(tmp_path):
    frame = clean_frame(6000, 5)
    set_service(frame, np.ones(len(frame), bool), (frame["prompt_tokens"].to_numpy() * 30).astype(np.int64))
    doc = explain_run(write_dir(tmp_path, frame))
    cause = top(doc)
    assert (cause["kind"], cause["name"]) == ("what", "prompt_tokens")
    # +30 µs a token: the tail is mostly the longest fifth of the prompts (1 when all of it)
    assert cause["effect"] > 0.8 and cause["detail"]["all_share"] == pytest.approx(0.2, abs=0.01)


def test_prefix_cache_misses_are_a_what_cause(tmp_path):
    frame = clean_frame(6000, 6)
    rng = np.random.default_rng(6)
    miss = rng.random(len(frame)) < 0.25
    frame["cached_tokens"] = np.where(miss, 0, frame["prompt_tokens"] // 2).astype(np.int32)
    set_service(frame, miss, rng.integers(8_000, 16_000, int(miss.sum())))
    doc = explain_run(write_dir(tmp_path, frame))
    cause = top(doc)
    assert (cause["kind"], cause["name"]) == ("what", "prefix_cache_miss")
    assert cause["effect"] > 0.95 and cause["detail"]["all_share"] == pytest.approx(miss.mean(), abs=1e-4)


def test_queueing_in_bursts_is_found_in_time_and_in_the_servers_queue(tmp_path):
    frame = clean_frame(6000, 7)
    rng = np.random.default_rng(7)
    n = len(frame)
    base = np.cumsum(rng.exponential(1e6 / RATE, n))
    burst = (base % 2.5e6) < 5e5  # every 2.5 s, half a second at 4× the rate
    gaps = rng.exponential(1e6 / RATE, n) * np.where(burst, 0.25, 1.0)
    intended = np.cumsum(gaps).astype(np.int64)
    service = rng.lognormal(np.log(2500), 0.3, n)  # one server: FIFO (Lindley), 2.6 ms a request: busy 55 %,
    # 220 % during a burst, so each burst builds a queue the next quiet stretch drains
    wait, free = np.zeros(n), 0.0
    for i in range(n):
        wait[i] = max(0.0, free - intended[i])
        free = intended[i] + wait[i] + service[i]
    shift = intended - frame["intended_us"].to_numpy()
    for column in ("intended_us", "sent_us", "first_byte_us", "end_us"):
        frame[column] += shift
    frame["server.compute"] = service / 1000
    frame["server.queue"] = wait / 1000
    extra = (wait + service).astype(np.int64) - (frame["service_us"] - frame["network_us"] - frame["decode_us"])
    for column in ("end_us", "first_byte_us", "latency_us", "service_us", "client_inclusive_us"):
        frame[column] += extra
    t = np.arange(0, intended.max() / 1e6, 0.25)  # queue depth sampled at 4 Hz
    depth = np.searchsorted(np.sort(intended / 1e6), t) - np.searchsorted(np.sort((intended + wait) / 1e6), t)
    telemetry = pd.DataFrame({"t_s": t, "source": "prometheus", "device": "server", "metric": "queue_depth",
                              "value": depth.astype(float)})
    doc = explain_run(write_dir(tmp_path, frame, telemetry=telemetry))
    standing = {c["name"]: c for c in doc["causes"] if c["stands_out"]}
    assert top(doc)["kind"] in ("time", "server_state")
    assert {"bursts", "queue_depth"} <= set(standing)
    assert standing["bursts"]["effect"] > 0.9 and standing["queue_depth"]["effect"] > 0.9
    assert standing["queue_depth"]["detail"]["direction"] == "higher"
    assert {c["name"]: c for c in doc["components"]}["server.queue"]["share"] > 0.8  # the time went to the queue


def test_the_servers_state_at_send_time_is_compared_with_the_interval_p99(tmp_path):
    frame = clean_frame(6000, 8)
    sent_s = frame["sent_us"].to_numpy() / 1e6
    t = np.arange(0, sent_s.max() + 1, 0.5)
    full = (t % 6) >= 5  # the KV cache is full one second in six; requests sent then wait 20 ms
    kv = np.where(full, 98.0, 40.0) + np.random.default_rng(8).normal(0, 2, len(t))
    slow = full[np.searchsorted(t, sent_s, side="right") - 1]
    set_service(frame, slow, 20_000)
    telemetry = pd.DataFrame({"t_s": t, "source": "prometheus", "device": "server", "metric": "kv_cache_usage_pct",
                              "value": kv})
    doc = explain_run(write_dir(tmp_path, frame, telemetry=telemetry))
    cause = named(doc, "kv_cache_usage_pct")
    assert cause["kind"] == "server_state" and cause["stands_out"] and cause["effect"] > 0.9
    # one value per stretch between two samples: a stretch that enters or leaves a full second averages
    # 98 with 40 along the interpolation, so the tail's median stretch reads above 75, the body's near 40
    assert cause["detail"]["tail"]["p50"] > 75 > 50 > cause["detail"]["body"]["p50"]
    assert len(cause["detail"]["series"]["t_s"]) == len(t)


def test_streams_explain_ttft_by_default_split_into_send_lag_and_the_wait_for_the_first_token(tmp_path):
    frame = clean_frame(6000, 9, stream=True)
    slow = (frame["class"] == "chat").to_numpy() & (np.random.default_rng(9).random(len(frame)) < 0.3)
    extra = np.where(slow, 20_000, 0)
    for column in ("first_token_us", "ttft_us", "end_us", "latency_us", "service_us"):
        frame[column] += extra
    doc = explain_run(write_dir(tmp_path, frame))
    assert doc["metric"] == "ttft"
    assert [c["name"] for c in doc["components"]] == ["send_lag", "server.compute", "first_token_rest"]
    assert named(doc, "class=chat")["stands_out"]
    doc = explain_run(tmp_path, metric="latency")
    assert [c["name"] for c in doc["components"]] == ["send_lag", "server.compute", "first_token_rest", "token_stream"]
    frame = frame.drop(columns="server.compute")  # a server that says nothing: the whole wait is one part
    doc = explain_run(write_dir(tmp_path / "plain", frame))
    assert [c["name"] for c in doc["components"]] == ["send_lag", "first_token_wait"]


# -- what is measured, and what is not -------------------------------------------------------------


def test_warm_up_and_failures_are_left_out(tmp_path):
    frame = clean_frame(3000, 10)
    frame.loc[:499, "warmup"] = True
    frame.loc[:499, "latency_us"] += 1_000_000  # a slow warm-up does not make the tail
    frame.loc[500:599, "error"] = "timeout"
    frame.loc[500:599, "latency_us"] = None
    doc = explain_run(write_dir(tmp_path, frame))
    assert doc["requests"]["measured"] == 2400 and doc["tail"]["n"] == 24
    assert doc["verdict"] == "nothing_stands_out"


def test_too_few_requests_is_not_enough_data_saying_how_many_are_needed(tmp_path):
    doc = explain_run(write_dir(tmp_path, clean_frame(500, 11)))
    assert doc["verdict"] == "not_enough_data" and doc["causes"] == []
    assert "1,000 requests" in doc["reason"] and doc["summary"].startswith("Not enough data")
    assert explain_run(tmp_path, quantile=0.9)["verdict"] != "not_enough_data"  # 50 above p90


def test_a_missing_or_damaged_requests_file_is_a_results_error_or_not_enough_data_for_a_run(tmp_path):
    path = write_dir(tmp_path, clean_frame(2000, 12))
    (path / "requests.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(ResultsError, match="requests.parquet: unreadable"):
        explain_run(path)
    assert explain_or_reason(path)["verdict"] == "not_enough_data"
    (path / "requests.parquet").unlink()
    with pytest.raises(ResultsError, match="requests.parquet: missing"):
        explain_run(path)
    assert explanation(load_run(path)) is None  # the report's "not measured"
    with pytest.raises(ResultsError, match="no metric 'tpot'"):
        explain_run(write_dir(tmp_path / "b", clean_frame(2000, 12)), metric="tpot")


def test_explain_json_is_json_and_the_report_reads_it_back(tmp_path):
    frame = clean_frame(6000, 1)
    set_service(frame, (frame["replica"] == "r2").to_numpy(), 15_000)
    path = write_dir(tmp_path, frame)
    doc = explain_run(path)
    written = write_explain(path, doc)
    assert json.loads(written.read_text()) == doc  # no NaN, plain types
    assert explanation(load_run(path)) == doc
    assert [c["rank"] for c in doc["causes"]] == list(range(1, len(doc["causes"]) + 1)) and len(doc["causes"]) <= ex.MAX_CAUSES
    for key in ("schema_version", "metric", "quantile", "verdict", "summary", "threshold_ms", "tail", "body",
                "excess_ms", "components", "causes", "tested", "alpha", "min_effect"):
        assert key in doc
    assert doc["requests"]["sampled"] is False
    sampled = write_dir(tmp_path / "sampled", frame, summary={"request_records": {"file": "requests.parquet",
                                                                                "rows": 6000, "sampled": True}})
    assert explain_run(sampled)["requests"]["sampled"] is True  # a sample is explained, and says so


def test_the_python_api_and_the_gate_check_use_the_same_explanation(tmp_path):
    from latscope.analysis.gate import FAIL, INCONCLUSIVE, PASS, gate, tail_cause_check
    from latscope.api import open_results
    from latscope.scenario.gate_file import GateFile

    frame = clean_frame(6000, 2)
    lag = np.where((frame["intended_us"].to_numpy() / 1e6) % 5 < 0.3, 25_000, 0)  # the client late in bursts
    for column in ("send_lag_us", "sent_us", "first_byte_us", "end_us", "latency_us", "client_inclusive_us"):
        frame[column] += lag
    path = write_dir(tmp_path / "gen", frame)
    doc = open_results(path).explain()
    assert doc == explain_run(path) and doc["causes"][0]["name"] == "generator"
    check = tail_cause_check(path)
    assert check.kind == "tail_cause" and check.status == FAIL and "load generator made this tail" in check.message
    clean = write_dir(tmp_path / "clean", clean_frame(6000, 0))
    assert tail_cause_check(clean).status == PASS
    assert "nothing in it stands out" in tail_cause_check(clean).message
    old = tail_cause_check(DATA / "run_f16f211")  # written before requests.parquet: cannot tell
    assert old.status == INCONCLUSIVE and "cannot tell what made the tail" in old.message
    # without fail_on_generator_tail the gate does not look (a run's own tail is not checked)
    assert all(c.kind != "tail_cause" for c in gate(path, None, GateFile()).checks)


def test_an_action_and_the_first_request_after_an_idle_stretch_are_time_causes(tmp_path):
    frame = clean_frame(6000, 13)
    t = frame["intended_us"].to_numpy() / 1e6
    during = (t >= 10) & (t <= 12.5)  # in flight while the action ran (10–11.5 s) or within its 1 s after
    set_service(frame, during, 20_000)
    events = [{"event": "action_start", "t_s": 10.0, "name": "flush-cache", "kind": "command"},
              {"event": "action_end", "t_s": 11.5, "name": "flush-cache", "kind": "command", "ok": True}]
    doc = explain_run(write_dir(tmp_path / "action", frame, events=events))
    cause = top(doc)
    assert (cause["kind"], cause["name"]) == ("time", "action=flush-cache") and cause["effect"] > 0.95
    assert cause["detail"]["spans_s"] == [[10.0, 12.5]]
    # the bare "stretches of time" finds the same moment, but one moment is a one-off: not standing out
    assert not named(doc, "time")["stands_out"] and "one-off" in named(doc, "time")["evidence"]

    frame = clean_frame(3000, 14)
    # 1.5 s of silence before every 101st request (odd: the first ones alternate between the two workers)
    gap = (np.arange(len(frame)) // 101) * 1_500_000
    first = (np.arange(len(frame)) % 101 == 0) & (np.arange(len(frame)) > 0)
    for column in ("intended_us", "sent_us", "first_byte_us", "end_us"):
        frame[column] += gap
    set_service(frame, first, 30_000)  # a cold cache after each idle stretch
    doc = explain_run(write_dir(tmp_path / "idle", frame))
    cause = top(doc)
    assert (cause["kind"], cause["name"]) == ("time", "after_idle")
    # the 29 first-after-idle requests are 29 of the 30 above p99: effect (29/30 − 29/3000) / (1 − 29/3000)
    assert cause["effect"] == pytest.approx((29 / 30 - 29 / 3000) / (1 - 29 / 3000), abs=1e-3)
    assert cause["detail"]["all_share"] == pytest.approx(29 / 3000, abs=1e-4)


def test_a_signal_lower_in_the_tail_or_latscopes_own_signal_without_its_delay_is_no_cause(tmp_path):
    frame = clean_frame(6000, 15)
    set_service(frame, (frame["replica"] == "r2").to_numpy(), 15_000)  # the cause: replica r2
    doc = explain_run(write_dir(tmp_path / "a", frame))
    tail_s = np.sort(frame.loc[frame["latency_us"] > doc["threshold_ms"] * 1000, "sent_us"].to_numpy() / 1e6)
    t = np.round(np.arange(0, frame["sent_us"].max() / 1e6 + 1, 0.05), 3)
    near = np.abs(t[:, None] - tail_s[None, :]).min(axis=1) < 0.05  # samples next to a tail request's send
    telemetry = pd.concat([
        # the GPU "idles" when the tail is sent: lower in the tail, which cannot have made it
        pd.DataFrame({"t_s": t, "source": "nvml", "device": "0", "metric": "gpu_util_pct",
                      "value": np.where(near, 10.0, 80.0)}),
        # latscope's loop lag is higher then, but its send lag and stalls are tens of µs: not a cause
        pd.DataFrame({"t_s": t, "source": "host", "device": "worker-0", "metric": "loop_lag_p99_ms",
                      "value": np.where(near, 20.0, 1.0)})])
    doc = explain_run(write_dir(tmp_path / "b", frame, telemetry=telemetry))
    assert top(doc)["name"] == "replica=r2"
    # effect 0: ranked below the twelve causes kept, or kept with 0
    assert all(c["effect"] == 0 for c in doc["causes"] if c["name"] == "gpu_util_pct")
    lag = named(doc, "generator.loop_lag_p99_ms")
    assert lag["effect"] > 0.8 and lag["p_value"] < 1e-6 and not lag["stands_out"]
    assert "did not make them slow" in lag["evidence"]


def test_a_generator_share_under_half_ranks_by_effect_not_first(tmp_path):
    frame = clean_frame(6000, 16)
    slow = (frame["replica"] == "r2").to_numpy()
    set_service(frame, slow, 15_000)
    lag = np.where(slow, 14_000, 0)  # and r2's requests also left 14 ms late (say, its own worker was busy)
    for column in ("send_lag_us", "sent_us", "first_byte_us", "end_us", "latency_us", "client_inclusive_us"):
        frame[column] += lag
    doc = explain_run(write_dir(tmp_path, frame))
    standing = [c["name"] for c in doc["causes"] if c["stands_out"]]
    assert standing[:2] == ["replica=r2", "generator"]  # effect 1.00, then the generator's ~0.4
    assert 0.3 <= named(doc, "generator")["effect"] < ex.GENERATOR_FIRST
    assert generator_caused(doc) is None  # the gate would not blame the generator for this tail

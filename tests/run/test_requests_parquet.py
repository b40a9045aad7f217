"""requests.parquet from whole runs: real workers, real loopback targets, real signals.

The records must be the histograms' values exactly: every percentile is checked by putting the
records' µs back into an HDR histogram with latscope's own code (recorder.counts_from_values,
from_sparse, summarize) and comparing the result with summary.json's entry for equality, every
statistic of ROW_STATS. Equal, not close: the values are the same integers, so their HDR buckets
and every statistic derived from them are the same.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import signal

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import yaml
from aiohttp import web

from chat_server import make_chat_app
from conftest import scenario_dict, serve, stream_target_process
from helpers import read_summary, run_cli_until
from latscope.recorder import counts_from_values, from_sparse, summarize
from latscope.request_ids import request_row
from latscope.request_log import kept
from latscope.results.schema import REQUEST_COLUMNS
from latscope.run import run_scenario
from latscope.scenario import scenario_from_dict


def records(run_dir):
    """requests.parquet as a pyarrow table (nulls stay nulls, ints stay ints)."""
    return pq.read_table(run_dir / "requests.parquet")


def hdr_summary(values) -> dict:
    """summarize() of a histogram holding exactly `values` (µs)."""
    counts = counts_from_values(np.asarray(values, np.int64))
    nz = np.flatnonzero(counts)
    return summarize(from_sparse(nz, counts[nz]))


def assert_same_as_summary(table, summary: dict, column: str, metric: str) -> None:
    """The metric's summary.json statistics (class all, outside warm-up) from the records' column."""
    measured = table.filter(table["warmup"].to_numpy(zero_copy_only=False) == False)  # noqa: E712
    values = measured[column].drop_null().to_numpy()
    assert len(values) > 0, column
    assert hdr_summary(values) == summary["metrics"][metric]["all"], (column, metric)


def _timing_app(secret: str) -> web.Application:
    """Answers after ~1 ms with Server-Timing `app` (every response), `db` (every third) and a part
    whose name is the scenario's secret (every fifth: it must reach no file), and X-Replica-Id."""
    count = itertools.count()

    async def handle(request: web.Request) -> web.Response:
        n = next(count)
        await asyncio.sleep(0.001)
        parts = [f"app;dur={1 + n % 7}.25"] + ([f"db;dur={n % 3}.5"] * (n % 3 == 0)) + ([f"{secret};dur=1"] * (n % 5 == 0))
        return web.Response(text="ok", headers={"Server-Timing": ", ".join(parts), "X-Replica-Id": f"r{n % 2}"})

    app = web.Application()
    app.router.add_post("/infer", handle)
    return app


def test_one_row_per_sent_request_with_the_histograms_values(tmp_path):
    """Two workers, a warm-up then a measured phase: one row per schedule row, warm-up flagged, the
    percentiles of summary.json from the records exactly, Server-Timing parts as columns."""
    secret = "sk-topsecret"
    with serve(_timing_app(secret)) as url:
        data = scenario_dict(url, tmp_path, [
            {"name": "warm", "duration": 0.5, "warmup": True, "arrival": {"type": "constant", "rate": 60}},
            {"name": "main", "duration": 1.5, "arrival": {"type": "poisson", "rate": 200}}])
        data["target"]["api_key"] = secret
        run = run_scenario(scenario_from_dict(data), workers=2)
    s, run_dir = run.summary, run.run_dir
    table = records(run_dir)
    schedule = pq.read_table(run_dir / "schedule.parquet")
    rows = table["row"].to_numpy()
    assert sorted(rows.tolist()) == list(range(schedule.num_rows))  # every schedule row once, nothing else
    warm = table["warmup"].to_numpy(zero_copy_only=False)
    assert (~warm).sum() == s["requests"]["sent"] and warm.sum() == s["warmup_requests"]["sent"] == 30
    assert s["request_records"] == {"file": "requests.parquet", "rows": table.num_rows, "sampled": False,
                                    "fraction": 1.0, "max_rows": 5_000_000}
    assert not (run_dir / ".requests").exists()
    names = table.schema.names
    assert names[:len(REQUEST_COLUMNS)] == list(REQUEST_COLUMNS)
    assert names[len(REQUEST_COLUMNS):] == ["server.<redacted>", "server.app", "server.db"]  # scrubbed, sorted
    assert secret not in (run_dir / "requests.parquet").read_bytes().decode("latin-1")
    for column, metric in [("latency_us", "latency"), ("service_us", "service_time"), ("send_lag_us", "send_lag"),
                           ("network_us", "network")]:
        assert_same_as_summary(table, s, column, metric)
    # Server-Timing parts: the histograms got round(ms × 1000) µs
    measured = table.filter(~table["warmup"].to_numpy(zero_copy_only=False))
    for part in ("app", "db"):
        ms = measured[f"server.{part}"].drop_null().to_numpy()
        assert hdr_summary(np.rint(ms * 1000).astype(np.int64)) == s["metrics"][f"server.{part}"]["all"]
    n = table.num_rows  # the app's responses: `db` on every third, the secret's part on every fifth, from the first
    assert (table["server.app"].null_count, table["server.db"].null_count, table["server.<redacted>"].null_count) == (
        0, n - math.ceil(n / 3), n - math.ceil(n / 5))
    # the run clock: intended times are the schedule's, and every request's times are in order
    intended = table["intended_us"].to_numpy()
    planned = schedule["intended_s"].to_numpy()[rows]
    assert np.all(np.abs(intended - planned * 1e6) <= 1)
    sent, first, end = (table[c].to_numpy() for c in ("sent_us", "first_byte_us", "end_us"))
    assert np.all(intended <= sent) and np.all(sent < first) and np.all(first <= end)
    # each time is floor((t − t0) / 1000), a duration floor((end − start) / 1000): they differ by 1 µs at most
    assert np.all(np.abs(table["latency_us"].to_numpy() - (end - intended)) <= 1)
    assert set(table["replica"].to_pylist()) == {"r0", "r1"}
    assert set(table["phase"].to_pylist()) == {"warm", "main"}
    assert table["node"].null_count == table.num_rows and table["error"].null_count == table.num_rows
    assert table["status"].to_numpy().min() == 200 and table["connection"].null_count == 0
    assert set(table["worker"].to_numpy().tolist()) == {0, 1}


def test_a_stream_fills_ttft_tpot_worst_gap_and_first_token(tmp_path):
    with stream_target_process(ttft_ms=5, itl_ms=2, tokens=6) as url:
        data = scenario_dict(url, tmp_path, [{"name": "p", "duration": 1.5, "arrival": {"type": "constant", "rate": 40}}],
                             target={"url": url, "protocol": "openai", "model": "m", "timeout": 5})
        run = run_scenario(scenario_from_dict(data), workers=1)
    s, table = run.summary, records(run.run_dir)
    assert table.num_rows == s["requests"]["sent"] == 60
    for column, metric in [("ttft_us", "ttft"), ("tpot_us", "tpot"), ("latency_us", "latency")]:
        assert_same_as_summary(table, s, column, metric)
    # the worst gap of each stream is one of its gaps: the largest of them is the itl histogram's max
    assert hdr_summary(table["itl_max_us"].to_numpy())["max_ms"] == s["metrics"]["itl"]["all"]["max_ms"]
    first_token, first_byte = table["first_token_us"].to_numpy(), table["first_byte_us"].to_numpy()
    assert np.all(first_byte <= first_token) and np.all(first_token <= table["end_us"].to_numpy())
    assert np.all(np.abs(table["ttft_us"].to_numpy() - (first_token - table["intended_us"].to_numpy())) <= 1)
    assert (table["output_tokens"].to_numpy() == 6).all()
    assert table["server.compute"].null_count == 0  # the stream target's Server-Timing


def test_sigterm_mid_run_leaves_a_complete_requests_parquet(target, tmp_path):
    """A 1 s target at 100 req/s stopped 2 s in: ~100 requests in flight at the teardown, which the
    engine cancels after its 0.5 s drain; every sent request has its row, the cancelled ones too."""
    url = target(delay_ms=1000)
    data = scenario_dict(url, tmp_path, [{"name": "long", "duration": 30, "arrival": {"type": "constant", "rate": 100}}])
    path = tmp_path / "long.yaml"
    path.write_text(yaml.safe_dump(data))
    out = tmp_path / "run"
    code, output = run_cli_until(path, out, 2, signal.SIGTERM, workers=2)
    assert code == 1, output
    s = read_summary(out)
    assert s["partial"] is True
    table = records(out)
    assert table.num_rows == s["requests"]["sent"] > 100 and s["request_records"]["rows"] == table.num_rows
    errors = table["error"].to_pylist()
    assert errors.count("cancelled") == s["requests"]["cancelled"] > 20
    cancelled = table.filter(pc.equal(table["error"], "cancelled"))
    assert cancelled["sent_us"].null_count == cancelled["latency_us"].null_count == cancelled.num_rows
    assert sum(e is None for e in errors) == s["requests"]["completed"]
    assert not (out / ".requests").exists()


def test_off_writes_no_records(target, tmp_path):
    data = scenario_dict(target(delay_ms=0), tmp_path, [{"name": "p", "duration": 0.5, "arrival": {"type": "constant", "rate": 40}}])
    data["output"]["requests"] = "off"
    run = run_scenario(scenario_from_dict(data), workers=1)
    assert not (run.run_dir / "requests.parquet").exists() and not (run.run_dir / ".requests").exists()
    assert run.summary["request_records"] is None


def test_max_rows_keeps_the_seeded_sample_of_about_max_rows(target, tmp_path):
    """1,200 planned requests, max_rows 300: each row kept with probability 1/4, decided by a hash of
    (seed, row), so the rows kept are exactly those `kept` names; their number is Binomial(1200, 1/4)
    (sd 15): within 4 sd of 300."""
    data = scenario_dict(target(delay_ms=0), tmp_path, [{"name": "p", "duration": 2, "arrival": {"type": "constant", "rate": 600}}])
    data["output"]["requests"] = {"max_rows": 300}
    run = run_scenario(scenario_from_dict(data), workers=2)
    s, table = run.summary, records(run.run_dir)
    assert s["requests"]["sent"] == 1200
    fraction = 300 / 1200
    assert s["request_records"] == {"file": "requests.parquet", "rows": table.num_rows, "sampled": True,
                                    "fraction": fraction, "max_rows": 300}
    assert sorted(table["row"].to_pylist()) == [r for r in range(1200) if kept(1, r, fraction)]
    assert abs(table.num_rows - 300) <= 4 * math.sqrt(1200 * fraction * (1 - fraction))


def test_all_keeps_every_row_without_a_bound(target, tmp_path):
    data = scenario_dict(target(delay_ms=0), tmp_path, [{"name": "p", "duration": 0.5, "arrival": {"type": "constant", "rate": 40}}])
    data["output"]["requests"] = "all"
    run = run_scenario(scenario_from_dict(data), workers=1)
    assert run.summary["request_records"] == {"file": "requests.parquet", "rows": 20, "sampled": False, "fraction": 1.0,
                                              "max_rows": None}


def test_session_turns_have_their_session_turn_row_and_the_request_id_the_server_saw(tmp_path):
    """Sessions of three turns (0.2 s think time) starting at 4/s for 1 s, then an idle phase for
    their later turns: every turn has its row (later turns' rows follow the plan's, as X-Request-Id
    says), its session and turn, and a phase by its intended time."""
    log: list[dict] = []
    with serve(make_chat_app(log)) as url:
        data = {"name": "chat", "seed": 7,
                "target": {"protocol": "openai", "url": url, "model": "m", "timeout": 5,
                           "request_id_header": "X-Request-Id"},
                "workload": {"classes": [{"name": "chat", "prompt_tokens": 12, "output_tokens": 3,
                                          "session": {"turns": 3, "think_time": "0.2s"}}]},
                "phases": [{"name": "start", "duration": 1, "arrival": {"type": "constant", "rate": 4}},
                           {"name": "tail", "duration": 1, "arrival": {"type": "idle"}}],
                "output": {"dir": str(tmp_path / "results"), "report": False}}
        run = run_scenario(scenario_from_dict(data), workers=1)
    t = records(run.run_dir).to_pydict()
    assert len(t["row"]) == len(log) == 12
    assert sorted(t["row"]) == sorted(request_row(e["request_id"]) for e in log)
    turns = sorted(zip(t["session"], t["turn"]))
    assert turns == [(s, k) for s in range(4) for k in (1, 2, 3)]
    first = [r for r, k in zip(t["row"], t["turn"]) if k == 1]
    assert sorted(first) == [0, 1, 2, 3]  # turn 1 is the session's plan row; later turns come after the plan's rows
    for intended, phase in zip(t["intended_us"], t["phase"]):
        assert phase == ("start" if intended < 1_000_000 else "tail")
    assert all(n == 3 for n in t["output_tokens"]) and None not in t["ttft_us"]

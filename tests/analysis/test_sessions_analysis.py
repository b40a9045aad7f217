"""latscope.analysis.sessions over known results directories: tests/data/run_sessions (a real run of
four-turn chat sessions against the reference server with its prefix cache on: five sessions, a 512-token
system prompt each, every later turn served it from the cache), tests/data/run_f16f211 (written before
sessions existed), and frames built by hand for what that run did not have (several classes, abandoned
and cut sessions, warm-up, a closed loop)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from conftest import REPO
from latscope.analysis import sessions
from latscope.analysis.run_data import RunData, load_run
from latscope.results.schema import SESSION_COUNTERS, TELEMETRY_COLUMNS

SESSIONS_RUN = REPO / "tests" / "data" / "run_sessions"
OLD_RUN = REPO / "tests" / "data" / "run_f16f211"


def test_session_table_of_the_sample_run():
    table = sessions.session_table(load_run(SESSIONS_RUN))
    assert list(table["class"]) == ["chat"]
    row = table.iloc[0]
    assert (row["started"], row["completed"], row["abandoned"], row["cut"], row["turns_not_sent"]) == (5, 5, 0, 0, 0)
    assert (row["duration_count"], row["duration_p50_ms"], row["duration_p99_ms"]) == (5, 989.183, 1003.519)
    assert (row["cached_tokens"], row["prompt_tokens"], row["hit_rate"]) == (7680, 10940, 0.702011)


def test_turn_table_of_the_sample_run_shows_later_turns_cheaper():
    turns = sessions.turn_table(load_run(SESSIONS_RUN))
    assert list(turns["class"]) == ["chat"] * 4 and list(turns["turn"]) == [1, 2, 3, 4]
    assert list(turns["completed"]) == [5] * 4 and list(turns["errors"]) == [0] * 4
    assert list(turns["ttft_p50_ms"]) == [36.671, 10.639, 8.399, 7.783]
    assert list(turns["ttft_p99_ms"]) == [58.079, 17.631, 11.047, 15.527]
    assert list(turns["latency_p50_ms"]) == [44.063, 13.183, 13.231, 12.943]
    assert list(turns["itl_count"]) == [15] * 4
    # turn 1 finds nothing in the cache; each later one, the 512-token system prompt's full blocks
    assert list(turns["hit_rate"]) == [0.0, 0.936015, 0.936015, 0.936015]
    assert list(turns["cached_tokens"]) == [0, 2560, 2560, 2560] and list(turns["cache_reported_prompt_tokens"]) == [2735] * 4


def test_prefix_cache_table_of_the_sample_run_lists_all_last():
    cache = sessions.prefix_cache_table(load_run(SESSIONS_RUN))
    assert list(cache["class"]) == ["chat", "all"]
    assert list(cache["cached_tokens"]) == [7680, 7680] and list(cache["hit_rate"]) == [0.702011, 0.702011]


def test_session_timeline_of_the_sample_run():
    run = load_run(SESSIONS_RUN)
    timeline = sessions.session_timeline(run)
    assert list(timeline["class"].unique()) == ["chat"]  # one session class: no "all" line
    assert list(timeline["t_s"]) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert list(timeline["started"]) == [4, 0, 1, 0, 0, 0, 0]
    assert list(timeline["ended"]) == [0, 2, 0, 1, 0, 1, 1]
    assert list(timeline["in_progress"]) == [4, 2, 3, 2, 2, 1, 0]
    assert timeline["started"].sum() == run.summary["sessions"]["chat"]["started"]
    assert not timeline["warmup"].any() and list(timeline["phase"].unique()) == ["p", "tail"]


def test_an_old_run_has_no_session_data():
    run = load_run(OLD_RUN)
    assert sessions.session_table(run).empty and sessions.turn_table(run).empty
    assert sessions.prefix_cache_table(run).empty and sessions.session_timeline(run).empty
    assert sessions.load_model(run.summary) == {"model": "open"} and not sessions.closed_loop(run.summary)
    assert not sessions.has_session_data(run)
    assert sessions.has_session_data(load_run(SESSIONS_RUN))


def test_a_timeseries_without_the_session_columns_has_no_timeline(tmp_path):
    """A file written before the session counters existed lacks their columns: absent, not zero."""
    run = tmp_path / "run"
    shutil.copytree(SESSIONS_RUN, run)
    frame = pd.read_parquet(run / "timeseries.parquet")
    frame.drop(columns=[c for c in SESSION_COUNTERS if c in frame]).to_parquet(run / "timeseries.parquet", index=False)
    assert sessions.session_timeline(load_run(run)).empty
    assert len(sessions.turn_table(load_run(run))) == 4  # the summary's turns are still there


def _rows(t: float, phase: str, counts: dict[str, dict[str, int]]) -> list[dict]:
    """One interval's "latency" rows (where the counters are) and a ttft row that must be ignored."""
    out = []
    for cls, c in counts.items():
        row = {"interval_start_s": t, "interval_s": 1.0, "phase": phase, "metric": "latency", "class": cls,
               **{k: c.get(k.removeprefix("sessions_"), 0) for k in SESSION_COUNTERS}}
        out += [row, {**row, "metric": "ttft", "sessions_started": 99}]
    return out


def _run(tmp_path: Path, summary: dict, timeseries: pd.DataFrame | None = None) -> RunData:
    telemetry = pd.DataFrame({c: [] for c in TELEMETRY_COLUMNS})
    ts = timeseries if timeseries is not None else pd.DataFrame({"interval_start_s": [], "metric": [], "class": [], "phase": []})
    return RunData(tmp_path, summary, [], ts, telemetry)


def test_timeline_of_several_classes_with_abandoned_and_cut_sessions_and_warmup(tmp_path):
    rows = (_rows(0.0, "w", {"a": {"started": 2}, "b": {"started": 1}, "all": {"started": 3}})
            + _rows(1.0, "main", {"a": {"started": 3, "completed": 1, "abandoned": 1, "turns_not_sent": 2},
                                  "b": {"started": 0}, "all": {"started": 3, "completed": 1, "abandoned": 1, "turns_not_sent": 2}})
            + _rows(2.0, "main", {"a": {"cut": 3, "turns_not_sent": 4}, "b": {"completed": 1}, "c": {},
                                  "all": {"completed": 1, "cut": 3, "turns_not_sent": 4}}))
    summary = {"phases": [{"name": "w", "start_s": 0.0, "duration_s": 1.0, "warmup": True},
                          {"name": "main", "start_s": 1.0, "duration_s": 2.0, "warmup": False}]}
    timeline = sessions.session_timeline(_run(tmp_path, summary, pd.DataFrame(rows)))
    # classes that started a session, then "all"; class c (no session) is left out
    assert list(timeline["class"].unique()) == ["a", "b", "all"]
    a = timeline[timeline["class"] == "a"]
    assert list(a["in_progress"]) == [2, 3, 0] and list(a["abandoned"]) == [0, 1, 0] and list(a["cut"]) == [0, 0, 3]
    assert list(a["turns_not_sent"]) == [0, 2, 4] and list(a["warmup"]) == [True, False, False]
    assert list(timeline[timeline["class"] == "b"]["in_progress"]) == [1, 1, 0]
    assert list(timeline[timeline["class"] == "all"]["in_progress"]) == [3, 4, 0]


def test_turns_from_the_metrics_when_the_summary_has_no_by_turn(tmp_path):
    stats = {"count": 4, "p50_ms": 20.0, "p99_ms": 40.0}
    summary = {"metrics": {"turn.ttft": {"x#2": {**stats, "p50_ms": 5.0}, "x#1": stats},
                           "turn.latency": {"x#1": stats}}}
    turns = sessions.turn_table(_run(tmp_path, summary))
    assert list(turns["turn"]) == [1, 2] and list(turns["ttft_p50_ms"]) == [20.0, 5.0]
    assert turns["hit_rate"].isna().all()  # no counters: the hit rate is unknown, not 0
    assert turns["latency_p50_ms"].iloc[0] == 20.0 and pd.isna(turns["latency_p50_ms"].iloc[1])


def test_hit_rate_is_none_when_the_server_never_reported(tmp_path):
    summary = {"sessions": {"s": {"started": 2, "completed": 2, "abandoned": 0, "cut": 0, "turns_not_sent": 0,
                                  "duration": {"count": 0},
                                  "prefix_cache": {"cached_tokens": 0, "prompt_tokens": 0, "hit_rate": None},
                                  "by_turn": {"10": {"completed": 2, "hit_rate": None}, "2": {"completed": 2}}}}}
    run = _run(tmp_path, summary)
    table = sessions.session_table(run)
    assert table["hit_rate"].isna().all() and pd.isna(table["duration_p50_ms"].iloc[0])
    turns = sessions.turn_table(run)
    assert list(turns["turn"]) == [2, 10]  # in number order, not string order
    assert turns["hit_rate"].isna().all()


@pytest.mark.parametrize("load, closed", [
    ({"model": "closed", "users": 3, "note": "closed loop: ..."}, True),
    ({"model": "mixed", "users": 1, "note": "..."}, True),
    ({"model": "open"}, False), (None, False), ("closed", False), ({}, False)])
def test_load_model(load, closed):
    summary = {} if load is None else {"load": load}
    assert sessions.closed_loop(summary) is closed
    assert sessions.load_model(summary)["model"] == (load["model"] if closed else "open")

"""results/schema.py is the one catalogue of a results directory's vocabulary: every event the code
emits is in it with the fields it is written with, every entry is emitted somewhere, and the files
of a real run (the f16f211 fixture, and the writers' own column lists) use its names."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pyarrow.parquet as pq

from latscope.recorder import new_histogram, summarize
from latscope.results import schema

from conftest import REPO

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "run_f16f211"


def emits() -> list[tuple[str, str, set[str], bool]]:
    """Every `<x>.emit("name", ...)` in latscope: (where, name, keyword fields, passes **fields)."""
    found = []
    for path in sorted((REPO / "latscope").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "emit"
                    and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
                keywords = {k.arg for k in node.keywords if k.arg is not None}
                found.append((f"{path.relative_to(REPO)}:{node.lineno}", node.args[0].value, keywords - {"at_ns"},
                              any(k.arg is None for k in node.keywords)))
    return found


def test_every_emitted_event_is_catalogued_with_its_fields():
    found = emits()
    assert len(found) >= 20
    for where, name, fields, _ in found:
        assert name in schema.EVENT_TYPES, f"{where}: event {name!r} is not in results/schema.py EVENT_TYPES"
        assert fields <= set(schema.EVENT_TYPES[name].fields), f"{where}: {name} fields {fields - set(schema.EVENT_TYPES[name].fields)}"
    assert {name for _, name, _, _ in found} == set(schema.EVENT_TYPES)  # and no entry is dead


def test_the_fixtures_events_and_files_use_the_catalogue():
    for line in (FIXTURE / schema.EVENTS).read_text().splitlines():
        event = json.loads(line)
        assert set(event) - {"event", "t_s", "wall"} <= set(schema.EVENT_TYPES[event["event"]].fields)
    timeseries = pq.read_schema(FIXTURE / schema.TIMESERIES)
    # Columns are only ever added, at the end: the fixture predates the goodput, cache and session
    # counters, and the schedule's session columns.
    later = (*schema.GOODPUT_COUNTERS, *schema.CACHE_COUNTERS, *schema.SESSION_COUNTERS, *schema.REASONING_COUNTERS,
             *schema.TOKEN_SOURCE_COUNTERS, *schema.AGENT_COUNTERS)
    assert timeseries.names + list(later) == list(schema.TIMESERIES_COLUMNS)
    assert pq.read_schema(FIXTURE / schema.TELEMETRY).names == list(schema.TELEMETRY_COLUMNS)
    assert pq.read_schema(FIXTURE / schema.SCHEDULE).names + ["session", "turn", "think_s"] == list(schema.SCHEDULE_COLUMNS)
    summary = json.loads((FIXTURE / schema.SUMMARY).read_text())
    assert list(summary["errors"]) == list(schema.ERROR_KINDS)
    assert list(summary["metrics"]) == schema.summary_order(summary["metrics"])
    assert all(m in schema.METRICS or m.startswith("server.") for m in summary["metrics"])
    assert list(summary["metrics"]["latency"]["all"]) == list(schema.ROW_STATS)


def test_row_stats_are_what_a_histogram_summarizes_to():
    h = new_histogram()
    h.record_value(1000)
    assert tuple(summarize(h)) == schema.ROW_STATS


def test_counter_indices_name_their_counters():
    assert [schema.COUNTERS[i] for i in (schema.SENT, schema.COMPLETED, schema.DROPPED, schema.LATE, schema.CANCELLED)] == [
        "sent", "completed", "dropped", "late", "cancelled"]
    assert all(schema.COUNTERS[i] == kind for kind, i in schema.ERROR_INDEX.items())
    assert [schema.COUNTERS[i] for i in (schema.PROMPT_TOKENS, schema.OUTPUT_TOKENS, schema.OUTPUT_TOKENS_USAGE)] == list(
        schema.TOKEN_COUNTERS)
    assert [schema.COUNTERS[i] for i in (schema.GOOD, schema.GOOD_OUTPUT_TOKENS)] == list(schema.GOODPUT_COUNTERS)
    assert [schema.COUNTERS[i] for i in (schema.CACHED_TOKENS, schema.CACHE_REPORTED)] == list(schema.CACHE_COUNTERS)
    assert [schema.COUNTERS[i] for i in (schema.SESSIONS_STARTED, schema.SESSIONS_COMPLETED, schema.SESSIONS_ABANDONED,
                                         schema.SESSIONS_CUT, schema.TURNS_NOT_SENT, schema.SESSIONS_HISTORY_LIMIT)] == list(
        schema.SESSION_COUNTERS)
    assert [schema.COUNTERS[i] for i in (schema.REASONING_TOKENS, schema.EMPTY, schema.ITEMS)] == list(
        schema.REASONING_COUNTERS)
    assert [schema.COUNTERS[i] for i in (schema.TOOL_CALLS, schema.TOOL_CALLS_INVALID, schema.JOB_ROUNDS,
                                         schema.JOB_CONTEXT_TOKENS, schema.JOB_PROMPT_TOKENS, schema.JOB_CACHED_TOKENS,
                                         schema.JOBS_GOOD, schema.JOB_REQUESTS)] == list(
        schema.AGENT_COUNTERS)
    # each added last, in its turn: no index moved
    later = (*schema.GOODPUT_COUNTERS, *schema.CACHE_COUNTERS, *schema.SESSION_COUNTERS, *schema.REASONING_COUNTERS,
             *schema.TOKEN_SOURCE_COUNTERS, *schema.AGENT_COUNTERS)
    assert schema.COUNTERS[-len(later):] == later == schema.TIMESERIES_COLUMNS[-len(later):]

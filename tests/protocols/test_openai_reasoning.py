"""Reasoning streams, empty answers and carried reasoning, against a loopback aiohttp server that
streams R reasoning chunks then C content chunks, each written on a fixed schedule (start + i × GAP,
not sleep after sleep, so late timers do not add up), and records every request body and its own
write times (perf_counter_ns: the client's clock)."""

from __future__ import annotations

import asyncio
import json
import time

import pyarrow.parquet as pq
import pytest
import uvloop
from aiohttp import web

from events_server import v1_app
from latscope.intervals import IntervalRecorder
from latscope.protocols import make_client
from latscope.records import Conversation, Outcome, Request
from latscope.results.schema import EMPTY, REASONING_TOKENS
from latscope.run import run_scenario
from latscope.scenario import scenario_from_dict

from conftest import serve

MS = 1_000_000
R, C, GAP_MS = 8, 5, 10  # reasoning chunks, content chunks, the gap between two writes
# The client's bar (the issue's): ttfot = ttft + the reasoning span within 2 ms. The span the client
# sees is the difference of two read times, each trailing its write by the loopback delivery (< 1 ms
# on an idle box), so it is within 1 ms of the server's own write times, and those are within 1 ms of
# the schedule (a timer that fires late delays one write, not the next: absolute deadlines).
SPAN_TOLERANCE_MS = 2.0
ROLE = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
DONE = b"data: [DONE]\n\n"


def _chunk(field: str, text: str) -> bytes:
    return b"data: %s\n\n" % json.dumps({"choices": [{"index": 0, "delta": {field: text}}]}).encode()


def _app(log: list[dict]) -> web.Application:
    """Answers by `model`: reason (reasoning_content, no usage), reason-usage (usage says 2 tokens a
    reasoning chunk), reasoning-field (`reasoning`, as gpt-oss servers write it), empty (a role chunk,
    usage 0), empty-bare (a role chunk, no usage); without `stream`: a whole answer, empty for empty*."""

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        entry: dict = {"body": body, "writes": []}
        log.append(entry)
        model = body["model"]
        if not body.get("stream"):
            message = {"role": "assistant", "content": "" if model.startswith("empty") else "whole answer",
                       **({"reasoning_content": "whole thought"} if model.startswith("reason") else {})}
            return web.json_response({"choices": [{"index": 0, "message": message}],
                                      "usage": {"prompt_tokens": 3, "completion_tokens": 0 if model.startswith("empty") else 4,
                                                "completion_tokens_details": {"reasoning_tokens": 0 if model.startswith("empty") else 2}}})
        field = "reasoning" if model == "reasoning-field" else "reasoning_content"
        pieces = [] if model.startswith("empty") else (
            [_chunk(field, f" r{i}") for i in range(R)] + [_chunk("content", f" w{i}") for i in range(C)])
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(ROLE)
        start = time.perf_counter_ns()
        for i, piece in enumerate(pieces):
            await asyncio.sleep(max(0.0, (start + i * GAP_MS * MS - time.perf_counter_ns()) / 1e9))
            entry["writes"].append(time.perf_counter_ns())
            await response.write(piece)
        usage = {"reason-usage": {"prompt_tokens": 9, "completion_tokens": 2 * R + C,
                                  "completion_tokens_details": {"reasoning_tokens": 2 * R}},
                 "empty": {"prompt_tokens": 9, "completion_tokens": 0}}.get(model)
        if usage:
            await response.write(b"data: %s\n\n" % json.dumps({"choices": [], "usage": usage}).encode())
        await response.write(DONE)
        await response.write_eof()
        return response

    return v1_app(handle)


def _scenario(url: str, classes: list[dict], rate: float = 1, **extra) -> object:
    return scenario_from_dict({
        "name": "reasoning", "seed": 1,
        "target": {"url": url, "protocol": "openai", "timeout": 5},
        "workload": {"classes": classes},
        "phases": [{"name": "p", "duration": 1, "arrival": {"type": "constant", "rate": rate}}], **extra})


def _send(scenario, requests: list[Request]) -> list[Outcome]:
    async def main() -> list[Outcome]:
        client = make_client(scenario)
        await client.open()
        try:
            out = []
            for r in requests:
                r.intended_ns = time.perf_counter_ns()
                out.append(await client.send(r))
            return out
        finally:
            await client.close()

    return uvloop.run(main())


class _Values:
    """A Recorder that keeps every value as given (the histograms' own µs, before bucketing)."""

    def __init__(self) -> None:
        self.seen: dict[str, list[int]] = {}

    def record(self, metric: str, cls: str, value_us: int, warmup: bool = False) -> None:
        self.seen.setdefault(metric, []).append(value_us)


def _recorded(request: Request, outcome: Outcome) -> tuple[dict[str, list[int]], list[int]]:
    recorder = IntervalRecorder(["c0", "c1"])
    recorder.recorder = _Values()
    recorder.record(request, outcome)
    return recorder.recorder.seen, recorder.counters[(request.cls, False)]


def test_a_reasoning_stream_times_its_answer_apart_and_counts_both_kinds():
    log: list[dict] = []
    with serve(_app(log)) as url:
        scenario = _scenario(url, [{"name": "r", "model": "reason"}, {"name": "u", "model": "reason-usage"}])
        misses = []
        for _ in range(3):  # a shared box may hold one read back a few ms; a wrong stamp is off every time
            log.clear()
            requests = [Request(i, 0, cls, False, 4, 32, i) for i, cls in enumerate([0, 0, 1])]  # the first warms up
            _, plain, usage = _send(scenario, requests)
            for outcome in (plain, usage):
                assert outcome.error is None, outcome.reason
                assert len(outcome.token_ns) == R + C and outcome.reasoning_chunks == R
                assert outcome.content_ns == outcome.token_ns[R]  # the first content chunk's read
            span_ms = (plain.content_ns - plain.token_ns[0]) / MS
            writes = log[1]["writes"]
            server_span_ms = (writes[R] - writes[0]) / MS
            if abs(span_ms - R * GAP_MS) <= SPAN_TOLERANCE_MS and abs(span_ms - server_span_ms) <= 1.0:
                break
            misses.append(f"span {span_ms:.3f} ms, server's {server_span_ms:.3f} ms, scheduled {R * GAP_MS} ms")
        else:
            pytest.fail("\n".join(misses))
    # The metrics, as intervals.py records them from the intended time: ttfot = ttft + reasoning_time
    # (to the µs their floors allow), content_tpot over the C content tokens only.
    values, row = _recorded(requests[1], plain)
    (ttft,), (ttfot,), (reasoning,) = values["ttft"], values["ttfot"], values["reasoning_time"]
    assert ttfot - ttft - reasoning in (0, 1) and abs(reasoning / 1000 - R * GAP_MS) <= SPAN_TOLERANCE_MS
    assert values["content_tpot"] == [(plain.end_ns - plain.content_ns) // 1000 // (C - 1)]
    assert values["tpot"] == [(plain.end_ns - plain.token_ns[0]) // 1000 // (R + C - 1)]
    # No usage: reasoning tokens are the reasoning chunks counted; with usage, the server's count.
    assert (plain.output_tokens, plain.tokens_from_usage, plain.reasoning_tokens, plain.prompt_from_usage) == (R + C, False, -1, False)
    assert row[REASONING_TOKENS] == R and row[EMPTY] == 0
    assert (usage.output_tokens, usage.reasoning_tokens, usage.prompt_tokens, usage.prompt_from_usage) == (2 * R + C, 2 * R, 9, True)
    values, row = _recorded(requests[2], usage)
    assert row[REASONING_TOKENS] == 2 * R
    assert values["content_tpot"] == [(usage.end_ns - usage.content_ns) // 1000 // (C - 1)]  # 21 − 16 = 5 content tokens


@pytest.mark.parametrize("model, stream, from_usage", [("empty", True, True), ("empty-bare", True, False),
                                                        ("empty", False, True)])
def test_an_empty_answer_completes_with_zero_tokens_and_no_ttft(model, stream, from_usage):
    with serve(_app([])) as url:
        (outcome,) = _send(_scenario(url, [{"name": "e", "model": model, "openai": {"stream": stream}}]),
                           [Request(0, 0, 0, False, 4, 8)])
    assert outcome.error is None and outcome.status == 200, outcome.reason
    assert outcome.token_ns == ([] if stream else None) and outcome.content_ns == 0
    assert (outcome.output_tokens, outcome.tokens_from_usage) == (0, from_usage)
    values, row = _recorded(Request(0, outcome.sent_ns, 0, False, 4, 8), outcome)
    assert row[EMPTY] == 1 and row[REASONING_TOKENS] == 0
    assert not {"ttft", "ttfot", "tpot", "itl"} & values.keys() and values["latency"]


def _session_bodies(model: str, stream: bool, carry_reasoning: bool | None) -> list[dict]:
    """Two turns of one carried session; the bodies the server got."""
    session = {"turns": 2, "history": "carry"}
    if carry_reasoning is not None:
        session["carry_reasoning"] = carry_reasoning
    log: list[dict] = []
    with serve(_app(log)) as url:
        scenario = _scenario(url, [{"name": "s", "model": model, "openai": {"stream": stream}, "session": session}])
        conv = Conversation(0, 0, True, -1, 2, 0)
        outcomes = _send(scenario, [Request(t - 1, 0, 0, False, 3, 16, 0, turn=t, session=conv) for t in (1, 2)])
    assert all(o.error is None for o in outcomes), [o.reason for o in outcomes]
    return [entry["body"] for entry in log]


@pytest.mark.parametrize("model, stream, key, thought, answer", [
    ("reason", True, "reasoning_content", "".join(f" r{i}" for i in range(R)), "".join(f" w{i}" for i in range(C))),
    ("reasoning-field", True, "reasoning", "".join(f" r{i}" for i in range(R)), "".join(f" w{i}" for i in range(C))),
    ("reason", False, "reasoning_content", "whole thought", "whole answer"),
])
def test_a_carried_history_leaves_the_reasoning_out_unless_asked(model, stream, key, thought, answer):
    for carry, expected in ((None, {"role": "assistant", "content": answer}),
                            (False, {"role": "assistant", "content": answer}),
                            (True, {"role": "assistant", "content": answer, key: thought})):
        first, second = _session_bodies(model, stream, carry)
        assert len(first["messages"]) == 1
        user, assistant, user2 = second["messages"]
        assert user == first["messages"][0] and user2["role"] == "user"
        assert assistant == expected


def test_a_run_counts_reasoning_tokens_empty_answers_and_times_the_answer(tmp_path):
    """Through the worker, the collector, summary.json and timeseries.parquet."""
    with serve(_app([])) as url:
        scenario = _scenario(url, [{"name": "think", "model": "reason-usage"}, {"name": "empty", "model": "empty"},
                                   {"name": "whole", "model": "empty", "openai": {"stream": False}}],
                             rate=12, output={"dir": str(tmp_path / "results")})
        result = run_scenario(scenario, workers=1)
    s = result.summary
    done = {c: s["requests_by_class"][c]["completed"] for c in ("think", "empty", "whole")}
    assert all(done.values()) and s["requests"]["errors"] == 0, s["error_examples"]
    assert {c: s["requests_by_class"][c]["empty"] for c in done} == {"think": 0, "empty": done["empty"], "whole": done["whole"]}
    assert s["requests"]["empty"] == done["empty"] + done["whole"]
    assert s["tokens"]["think"]["reasoning_tokens"] == 2 * R * done["think"] == s["tokens"]["all"]["reasoning_tokens"]
    assert s["tokens"]["think"]["output_tokens"] == (2 * R + C) * done["think"]
    metrics = s["metrics"]
    for metric in ("ttft", "ttfot", "reasoning_time", "content_tpot"):
        assert metrics[metric]["think"]["count"] == done["think"] and "empty" not in metrics[metric]
    # Requests overlap here on one busy server thread, whose writes can only be late: the span is at
    # least the schedule's (less the delivery jitter), and the exact bar is the test above's.
    assert R * GAP_MS - SPAN_TOLERANCE_MS <= metrics["reasoning_time"]["think"]["min_ms"] < R * GAP_MS + 50
    ts = pq.read_table(result.run_dir / "timeseries.parquet").to_pandas()
    rows = ts[ts["metric"] == "latency"]  # one row per class and interval carries its counters
    assert rows.groupby("class")["empty"].sum().to_dict() == {"all": done["empty"] + done["whole"], **{c: s["requests_by_class"][c]["empty"] for c in done}}
    assert rows[rows["class"] == "think"]["reasoning_tokens"].sum() == 2 * R * done["think"]
    requests = pq.read_table(result.run_dir / "requests.parquet").to_pandas()
    think, empty = requests[requests["class"] == "think"], requests[requests["class"] != "think"]
    assert (think["reasoning_tokens"] == 2 * R).all()
    assert ((think["ttfot_us"] - think["ttft_us"]) / 1000 >= R * GAP_MS - SPAN_TOLERANCE_MS).all()
    assert (empty["output_tokens"] == 0).all() and empty["ttft_us"].isna().all() and empty["ttfot_us"].isna().all()

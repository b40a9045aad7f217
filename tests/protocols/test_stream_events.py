"""What the two typed-event clients share (latscope/protocols/stream_events.py): the event sink on its
own, byte by byte, and a whole run that speaks both protocols (one class each, and a session), through
the engine, intervals and summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from events_server import make_events_app, request, scenario, send
from helpers import build_tokenizer
from latscope.errors import ScenarioError
from latscope.protocols.anthropic_messages import MessagesStream
from latscope.protocols.openai_responses import ResponsesStream
from latscope.run import run_scenario
from latscope.scenario import scenario_from_dict
from latscope.workload import Payloads

from conftest import serve


def _event(kind: str, **fields) -> bytes:
    return b"event: %s\ndata: %s\n\n" % (kind.encode(), json.dumps({"type": kind, **fields}).encode())


def test_events_split_anywhere_are_stamped_by_the_read_that_completed_them():
    """Each piece is one socket read (its read time given): a delta is stamped by the read holding its
    last byte; events after the end are not read; `[DONE]` (which the API never sends) ends nothing. The
    answer's text is kept apart from the reasoning and a tool call's input (a session carries the text
    alone; a tokenizer counts them all)."""
    body = (_event("response.created", response={}) + _event("response.reasoning_text.delta", delta=" hm")
            + b"data: [DONE]\n\n" + _event("response.output_text.delta", delta=" Hi")
            + _event("response.output_text.delta", delta="") + _event("response.function_call_arguments.delta", delta="{")
            + _event("response.completed", response={"usage": {"output_tokens": 3}}) + b"data: {not json\n\n")
    cut = body.index(b"Hi") + 1  # the delta " Hi" ends 5 bytes later (i"}\n\n): in the third read
    stream = ResponsesStream(keep_text=True, keep_rest=True)
    for at, piece in enumerate((body[:40], body[40:cut], body[cut:cut + 5], body[cut + 5:])):
        stream(piece, 100 + at)
    stream.finish(200)
    assert stream.token_ns == [101, 102, 103] and stream.reasoning_chunks == 1 and stream.content_ns == 102
    assert stream.done and stream.error is None and stream.text == [" Hi"] and stream.rest == [" hm", "{"]
    assert stream.usage == {"output_tokens": 3}


def test_an_event_type_comes_from_the_data_before_the_event_line():
    """The data's `type` decides (a server that writes no `event:` line is read the same); `ping` and
    unknown events are nothing; message_start's output count is not taken as the answer's."""
    stream = MessagesStream()
    stream(b'event: ping\ndata: {"type":"content_block_delta","delta":{"type":"text_delta","text":"a"}}\n\n'
           + b'data: {"type":"message_start","message":{"usage":{"input_tokens":4,"output_tokens":1}}}\n\n'
           + _event("ping") + _event("content_block_delta", delta={"type": "citations_delta", "citation": {}})
           + _event("brand_new_event", delta={"type": "text_delta", "text": "x"}) + _event("message_stop"), 7)
    assert stream.token_ns == [7] and stream.done and stream.error is None
    assert stream.usage == {"input_tokens": 4}
    # An OpenAI-style error object without a type (as vLLM writes one mid-stream) is an error event.
    untyped = ResponsesStream()
    untyped(b'data: {"error": {"message": "out of memory", "code": 500}}\n\n', 8)
    assert untyped.error == "error event after 0 tokens: out of memory"


def test_an_incomplete_response_is_an_answer_and_a_failed_one_an_error():
    """`response.incomplete` (cut at max_output_tokens) ends the stream like `response.completed`, its usage
    taken; `response.failed` without an error object still says what happened."""
    cut = ResponsesStream()
    cut(_event("response.output_text.delta", delta="a") + _event(
        "response.incomplete", response={"status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"},
                                         "usage": {"output_tokens": 1}}), 5)
    assert cut.done and cut.error is None and cut.usage == {"output_tokens": 1} and cut.token_ns == [5]
    failed = ResponsesStream()
    failed(_event("response.failed", response={"status": "failed", "error": None}), 6)
    assert failed.error == "response failed after 0 tokens: (no message)" and not failed.done


def test_sessions_are_for_text_protocols_and_reasoning_is_carried_by_openai_alone():
    data = {"name": "s", "target": {"url": "http://127.0.0.1:9", "protocol": "anthropic-messages", "model": "m"},
            "workload": {"classes": [{"name": "c", "session": {"turns": 2, "carry_reasoning": True}}]},
            "phases": [{"name": "p", "duration": 1, "arrival": {"type": "constant", "rate": 1}}]}
    with pytest.raises(ScenarioError, match=r"workload\.classes\[0\]\.session\.carry_reasoning: anthropic-messages "
                                            r"cannot carry reasoning"):
        scenario_from_dict(data)
    data["workload"]["classes"][0]["session"]["carry_reasoning"] = False
    for protocol in ("anthropic-messages", "openai-responses"):
        data["target"]["protocol"] = protocol
        assert scenario_from_dict(data).workload.classes[0].session.turns.value == 2


@pytest.mark.parametrize("protocol, section", [("openai-responses", "openai"), ("anthropic-messages", "anthropic")])
def test_an_answer_without_usage_is_counted_by_the_tokenizer_or_by_its_chunks(tmp_path: Path, protocol, section):
    """No usage from the server: with workload.tokenizer the output is the tokenizer's count of everything
    generated (reasoning and answer), streamed or whole; without one, a stream's token chunks are counted."""
    tokenizer = build_tokenizer(tmp_path / "tokenizer.json")
    log: list[dict] = []
    with serve(make_events_app(log, ttft_ms=1, gap_ms=1, reasoning=3, content=5)) as url:
        classes = [{"name": f"{how}-{stream}", "model": "no-usage", section: {"stream": stream}}
                   for how in ("plain", "counted") for stream in (True, False)]
        plain = scenario(url, protocol, classes)
        counted = scenario(url, protocol, classes, {"tokenizer": {"file": str(tokenizer)}})
        outcomes = send(plain, [request(0, 0, 6, 8), request(1, 1, 6, 8)]) + send(
            counted, [request(2, 2, 6, 8), request(3, 3, 6, 8)])
    assert [o.error for o in outcomes] == [None] * 4, [o.reason for o in outcomes]
    assert not any(o.tokens_from_usage or o.prompt_from_usage for o in outcomes)
    streamed, whole, by_tokenizer = outcomes[0], outcomes[1], outcomes[2:]
    assert (streamed.output_tokens, streamed.output_by_tokenizer) == (8, False)  # the chunks
    assert (whole.output_tokens, whole.output_by_tokenizer) == (0, False)  # nothing said, nothing counted
    count = Payloads(counted).tokenizer.count
    for outcome, entry in zip(by_tokenizer, log[2:]):
        generated = " think0 think1 think2" + entry["answer"]
        assert (outcome.output_tokens, outcome.output_by_tokenizer) == (count(generated), True)
        assert count(generated) not in (0, 8)  # the test tells the tokenizer from the chunks


def test_a_run_speaks_both_protocols_with_reasoning_and_sessions(tmp_path: Path):
    """One class per protocol and an anthropic-messages session class of 3 turns, 1.2 s at 20 req/s, one
    worker: every request completes; each stream's 3 reasoning chunks and its answer give ttft, ttfot and
    reasoning_time for every request, the reasoning tokens from usage (Responses; Messages with thinking
    on) or counted (the session class); every session completes its 3 turns."""
    log: list[dict] = []
    classes = [{"name": "resp", "prompt_tokens": 6, "output_tokens": 8},
               {"name": "msg", "protocol": "anthropic-messages", "prompt_tokens": 6, "output_tokens": 8,
                "anthropic": {"extra_body": {"thinking": {"type": "enabled", "budget_tokens": 100}}}},
               {"name": "sess", "protocol": "anthropic-messages", "prompt_tokens": 4, "output_tokens": 5,
                "session": {"turns": 3}}]
    with serve(make_events_app(log, ttft_ms=5, gap_ms=2, reasoning=3, content=5)) as url:
        for cls in classes[1:]:
            cls["url"] = url
        scenario = scenario_from_dict({
            "name": "typed-events", "seed": 1, "target": {"url": url, "protocol": "openai-responses", "model": "m"},
            "workload": {"classes": classes}, "output": {"dir": str(tmp_path), "report": False},
            "phases": [{"name": "p", "duration": 1.2, "arrival": {"type": "constant", "rate": 20}}]})
        summary = run_scenario(scenario, workers=1).summary
    by_class = summary["requests_by_class"]
    assert summary["requests"]["errors"] == 0 and summary["error_examples"] == {}
    assert {e["path"] for e in log} == {"/v1/responses", "/v1/messages"}
    done = {name: by_class[name]["completed"] for name in ("resp", "msg", "sess")}
    assert all(done.values()) and sum(done.values()) == summary["requests"]["sent"] == len(log)
    metrics, tokens = summary["metrics"], summary["tokens"]
    for name, n in done.items():
        for metric in ("ttft", "ttfot", "reasoning_time", "content_tpot"):
            assert metrics[metric][name]["count"] == n, (metric, name)
        assert metrics["itl"][name]["count"] == n * ((8 if name != "sess" else 5) - 1)  # 3 reasoning + 5 or 2 content
        assert tokens[name]["reasoning_tokens"] == 3 * n and tokens[name]["output_count_source"] == "usage"
    assert tokens["resp"]["prompt_tokens"] == 6 * done["resp"] and tokens["msg"]["prompt_tokens"] == 6 * done["msg"]
    sessions = summary["sessions"]["sess"]
    assert sessions["completed"] == done["sess"] // 3 >= 1 and sessions["abandoned"] == 0

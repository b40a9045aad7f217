"""The openai-responses client (POST /v1/responses) against a loopback server that records every request
and the write time of every token event (events_server.py): the body field by field, token stamps
against the server's writes, reasoning and usage counts, each broken stream's reason, empty answers,
and sessions that carry their input."""

from __future__ import annotations

import json

import pytest

from events_server import MS, make_events_app, request, scenario, send, timing_miss, within
from latscope.records import Conversation

from conftest import serve

PROTOCOL = "openai-responses"


def test_request_bodies_and_headers_are_the_apis():
    log: list[dict] = []
    with serve(make_events_app(log, ttft_ms=1, gap_ms=1)) as url:
        classes = [{"name": "s", "model": "gpt-x", "prompt_tokens": 6, "output_tokens": 4},
                   {"name": "w", "openai": {"stream": False, "extra_body": {"temperature": 0, "store": False}},
                    "prompt_tokens": 7},
                   {"name": "own-max", "openai": {"extra_body": {"max_output_tokens": 9}}, "output_tokens": 4}]
        send(scenario(url, PROTOCOL, classes, api_key="sk-test", request_id_header="X-Request-Id"),
             [request(0, 0, 6, 4), request(1, 1, 7, 0), request(2, 2, 3, 4)])
    streamed, whole, own = (entry for entry in log)
    assert streamed["path"] == whole["path"] == "/v1/responses"
    assert streamed["headers"]["authorization"] == "Bearer sk-test"
    assert streamed["headers"]["content-type"] == "application/json" and streamed["headers"]["x-request-id"]
    prompt = streamed["body"].pop("input")
    assert isinstance(prompt, str) and len(prompt.split()) == 6
    assert streamed["body"] == {"model": "gpt-x", "max_output_tokens": 4, "stream": True}
    assert len(whole["body"].pop("input").split()) == 7
    # No planned answer length: max_output_tokens left out (the API's default applies).
    assert whole["body"] == {"model": "m", "stream": False, "temperature": 0, "store": False}
    own["body"].pop("input")
    assert own["body"] == {"model": "m", "stream": True, "max_output_tokens": 9}  # extra_body's, once


def test_stream_tokens_are_stamped_at_the_servers_writes_with_reasoning_and_usage():
    """3 reasoning deltas then 5 text deltas, the first 20 ms after the request, then one every 10 ms."""
    log: list[dict] = []
    with serve(make_events_app(log, ttft_ms=20, gap_ms=10, reasoning=3, content=5)) as url:
        scn = scenario(url, PROTOCOL, [{"name": "s", "prompt_tokens": 6, "output_tokens": 8}])

        def attempt() -> str | None:
            log.clear()
            (outcome,) = send(scn, [request(0, 0, 6, 8)])
            assert outcome.error is None and outcome.status == 200, outcome.reason
            writes = log[0]["writes"]
            assert [kind for kind, _ in writes] == ["reasoning"] * 3 + ["content"] * 5
            assert outcome.reasoning_chunks == 3 and outcome.content_ns == outcome.token_ns[3]
            assert (outcome.output_tokens, outcome.tokens_from_usage, outcome.reasoning_tokens) == (8, True, 3)
            assert (outcome.prompt_tokens, outcome.prompt_from_usage, outcome.cached_tokens) == (6, True, 2)
            assert outcome.replica == "events-1" and outcome.decode_ns > 0 and outcome.encode_ns > 0
            assert outcome.sent_ns < outcome.token_ns[0] and outcome.token_ns[-1] <= outcome.end_ns
            gaps = [(b - a) / MS for a, b in zip(outcome.token_ns, outcome.token_ns[1:])]
            assert all(g > 5 for g in gaps), gaps  # one event per read: no two stamped together
            return timing_miss(outcome, writes)

        within(3, attempt)


def test_whole_answer_takes_usage_and_text():
    log: list[dict] = []
    with serve(make_events_app(log, ttft_ms=1, gap_ms=1, reasoning=2, content=3)) as url:
        (outcome,) = send(scenario(url, PROTOCOL, [{"name": "w", "openai": {"stream": False}}]), [request(0, 0, 6, 5)])
    assert outcome.error is None and outcome.token_ns is None, outcome.reason
    assert (outcome.output_tokens, outcome.tokens_from_usage, outcome.reasoning_tokens) == (5, True, 2)
    assert (outcome.prompt_tokens, outcome.prompt_from_usage, outcome.cached_tokens) == (6, True, 2)
    assert outcome.content_ns == 0 and outcome.reasoning_chunks == 0 and outcome.decode_ns > 0


@pytest.mark.parametrize("model, stream, kind, reason", [
    ("bad-json", True, "protocol", "malformed SSE event after 4 tokens (not JSON): {not json"),
    ("not-object", True, "protocol", "malformed SSE event after 4 tokens (not a JSON object): [1, 2]"),
    ("no-type", True, "protocol", 'malformed SSE event after 4 tokens (no event type): {"delta": " x"}'),
    ("bad-delta", True, "protocol", "malformed SSE event after 4 tokens (response.output_text.delta without a text delta)"),
    ("bad-end", True, "protocol", "malformed SSE event after 4 tokens (response.completed without a response object)"),
    ("error", True, "protocol", "error event after 4 tokens: The server had an error"),
    ("failed", True, "protocol", "response failed after 4 tokens: the model crashed"),
    ("no-end", True, "protocol", "stream ended without response.completed after 8 tokens"),
    ("truncate", True, "protocol", "stream truncated after 2 tokens: connection lost"),
    ("json-200", True, "protocol", "stream asked for, got Content-Type application/json"),
    ("http-400", True, "http_4xx", "HTTP 400 Bad Request: max_output_tokens: too large"),
    ("http-400", False, "http_4xx", "HTTP 400 Bad Request: max_output_tokens: too large"),
    ("failed", False, "protocol", "response failed: the model crashed"),
    ("bad-end", False, "protocol", "response has no output list"),
])
def test_each_broken_answer_is_an_error_that_says_why(model, stream, kind, reason):
    with serve(make_events_app([], ttft_ms=1, gap_ms=1)) as url:
        (outcome,) = send(scenario(url, PROTOCOL, [{"name": "c", "model": model, "openai": {"stream": stream}}]),
                          [request(0, 0, 6, 8)])
    assert outcome.error == kind and reason in outcome.reason, outcome.reason
    assert len(outcome.reason) < 300


@pytest.mark.parametrize("stream", [True, False])
def test_an_empty_answer_completes_with_no_tokens(stream):
    with serve(make_events_app([], ttft_ms=1, gap_ms=1)) as url:
        (outcome,) = send(scenario(url, PROTOCOL, [{"name": "c", "model": "empty", "openai": {"stream": stream}}]),
                          [request(0)])
    assert outcome.error is None, outcome.reason
    assert (outcome.output_tokens, outcome.tokens_from_usage) == (0, True)
    assert outcome.token_ns == ([] if stream else None) and outcome.content_ns == 0


@pytest.mark.parametrize("stream", [True, False])
def test_a_session_carries_its_input(stream):
    """Turn k sends the shared prefix as `instructions`, then every earlier turn and the answer the server
    gave to it (reasoning left out), then its own text: the server sees its own answers come back."""
    log: list[dict] = []
    session = {"turns": 3, "shared_prefix": {"tokens": 4}}
    with serve(make_events_app(log, ttft_ms=1, gap_ms=1, reasoning=2, content=3)) as url:
        scn = scenario(url, PROTOCOL, [{"name": "c", "prompt_tokens": 5, "output_tokens": 5, "session": session,
                                        "openai": {"stream": stream}}])
        conv = Conversation(0, 0, True, 0, 3, 0)
        outcomes = send(scn, [request(k - 1, 0, 5, 5, turn=k, session=conv) for k in (1, 2, 3)])
    assert all(o.error is None for o in outcomes), [o.reason for o in outcomes]
    bodies = [entry["body"] for entry in log]
    instructions = bodies[0]["instructions"]
    assert len(instructions.split()) == 4 and all(b["instructions"] == instructions for b in bodies)
    users = [b["input"][-1]["content"] for b in bodies]
    assert all(len(u.split()) == 5 for u in users) and len(set(users)) == 3
    assert bodies[2]["input"] == [{"role": "user", "content": users[0]}, {"role": "assistant", "content": log[0]["answer"]},
                                  {"role": "user", "content": users[1]}, {"role": "assistant", "content": log[1]["answer"]},
                                  {"role": "user", "content": users[2]}]
    assert bodies[1]["input"] == bodies[2]["input"][:3] and "think" not in str(bodies[2]["input"])
    assert all(b["max_output_tokens"] == 5 and b["stream"] is stream and b["model"] == "m" for b in bodies)
    assert set(bodies[2]) == {"model", "instructions", "input", "max_output_tokens", "stream"}
    # What chat.py bounds (session.max_history_bytes): the history's bytes as sent, the last answer not kept.
    compact = {"separators": (",", ":"), "ensure_ascii": False}
    assert conv.carried == (len(b'"instructions":,') + len(json.dumps(instructions, **compact).encode())
                            + len(json.dumps(bodies[2]["input"], **compact).encode()) - 2)


@pytest.mark.parametrize("stream", [True, False])
def test_the_official_client_sends_the_same_body_and_reads_the_same_answer(stream):
    """OpenAI's own `openai` library, asked for the same request, sends exactly latscope's body, and reads
    this server's answer (its events, in OpenAI's order) to the same text and usage latscope counted."""
    openai = pytest.importorskip("openai")  # a dev dependency; imported here, where it is used (seconds)
    log: list[dict] = []
    with serve(make_events_app(log, ttft_ms=1, gap_ms=1, reasoning=2, content=4)) as url:
        (outcome,) = send(scenario(url, PROTOCOL, [{"name": "c", "openai": {"stream": stream}}]), [request(0, 0, 6, 6)])
        ours = log[-1]["body"]
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-test", max_retries=0)
        if stream:
            with client.responses.stream(model="m", input=ours["input"], max_output_tokens=6) as events:
                deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
                answer = events.get_final_response()
            assert "".join(deltas) == answer.output_text
        else:
            answer = client.responses.create(model="m", input=ours["input"], max_output_tokens=6, stream=False)
    assert log[-1]["body"] == ours
    assert outcome.error is None and answer.output_text == log[0]["answer"].replace("r1", "r2")
    usage = answer.usage
    assert (outcome.output_tokens, outcome.prompt_tokens) == (usage.output_tokens, usage.input_tokens) == (6, 6)
    assert (outcome.reasoning_tokens, outcome.cached_tokens) == (usage.output_tokens_details.reasoning_tokens,
                                                                 usage.input_tokens_details.cached_tokens) == (2, 2)

"""The openai-responses client (POST /v1/responses) against a loopback server that records every request
and the write time of every token event (events_server.py): the body field by field, token stamps
against the server's writes, reasoning and usage counts, each broken stream's reason, empty answers,
and sessions that carry their input."""

from __future__ import annotations

import json

import pytest

from events_server import AnswersAlike, check_carried, check_stamped_stream, one_answer, session_of_three
from events_server import make_events_app, request, requests_seen, scenario, send

from conftest import serve

PROTOCOL = "openai-responses"


def test_request_bodies_and_headers_are_the_apis():
    classes = [{"name": "s", "model": "gpt-x", "prompt_tokens": 6, "output_tokens": 4},
               {"name": "w", "openai": {"stream": False, "extra_body": {"temperature": 0, "store": False}},
                "prompt_tokens": 7},
               {"name": "own-max", "openai": {"extra_body": {"max_output_tokens": 9}}, "output_tokens": 4}]
    streamed, whole, own = requests_seen(PROTOCOL, classes, [request(0, 0, 6, 4), request(1, 1, 7, 0), request(2, 2, 3, 4)],
                                         api_key="sk-test", request_id_header="X-Request-Id")
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
    check_stamped_stream(PROTOCOL)


def test_whole_answer_takes_usage_and_text():
    outcome = one_answer(PROTOCOL, {"name": "w", "openai": {"stream": False}}, request(0, 0, 6, 5),
                         reasoning=2, content=3)
    assert outcome.error is None and outcome.token_ns is None, outcome.reason
    assert (outcome.output_tokens, outcome.tokens_from_usage, outcome.reasoning_tokens) == (5, True, 2)
    assert (outcome.prompt_tokens, outcome.prompt_from_usage, outcome.cached_tokens) == (6, True, 2)
    assert outcome.content_ns == 0 and outcome.reasoning_chunks == 0 and outcome.decode_ns > 0




class TestAnswersAlike(AnswersAlike):
    """Each broken answer (events_server.BROKEN) an error that says why; an empty answer completes with no tokens."""

    PROTOCOL = PROTOCOL


@pytest.mark.parametrize("stream", [True, False])
def test_a_session_carries_its_input(stream):
    """Turn k sends the shared prefix as `instructions`, then every earlier turn and the answer the server
    gave to it (reasoning left out), then its own text: the server sees its own answers come back."""
    log, conv = session_of_three(PROTOCOL, stream)
    bodies, instructions = check_carried(log, "instructions", "input")
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

"""The anthropic-messages client (POST /v1/messages) against a loopback server that records every request
and the write time of every token event (events_server.py): headers and body field by field, token
stamps against the server's writes, thinking deltas and usage counts, each broken stream's reason, empty
answers, and sessions that carry their messages."""

from __future__ import annotations

import pytest

from events_server import AnswersAlike, check_carried, check_stamped_stream, one_answer, session_of_three
from events_server import make_events_app, request, requests_seen, scenario, send
from latscope.records import Conversation

from conftest import serve

PROTOCOL = "anthropic-messages"


def test_request_headers_and_bodies_are_the_apis():
    classes = [{"name": "s", "model": "claude-x", "prompt_tokens": 6, "output_tokens": 4},
               {"name": "w", "prompt_tokens": 7,
                "anthropic": {"stream": False, "max_tokens": 77, "version": "2024-01-01",
                              "extra_body": {"thinking": {"type": "enabled", "budget_tokens": 64}}}},
               {"name": "default-max", "prompt_tokens": 3},
               {"name": "own-headers", "headers": {"anthropic-version": "2099-01-01", "X-Api-Key": "sk-own"}}]
    log = requests_seen(PROTOCOL, classes, [request(0, 0, 6, 4), request(1, 1, 7, 0), request(2, 2, 3, 0),
                                            request(3, 3, 2, 2)], api_key="sk-test")
    streamed, whole, default, own = log
    assert {e["path"] for e in log} == {"/v1/messages"}
    headers = streamed["headers"]
    assert headers["anthropic-version"] == "2023-06-01" and headers["x-api-key"] == "sk-test"
    assert headers["content-type"] == "application/json" and "authorization" not in headers
    assert whole["headers"]["anthropic-version"] == "2024-01-01"
    assert own["headers"]["anthropic-version"] == "2099-01-01" and own["headers"]["x-api-key"] == "sk-own"
    (message,) = streamed["body"].pop("messages")
    assert message["role"] == "user" and len(message["content"].split()) == 6 and set(message) == {"role", "content"}
    assert streamed["body"] == {"model": "claude-x", "max_tokens": 4, "stream": True}
    assert len(whole["body"].pop("messages")[0]["content"].split()) == 7
    # No planned answer length: anthropic.max_tokens (the API requires one), 1024 unless given.
    assert whole["body"] == {"model": "m", "max_tokens": 77, "stream": False,
                             "thinking": {"type": "enabled", "budget_tokens": 64}}
    default["body"].pop("messages")
    assert default["body"] == {"model": "m", "max_tokens": 1024, "stream": True}


def test_stream_tokens_are_stamped_at_the_servers_writes_with_thinking_and_usage():
    """3 thinking deltas then 5 text deltas, the first 20 ms after the request, then one every 10 ms;
    ping, block starts and stops, a signature delta between them: no tokens. The output count is
    message_delta's (thinking included) with its thinking count; the prompt's 6 words are input_tokens 3 +
    cache_creation 1 + cache_read 2."""
    check_stamped_stream(PROTOCOL, {"extra_body": {"thinking": {"type": "enabled", "budget_tokens": 1024}}})


def test_whole_answer_takes_usage_and_text():
    outcome = one_answer(PROTOCOL, {"name": "w", "anthropic": {"stream": False}}, request(0, 0, 6, 5),
                         reasoning=2, content=3)
    assert outcome.error is None and outcome.token_ns is None, outcome.reason
    # Thinking not asked for: the server says no thinking count (its thinking block is still left out of the text).
    assert (outcome.output_tokens, outcome.tokens_from_usage, outcome.reasoning_tokens) == (5, True, -1)
    assert (outcome.prompt_tokens, outcome.prompt_from_usage, outcome.cached_tokens) == (6, True, 2)
    assert outcome.content_ns == 0 and outcome.reasoning_chunks == 0




class TestAnswersAlike(AnswersAlike):
    """Each broken answer (events_server.BROKEN) an error that says why; an empty answer completes with no tokens."""

    PROTOCOL = PROTOCOL


@pytest.mark.parametrize("stream", [True, False])
def test_a_session_carries_its_messages(stream):
    """Turn k sends the shared prefix as `system`, then every earlier turn and the answer the server gave
    to it (thinking left out), then its own text."""
    log, _ = session_of_three(PROTOCOL, stream)
    bodies, _ = check_carried(log, "system", "messages")
    assert set(bodies[2]) == {"model", "system", "messages", "max_tokens", "stream"}


def test_an_empty_answer_is_not_carried():
    """The API refuses an assistant message without content: a session goes on with the user turns alone."""
    log: list[dict] = []
    with serve(make_events_app(log, ttft_ms=1, gap_ms=1)) as url:
        scn = scenario(url, PROTOCOL, [{"name": "c", "model": "empty", "session": {"turns": 2}}])
        conv = Conversation(0, 0, True, -1, 2, 0)
        outcomes = send(scn, [request(k - 1, 0, 5, 3, turn=k, session=conv) for k in (1, 2)])
    assert [o.error for o in outcomes] == [None, None]
    first, second = (entry["body"]["messages"] for entry in log)
    assert "system" not in log[1]["body"]
    assert second == [first[0], {"role": "user", "content": second[1]["content"]}] and len(second) == 2


@pytest.mark.parametrize("stream", [True, False])
def test_the_official_client_sends_the_same_request_and_reads_the_same_answer(stream):
    """Anthropic's own `anthropic` library, asked for the same request, sends exactly latscope's body and
    API headers, and reads this server's answer (its events, in Anthropic's order) to the same text and
    usage latscope counted."""
    anthropic = pytest.importorskip("anthropic")  # a dev dependency; imported here, where it is used (seconds)
    log: list[dict] = []
    with serve(make_events_app(log, ttft_ms=1, gap_ms=1, reasoning=2, content=4)) as url:
        (outcome,) = send(scenario(url, PROTOCOL, [{"name": "c", "anthropic": {"stream": stream}}], api_key="sk-test"),
                          [request(0, 0, 6, 6)])
        ours = log[-1]
        client = anthropic.Anthropic(base_url=url, api_key="sk-test", max_retries=0)
        args = {"model": "m", "max_tokens": 6, "messages": ours["body"]["messages"]}
        if stream:
            with client.messages.stream(**args) as events:
                deltas = [e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta"]
                answer = events.get_final_message()
        else:
            answer = client.messages.create(**args)
    theirs = log[-1]
    # The library leaves out `"stream": false` (the API's default), sends the newest API version it knows
    # and (this version of it) the key as a Bearer token; latscope sends 2023-06-01, which every
    # Anthropic-compatible server takes, and the key in x-api-key, as the API's reference documents.
    assert theirs["body"] == {k: v for k, v in ours["body"].items() if k != "stream" or stream}
    assert ours["headers"]["anthropic-version"] == "2023-06-01" and theirs["headers"]["anthropic-version"]
    assert ours["headers"]["x-api-key"] == "sk-test" and theirs["headers"]["content-type"] == ours["headers"]["content-type"]
    text = "".join(block.text for block in answer.content if block.type == "text")
    assert outcome.error is None and text == log[0]["answer"].replace("r1", "r2")
    assert not stream or "".join(deltas) == text
    usage = answer.usage
    prompt = usage.input_tokens + usage.cache_creation_input_tokens + usage.cache_read_input_tokens
    assert (outcome.output_tokens, outcome.prompt_tokens, outcome.cached_tokens) == (
        usage.output_tokens, prompt, usage.cache_read_input_tokens) == (6, 6, 2)

"""The OpenAI-compatible endpoint of the reference server, as a real process, checked with the official
`openai` package (and a raw HTTP client where the wire format or the timing is the point): completions
and chat, streaming and not, usage counts, prefill cost, continuous batching, bad input, overload."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import aiohttp
import pytest

import refserver
from refserver import http, metric, post_json, running_server, scrape, server_timing_ms

openai = pytest.importorskip("openai")

MODEL = "decoder"

# The shared module-scoped fixtures (refserver.py), bound here so that pytest finds them by name.
cache, logs = refserver.cache, refserver.logs


def words(n: int, salt: str = "w") -> str:
    """A prompt of exactly n tokens under the server's toy tokenizer (one token per word)."""
    return " ".join(f"{salt}{i}" for i in range(n))


@contextmanager
def running(cache: Path, logs: Path, *flags: str) -> Iterator[str]:
    """Start the server on port 0, wait for its 'ready http://...' stdout line; SIGTERM must exit 0."""
    with running_server(logs, "--http-port", "0", "--layers", "2", "--decoder-layers", "2", "--cache-dir", str(cache),
                        *flags) as server:
        yield server.url


async def sse_stream(session: aiohttp.ClientSession, url: str, prompt: str, max_tokens: int,
                     started: float | None = None, times: list[float] | None = None) -> dict:
    """One streamed completion with a raw client: times (perf_counter) of the first and last content chunk.
    `times`, when given, receives the arrival time of every content chunk as it comes."""
    started = time.perf_counter() if started is None else started
    times = [] if times is None else times
    texts = []
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": True}
    async with session.post(f"{url}/v1/completions", json=body) as response:
        assert response.status == 200, await response.text()
        async for raw in response.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            text = json.loads(line[6:])["choices"][0]["text"]
            if text:
                times.append(time.perf_counter())
                texts.append(text)
    return {"started": started, "first": times[0], "last": times[-1], "tokens": len(texts), "text": "".join(texts)}


@pytest.fixture(scope="module")
def server(cache, logs) -> Iterator[str]:
    with running(cache, logs, "--max-body-bytes", "65536", "--max-tokens-limit", "400") as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=f"{server}/v1", api_key="x", max_retries=0, timeout=60) as c:
        yield c


# --- the OpenAI protocol, through the official client ------------------------------------------------

def test_models_lists_the_decoder(client):
    assert [m.id for m in client.models.list()] == [MODEL]


def test_completion_streamed_equals_non_streamed_and_usage_counts_tokens(client):
    prompt = "the quick brown fox jumps over the lazy dog"
    answer = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12)
    (choice,) = answer.choices
    assert answer.object == "text_completion" and answer.model == MODEL and choice.finish_reason == "length"
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens, answer.usage.total_tokens) == (9, 12, 21)
    assert len(choice.text.split()) == 12 and choice.text.startswith(" ")
    assert client.completions.create(model=MODEL, prompt=prompt, max_tokens=12).choices[0].text == choice.text

    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, stream=True,
                                            stream_options={"include_usage": True}))
    content = [c for c in chunks if c.choices and c.choices[0].text]
    usage = [c.usage for c in chunks if c.usage]
    assert len(usage) == 1 and not chunks[-1].choices and chunks[-1].usage is usage[0]
    assert usage[0].completion_tokens == len(content) == 12 and usage[0].prompt_tokens == 9
    assert "".join(c.choices[0].text for c in content) == choice.text
    assert content[-1].choices[0].finish_reason == "length"
    assert all(c.choices[0].finish_reason is None for c in content[:-1])

    # A prompt of token ids counts one token per id; a shorter answer is the longer one's prefix (greedy).
    ids = client.completions.create(model=MODEL, prompt=[5, 6, 7, 8], max_tokens=3)
    assert ids.usage.prompt_tokens == 4 and ids.usage.completion_tokens == 3
    longer = client.completions.create(model=MODEL, prompt=[5, 6, 7, 8], max_tokens=6).choices[0].text
    assert longer.startswith(ids.choices[0].text)


def test_chat_streamed_equals_non_streamed(client):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
    answer = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10)
    (choice,) = answer.choices
    assert answer.object == "chat.completion" and choice.message.role == "assistant"
    assert choice.finish_reason == "length" and len(choice.message.content.split()) == 10
    assert answer.usage.prompt_tokens == len("system: be brief user: hello there assistant:".split())
    assert answer.usage.completion_tokens == 10

    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[0].object == "chat.completion.chunk" and chunks[0].choices[0].delta.role == "assistant"
    assert not chunks[0].choices[0].delta.content
    content = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert "".join(content) == choice.message.content
    assert len(content) == chunks[-1].usage.completion_tokens == 10

    # Without include_usage there is no usage chunk; every chunk has a choice.
    plain = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, stream=True))
    assert all(c.choices and c.usage is None for c in plain) and len(plain) == 5  # role chunk + 4 tokens


def test_errors_are_openai_shaped_and_the_server_stays_healthy(server, client):
    with pytest.raises(openai.NotFoundError) as not_found:
        client.completions.create(model="gpt-4", prompt="hi")
    assert not_found.value.body["code"] == "model_not_found" and "decoder" in not_found.value.body["message"]
    cases = [
        {"model": MODEL, "prompt": None},  # no prompt
        {"model": MODEL, "prompt": "hi", "max_tokens": 0},
        {"model": MODEL, "prompt": "hi", "max_tokens": "ten"},
        {"model": MODEL, "prompt": "hi", "max_tokens": 401},  # over --max-tokens-limit
        {"model": MODEL, "prompt": words(1000), "max_tokens": 100},  # over the 1024-token context
        {"model": MODEL, "prompt": "", "max_tokens": 4},
        {"model": MODEL, "prompt": [1, 99999]},  # id outside the vocabulary
        {"model": MODEL, "prompt": ["one", "two"]},  # several prompts
        {"model": MODEL, "prompt": "hi", "n": 2},
        {"model": MODEL, "prompt": "hi", "stream": "yes"},
    ]
    for body in cases:
        with pytest.raises(openai.BadRequestError) as bad:
            client.completions.create(**body)
        assert bad.value.status_code == 400 and bad.value.body["message"], body
    with pytest.raises(openai.BadRequestError) as context:
        client.completions.create(model=MODEL, prompt=words(1000), max_tokens=100)
    assert context.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=[], max_tokens=4)

    for path, body in [("completions", b"{not json"), ("completions", b"[" * 20000 + b"]" * 20000),
                       ("chat/completions", b"[1, 2]"),
                       ("chat/completions", json.dumps({"model": MODEL, "prompt": "no messages"}).encode())]:
        status, headers, raw = http("POST", f"{server}/v1/{path}", body, {"Content-Type": "application/json"})
        error = json.loads(raw)["error"]
        assert status == 400 and error["type"] == "invalid_request_error" and error["message"], raw
        assert headers["X-Replica-Id"]
    status, _, raw = post_json(f"{server}/v1/completions", {"model": MODEL, "prompt": "x " * 40000})
    assert status == 413 and json.loads(raw)["error"]["message"]  # --max-body-bytes 65536

    assert http("GET", f"{server}/v2/health/ready")[0] == 200
    assert client.completions.create(model=MODEL, prompt="still fine", max_tokens=2).usage.completion_tokens == 2


# --- the wire format and the timing headers --------------------------------------------------------------

def test_sse_wire_format_and_server_timing(server):
    doc = {"model": MODEL, "prompt": words(30), "max_tokens": 5}
    status, headers, raw = post_json(f"{server}/v1/completions", doc)
    assert status == 200 and headers["Content-Type"].startswith("application/json") and headers["X-Replica-Id"]
    timing = server_timing_ms(headers["Server-Timing"])
    assert set(timing) == {"deser", "queue", "prefill", "decode", "ser"}
    assert timing["prefill"] > 0 and timing["decode"] > 0 and all(v >= 0 for v in timing.values())

    started = time.perf_counter()
    status, headers, raw = post_json(f"{server}/v1/completions",
                                     {**doc, "stream": True, "stream_options": {"include_usage": True}})
    total_ms = (time.perf_counter() - started) * 1000
    assert status == 200 and headers["Content-Type"] == "text/event-stream" and headers["X-Replica-Id"]
    timing = server_timing_ms(headers["Server-Timing"])
    assert set(timing) == {"deser", "queue", "prefill"} and sum(timing.values()) <= total_ms
    events = raw.decode().split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    assert all(e.startswith("data: {") for e in events[:-2])
    chunks = [json.loads(e[6:]) for e in events[:-2]]
    assert [len(c["choices"]) for c in chunks] == [1] * 5 + [0]
    # The same 30-token prompt a second time: its first full block (16 tokens) came from the prefix cache.
    assert chunks[-1]["usage"] == {"prompt_tokens": 30, "completion_tokens": 5, "total_tokens": 35,
                                   "prompt_tokens_details": {"cached_tokens": 16}}
    assert len({c["id"] for c in chunks}) == 1


def test_metrics(server, client):
    before = metric(scrape(server), "latscope_ref_generated_tokens_total")
    client.completions.create(model=MODEL, prompt="count me", max_tokens=7)
    assert metric(scrape(server), "latscope_ref_generated_tokens_total") - before == 7
    for name in ("latscope_ref_generation_requests_total", "latscope_ref_time_to_first_token_seconds_count",
                 "latscope_ref_decode_batch_size_count", "latscope_ref_prefill_duration_seconds_count"):
        assert metric(scrape(server), name) > 0, name
    assert metric(scrape(server), "latscope_ref_active_sequences") == 0
    assert metric(scrape(server), "latscope_ref_waiting_sequences") == 0


# --- costs: prefill grows with the prompt, decode steps are shared ---------------------------------------

def test_longer_prompts_take_longer_to_first_token(server):
    async def main():
        ttft: dict[int, list[float]] = {20: [], 600: []}
        prefill: dict[int, list[float]] = {20: [], 600: []}
        async with aiohttp.ClientSession() as session:
            for i in range(5):
                for n in (20, 600):
                    s = await sse_stream(session, server, words(n, f"p{i}x"), 1)
                    ttft[n].append(s["first"] - s["started"])
                    async with session.post(f"{server}/v1/completions",  # a new prompt: no prefix cached
                                            json={"model": MODEL, "prompt": words(n, f"q{i}x"), "max_tokens": 1}) as r:
                        prefill[n].append(server_timing_ms(r.headers["Server-Timing"])["prefill"])
        return ttft, prefill

    ttft, prefill = asyncio.run(main())
    short, long = statistics.median(ttft[20]), statistics.median(ttft[600])
    assert long > 2 * short, (ttft, prefill)
    assert statistics.median(prefill[600]) > 5 * statistics.median(prefill[20]), prefill


def test_concurrent_streams_share_decode_steps(server):
    async def main():
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            alone = []
            for i in range(3):
                s = await sse_stream(session, server, words(10, f"a{i}x"), 32)
                assert s["tokens"] == 32
                alone.append(s["last"] - s["started"])
            started = time.perf_counter()
            together = await asyncio.gather(*(sse_stream(session, server, words(10, f"c{i}x"), 32, started)
                                              for i in range(8)))
            return statistics.median(alone), max(s["last"] for s in together) - started, together

    steps_before = metric(scrape(server), "latscope_ref_decode_batch_size_count")
    rows_before = metric(scrape(server), "latscope_ref_decode_batch_size_sum")
    alone, together, streams = asyncio.run(main())
    assert all(s["tokens"] == 32 for s in streams)
    assert together < 0.7 * 8 * alone, (alone, together)
    steps = metric(scrape(server), "latscope_ref_decode_batch_size_count") - steps_before
    rows = metric(scrape(server), "latscope_ref_decode_batch_size_sum") - rows_before
    assert rows == 3 * 31 + 8 * 31  # one token per sequence per step (the first comes from the prefill)
    assert steps < 3 * 31 + 8 * 31 / 2, steps  # the 8 shared most of their steps


def test_a_new_request_joins_while_others_decode(server):
    async def main():
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            seen: list[list[float]] = [[] for _ in range(4)]
            long = [asyncio.create_task(sse_stream(session, server, words(10, f"l{i}x"), 300, times=seen[i]))
                    for i in range(4)]
            while min(map(len, seen)) < 5:  # all four are decoding
                await asyncio.sleep(0.002)
            late = await sse_stream(session, server, words(10, "late"), 4)
            return late, await asyncio.gather(*long)

    late, long = asyncio.run(main())
    assert all(s["tokens"] == 300 for s in long) and late["tokens"] == 4
    assert late["first"] < late["last"] < min(s["last"] for s in long)
    assert late["started"] > max(s["first"] for s in long)  # it really arrived while the others were decoding


# --- bounds: overload, client disconnects, --no-generator --------------------------------------------------

def test_overload_gets_429_and_a_disconnect_frees_the_slot(cache, logs):
    with running(cache, logs, "--max-sequences", "1", "--max-queue", "1", "--max-tokens-limit", "1000") as url:
        with openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=60) as client:
            stream = client.completions.create(model=MODEL, prompt="hold the slot", max_tokens=1000, stream=True)
            next(iter(stream))  # decoding now: the only sequence slot is taken

            async def fill_and_overflow():
                async with aiohttp.ClientSession() as session:
                    waiting = asyncio.create_task(sse_stream(session, url, "waits its turn", 3))
                    while metric(scrape(url), "latscope_ref_waiting_sequences") < 1:
                        await asyncio.sleep(0.005)
                    async with session.post(f"{url}/v1/completions",
                                            json={"model": MODEL, "prompt": "one too many", "max_tokens": 3}) as r:
                        refused = r.status, r.headers.get("Retry-After"), await r.json()
                    stream.close()  # the client of the long stream goes away: its slot goes to the waiting one
                    return refused, await asyncio.wait_for(waiting, 30)

            (status, retry_after, body), waited = asyncio.run(fill_and_overflow())
            assert status == 429 and retry_after == "1" and body["error"]["code"] == "rate_limit_exceeded"
            assert waited["tokens"] == 3
            # The abandoned sequence was cancelled long before its 1000 tokens (plus 3 for the waiting one).
            assert metric(scrape(url), "latscope_ref_generated_tokens_total") < 1000
            assert metric(scrape(url), "latscope_ref_active_sequences") == 0
            assert client.completions.create(model=MODEL, prompt="after", max_tokens=2).usage.completion_tokens == 2


def test_no_generator_serves_only_the_encoder(cache, logs):
    with running(cache, logs, "--no-generator") as url:
        status, _, body = post_json(f"{url}/v1/completions", {"model": MODEL, "prompt": "hi"})
        assert status == 404 and "error" in json.loads(body)
        assert http("GET", f"{url}/v2/health/ready")[0] == 200

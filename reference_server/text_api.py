"""What the text-generation front ends share: openai_api.py (completions, chat), responses_api.py (OpenAI's
Responses) and messages_api.py (Anthropic's Messages), all over the one decoder and its generator.

- **Toy tokenizer** (nothing downloaded): a prompt string is one token per whitespace-separated word (the
  word's CRC-32 modulo the vocabulary); every generated token renders as a space and one pseudo-word.
- **Models**: the decoder answers to `--generator-name`; each `--adapter NAME=FACTOR` is one more model name
  over the same decoder, whose sequences cost FACTOR model runs per token (generation.py, cost factors) and
  keep their own prefix-cache blocks (keys salted with the name). Any other name: 404 in the API's shape.
- **Reasoning**: an answer is exactly max_tokens tokens (greedy, no end-of-sequence token); its first R are
  reasoning, R = the request's count (each API says how it asks) else `--reasoning-tokens`, at most
  max_tokens. Reasoning tokens count toward max_tokens and the output count of usage, as OpenAI, Anthropic
  and vLLM count them; R >= max_tokens leaves an answer with reasoning only and no text.
- **Errors**: `ApiError` (api_error.py) carries the status and OpenAI's fields; `response()` is OpenAI's shape
  `{"error": {"message", "type", "param", "code"}}`, a front end may render it in its own (Anthropic's).
- **Serving one request** (`TextRoutes.handle`): read the body (bounded: 413 past `--max-body-bytes`), parse
  it (the front end's `parse`, into a `TextRequest`), submit it (429 + Retry-After when the queue is full),
  then a whole answer (`complete`: every token, then the front end's `answer` document as JSON) or the front
  end's `stream`; the helpers `collect` and `stream_tokens` read the tokens, drop the sequence when the client
  goes away and end a stream with the API's error event when the model fails after the headers went out.
  Server-Timing as openai_api.py describes it.
"""

from __future__ import annotations

import json
import random
import re
import time
import zlib
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Callable

from aiohttp import web

from reference_server.api_error import ApiError
from reference_server.batcher import Overloaded
from reference_server.client_errors import BodyTooLarge, BodyUnreadable, read_body
from reference_server.generation import ContextTooLong, Generation, GenerationFailed, Generator, Token
from reference_server.metrics import Metrics
from reference_server.tools import Tool

RETRY_AFTER_S = 1
DEFAULT_MAX_TOKENS = 16
STATUS_CLIENT_GONE = 499  # the client closed the connection before the answer was ready (nginx's convention)
TOOL_CALL_SEED = 0  # of the routes' Random that decides tool call or text (the server has no --seed)
_WORD = re.compile(r"\S+")
_SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"][:64]


# --- the toy tokenizer ---------------------------------------------------------------------------------

def encode(text: str, vocab: int) -> list[int]:
    """One token per whitespace-separated word, the word's CRC-32 modulo the vocabulary."""
    return [zlib.crc32(word.encode()) % vocab for word in _WORD.findall(text)]


def render(token_id: int) -> str:
    """A token as text: a space and a pseudo-word, one syllable per base-64 digit of the id."""
    syllables = [_SYLLABLES[token_id % 64]]
    token_id //= 64
    while token_id:
        syllables.append(_SYLLABLES[token_id % 64])
        token_id //= 64
    return " " + "".join(syllables)


def chat_prompt(messages: list[dict[str, Any]]) -> str:
    """The chat transcript the decoder continues: 'role: content' lines, then 'assistant:'."""
    return "\n".join([*(f"{m['role']}: {m['content']}" for m in messages), "assistant:"])


# --- errors, models, limits ----------------------------------------------------------------------------

def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class TextModels:
    """The model names the generation APIs answer to: the decoder, then its adapters (name -> cost factor)."""

    base: str
    adapters: dict[str, float] = field(default_factory=dict)

    def names(self) -> list[str]:
        return [self.base, *self.adapters]

    def factor(self, name: Any) -> float:
        """The cost factor of model `name` (1 for the decoder); ApiError 400 without a name, 404 for another."""
        if not isinstance(name, str):
            raise ApiError(400, "'model' is required (a string)", param="model")
        if name == self.base:
            return 1.0
        if name in self.adapters:
            return self.adapters[name]
        served = ", ".join(f"'{n}'" for n in self.names())
        raise ApiError(404, f"The model '{name}' does not exist; this server serves {served}", param="model",
                       code="model_not_found")

    def salt(self, name: str) -> bytes:
        """Its prefix-cache key salt: none for the decoder, the name for an adapter."""
        return b"" if name == self.base else name.encode() + b"\0"


def max_tokens_of(value: Any, field_name: str, limit: int) -> int:
    """A request's token budget: DEFAULT_MAX_TOKENS when absent, else an int in [1, limit] (ApiError 400)."""
    if value is None:
        return DEFAULT_MAX_TOKENS
    if not is_int(value) or value < 1:
        raise ApiError(400, f"'{field_name}' must be an integer >= 1", param=field_name)
    if value > limit:
        raise ApiError(400, f"'{field_name}' is {value}; this server allows at most {limit} (--max-tokens-limit)",
                       param=field_name)
    return value


def reasoning_of(value: Any, field_name: str, default: int, max_tokens: int) -> int:
    """Reasoning tokens of an answer: the request's `value` (an int >= 0) or the server's `default`, at most max_tokens."""
    if value is None:
        value = default
    elif not is_int(value) or value < 0:
        raise ApiError(400, f"'{field_name}' must be an integer >= 0", param=field_name)
    return min(value, max_tokens)


def check_context(prompt: list[int], max_tokens: int, max_context: int, param: str) -> None:
    if len(prompt) + max_tokens > max_context:
        raise ApiError(400, f"This model's maximum context length is {max_context} tokens. However, you requested "
                            f"{len(prompt) + max_tokens} tokens ({len(prompt)} in the prompt, {max_tokens} for the "
                            f"completion).", param=param, code="context_length_exceeded")


def stream_flag(body: dict[str, Any]) -> bool:
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise ApiError(400, "'stream' must be a boolean", param="stream")
    return stream


async def read_json(request: web.Request, max_bytes: int) -> Any:
    """The body as JSON; ApiError 413 past `max_bytes`, 400 when it cannot be read or is not JSON."""
    try:
        body = await read_body(request, max_bytes)
    except BodyTooLarge:
        raise ApiError(413, f"request body is over {max_bytes} bytes (--max-body-bytes)", code="request_too_large") from None
    except BodyUnreadable as exc:
        raise ApiError(400, str(exc)) from None
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise ApiError(400, "request body is not valid JSON: nested too deeply") from None


def object_body(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    return body


def timing(cached: int, **parts_ns: int) -> str:
    """Server-Timing: the durations in ms, then the cached prompt tokens (a desc, no duration)."""
    return ", ".join([*(f"{name};dur={ns / 1e6:.3f}" for name, ns in parts_ns.items()), f'cached;desc="{cached}"'])


def gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


# --- serving one request -------------------------------------------------------------------------------

@dataclass
class TextRequest:
    """A parsed generation request: what the generator needs, and what the front end keeps for its answer."""

    model: str
    prompt: list[int]
    max_tokens: int
    reasoning: int  # of the max_tokens, how many are reasoning
    stream: bool
    extra: dict[str, Any] = field(default_factory=dict)  # the front end's own (chat or not, include_usage, ...)
    tool: Tool | None = None  # the tool the answer calls (its non-reasoning tokens are the arguments); None: text


@dataclass
class Job:
    """A submitted request: its generation and timings (perf_counter_ns) for the answer's Server-Timing."""

    request: TextRequest
    generation: Generation
    arrived_ns: int
    deser_ns: int


@dataclass(eq=False)
class TextRoutes:
    """The skeleton of a generation front end: subclasses set `api` (the metrics label), `parse`, `answer`,
    `stream`, and may override `error_response` (their error shape)."""

    api = ""  # a class attribute, not a field

    generator: Generator
    models: TextModels
    metrics: Metrics
    _: KW_ONLY
    max_body_bytes: int
    max_tokens_limit: int
    reasoning_tokens: int
    replica_id: str
    tool_call_rate: float  # in [0, 1]: the chance that a request declaring tools is answered with a call
    _rng: random.Random = field(init=False, repr=False, default_factory=lambda: random.Random(TOOL_CALL_SEED))

    def parse(self, body: Any) -> TextRequest:
        raise NotImplementedError

    def answer(self, job: Job, ids: list[int]) -> dict[str, Any]:
        """The whole answer's document (sent as JSON) for the token ids `ids` of `job`."""
        raise NotImplementedError

    async def stream(self, request: web.Request, job: Job) -> web.StreamResponse:
        raise NotImplementedError

    def error_response(self, exc: ApiError) -> web.Response:
        return exc.response()

    def choose_tool(self, tools: list[Tool], prompt: list[int], answer_tokens: int) -> Tool | None:
        """The tool a request's answer calls, or None for a text answer. With tools and `answer_tokens` (its
        non-reasoning tokens) >= 1 it takes one draw of the routes' Random (seeded TOOL_CALL_SEED): below
        tool_call_rate, `tools[len(prompt) % len(tools)]`."""
        if not tools or answer_tokens < 1 or self._rng.random() >= self.tool_call_rate:
            return None
        return tools[len(prompt) % len(tools)]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        arrived = time.perf_counter_ns()
        try:
            body = await read_json(request, self.max_body_bytes)
            started = time.perf_counter_ns()
            parsed = self.parse(body)
            deser_ns = time.perf_counter_ns() - started
            generation = self._submit(parsed)
        except ApiError as exc:
            return self.error_response(exc)
        self.metrics.generation_requests.labels(self.api, str(parsed.stream).lower()).inc()
        if parsed.tool is not None:
            self.metrics.tool_calls.labels(self.api).inc()
        job = Job(parsed, generation, arrived, deser_ns)
        try:
            if parsed.stream:
                return await self.stream(request, job)
            return await self.complete(request, job)
        except GenerationFailed as exc:
            return self.error_response(ApiError(500, str(exc), type="server_error"))
        finally:
            generation.cancel()  # frees its slot when the client left or the handler was cancelled; no-op once done

    def _submit(self, parsed: TextRequest) -> Generation:
        try:
            return self.generator.submit(parsed.prompt, parsed.max_tokens, factor=self.models.factor(parsed.model),
                                         cache_salt=self.models.salt(parsed.model))
        except Overloaded as exc:
            raise ApiError(429, f"server overloaded: {exc}; retry after {RETRY_AFTER_S} s", type="rate_limit_error",
                           code="rate_limit_exceeded", headers={"Retry-After": str(RETRY_AFTER_S)}) from None
        except ContextTooLong as exc:  # parse() checks this already; kept for the generator's own limit
            raise ApiError(400, str(exc), code="context_length_exceeded") from None

    def first_token(self, tokens: list[Token], job: Job) -> None:
        self.metrics.ttft_seconds.observe((tokens[0].emitted_ns - job.arrived_ns) / 1e9)

    async def collect(self, request: web.Request, job: Job) -> list[int] | None:
        """Every token id of the answer; None when the client went away meanwhile."""
        ids: list[int] = []
        while tokens := await job.generation.tokens():
            if not ids:
                self.first_token(tokens, job)
            ids.extend(t.id for t in tokens)
            if gone(request):
                return None
        return ids

    async def complete(self, request: web.Request, job: Job) -> web.StreamResponse:
        """A whole answer: every token, then `answer` as JSON, with Server-Timing deser, queue, prefill, decode and
        ser (building and encoding the answer); 499 when the client went away meanwhile."""
        ids = await self.collect(request, job)
        if ids is None:
            return web.Response(status=STATUS_CLIENT_GONE)
        started = time.perf_counter_ns()
        payload = json.dumps(self.answer(job, ids), separators=(",", ":")).encode()
        g = job.generation
        server_timing = timing(g.cached_tokens, deser=job.deser_ns, queue=g.queue_ns, prefill=g.prefill_ns,
                               decode=g.decode_ns, ser=time.perf_counter_ns() - started)
        return web.Response(body=payload, content_type="application/json", headers={"Server-Timing": server_timing})

    async def stream_tokens(self, request: web.Request, job: Job, *, content_type: str, opening: bytes,
                            piece: Callable[[int, int], bytes], closing: Callable[[int], bytes],
                            failure: Callable[[str], bytes]) -> web.StreamResponse:
        """A streamed answer: headers (with Server-Timing deser, queue, prefill) and `opening` go out with the
        first token; `piece(index, token_id)` for every token (index 0 …, in order); `closing(count)` at the end;
        when the model fails after the headers went out, `failure(message)` and the stream ends there."""
        generation = job.generation
        tokens = await generation.tokens()  # headers go out with the first token, so they can carry queue and prefill
        self.first_token(tokens, job)
        response = web.StreamResponse(headers={
            "Content-Type": content_type, "Cache-Control": "no-cache", "X-Replica-Id": self.replica_id,
            "Server-Timing": timing(generation.cached_tokens, deser=job.deser_ns, queue=generation.queue_ns,
                                    prefill=generation.prefill_ns)})
        count = 0
        try:
            await response.prepare(request)
            chunks = [opening]
            while tokens:
                for token in tokens:
                    chunks.append(piece(count, token.id))
                    count += 1
                await response.write(b"".join(chunks))
                chunks = []
                try:
                    tokens = await generation.tokens()
                except GenerationFailed as exc:  # headers are gone: report in the stream, end it
                    await response.write(failure(str(exc)))
                    return response
            await response.write(closing(count))
            await response.write_eof()
        except ConnectionError:  # the client went away mid-stream; handle() cancels the sequence
            pass
        return response

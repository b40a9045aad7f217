"""OpenAI-compatible text generation (aiohttp): POST /v1/completions, POST /v1/chat/completions, GET /v1/models.

Backed by the built-in decoder and the continuous-batching generator (generation.py). Streaming
answers are Server-Sent Events, one `data: {chunk}` per token, an optional usage chunk
(`stream_options.include_usage`), then `data: [DONE]`. Errors use OpenAI's shape
`{"error": {"message", "type", "param", "code"}}`.

Tokenization is a deterministic toy, so nothing is downloaded: a prompt string is one token per
whitespace-separated word (each word hashed into the vocabulary); a prompt may also be a list of token
ids. Each generated token renders as one pseudo-word with a leading space, built from a fixed
syllable table. Decoding is greedy and has no end-of-sequence token, so every answer is exactly
`max_tokens` tokens (finish_reason "length"); sampling parameters are accepted and ignored.

Server-Timing (ms): non-streaming answers carry deser (parsing and tokenizing the body already read),
queue (submission to the start of its prefill run), prefill (that run, shared by the prompts prefilled
with it), decode (first token to last token) and ser (encoding the answer). A streaming answer sends
its headers with its first token, so they carry deser, queue and prefill only: aiohttp cannot send
HTTP trailers, so decode and ser are not reported for streams. Both also carry `cached;desc="N"`: the
prompt tokens taken from the prefix cache (prefix_cache.py), also sent as
usage.prompt_tokens_details.cached_tokens (as OpenAI and vLLM report it).
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

from reference_server.backends.onnxruntime import OnnxRuntimeBackend
from reference_server.batcher import Overloaded
from reference_server.client_errors import BodyTooLarge, BodyUnreadable, read_body
from reference_server.decoder import DecoderConfig, cached_decoder
from reference_server.errors import StartupError
from reference_server.generation import ContextTooLong, Generation, GenerationFailed, Generator, Token, warm_up
from reference_server.http_server import REPLICA_ID
from reference_server.metrics import Metrics
from reference_server.prefix_cache import PrefixCache

if TYPE_CHECKING:
    from reference_server.config import ServerConfig

log = logging.getLogger(__name__)

RETRY_AFTER_S = 1
DEFAULT_MAX_TOKENS = 16
_WORD = re.compile(r"\S+")
_SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"][:64]
STATUS_CLIENT_GONE = 499  # the client closed the connection before the answer was ready (nginx's convention)


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


# --- request parsing -----------------------------------------------------------------------------------

class ApiError(Exception):
    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def response(self) -> web.Response:
        body = {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
        return web.json_response(body, status=self.status, headers=self.headers)


@dataclass
class Parsed:
    prompt: list[int]
    max_tokens: int
    stream: bool
    include_usage: bool


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _text_of(content: Any, index: int) -> str:
    """A message's content: a string, or a list of parts whose text parts are joined (others are rejected)."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        texts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise ApiError(400, f"messages[{index}].content: only text parts are supported", param="messages")
            texts.append(part["text"])
        return "".join(texts)
    raise ApiError(400, f"messages[{index}].content must be a string or a list of text parts", param="messages")


def _prompt_ids(body: dict[str, Any], chat: bool, vocab: int) -> list[int]:
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "'messages' is required: a non-empty list of {role, content}", param="messages")
        cleaned = []
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise ApiError(400, f"messages[{i}] must be an object with a string 'role'", param="messages")
            cleaned.append({"role": m["role"], "content": _text_of(m.get("content"), i)})
        return encode(chat_prompt(cleaned), vocab)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one prompt
    if isinstance(prompt, str):
        ids = encode(prompt, vocab)
    elif isinstance(prompt, list) and all(_int(t) for t in prompt):
        if any(not 0 <= t < vocab for t in prompt):
            raise ApiError(400, f"token ids in 'prompt' must be in [0, {vocab})", param="prompt")
        ids = prompt
    elif prompt is None:
        raise ApiError(400, "'prompt' is required: a string or a list of token ids", param="prompt")
    else:
        raise ApiError(400, "'prompt' must be a string or a list of token ids (one prompt per request)",
                       param="prompt")
    if not ids:
        raise ApiError(400, "'prompt' is empty (no tokens)", param="prompt")
    return ids


def parse(body: Any, *, chat: bool, model: str, vocab: int, max_context: int, max_tokens_limit: int) -> Parsed:
    """Validate one request body (already JSON-decoded); raises ApiError (400, or 404 for another model)."""
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    name = body.get("model")
    if not isinstance(name, str):
        raise ApiError(400, "'model' is required (a string)", param="model")
    if name != model:
        raise ApiError(404, f"The model '{name}' does not exist; this server serves '{model}'", param="model",
                       code="model_not_found")
    prompt = _prompt_ids(body, chat, vocab)
    field = "max_completion_tokens" if chat and body.get("max_tokens") is None else "max_tokens"
    max_tokens = body.get(field)
    if max_tokens is None:
        max_tokens = DEFAULT_MAX_TOKENS
    if not _int(max_tokens) or max_tokens < 1:
        raise ApiError(400, f"'{field}' must be an integer >= 1", param=field)
    if max_tokens > max_tokens_limit:
        raise ApiError(400, f"'{field}' is {max_tokens}; this server allows at most {max_tokens_limit} "
                            f"(--max-tokens-limit)", param=field)
    if len(prompt) + max_tokens > max_context:
        raise ApiError(400, f"This model's maximum context length is {max_context} tokens. However, you requested "
                            f"{len(prompt) + max_tokens} tokens ({len(prompt)} in the prompt, {max_tokens} for the "
                            f"completion).", param="prompt" if not chat else "messages",
                       code="context_length_exceeded")
    n = body.get("n", 1)
    if n is not None and n != 1:
        raise ApiError(400, "only n=1 is supported", param="n")
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise ApiError(400, "'stream' must be a boolean", param="stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
        raise ApiError(400, "'stream_options' must be an object like {\"include_usage\": true}",
                       param="stream_options")
    return Parsed(prompt, max_tokens, stream, bool(options.get("include_usage")))


# --- responses -----------------------------------------------------------------------------------------

def _timing(cached: int, **parts_ns: int) -> str:
    """Server-Timing: the durations in ms, then the cached prompt tokens (a desc, no duration)."""
    return ", ".join([*(f"{name};dur={ns / 1e6:.3f}" for name, ns in parts_ns.items()), f'cached;desc="{cached}"'])


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


class _Answer:
    """The OpenAI objects for one request (completion or chat), sharing id, created and model."""

    def __init__(self, chat: bool, model: str) -> None:
        self.chat = chat
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model

    def _envelope(self, kind: str, choices: list[dict], **extra: Any) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices,
                **extra}

    def chunk(self, text: str | None, finish_reason: str | None = None, *, role: bool = False) -> bytes:
        if self.chat:
            delta: dict[str, str] = {"role": "assistant", "content": ""} if role else {"content": text or ""}
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            return _sse(self._envelope("chat.completion.chunk", [choice]))
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return _sse(self._envelope("text_completion", [choice]))

    def usage_chunk(self, usage: dict[str, Any]) -> bytes:
        return _sse(self._envelope("chat.completion.chunk" if self.chat else "text_completion", [], usage=usage))

    def complete(self, text: str, usage: dict[str, Any]) -> dict[str, Any]:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": "length"}
            return self._envelope("chat.completion", [choice], usage=usage)
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
        return self._envelope("text_completion", [choice], usage=usage)


def _usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def _gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


class OpenAIRoutes:
    def __init__(self, generator: Generator, model: str, metrics: Metrics, *, max_body_bytes: int,
                 max_tokens_limit: int, replica_id: str) -> None:
        self.generator = generator
        self.model = model
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes
        self.max_tokens_limit = max_tokens_limit
        self.replica_id = replica_id
        self.created = int(time.time())

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": self.model, "object": "model", "created": self.created, "owned_by": "latscope-ref"}]})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _read(self, request: web.Request) -> Any:
        too_large = ApiError(413, f"request body is over {self.max_body_bytes} bytes (--max-body-bytes)",
                             code="request_too_large")
        try:
            body = await read_body(request, self.max_body_bytes)
        except BodyTooLarge:
            raise too_large from None
        except BodyUnreadable as exc:
            raise ApiError(400, str(exc)) from None
        try:
            return json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ApiError(400, f"request body is not valid JSON: {exc}") from None
        except RecursionError:
            raise ApiError(400, "request body is not valid JSON: nested too deeply") from None

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        arrived = time.perf_counter_ns()
        config = self.generator.config
        try:
            body = await self._read(request)
            started = time.perf_counter_ns()
            parsed = parse(body, chat=chat, model=self.model, vocab=config.vocab, max_context=config.max_context,
                           max_tokens_limit=self.max_tokens_limit)
            deser_ns = time.perf_counter_ns() - started
            try:
                generation = self.generator.submit(parsed.prompt, parsed.max_tokens)
            except Overloaded as exc:
                raise ApiError(429, f"server overloaded: {exc}; retry after {RETRY_AFTER_S} s",
                               type="rate_limit_error", code="rate_limit_exceeded",
                               headers={"Retry-After": str(RETRY_AFTER_S)}) from None
            except ContextTooLong as exc:  # parse() checks this already; kept for the generator's own limit
                raise ApiError(400, str(exc), code="context_length_exceeded") from None
        except ApiError as exc:
            return exc.response()
        self.metrics.generation_requests.labels("chat" if chat else "completions", str(parsed.stream).lower()).inc()
        try:
            if parsed.stream:
                return await self._stream(request, chat, parsed, generation, arrived, deser_ns)
            return await self._complete(request, chat, parsed, generation, arrived, deser_ns)
        except GenerationFailed as exc:
            return ApiError(500, str(exc), type="server_error").response()
        finally:
            generation.cancel()  # frees its slot when the client left or the handler was cancelled; no-op once done

    def _first(self, tokens: list[Token], arrived: int) -> None:
        self.metrics.ttft_seconds.observe((tokens[0].emitted_ns - arrived) / 1e9)

    async def _complete(self, request: web.Request, chat: bool, parsed: Parsed, generation: Generation,
                        arrived: int, deser_ns: int) -> web.Response:
        ids: list[int] = []
        while tokens := await generation.tokens():
            if not ids:
                self._first(tokens, arrived)
            ids.extend(t.id for t in tokens)
            if _gone(request):
                return web.Response(status=STATUS_CLIENT_GONE)
        started = time.perf_counter_ns()
        answer = _Answer(chat, self.model).complete("".join(map(render, ids)),
                                                    _usage(len(parsed.prompt), len(ids), generation.cached_tokens))
        payload = json.dumps(answer, separators=(",", ":")).encode()
        timing = _timing(generation.cached_tokens, deser=deser_ns, queue=generation.queue_ns,
                         prefill=generation.prefill_ns, decode=generation.decode_ns,
                         ser=time.perf_counter_ns() - started)
        return web.Response(body=payload, content_type="application/json", headers={"Server-Timing": timing})

    async def _stream(self, request: web.Request, chat: bool, parsed: Parsed, generation: Generation,
                      arrived: int, deser_ns: int) -> web.StreamResponse:
        tokens = await generation.tokens()  # headers go out with the first token, so they can carry queue and prefill
        self._first(tokens, arrived)
        response = web.StreamResponse(headers={
            "Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Replica-Id": self.replica_id,
            "Server-Timing": _timing(generation.cached_tokens, deser=deser_ns, queue=generation.queue_ns,
                                     prefill=generation.prefill_ns)})
        answer = _Answer(chat, self.model)
        count = 0
        try:
            await response.prepare(request)
            chunks = [answer.chunk(None, role=True)] if chat else []
            while tokens:
                for token in tokens:
                    count += 1
                    chunks.append(answer.chunk(render(token.id), "length" if count == parsed.max_tokens else None))
                await response.write(b"".join(chunks))
                chunks = []
                try:
                    tokens = await generation.tokens()
                except GenerationFailed as exc:  # headers are gone: report in the stream, end it without [DONE]
                    await response.write(_sse({"error": {"message": str(exc), "type": "server_error",
                                                         "param": None, "code": None}}))
                    return response
            if parsed.include_usage:
                chunks.append(answer.usage_chunk(_usage(len(parsed.prompt), count, generation.cached_tokens)))
            chunks.append(b"data: [DONE]\n\n")
            await response.write(b"".join(chunks))
            await response.write_eof()
        except ConnectionError:  # the client went away mid-stream; the caller cancels the sequence
            pass
        return response


def add_routes(app: web.Application, routes: OpenAIRoutes) -> None:
    app.router.add_get("/v1/models", routes.models)
    app.router.add_post("/v1/completions", routes.completions)
    app.router.add_post("/v1/chat/completions", routes.chat_completions)


def mount_generator(app: web.Application, config: ServerConfig, metrics: Metrics) -> Generator | None:
    """With --generator (the default): build or reuse the decoder, load and warm it up on ONNX Runtime, add the
    /v1 routes to `app` (before it starts) and return the generator for the caller to start() and stop()."""
    if not config.generator:
        log.info("generator: off (--no-generator); no /v1 routes")
        return None
    decoder = DecoderConfig() if config.decoder_layers is None else DecoderConfig(layers=config.decoder_layers)
    started = time.perf_counter()
    path, reused = cached_decoder(decoder, config.cache_dir.expanduser() / "decoder")  # beside the encoder's file
    log.info("generator %s: built-in decoder, %d layers, hidden %d, context %d, %s %s in %.2f s",
             config.generator_name, decoder.layers, decoder.hidden, decoder.max_context,
             "reused cached" if reused else "built", path, time.perf_counter() - started)
    started = time.perf_counter()
    try:
        backend = OnnxRuntimeBackend(path, config.threads)
        backend.load()
        load_s = time.perf_counter() - started
        warm_up(backend.run, decoder)
    except Exception as exc:  # noqa: BLE001 - onnx/onnxruntime raise many types; name the file and stop
        raise StartupError(f"onnxruntime cannot load the decoder {path}: {exc}") from None
    metrics.model_load_seconds.labels(config.generator_name, backend.name).set(load_s)
    log.info("generator %s: %s; loaded in %.2f s, warmed up in %.3f s", config.generator_name, backend.describe(),
             load_s, time.perf_counter() - started - load_s)
    prefix_cache = PrefixCache(config.prefix_cache_mb * 2**20, on_evict=metrics.prefix_cache_evictions.inc)
    generator = Generator(backend.run, decoder, max_sequences=config.max_sequences, max_waiting=config.max_queue,
                          on_prefill=metrics.on_prefill, on_step=metrics.on_decode_step, prefix_cache=prefix_cache,
                          on_prompt=metrics.on_prompt)
    metrics.active_sequences.set_function(generator.active)
    metrics.waiting_sequences.set_function(generator.waiting)
    metrics.prefix_cache_bytes.set_function(lambda: prefix_cache.bytes_in_use)
    metrics.prefix_cache_capacity_bytes.set(prefix_cache.capacity_bytes)
    add_routes(app, OpenAIRoutes(generator, config.generator_name, metrics, max_body_bytes=config.max_body_bytes,
                                 max_tokens_limit=config.max_tokens_limit, replica_id=app[REPLICA_ID]))
    log.info("generator %s: continuous batching, at most %d sequences, %d waiting, max_tokens <= %d, prefix cache "
             "%s; POST /v1/completions, /v1/chat/completions", config.generator_name, config.max_sequences,
             config.max_queue, config.max_tokens_limit,
             f"{config.prefix_cache_mb} MiB" if config.prefix_cache_mb else "off (--prefix-cache-mb 0)")
    return generator

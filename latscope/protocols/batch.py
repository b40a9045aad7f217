"""What the batch protocols share (openai-embeddings: embeddings.py, rerank: rerank.py): one POST of a
JSON body carrying a batch of texts, one whole JSON answer.

Per request (`prepare`, timed: `encode`):

- the batch size b: the class's `batch` (a Length; the protocol's DEFAULT_BATCH when not given),
  drawn per request from a generator seeded by the request's plan `item` (reproducible from the
  scenario's seed; no draw at all when fixed), cut to MAX_BATCH;
- the items: b texts of the request's planned `prompt_tokens` each (the plan's per-request draw of
  the class's prompt_tokens: all items of one request have the same length), disjoint slices of
  the synthetic text (workload.Payloads: words that are one token each), or b consecutive rows of
  the class's dataset from the request's row on; rerank's query is `query_tokens` words of the
  synthetic text after them (dataset classes too);
- `Request.prompt_tokens` becomes the request's planned prompt count, what a server's usage counts:
  the items' lengths summed, plus b × the query for rerank (a cross-encoder reads the query with
  every document). A dataset row's length is its workload.tokenizer count (workload.class_prompts);
  without a tokenizer it is not known, and the request's planned count is 0.

`send` posts the body on the shared keep-alive pool (http.py), times the parse and checks of the
whole answer (`decode`), and fills Outcome.items with b on every outcome. The server's usage gives
Outcome.prompt_tokens with prompt_from_usage (usage.prompt_tokens, else usage.total_tokens: these
protocols generate nothing). HTTP >= 400 is http_4xx / http_5xx with the server's message; an answer
that is not what the protocol specifies is a `protocol` error whose reason says what is wrong.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import orjson

from latscope.protocols.http import (Failure, HttpPool, error_message, http_error, prefix_or_refusal, refused_outcome,
                                     refused_what, request_id_line, request_id_name, what_it_sends,
                                     with_server_headers)
from latscope.records import Outcome, Request
from latscope.scenario import Endpoint, FixedLength, LengthDist, Scenario
from latscope.scenario.workload import MAX_BATCH
from latscope.workload import Payloads, class_prompts, draw_lengths, read_lengths

_pc = time.perf_counter_ns
MAX_REASON = 200  # characters of a body kept in a reason


def clip(text: Any, limit: int = MAX_REASON) -> str:
    """A body or value as a reason shows it: one line, at most `limit` characters."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text[: limit * 4]).decode("utf-8", "replace")
    elif not isinstance(text, str):
        text = json.dumps(text, ensure_ascii=False)[: limit * 4]
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def is_count(value: Any) -> bool:
    return type(value) is int and value >= 0


class _Draw:
    """One Length of a class, drawn per request: a fixed one without a generator, else from the
    request's (`rng_of` makes it when first asked), an empirical one from its file read once; cut to `top`."""

    def __init__(self, dist: LengthDist, scenario: Scenario, top: int | None = None):
        self.dist, self.scenario, self.top = dist, scenario, top
        self.fixed = dist.value if dist.dist == "fixed" else None
        self.sample = read_lengths(scenario.resolve_path(dist.file), dist.column) if dist.dist == "empirical" else None

    def __call__(self, rng_of: Callable[[], np.random.Generator]) -> int:
        if self.fixed is not None:
            value = self.fixed
        elif self.sample is not None:
            value = int(self.sample[rng_of().integers(len(self.sample))])
        else:
            value = int(draw_lengths(self.dist, 1, rng_of(), self.scenario)[0])
        return min(value, self.top) if self.top else value


@dataclass(slots=True)
class BatchClass:
    """What every request of one workload class shares."""

    batch: _Draw
    query: _Draw | None  # rerank's query length
    dataset: bool  # the items are dataset rows
    row_tokens: np.ndarray | None  # with workload.tokenizer, the token count of each dataset row (else unknown)
    fields: dict[str, Any]  # the body's fields before the texts (model)
    items_key: str  # the body's field of the items: "input", "documents", "texts"
    rest: dict[str, Any]  # the body's fields after them (options, extra_body)
    prefix: bytes  # request line and headers without Content-Length
    request_id: bytes | None
    refused: str | None
    sends: str | None


@dataclass(slots=True)
class Batch:
    """One request's texts: its items and (rerank) its query."""

    items: list[str]
    query: str | None


class BatchClient:
    """A batch protocol's requests for some workload classes of one (protocol, URL). A subclass says
    its defaults (DEFAULT_BATCH, DEFAULT_QUERY_TOKENS: 0 for no query), its body's fields (`options`)
    and checks its answer (`answer`)."""

    DEFAULT_BATCH = 1
    DEFAULT_QUERY_TOKENS = 0  # no query

    def __init__(self, scenario: Scenario, classes: list[int], payloads: Payloads) -> None:
        self._pool = HttpPool(scenario.endpoint(classes[0]).url, scenario.target.timeout,
                              scenario.limits.max_response_bytes)
        self._payloads = payloads
        self._classes = {c: self._class(scenario, c) for c in classes}
        self._scratch = Request(0, 0, 0, False)  # what Payloads.get is asked for each item

    def options(self, endpoint: Endpoint) -> tuple[dict[str, Any], str, dict[str, Any]]:
        """A class's body, from its endpoint: (the fields before the texts, the items' field, the fields after them)."""
        raise NotImplementedError

    def answer(self, doc: Any, outcome: Outcome, cls: BatchClass) -> str | None:
        """Check a parsed answer and take its counts into `outcome`; why it is wrong, or None."""
        raise NotImplementedError

    def _class(self, scenario: Scenario, c: int) -> BatchClass:
        endpoint, wc = scenario.endpoint(c), scenario.workload.effective_classes()[c]
        where = ("workload", "classes", c) if scenario.workload.classes else ("target",)
        with scenario.about((*where, "batch")):
            batch = _Draw(wc.batch or FixedLength(value=self.DEFAULT_BATCH), scenario, MAX_BATCH)
        query = None
        if self.DEFAULT_QUERY_TOKENS:
            with scenario.about((*where, "query_tokens")):
                query = _Draw(wc.query_tokens or FixedLength(value=self.DEFAULT_QUERY_TOKENS), scenario,
                              scenario.limits.max_prompt_tokens)
        fields, items_key, rest = self.options(endpoint)
        prefix, refused = prefix_or_refusal(endpoint, "application/json")
        prompts = class_prompts(scenario, c)
        return BatchClass(batch, query, prompts is not None, prompts and prompts.tokens, fields, items_key, rest, prefix,
                          request_id_name(endpoint, scenario), refused, what_it_sends(endpoint))

    async def open(self) -> None:
        await self._pool.open()

    async def close(self) -> None:
        await self._pool.close()

    def texts(self, cls: BatchClass, request: Request) -> Batch:
        """The request's batch (the module docstring), and its planned prompt count into the request."""
        rng = None

        def rng_of() -> np.random.Generator:
            nonlocal rng
            if rng is None:
                rng = np.random.default_rng(request.item)
            return rng

        b = cls.batch(rng_of)
        length = request.prompt_tokens
        stride = 1 if cls.dataset else max(length, 1)  # the next row, or the next slice of the synthetic text
        scratch, get = self._scratch, self._payloads.get
        scratch.cls, scratch.prompt_tokens = request.cls, length
        items = []
        for j in range(b):
            scratch.item = request.item + j * stride
            items.append(get(scratch).prompt or "")
        lengths = [length] * b  # each item's planned tokens (0: not known)
        if cls.dataset:
            rows = cls.row_tokens
            lengths = [int(rows[(request.item + j) % len(rows)]) for j in range(b)] if rows is not None else [0] * b
        query, q = None, 0
        if cls.query is not None:
            q = cls.query(rng_of)
            query = self._payloads.synthetic_prompt(q, request.item + b * stride)
        request.prompt_tokens = sum(lengths) + b * q if all(lengths) else 0
        return Batch(items, query)

    def prepare(self, request: Request) -> None:
        """The request's bytes: its batch drawn and its JSON body built (timed: `encode`)."""
        cls = self._classes[request.cls]
        if cls.refused:
            return
        started = _pc()
        batch = self.texts(cls, request)
        texts = {"query": batch.query, cls.items_key: batch.items} if batch.query is not None else {cls.items_key: batch.items}
        body = orjson.dumps({**cls.fields, **texts, **cls.rest}, option=orjson.OPT_NON_STR_KEYS)  # compact UTF-8
        request.wire = (b"%s%sContent-Length: %d\r\n\r\n%s" % (cls.prefix, request_id_line(cls.request_id, request.seq),
                                                               len(body), body), len(batch.items), len(body))
        request.wire_bytes = len(request.wire[0])
        request.prepared_ns = _pc()
        request.encode_ns = request.prepared_ns - started

    async def send(self, request: Request) -> Outcome:
        """One request, prepared already (or now). Never raises for a failed request."""
        cls = self._classes[request.cls]
        if cls.refused:
            return refused_outcome(cls.refused)
        if request.wire is None:
            self.prepare(request)
        data, items, body_len = request.wire
        sent = _pc()
        try:
            response = await self._pool.request(data, keep_body=True)
        except Failure as failure:
            return Outcome(sent, _pc(), error=failure.kind, reason=failure.reason, bytes_out=body_len,
                           encode_ns=request.encode_ns, items=items)
        outcome = Outcome(sent, response.end_ns, status=response.status, bytes_out=body_len,
                          bytes_in=response.body_len, encode_ns=request.encode_ns, items=items)
        with_server_headers(outcome, response)
        body = response.body or b""
        if response.status >= 400:
            return refused_what(http_error(outcome, response, body), cls.sends)
        started = _pc()
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError:
            doc = None
        if doc is None:
            problem = f"response is not JSON: {clip(body)}"
        elif type(doc) is dict and doc.get("error"):
            problem = f"error in a {response.status} response: {error_message(body)}"
        else:
            problem = self.answer(doc, outcome, cls)
        outcome.decode_ns = _pc() - started
        if problem is not None:
            outcome.error, outcome.reason = "protocol", problem
        return outcome


def usage_into(outcome: Outcome, usage: Any) -> None:
    """The server's prompt count from `usage`: prompt_tokens, else total_tokens (nothing is generated)."""
    if type(usage) is dict:
        count = usage.get("prompt_tokens")
        if not is_count(count):
            count = usage.get("total_tokens")
        if is_count(count):
            outcome.prompt_tokens, outcome.prompt_from_usage = count, True

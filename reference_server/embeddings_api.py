"""Embeddings and rerank from the built-in encoder: POST /v1/embeddings (OpenAI's API), POST /v1/rerank and
/rerank (the query + documents shape vLLM, Jina and Cohere share).

Both run on the encoder's batcher (http_server.py's model, the one KServe v2 serves), so they batch with each
other and with /v2 infer requests. Texts are tokenized by the toy tokenizer (text_api.encode: one token per
word); a request's texts are sorted by length and cut into runs of at most --max-batch-size rows, each padded
to its longest, submitted together (the batcher buckets them by length).

/v1/embeddings: `model` = the encoder's --model-name; `input` a string, a list of strings, a list of token
ids, or a list of lists of token ids (at most MAX_INPUTS inputs, each 1 to the encoder's 512 tokens);
`encoding_format` "float" (default) or "base64" (little-endian float32 bytes, what the openai client asks
for); `dimensions`, when given, must be the encoder's width (384). Each `data[i].embedding` is the encoder's
mean-pooled output for input i, **not normalized** (the same vector /v2/models/NAME/infer answers);
`usage` = {prompt_tokens, total_tokens}: the inputs' tokens.

/v1/rerank, /rerank: `model`, `query` (a string), `documents` (strings or `{"text": …}` objects, at most
MAX_INPUTS), `top_n` (default all), `return_documents` (default true). The query and the documents are
embedded in one request (a bi-encoder, not a cross-encoder: the query is computed once), and each
document's `relevance_score` is the cosine of its pooled embedding with the query's (in float64 from the
float32 vectors): `results` = [{index, relevance_score, document: {text}}] sorted by score (highest first,
then by index), the first top_n; `usage` = {prompt_tokens, total_tokens}: the query's tokens + every document's.

Errors are OpenAI-shaped (text_api.ApiError): 400 bad input, 404 another model, 413 over --max-body-bytes,
429 + Retry-After when the encoder's queue is full, 500 when the model run failed.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
import uuid
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson
from aiohttp import web

from reference_server.batcher import InferenceFailed, Overloaded
from reference_server.model import EncoderConfig
from reference_server.text_api import RETRY_AFTER_S, ApiError, encode, is_int, object_body, read_json

if TYPE_CHECKING:
    from reference_server.config import ServerConfig
    from reference_server.http_server import ServedModel

log = logging.getLogger(__name__)

MAX_INPUTS = 2048  # OpenAI's limit of inputs per embeddings request


class EmbeddingRoutes:
    def __init__(self, model: ServedModel, encoder: EncoderConfig, *, max_body_bytes: int) -> None:
        self.model = model
        self.encoder = encoder
        self.max_body_bytes = max_body_bytes

    # --- shared ---

    def _check_model(self, body: dict[str, Any]) -> None:
        name = body.get("model")
        if not isinstance(name, str):
            raise ApiError(400, "'model' is required (a string)", param="model")
        if name != self.model.name:
            raise ApiError(404, f"The model '{name}' does not exist; this server embeds with '{self.model.name}'",
                           param="model", code="model_not_found")

    def _tokens(self, text: Any, where: str, param: str) -> list[int]:
        """One input's token ids: a string (one token per word) or a list of ids; 1 to max_seq tokens."""
        vocab, limit = self.encoder.vocab, self.encoder.max_seq
        if isinstance(text, str):
            ids = encode(text, vocab)
        elif isinstance(text, list) and all(is_int(t) for t in text):
            if any(not 0 <= t < vocab for t in text):
                raise ApiError(400, f"{where}: token ids must be in [0, {vocab})", param=param)
            ids = text
        else:
            raise ApiError(400, f"{where} must be a string or a list of token ids", param=param)
        if not ids:
            raise ApiError(400, f"{where} is empty (no tokens)", param=param)
        if len(ids) > limit:
            raise ApiError(400, f"{where} has {len(ids)} tokens; this encoder reads at most {limit}", param=param,
                           code="context_length_exceeded")
        return ids

    async def _embed(self, texts: list[list[int]]) -> np.ndarray:
        """The pooled embeddings [len(texts), hidden] (float32), in the order of `texts`."""
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        rows = self.model.batcher.max_rows
        runs = [order[i:i + rows] for i in range(0, len(order), rows)]
        try:
            results = await asyncio.gather(*(self.model.batcher.submit(self._inputs([texts[i] for i in run]))
                                              for run in runs))
        except Overloaded as exc:
            raise ApiError(429, f"server overloaded: {exc}; retry after {RETRY_AFTER_S} s", type="rate_limit_error",
                           code="rate_limit_exceeded", headers={"Retry-After": str(RETRY_AFTER_S)}) from None
        except InferenceFailed as exc:
            raise ApiError(500, str(exc), type="server_error") from None
        out = np.empty((len(texts), results[0].outputs["embedding"].shape[1]), np.float32)
        for run, result in zip(runs, results):
            out[run] = result.outputs["embedding"]
        return out

    @staticmethod
    def _inputs(texts: list[list[int]]) -> dict[str, np.ndarray]:
        width = max(map(len, texts))
        ids = np.zeros((len(texts), width), np.int64)
        mask = np.zeros((len(texts), width), np.int64)
        for i, t in enumerate(texts):
            ids[i, :len(t)] = t
            mask[i, :len(t)] = 1
        return {"input_ids": ids, "attention_mask": mask}

    async def _serve(self, request: web.Request, answer) -> web.Response:
        try:
            body = object_body(await read_json(request, self.max_body_bytes))
            self._check_model(body)
            doc = await answer(body)
        except ApiError as exc:
            return exc.response()
        return web.Response(body=orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY), content_type="application/json")

    # --- /v1/embeddings ---

    async def embeddings(self, request: web.Request) -> web.Response:
        return await self._serve(request, self._embeddings)

    async def _embeddings(self, body: dict[str, Any]) -> dict[str, Any]:
        value = body.get("input")
        if isinstance(value, str) or (isinstance(value, list) and value and all(is_int(t) for t in value)):
            value = [value]  # one input
        if not isinstance(value, list) or not value:
            raise ApiError(400, "'input' is required: a string, a list of strings or a list of token-id lists",
                           param="input")
        if len(value) > MAX_INPUTS:
            raise ApiError(400, f"'input' has {len(value)} inputs; at most {MAX_INPUTS} per request", param="input")
        fmt = body.get("encoding_format") or "float"
        if fmt not in ("float", "base64"):
            raise ApiError(400, "'encoding_format' must be 'float' or 'base64'", param="encoding_format")
        dimensions = body.get("dimensions")
        hidden = self.encoder.hidden
        if dimensions is not None and dimensions != hidden:
            raise ApiError(400, f"'dimensions' must be {hidden} (this encoder's width) or left out", param="dimensions")
        texts = [self._tokens(t, f"input[{i}]", "input") for i, t in enumerate(value)]
        vectors = await self._embed(texts)
        tokens = sum(map(len, texts))
        data = [{"object": "embedding", "index": i,
                 "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode() if fmt == "base64" else v}
                for i, v in enumerate(vectors)]
        return {"object": "list", "data": data, "model": self.model.name,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    # --- /v1/rerank ---

    async def rerank(self, request: web.Request) -> web.Response:
        return await self._serve(request, self._rerank)

    async def _rerank(self, body: dict[str, Any]) -> dict[str, Any]:
        query = body.get("query")
        if not isinstance(query, str):
            raise ApiError(400, "'query' is required (a string)", param="query")
        documents = body.get("documents")
        if not isinstance(documents, list) or not documents:
            raise ApiError(400, "'documents' is required: a non-empty list of strings or {\"text\": ...} objects",
                           param="documents")
        if len(documents) > MAX_INPUTS:
            raise ApiError(400, f"'documents' has {len(documents)} entries; at most {MAX_INPUTS} per request",
                           param="documents")
        texts = []
        for i, d in enumerate(documents):
            text = d.get("text") if isinstance(d, dict) else d
            if not isinstance(text, str):
                raise ApiError(400, f"documents[{i}] must be a string or an object with a string 'text'",
                               param="documents")
            texts.append(text)
        top_n = body.get("top_n")
        if top_n is not None and (not is_int(top_n) or top_n < 1):
            raise ApiError(400, "'top_n' must be an integer >= 1", param="top_n")
        keep_text = body.get("return_documents", True)
        if not isinstance(keep_text, bool):
            raise ApiError(400, "'return_documents' must be a boolean", param="return_documents")
        ids = [self._tokens(query, "query", "query"),
               *(self._tokens(t, f"documents[{i}]", "documents") for i, t in enumerate(texts))]
        vectors = (await self._embed(ids)).astype(np.float64)
        norms = np.linalg.norm(vectors, axis=1)
        scores = vectors[1:] @ vectors[0] / np.maximum(norms[1:] * norms[0], np.finfo(np.float64).tiny)
        order = sorted(range(len(texts)), key=lambda i: (-scores[i], i))[:top_n]
        tokens = sum(map(len, ids))
        results = [{"index": i, "relevance_score": float(scores[i]), **({"document": {"text": texts[i]}}
                                                                         if keep_text else {})} for i in order]
        return {"id": f"rerank-{uuid.uuid4().hex}", "model": self.model.name, "results": results,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}, "created": int(time.time())}


def add_routes(app: web.Application, routes: EmbeddingRoutes) -> None:
    app.router.add_post("/v1/embeddings", routes.embeddings)
    app.router.add_post("/v1/rerank", routes.rerank)
    app.router.add_post("/rerank", routes.rerank)


def mount_embeddings(app: web.Application, config: ServerConfig, model: ServedModel) -> bool:
    """Add the embeddings and rerank routes when the served model is the built-in encoder (their tokenizer and
    pooled output are its); False, with a log line, otherwise."""
    if config.model is not None or config.builtin != "encoder":
        log.info("embeddings, rerank: off (they need the built-in encoder, not %s)",
                 config.model or f"--builtin {config.builtin}")
        return False
    add_routes(app, EmbeddingRoutes(model, EncoderConfig(), max_body_bytes=config.max_body_bytes))
    log.info("embeddings, rerank: model %s, at most %d inputs per request; POST /v1/embeddings, /v1/rerank, /rerank",
             model.name, MAX_INPUTS)
    return True

"""OpenAI-compatible embeddings (protocol `openai-embeddings`): POST /v1/embeddings with a batch of inputs.

vLLM, TEI (its OpenAI-compatible route), SGLang, llama.cpp, Ollama, Infinity, the reference server
and OpenAI itself take the same request and answer:

    {"model": M, "input": [text 1, ..., text b], "encoding_format"?: "float" | "base64", ...extra_body}
    -> {"data": [{"embedding": [floats] | "base64", "index": i}, ...], "usage": {"prompt_tokens", "total_tokens"}}

The batch (b inputs of the request's planned length, or dataset rows) and the timing are batch.py's.
The answer must hold exactly one embedding per input, each a non-empty vector (or base64 string),
the vectors of one length, their indices 0..b-1 each once; anything else is a `protocol` error
saying what is wrong ("3 embeddings for a batch of 4 inputs", "data[2] has no embedding", ...).
usage.prompt_tokens is the server's count of the whole batch's tokens (Outcome.prompt_tokens,
prompt_from_usage). A latency here is the whole batch's: inputs/s and input tokens/s are in
summary.json's `batch` (run/summary.py).
"""

from __future__ import annotations

from typing import Any

from latscope.protocols.batch import BatchClass, BatchClient, clip, usage_into
from latscope.records import Outcome
from latscope.scenario import Endpoint


class EmbeddingsClient(BatchClient):
    DEFAULT_BATCH = 1  # one input per request unless the class gives `batch`

    def options(self, endpoint: Endpoint) -> tuple[dict[str, Any], str, dict[str, Any]]:
        options, model = endpoint.embeddings, endpoint.model
        rest: dict[str, Any] = {"encoding_format": options.encoding_format} if options.encoding_format else {}
        rest.update(options.extra_body)
        return ({"model": model} if model is not None else {}), "input", rest

    def answer(self, doc: Any, outcome: Outcome, cls: BatchClass) -> str | None:
        b = outcome.items
        data = doc.get("data") if type(doc) is dict else None
        if type(data) is not list:
            return f"response has no data list: {clip(doc)}"
        if len(data) != b:
            return f"{len(data)} embeddings for a batch of {b} input{'s' if b != 1 else ''}"
        seen = [False] * b
        size = -1
        for i, entry in enumerate(data):
            vector = entry.get("embedding") if type(entry) is dict else None
            if not vector or type(vector) not in (list, str):
                return f"data[{i}] has no embedding (a non-empty list of numbers or base64 string): {clip(entry, 80)}"
            if type(vector) is list:
                if size < 0:
                    size = len(vector)
                elif len(vector) != size:
                    return f"data[{i}]'s embedding has {len(vector)} numbers, data[0]'s {size}"
            index = entry.get("index", i)
            if type(index) is not int or not 0 <= index < b or seen[index]:
                return f"data[{i}] has index {clip(index, 40)}: each of 0..{b - 1} must come once"
            seen[index] = True
        usage_into(outcome, doc.get("usage"))
        return None

"""Rerank (protocol `rerank`): a query and b documents in, a relevance score per document out.

`rerank.api: cohere` (the default) is the shape vLLM (/rerank, /v1/rerank, /v2/rerank), Jina,
Cohere, Infinity, LiteLLM and the reference server share, at /v1/rerank unless the class gives a path:

    {"model"?: M, "query": q, "documents": [d1, ..., db], "top_n"?: n, "return_documents"?: bool, ...extra_body}
    -> {"results": [{"index": i, "relevance_score": s}, ...], "usage"?: {"prompt_tokens"? | "total_tokens"}}

`rerank.api: tei` is Hugging Face TEI's own /rerank (give `path: /rerank`): {"query", "texts", ...}
-> [{"index": i, "score": s}, ...], with no usage. The model is sent when the class or target names
one (TEI serves one model and takes none).

The batch (b documents of the request's planned length or dataset rows, a query of query_tokens)
and the timing are batch.py's. The answer must score at most b documents (fewer with top_n; how
many exactly is the server's business), each index an integer in 0..b-1 once, each score a
number; anything else is a `protocol` error saying what is wrong. The server's usage
(prompt_tokens, else total_tokens: vLLM and Jina send total_tokens) is Outcome.prompt_tokens.
Documents/s and input tokens/s are in summary.json's `batch` (run/summary.py).
"""

from __future__ import annotations

from typing import Any

from latscope.protocols.batch import BatchClass, BatchClient, clip, usage_into
from latscope.records import Outcome
from latscope.scenario import Endpoint

DEFAULT_DOCUMENTS = 8  # documents per request unless the class gives `batch`
DEFAULT_QUERY_TOKENS = 16  # the query's length unless the class gives `query_tokens`


class RerankClient(BatchClient):
    DEFAULT_BATCH = DEFAULT_DOCUMENTS
    DEFAULT_QUERY_TOKENS = DEFAULT_QUERY_TOKENS

    def options(self, endpoint: Endpoint) -> tuple[dict[str, Any], str, dict[str, Any]]:
        options, model = endpoint.rerank, endpoint.model
        rest: dict[str, Any] = {}
        if options.top_n is not None:
            rest["top_n"] = options.top_n
        if options.return_documents is not None:
            rest["return_documents" if options.api == "cohere" else "return_text"] = options.return_documents
        rest.update(options.extra_body)
        tei = options.api == "tei"
        return ({"model": model} if model is not None and not tei else {}), "texts" if tei else "documents", rest

    def answer(self, doc: Any, outcome: Outcome, cls: BatchClass) -> str | None:
        b = outcome.items
        tei = cls.items_key == "texts"  # api: tei (options)
        results = (doc if type(doc) is list else None) if tei else doc.get("results") if type(doc) is dict else None
        if type(results) is not list:
            return f"response has no {'list of scores' if tei else 'results list'}: {clip(doc)}"
        if len(results) > b:
            return f"{len(results)} results for {b} document{'s' if b != 1 else ''}"
        seen = [False] * b
        score_key = "score" if tei else "relevance_score"
        for i, entry in enumerate(results):
            index = entry.get("index") if type(entry) is dict else None
            if type(index) is not int or not 0 <= index < b:
                return f"results[{i}] names no document of 0..{b - 1}: {clip(entry, 80)}"
            if seen[index]:
                return f"results[{i}] scores document {index} a second time"
            seen[index] = True
            if type(entry.get(score_key)) not in (int, float):
                return f"results[{i}] has no {score_key} (a number): {clip(entry, 80)}"
        if not tei:
            usage_into(outcome, doc.get("usage"))
        return None

"""The wire protocols a scenario may name (`target.protocol`, a class's `protocol`): one row each.

The row is everything the rest of latscope needs to know about a protocol before speaking it: which
URLs it takes, its default method and path, whether it needs a model name or input tensors, whether
its requests are built from workload payloads, and which client speaks it. The scenario checks and
defaults read the table (schema.py), and so does the client factory (latscope/protocols/__init__.py),
so adding a protocol is one client module under latscope/protocols/ plus one row here.

Also here: the option sections of the protocols that have some (`openai:`, also for openai-responses;
`kserve:`, `anthropic:`, `embeddings:`, `rerank:`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Callable, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field

from latscope.scenario.base import HeaderValue, Model, check_http_url, check_url_text

DEFAULT_PROMPT_TOKENS = 32  # an openai class that gives neither prompt_tokens nor a dataset


class OpenAIOptions(Model):
    """How requests to an OpenAI-compatible server look. `extra_body` is merged into every request
    (temperature, vLLM's `ignore_eos`, ...). Protocol openai-responses takes `stream` and `extra_body`
    from here (its usage always comes: `api` and `include_usage` do not apply)."""

    api: Literal["chat", "completions"] = "chat"
    stream: bool = True
    include_usage: bool = True  # ask for the final usage chunk (stream_options.include_usage)
    extra_body: dict[str, Any] = {}


class AnthropicOptions(Model):
    """How requests to an Anthropic Messages API server look (protocol anthropic-messages): `version`
    is the anthropic-version header (unless the headers give one); `max_tokens` is sent when the class
    plans no output length (the API requires one); `extra_body` is merged into every request
    (temperature, `thinking: {type: enabled, budget_tokens: N}`, ...)."""

    version: HeaderValue = "2023-06-01"
    stream: bool = True
    max_tokens: int = Field(1024, ge=1)
    extra_body: dict[str, Any] = {}


class KServeOptions(Model):
    """KServe v2 / Open Inference Protocol options: `binary` uses the binary tensor extension (REST)
    for inputs and outputs; `outputs` names the outputs to ask for (default: all)."""

    binary: bool = False
    version: Annotated[str, AfterValidator(check_url_text)] | None = None  # goes into the path
    outputs: list[str] = []


class EmbeddingsOptions(Model):
    """How requests to an OpenAI-compatible /v1/embeddings look (protocol openai-embeddings):
    `encoding_format` is sent when given (`float` or `base64`; servers default to float);
    `extra_body` is merged into every request (`dimensions`, vLLM's `truncate_prompt_tokens`, ...)."""

    encoding_format: Literal["float", "base64"] | None = None
    extra_body: dict[str, Any] = {}


class RerankOptions(Model):
    """How rerank requests look (protocol rerank). `api: cohere` is the shape vLLM (/rerank, /v1/rerank,
    /v2/rerank), Jina and Cohere share: {model, query, documents, top_n?} answered by {results: [{index,
    relevance_score}], usage?}; `api: tei` is Hugging Face TEI's own /rerank: {query, texts} answered by
    [{index, score}] (give `path: /rerank`; TEI takes no model). `top_n` and `return_documents`
    (TEI: `return_text`) are sent when given; `extra_body` is merged into every request."""

    api: Literal["cohere", "tei"] = "cohere"
    top_n: int | None = Field(None, ge=1)
    return_documents: bool | None = None
    extra_body: dict[str, Any] = {}


def check_grpc_url(url: str) -> str:
    """grpc:// (plain) or grpcs:// (TLS), a host and a port, no path."""
    check_url_text(url)
    parts = urlsplit(url)
    if parts.scheme not in ("grpc", "grpcs") or not parts.hostname or parts.path not in ("", "/"):
        raise ValueError("kserve-v2-grpc needs a grpc://host:port (or grpcs:// for TLS) URL, like grpc://127.0.0.1:8001")
    try:
        if parts.port is None:
            raise ValueError
    except ValueError:
        raise ValueError("a grpc:// URL needs a port from 1 to 65535, like grpc://127.0.0.1:8001") from None
    return url


def openai_path(model: str | None, openai: OpenAIOptions, kserve: KServeOptions) -> str:
    return "/v1/chat/completions" if openai.api == "chat" else "/v1/completions"


def kserve_path(model: str | None, openai: OpenAIOptions, kserve: KServeOptions) -> str:
    return f"/v2/models/{model}" + (f"/versions/{kserve.version}" if kserve.version else "") + "/infer"


def responses_path(model: str | None, openai: OpenAIOptions, kserve: KServeOptions) -> str:
    return "/v1/responses"


def messages_path(model: str | None, openai: OpenAIOptions, kserve: KServeOptions) -> str:
    return "/v1/messages"


def embeddings_path(model: str | None, openai: OpenAIOptions, kserve: KServeOptions) -> str:
    return "/v1/embeddings"


def rerank_path(model: str | None, openai: OpenAIOptions, kserve: KServeOptions) -> str:
    return "/v1/rerank"  # TEI's own API is at /rerank (RerankOptions)


@dataclass(frozen=True)
class ProtocolSpec:
    name: str
    client: str  # "module:Class" under latscope.protocols; imported only by a worker that speaks it
    check_url: Callable[[str], str]  # the URL as given, or ValueError saying what one looks like
    url_example: str  # how a class that switches to this protocol writes its own url
    needs_model: bool = True  # target.model or the class's model is required (sent in every request)
    needs_tensors: bool = False  # the class must give `tensors` (the inputs)
    payloads: bool = True  # requests carry workload payloads (prompts, tensors) built in the worker
    default_method: str | None = "POST"  # None: the target's `method`
    # The path when neither the class nor the target gives one; None: the target's (empty) path.
    default_path: Callable[[str | None, OpenAIOptions, KServeOptions], str] | None = None
    default_prompt_tokens: int = 0  # prompt length of a class that gives neither prompt_tokens nor a dataset
    sessions: bool = False  # a class may be a `session` (conversations of text turns)


PROTOCOLS: dict[str, ProtocolSpec] = {
    spec.name: spec
    for spec in (
        ProtocolSpec("http", "http:HttpClient", check_http_url, "http://host:port", needs_model=False,
                     payloads=False, default_method=None),
        ProtocolSpec("openai", "openai:OpenAIClient", check_http_url, "http://host:port", default_path=openai_path,
                     default_prompt_tokens=DEFAULT_PROMPT_TOKENS, sessions=True),
        ProtocolSpec("openai-responses", "openai_responses:ResponsesClient", check_http_url, "http://host:port",
                     default_path=responses_path, default_prompt_tokens=DEFAULT_PROMPT_TOKENS, sessions=True),
        ProtocolSpec("anthropic-messages", "anthropic_messages:MessagesClient", check_http_url, "http://host:port",
                     default_path=messages_path, default_prompt_tokens=DEFAULT_PROMPT_TOKENS, sessions=True),
        ProtocolSpec("kserve-v2", "kserve:KServeClient", check_http_url, "http://host:port", needs_tensors=True,
                     default_path=kserve_path),
        ProtocolSpec("kserve-v2-grpc", "kserve_grpc:KServeGrpcClient", check_grpc_url, "grpc://host:port",
                     needs_tensors=True, default_path=kserve_path),
        ProtocolSpec("openai-embeddings", "embeddings:EmbeddingsClient", check_http_url, "http://host:port",
                     default_path=embeddings_path, default_prompt_tokens=DEFAULT_PROMPT_TOKENS),
        ProtocolSpec("rerank", "rerank:RerankClient", check_http_url, "http://host:port", needs_model=False,
                     default_path=rerank_path, default_prompt_tokens=DEFAULT_PROMPT_TOKENS),  # TEI serves one model
    )
}
# The protocols whose requests carry a class's `batch` of items, and what an item is called (summary.json `batch`)
BATCH_PROTOCOLS = {"openai-embeddings": "inputs", "rerank": "documents"}
Protocol = Literal[tuple(PROTOCOLS)]  # type: ignore[valid-type]  # "http", "openai", ..., the rows' names


def check_url(url: str, protocol: str) -> str:
    """`url` checked against `protocol`'s URL rules (http's when the protocol itself is not known)."""
    return PROTOCOLS.get(protocol, PROTOCOLS["http"]).check_url(url)

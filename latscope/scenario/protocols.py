"""The wire protocols a scenario may name (`target.protocol`, a class's `protocol`): one row each.

The row is everything the rest of latscope needs to know about a protocol before speaking it: which
URLs it takes, its default method and path, whether it needs a model name or input tensors, whether
its requests are built from workload payloads, and which client speaks it. The scenario checks and
defaults read the table (schema.py), and so does the client factory (latscope/protocols/__init__.py),
so adding a protocol is one client module under latscope/protocols/ plus one row here.

Also here: the option sections of the protocols that have some (`openai:`, `kserve:`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Callable, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator

from latscope.scenario.base import Model, check_http_url, check_url_text

DEFAULT_PROMPT_TOKENS = 32  # an openai class that gives neither prompt_tokens nor a dataset


class OpenAIOptions(Model):
    """How requests to an OpenAI-compatible server look. `extra_body` is merged into every request
    (temperature, vLLM's `ignore_eos`, ...)."""

    api: Literal["chat", "completions"] = "chat"
    stream: bool = True
    include_usage: bool = True  # ask for the final usage chunk (stream_options.include_usage)
    extra_body: dict[str, Any] = {}


class KServeOptions(Model):
    """KServe v2 / Open Inference Protocol options: `binary` uses the binary tensor extension (REST)
    for inputs and outputs; `outputs` names the outputs to ask for (default: all)."""

    binary: bool = False
    version: Annotated[str, AfterValidator(check_url_text)] | None = None  # goes into the path
    outputs: list[str] = []


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


PROTOCOLS: dict[str, ProtocolSpec] = {
    spec.name: spec
    for spec in (
        ProtocolSpec("http", "http:HttpClient", check_http_url, "http://host:port", needs_model=False,
                     payloads=False, default_method=None),
        ProtocolSpec("openai", "openai:OpenAIClient", check_http_url, "http://host:port", default_path=openai_path,
                     default_prompt_tokens=DEFAULT_PROMPT_TOKENS),
        ProtocolSpec("kserve-v2", "kserve:KServeClient", check_http_url, "http://host:port", needs_tensors=True,
                     default_path=kserve_path),
        ProtocolSpec("kserve-v2-grpc", "kserve_grpc:KServeGrpcClient", check_grpc_url, "grpc://host:port",
                     needs_tensors=True, default_path=kserve_path),
    )
}
Protocol = Literal[tuple(PROTOCOLS)]  # type: ignore[valid-type]  # "http", "openai", "kserve-v2", "kserve-v2-grpc"


def check_url(url: str, protocol: str) -> str:
    """`url` checked against `protocol`'s URL rules (http's when the protocol itself is not known)."""
    return PROTOCOLS.get(protocol, PROTOCOLS["http"]).check_url(url)

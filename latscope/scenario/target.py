"""The `target:` section (the endpoint under test, how to talk to it, and an optional process to
launch), and `Endpoint`, what one workload class resolves to (Scenario.endpoint)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from pydantic import Field, ValidationInfo, field_validator

from latscope.scenario.base import (SECRET, SECRET_BY_NAME, URL_CREDENTIALS, Duration, HeaderName, Headers, HeaderValue, Model,
                                    ModelName, PositiveDuration, ProcessText, check_http_url, check_method, check_path)
from latscope.scenario.protocols import (AnthropicOptions, EmbeddingsOptions, KServeOptions, OpenAIOptions, Protocol,
                                        RerankOptions, check_url)


class Launch(Model):
    """A target process latscope starts before the run and stops after it."""

    command: ProcessText | list[ProcessText]  # a string is split with shlex when the target is launched
    ready_url: Annotated[str | None, URL_CREDENTIALS] = None
    ready_timeout: Duration = 60.0
    env: Annotated[dict[ProcessText, ProcessText], SECRET_BY_NAME] = {}
    cwd: ProcessText | None = None  # relative to the scenario file's folder
    # Cores the target keeps to itself (Linux): it is pinned to the last `cpus` cores, latscope and its
    # workers to the rest, and the default worker count is what is left. On a small machine a target
    # that spreads over every core preempts the workers and makes latscope late (send lag).
    cpus: int | None = Field(None, ge=1)

    @field_validator("command")
    @classmethod
    def _command_not_empty(cls, command: str | list[str]) -> str | list[str]:
        if not (command.strip() if isinstance(command, str) else command):
            raise ValueError("the command is empty")
        return command

    @field_validator("ready_url")
    @classmethod
    def _ready_url_is_http(cls, url: str | None) -> str | None:
        return None if url is None else check_http_url(url)


class Target(Model):
    """The endpoint under test, and how to talk to it (`protocol`)."""

    protocol: Protocol = "http"  # before url: the URL is checked against it
    url: Annotated[str, URL_CREDENTIALS]
    method: str = "GET"
    path: str = ""  # default for openai: /v1/chat/completions or /v1/completions; kserve-v2: /v2/models/<model>/infer
    headers: Annotated[Headers, SECRET_BY_NAME] = {}  # also gRPC metadata (lower-cased) for kserve-v2-grpc
    timeout: PositiveDuration = 30.0
    model: ModelName | None = None  # the `model` of OpenAI requests; the model name of KServe v2 requests
    api_key: Annotated[HeaderValue | None, SECRET] = None  # sent as "Authorization: Bearer ..."; use ${ENV}, never a literal
    # Sent with every request, its value a UUID that says the request's `seq` (its row in schedule.parquet:
    # latscope/request_ids.py), e.g. X-Request-Id:
    # server logs and packet captures can then be matched to latscope's own records. gRPC: lower-cased metadata.
    request_id_header: HeaderName | None = None
    openai: OpenAIOptions = OpenAIOptions()
    kserve: KServeOptions = KServeOptions()
    anthropic: AnthropicOptions = AnthropicOptions()  # protocol anthropic-messages
    embeddings: EmbeddingsOptions = EmbeddingsOptions()  # protocol openai-embeddings
    rerank: RerankOptions = RerankOptions()  # protocol rerank
    launch: Launch | None = None

    @field_validator("url")
    @classmethod
    def _url(cls, url: str, info: ValidationInfo) -> str:
        return check_url(url, info.data.get("protocol", "http"))

    @field_validator("method")
    @classmethod
    def _method(cls, method: str) -> str:
        return check_method(method)

    @field_validator("path")
    @classmethod
    def _path(cls, path: str) -> str:
        return check_path(path)


@dataclass(frozen=True)
class Endpoint:
    """A workload class's resolved endpoint (see Scenario.endpoint)."""

    protocol: str
    url: str
    method: str
    path: str
    headers: dict[str, str]
    timeout: float
    model: str | None
    api_key: str | None
    openai: OpenAIOptions
    kserve: KServeOptions
    request_id_header: str | None = None
    anthropic: AnthropicOptions = field(default_factory=AnthropicOptions)
    embeddings: EmbeddingsOptions = field(default_factory=EmbeddingsOptions)
    rerank: RerankOptions = field(default_factory=RerankOptions)

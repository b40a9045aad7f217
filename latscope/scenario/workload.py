"""The `workload:` section: *what* each request is. Weighted classes (recorded separately and together),
each with its endpoint overrides and what its requests carry: a body (http), prompt and answer lengths
or a dataset (openai), input tensors (kserve-v2). workload.py draws the lengths and builds payloads."""

from __future__ import annotations

import json
import math
from typing import Annotated, Any, Literal, Union, get_args

import numpy as np
from pydantic import BeforeValidator, Field, ValidationInfo, field_validator, model_validator

from latscope.scenario.base import (NAME_RE, SECRET_BY_NAME, URL_CREDENTIALS, Duration, Headers, HeaderValue, Model,
                                    ModelName, ProblemAt, check_method, check_path, check_unique)
from latscope.scenario.protocols import (AnthropicOptions, EmbeddingsOptions, KServeOptions, OpenAIOptions, Protocol,
                                        RerankOptions, check_url)
from latscope.scenario.settings import Goodput


MAX_LENGTH = 2**31 - 1  # lengths are int32 in the plan; limits.max_prompt_tokens is the practical bound


class FixedLength(Model):
    dist: Literal["fixed"] = "fixed"
    value: int = Field(ge=1, le=MAX_LENGTH)


class UniformLength(Model):
    """Uniform integers from `min` to `max`, both included."""

    dist: Literal["uniform"] = "uniform"
    min: int = Field(ge=1, le=MAX_LENGTH)
    max: int = Field(ge=1, le=MAX_LENGTH)

    @model_validator(mode="after")
    def _ordered(self) -> UniformLength:
        if self.max < self.min:
            raise ValueError(f"max ({self.max}) must be at least min ({self.min})")
        return self


class NormalLength(Model):
    """Normal with this mean and standard deviation (tokens), rounded, clipped to [min, max]."""

    dist: Literal["normal"] = "normal"
    mean: float = Field(gt=0)
    std: float = Field(ge=0)
    min: int = Field(1, ge=1, le=MAX_LENGTH)
    max: int | None = Field(None, ge=1, le=MAX_LENGTH)


class LognormalLength(Model):
    """Log-normal with this mean and standard deviation *in tokens* (not of the log), rounded,
    clipped to [min, max]: the long right tail of real prompt and answer lengths."""

    dist: Literal["lognormal"] = "lognormal"
    mean: float = Field(gt=0)
    std: float = Field(gt=0)
    min: int = Field(1, ge=1, le=MAX_LENGTH)
    max: int | None = Field(None, ge=1, le=MAX_LENGTH)


class EmpiricalLength(Model):
    """Lengths drawn (with replacement) from a file: a CSV column, a JSONL field, or one number per
    line of a text file."""

    dist: Literal["empirical"] = "empirical"
    file: str = Field(min_length=1)
    column: str | None = None  # CSV column or JSONL field (required for those)


LengthDist = Annotated[
    Union[FixedLength, UniformLength, NormalLength, LognormalLength, EmpiricalLength], Field(discriminator="dist")
]

LENGTH_DISTS = tuple(m.model_fields["dist"].default for m in get_args(get_args(LengthDist)[0]))


def _length(value: Any) -> Any:
    """`prompt_tokens: 128` is short for `{dist: fixed, value: 128}`."""
    if isinstance(value, int) and not isinstance(value, bool):
        return {"dist": "fixed", "value": value}
    return value


Length = Annotated[LengthDist, BeforeValidator(_length)]


def _at_most(dist: LengthDist | None, limit: int, what: str) -> LengthDist | None:
    """`dist` when none of its values can pass `limit` (an empirical one is cut to it where it is drawn); else
    ValueError: `what` (like "sessions have at most 64 turns"), then a max of at most `limit` to give instead."""
    if dist is not None and dist.dist != "empirical":
        top = dist.max if dist.dist != "fixed" else dist.value
        if top is None or top > limit:
            raise ValueError(f"{what}: give a max of at most {limit:,}")
    return dist


def encoded_body(body: Any) -> bytes:
    """A body as the http client sends it: a mapping or list as compact JSON, anything else as its
    text (the one place that says so: the client sends it, check_sizes bounds it)."""
    if isinstance(body, (dict, list)):
        return json.dumps(body, separators=(",", ":")).encode()
    return str(body).encode()


class Dataset(Model):
    """Prompts from a JSONL file: `format: text` takes the string in `field` of each line;
    `format: sharegpt` takes each conversation's first human turn (`conversations[].from/value`), or,
    for a class with a `session`, its human turns in order."""

    file: str = Field(min_length=1)
    format: Literal["text", "sharegpt"] = "text"
    field: str = "text"
    # By token length (workload.tokenizer counts them, latscope/tokenizer.py): prompts shorter than
    # min_tokens or longer than max_tokens are left out; with `cut`, longer ones are cut to max_tokens.
    min_tokens: int | None = Field(None, ge=1, le=MAX_LENGTH)
    max_tokens: int | None = Field(None, ge=1, le=MAX_LENGTH)
    cut: bool = False

    @model_validator(mode="after")
    def _token_bounds(self) -> Dataset:
        if self.min_tokens is not None and self.max_tokens is not None and self.max_tokens < self.min_tokens:
            raise ValueError(f"max_tokens ({self.max_tokens}) must be at least min_tokens ({self.min_tokens})")
        if self.cut and self.max_tokens is None:
            raise ValueError("cut: true cuts prompts to max_tokens: give max_tokens")
        return self

    @property
    def by_tokens(self) -> bool:
        """Whether prompts are picked or cut by their token length (which needs workload.tokenizer)."""
        return self.min_tokens is not None or self.max_tokens is not None


def _chat_template(value: Any) -> Any:
    """`chat_template: true` is short for `{}` (the template the tokenizer file carries), a string
    for `{file: ...}`, false for none."""
    if value is True:
        return {}
    if value is False:
        return None
    return {"file": value} if isinstance(value, str) else value


class ChatTemplate(Model):
    """The model's chat template (Jinja, as Hugging Face ships it): from `file` (a tokenizer_config.json,
    its `chat_template`, or a template file), or, without one, the tokenizer file's own `chat_template`."""

    file: str | None = Field(None, min_length=1)


class TokenizerSpec(Model):
    """`workload.tokenizer`: a local Hugging Face tokenizer.json (never downloaded; `pip install
    'latscope[tokenizer]'`) that counts dataset prompts' tokens exactly, picks or cuts them by length,
    and counts answers a server sends no usage for. With `chat_template`, a chat class's prompt is
    counted as the template renders it (one user message and the generation prompt)."""

    file: str = Field(min_length=1)
    chat_template: Annotated[ChatTemplate | None, BeforeValidator(_chat_template)] = None


MAX_BATCH = 16384  # items (embeddings' inputs, rerank's documents) in one request: an empirical batch is cut to it
MAX_TURNS = 64  # turns of one session: per-turn histograms are kept for every turn index
MAX_THINK_S = 3600.0


class FixedThink(Model):
    dist: Literal["fixed"] = "fixed"
    value: Duration


class UniformThink(Model):
    """Uniform between `min` and `max` seconds."""

    dist: Literal["uniform"] = "uniform"
    min: Duration
    max: Duration

    @model_validator(mode="after")
    def _ordered(self) -> UniformThink:
        if self.max < self.min:
            raise ValueError(f"max ({self.max:g} s) must be at least min ({self.min:g} s)")
        return self


class ExponentialThink(Model):
    """Exponential with this mean (memoryless: a user as likely to answer now as later)."""

    dist: Literal["exponential"] = "exponential"
    mean: Annotated[Duration, Field(gt=0)]


class LognormalThink(Model):
    """Log-normal with this mean and standard deviation in seconds (not of the log)."""

    dist: Literal["lognormal"] = "lognormal"
    mean: Annotated[Duration, Field(gt=0)]
    std: Annotated[Duration, Field(gt=0)]


ThinkDist = Annotated[Union[FixedThink, UniformThink, ExponentialThink, LognormalThink], Field(discriminator="dist")]


def _think(value: Any) -> Any:
    """`think_time: 2s` (or a number of seconds) is short for `{dist: fixed, value: 2s}`."""
    if isinstance(value, (int, float, str)) and not isinstance(value, bool):
        return {"dist": "fixed", "value": value}
    return value


def _think_at_most(think: ThinkDist, what: str) -> ThinkDist:
    top = {"fixed": "value", "uniform": "max", "exponential": "mean", "lognormal": "mean"}[think.dist]
    if getattr(think, top) > MAX_THINK_S:
        raise ValueError(f"{what} are at most {MAX_THINK_S:g} s")
    return think


class SharedPrefix(Model):
    """A system prompt of `tokens` tokens in front of every turn of the class's sessions: the same text
    for every session, or one of `variants` different texts (each session takes one, seeded)."""

    tokens: int = Field(ge=1, le=MAX_LENGTH)
    variants: int = Field(1, ge=1, le=1_000_000)


class Session(Model):
    """The class's requests are conversations: `turns` turns, each sent `think_time` after the answer
    to the one before (open loop: a session's *start* comes from the phase's arrivals; its later
    turns from its own answers). Each turn's new text has the class's prompt_tokens and asks for its
    output_tokens (or comes from a ShareGPT dataset's human turns, in order). `history: carry` sends
    every earlier turn and the answer the server gave to it (chat); `new` sends only the new text.
    A carried history is bounded: past `max_history_bytes` (or the worker's
    limits.max_carried_bytes_per_worker) the session ends `history_limit` (chat.py). A carried answer
    leaves a reasoning model's reasoning out (as OpenAI, DeepSeek and vLLM recommend);
    `carry_reasoning: true` keeps it (protocols/openai.py)."""

    turns: Length | None = None  # default: 1, or a ShareGPT conversation's human turns
    think_time: Annotated[ThinkDist, BeforeValidator(_think)] = FixedThink(value=0.0)
    history: Literal["carry", "new"] = "carry"
    shared_prefix: SharedPrefix | None = None
    # The most one session's carried history may hold, as the client keeps it (the earlier turns and
    # answers, JSON-escaped: ~4-5 bytes a token). 8 MiB holds any history a real server accepts (a
    # 1M-token context, limits.max_prompt_tokens' default, is ~5 MB of text), while a target whose
    # answers are enormous ends the session after one of them instead of filling the worker's memory.
    max_history_bytes: int = Field(8 << 20, ge=1)
    carry_reasoning: bool = False  # history: carry keeps each answer's reasoning too (default: the answer only)

    @field_validator("turns")
    @classmethod
    def _turns_bounded(cls, turns: LengthDist | None) -> LengthDist | None:
        return _at_most(turns, MAX_TURNS, f"sessions have at most {MAX_TURNS} turns")

    @field_validator("think_time")
    @classmethod
    def _think_bounded(cls, think: ThinkDist) -> ThinkDist:
        return _think_at_most(think, "think times")


MAX_TOOLS = 128  # tools one agent declares


class Tools(Model):
    """The tools an agent declares, sent with every request as the body's `tools` (in its API's shape:
    protocols/tools.py): `count` functions, each taking one string argument, whose descriptions come to
    `schema_tokens` words of the synthetic text in all (a real agent's tool schemas are thousands of
    tokens, which the server prefills every round and a prefix cache keeps)."""

    count: int = Field(1, ge=1, le=MAX_TOOLS)
    schema_tokens: int = Field(0, ge=0, le=MAX_LENGTH)


MAX_FAN_OUT = 16  # sub-agents one fan-out starts


class _Rounds(Model):
    """What an agent and a fan-out's sub-agents both have: rounds, tool waits, tool results."""

    rounds: Length  # model rounds per job, at most MAX_TURNS
    tool_latency: Annotated[ThinkDist | None, BeforeValidator(_think)] = None
    tool_result_tokens: Length | None = None

    @field_validator("rounds")
    @classmethod
    def _rounds_bounded(cls, rounds: LengthDist) -> LengthDist:
        return _at_most(rounds, MAX_TURNS, f"agent jobs have at most {MAX_TURNS} rounds")

    @field_validator("tool_latency")
    @classmethod
    def _latency_bounded(cls, latency: ThinkDist | None) -> ThinkDist | None:
        return None if latency is None else _think_at_most(latency, "tool latencies")


class FanOut(_Rounds):
    """At round `at_round` of a job (after its answer), `agents` sub-agents start at once, each a job of
    its own: `rounds` rounds, its task of `prompt_tokens` (default: the class's), the class's tools and
    output_tokens, its own context. The parent's next round goes when the last of them has ended (the
    sub-agents are that round's tool: no tool wait of its own), carrying their final answers and its
    tool result. A failed sub-agent round abandons the whole job. Unset fields take the agent's."""

    at_round: int = Field(ge=1, le=MAX_TURNS - 1)
    agents: Length
    prompt_tokens: Length | None = None

    @field_validator("agents")
    @classmethod
    def _agents_bounded(cls, agents: LengthDist) -> LengthDist:
        return _at_most(agents, MAX_FAN_OUT, f"a fan-out starts at most {MAX_FAN_OUT} sub-agents")


class Agent(_Rounds):
    """The class's requests are agent jobs (docs/agents.md): each job sends `rounds` requests over
    one growing context. Round 1 sends the task (the class's prompt_tokens) with the declared `tools`;
    the model answers (with tool calls, or text); the tools run for `tool_latency`, and round k + 1 is
    sent then, carrying the whole context so far: every earlier request's new text, the model's answers
    as the API represents them (its tool calls with their arguments as streamed), and the round's tool
    result of `tool_result_tokens` (as the answer to each tool call the model made, else as a user
    message). Arrivals are job starts (open loop) or agents (closed loop, `arrival: {type: users}`).
    A job is a session whose turns are rounds and whose think times are tool waits, so everything a
    session has (by-turn metrics, prefix-cache hit rate by turn, bounds on the carried history) holds
    for jobs by round."""

    tools: Tools = Tools()
    tool_latency: Annotated[ThinkDist, BeforeValidator(_think)] = FixedThink(value=0.0)
    # tool_result_tokens (_Rounds): default, the class's prompt_tokens
    max_history_bytes: int = Field(8 << 20, ge=1)  # as a session's (Session.max_history_bytes)
    carry_reasoning: bool = False  # as a session's (openai chat only)
    fan_out: FanOut | None = None
    # A job is good (summary.json agents.<class>.goodput; SLO metric job_goodput) when it completed
    # within max_job_time and each of its rounds met the class's goodput objectives (when it has some).
    max_job_time: Duration | None = None

    @field_validator("max_job_time")
    @classmethod
    def _positive(cls, limit: float | None) -> float | None:
        if limit is not None and limit <= 0:
            raise ValueError("max_job_time must be more than 0 s")
        return limit

    @model_validator(mode="after")
    def _fan_out_within_rounds(self) -> Agent:
        if self.fan_out is not None:
            low = self.rounds.value if self.rounds.dist == "fixed" else getattr(self.rounds, "min", 1)
            if self.fan_out.at_round >= low:
                raise ValueError(f"fan_out.at_round {self.fan_out.at_round}: the sub-agents report to the round after it, "
                                 f"so every job needs more rounds than that (rounds can be {low})")
        return self

    def sub_agent(self) -> Agent:
        """What a sub-agent of the fan-out is: its own rounds and waits, this agent's tools, no fan-out."""
        fan_out = self.fan_out
        return self.model_copy(update={
            "rounds": fan_out.rounds, "tool_latency": fan_out.tool_latency or self.tool_latency,
            "tool_result_tokens": fan_out.tool_result_tokens or self.tool_result_tokens, "fan_out": None})

    def as_session(self) -> Session:
        """The session a job is: rounds as turns, tool waits as think times, the history carried."""
        return Session(turns=self.rounds, think_time=self.tool_latency, history="carry",
                       max_history_bytes=self.max_history_bytes, carry_reasoning=self.carry_reasoning)


# The KServe v2 datatypes a tensor may be given as, and the numpy dtype of each (workload.py builds
# them, check_sizes bounds their bytes).
DTYPES: dict[str, np.dtype] = {name: np.dtype(t) for name, t in (
    ("BOOL", np.bool_), ("INT8", np.int8), ("INT16", np.int16), ("INT32", np.int32), ("INT64", np.int64),
    ("UINT8", np.uint8), ("UINT16", np.uint16), ("UINT32", np.uint32), ("UINT64", np.uint64),
    ("FP16", np.float16), ("FP32", np.float32), ("FP64", np.float64))}


class TensorSpec(Model):
    """One input tensor of a KServe v2 request: random values (seeded) or the contents of a .npy file."""

    name: str = Field(min_length=1)
    datatype: Literal[tuple(DTYPES)] = "FP32"  # type: ignore[valid-type]
    shape: list[Annotated[int, Field(ge=1)]] = Field(default=[], min_length=0)
    npy: str | None = None  # a .npy file; its shape and dtype win
    low: float = 0.0  # random values are uniform in [low, high) (integers: high excluded)
    high: float = 1.0

    @model_validator(mode="after")
    def _shape_or_file(self) -> TensorSpec:
        if self.npy is None and not self.shape:
            raise ValueError("give a shape (like [1, 384]) for random values, or an npy file")
        return self


class WorkloadClass(Model):
    """A kind of request, drawn with probability proportional to `weight` and recorded separately.

    Unset endpoint fields fall back to the target's (protocol, url, method, path, model, openai,
    kserve) or the workload's (body); headers add to the target's. What a request carries depends on
    the protocol: `body` (http); `prompt_tokens`/`output_tokens` or a `dataset` (openai); `tensors`
    (kserve-v2, kserve-v2-grpc); `batch` items of `prompt_tokens` each, or a dataset's rows, with a
    query of `query_tokens` for rerank (openai-embeddings, rerank). `goodput` overrides the scenario's goodput objectives field by field
    for this class (Scenario.goodput_objectives).
    """

    name: str
    weight: float = Field(1.0, gt=0)
    protocol: Protocol | None = None
    url: Annotated[str | None, URL_CREDENTIALS] = None
    method: str | None = None
    path: str | None = None
    headers: Annotated[Headers, SECRET_BY_NAME] = {}
    model: ModelName | None = None
    openai: OpenAIOptions | None = None
    kserve: KServeOptions | None = None
    anthropic: AnthropicOptions | None = None
    body: Any = None
    prompt_tokens: Length | None = None
    output_tokens: Length | None = None
    dataset: Dataset | None = None
    tensors: list[TensorSpec] = []
    goodput: Goodput | None = None
    session: Session | None = None
    agent: Agent | None = None
    # Batch protocols (openai-embeddings, rerank): `batch` items in each request, each of prompt_tokens
    # tokens (or a dataset's rows); rerank's query has query_tokens. Drawn per request (protocols/embeddings.py).
    batch: Length | None = None
    query_tokens: Length | None = None
    embeddings: EmbeddingsOptions | None = None
    rerank: RerankOptions | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        # Class names become histogram tags ("latency/small") and column values.
        if not NAME_RE.fullmatch(name):
            raise ValueError("a class name may use only letters, digits, '_', '.' and '-'")
        if name == "all":
            raise ValueError("'all' is reserved for the aggregate of all classes")
        return name

    @field_validator("method")
    @classmethod
    def _method(cls, method: str | None) -> str | None:
        return None if method is None else check_method(method)

    @field_validator("path")
    @classmethod
    def _path(cls, path: str | None) -> str | None:
        return None if path is None else check_path(path)

    @field_validator("url")
    @classmethod
    def _url(cls, url: str | None, info: ValidationInfo) -> str | None:
        protocol = info.data.get("protocol")
        if url is None or protocol is None:  # checked against the target's protocol by the scenario
            return url
        return check_url(url, protocol)

    @field_validator("batch")
    @classmethod
    def _batch_bounded(cls, batch: LengthDist | None) -> LengthDist | None:
        return _at_most(batch, MAX_BATCH, f"a request carries at most {MAX_BATCH:,} items")

    @model_validator(mode="after")
    def _one_prompt_source(self) -> WorkloadClass:
        if self.dataset is not None and self.prompt_tokens is not None:
            raise ValueError("give prompt_tokens (synthetic prompts) or a dataset, not both")
        if self.agent is not None and self.session is not None:
            raise ValueError("an agent's jobs are sessions of their own (rounds, tool_latency): give agent or session, "
                             "not both")
        if self.agent is not None and self.dataset is not None:
            raise ValueError("an agent's task and tool results are synthetic text of prompt_tokens and "
                             "tool_result_tokens: leave out the dataset")
        return self

    @property
    def conversation(self) -> Session | None:
        """What the class's requests are turns of: its session, or its agent's jobs as one (None: neither)."""
        return self.agent.as_session() if self.agent is not None else self.session


class Workload(Model):
    """Request bodies and classes. A mapping or list body is sent as JSON, a string as is."""

    body: Any = None
    content_type: HeaderValue | None = None
    classes: list[WorkloadClass] = []
    tokenizer: TokenizerSpec | None = None  # exact token counts (latscope/tokenizer.py)

    @field_validator("classes")
    @classmethod
    def _unique_names(cls, classes: list[WorkloadClass]) -> list[WorkloadClass]:
        check_unique([c.name for c in classes], "class")
        return classes

    @model_validator(mode="after")
    def _tokenizer_for_lengths(self) -> Workload:
        for i, c in enumerate(self.classes):
            if c.dataset is not None and c.dataset.by_tokens and self.tokenizer is None:
                field_name = "min_tokens" if c.dataset.min_tokens is not None else "max_tokens"
                raise ProblemAt(("workload", "classes", i, "dataset", field_name), "picking prompts by token length needs a "
                                "tokenizer: give workload.tokenizer: {file: path/to/tokenizer.json}")
        return self

    def check_sizes(self, limit: int) -> None:
        """Each body (as sent) and each class's random input tensors within `limit` bytes (limits.
        max_body_bytes), before a worker builds one: a shape of [100000, 100000, 100] is 4 TB."""
        bodies = [(("workload", "body"), self.body), *((("workload", "classes", i, "body"), c.body)
                                                         for i, c in enumerate(self.classes))]
        for path, body in bodies:
            if body is not None and (size := len(encoded_body(body))) > limit:
                raise ProblemAt(path, f"the body is {size:,} bytes as sent; the limit is {limit:,} (limits.max_body_bytes)")
        for i, cls in enumerate(self.classes):
            total = 0
            for j, tensor in enumerate(cls.tensors):
                total += math.prod(tensor.shape) * DTYPES[tensor.datatype].itemsize if tensor.npy is None else 0
                if total > limit:
                    raise ProblemAt(("workload", "classes", i, "tensors", j, "shape"),
                                    f"the class's input tensors come to {total:,} bytes a request; the limit is "
                                    f"{limit:,} (limits.max_body_bytes)")

    def effective_classes(self) -> list[WorkloadClass]:
        """The classes requests are drawn from: one class named "default" when none are given."""
        return list(self.classes) or [WorkloadClass(name="default")]

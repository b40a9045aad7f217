"""The root of the scenario schema: `Scenario`, its sections (each in a module of its own, in the
order a scenario file is written), the checks across sections, and `endpoint()`, what one workload
class resolves to."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Iterator, Literal

from pydantic import BeforeValidator, Field, PrivateAttr, ValidationInfo, field_validator, model_validator

from latscope.errors import ScenarioError
from latscope.scenario.actions import Action, check_actions
from latscope.scenario.base import NAME_RE, DataPath, Model, ProblemAt, check_unique, dotted, split_credentials
from latscope.scenario.phases import Phase
from latscope.scenario.protocols import BATCH_PROTOCOLS, PROTOCOLS, ProtocolSpec
from latscope.scenario.settings import GOODPUT, GOODPUT_OBJECTIVES, Goodput, Limits, Output, Slo, Validity
from latscope.scenario.target import Endpoint, Target
from latscope.scenario.telemetry import Telemetry
from latscope.scenario.workload import Workload, WorkloadClass

MAX_SEED = 2**63 - 1


def _salt(value: Any) -> Any:
    """`prompt_salt`: run, none, or an integer in [0, MAX_SEED] (written as a number or a string of digits)."""
    if isinstance(value, str) and value.strip().isdigit() and len(value.strip()) <= 19:
        value = int(value)
    if value in ("run", "none") or (isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_SEED):
        return value
    raise ValueError(f"`run` (a new salt every run), `none` (the prompts depend on the seed alone) or an integer "
                     f"salt from 0 to {MAX_SEED}, not {str(value)[:40]!r}")


class Scenario(Model):
    """A latscope scenario: what to hit, with what traffic, for how long."""

    name: str | None = None  # load_scenario fills in the file's stem
    description: str = ""
    seed: int = Field(0, ge=0, le=MAX_SEED)  # numpy takes any integer >= 0; this range fits an int64 anywhere
    # The synthetic prompts' salt (workload.py), so that a second run against the same server is not
    # measured against its prefix cache: `run` (the default) draws a new salt for every run (the same
    # lengths, structure and shared prefixes within the run, other words from run to run); `none`
    # makes the prompts a function of the seed alone (the same text every run); an integer is that
    # salt (summary.json `prompt_salt.value` repeats a run's prompts exactly: --set prompt_salt=N).
    prompt_salt: Annotated[Literal["run", "none"] | int, BeforeValidator(_salt)] = "run"
    target: Target
    phases: list[Phase] = Field(min_length=1)
    workload: Workload = Workload()
    limits: Limits = Limits()
    slos: list[Slo] = []
    goodput: Goodput | None = None  # per-request objectives; None: no goodput is counted
    output: Output = Output()
    validity: Validity = Validity()
    telemetry: Telemetry = Telemetry()
    actions: list[Action] = []

    # Set by the loader, not part of the schema. The base directory makes relative paths (trace
    # file, launch cwd) mean "next to the scenario file" wherever latscope is started from.
    _source: Path | None = PrivateAttr(default=None)
    _base_dir: Path = PrivateAttr(default_factory=Path.cwd)
    # data path -> the string as written before ${VAR} interpolation, for redacted_yaml
    _templates: dict[DataPath, str] = PrivateAttr(default_factory=dict)
    # The loader's record of where each value came from (load.py's _Origin): Scenario.problem
    _origin: Any = PrivateAttr(default=None)
    # A file as written in the scenario -> where it is on this machine instead (a distributed run's
    # node keeps the files it fetched from the master in its cache: use_files)
    _files: dict[str, Path] = PrivateAttr(default_factory=dict)
    # Whether the run drew prompt_salt itself (`prompt_salt: run`, workload.with_run_salt)
    _salt_drawn: bool = PrivateAttr(default=False)

    @field_validator("name")
    @classmethod
    def _name(cls, name: str | None) -> str | None:
        # The name becomes part of the results directory's name.
        if name is not None and not NAME_RE.fullmatch(name):
            raise ValueError("a scenario name may use only letters, digits, '_', '.' and '-'")
        return name

    @field_validator("phases")
    @classmethod
    def _unique_phase_names(cls, phases: list[Phase]) -> list[Phase]:
        check_unique([p.name for p in phases], "phase")
        return phases

    @model_validator(mode="after")
    def _phase_classes_exist(self) -> Scenario:
        known = [c.name for c in self.workload.effective_classes()]
        for i, phase in enumerate(self.phases):
            for j, name in enumerate(phase.classes or ()):
                if name not in known:
                    raise ProblemAt(("phases", i, "classes", j), f"{name!r} is not a workload class (known: {', '.join(known)})")
            if getattr(phase.arrival, "format", None) == "agents":  # its arrivals are agent jobs
                classes = self.workload.effective_classes()
                if not all(c.agent is not None for c in classes if phase.classes is None or c.name in phase.classes):
                    agents = [c.name for c in classes if c.agent is not None]
                    raise ProblemAt(("phases", i, "classes"), "an agent trace's arrivals are agent jobs: give the phase "
                                    f"classes: [...] of agent classes only (here: {', '.join(agents) or 'none'})")
        return self

    @field_validator("actions")
    @classmethod
    def _unique_action_names(cls, actions: list[Action]) -> list[Action]:
        check_unique([a.name for a in actions], "action")
        return actions

    @model_validator(mode="after")
    def _actions_fit(self) -> Scenario:
        check_actions(self.actions, self.phases, launched=self.target.launch is not None)
        return self

    @field_validator("slos")
    @classmethod
    def _slo_classes_exist(cls, slos: list[Slo], info: ValidationInfo) -> list[Slo]:
        # A misspelt class would otherwise make an SLO that can never be evaluated.
        workload = info.data.get("workload")
        if workload is not None:
            known = ["all", *(c.name for c in workload.effective_classes())]
            for i, slo in enumerate(slos):
                if slo.class_ not in known:
                    raise ValueError(f"slos[{i}].class {slo.class_!r} is not a workload class (known: {', '.join(known)})")
        return slos

    @model_validator(mode="after")
    def _goodput_slos_have_objectives(self) -> Scenario:
        # A goodput SLO over requests that nothing judges would be "no data", a failure, in every run.
        objectives = dict(zip((c.name for c in self.workload.effective_classes()), self.goodput_objectives()))
        for i, slo in enumerate(self.slos):
            if slo.metric != GOODPUT:
                continue
            if not any(objectives.values()):
                raise ProblemAt(("slos", i), "a goodput SLO needs goodput objectives: add a `goodput:` section "
                                             "(ttft_ms, tpot_ms, itl_ms, latency_ms, ttfot_ms) or one to a workload class")
            if slo.class_ != "all" and objectives.get(slo.class_) is None:
                raise ProblemAt(("slos", i, "class"), f"class {slo.class_!r} has no goodput objectives (give the scenario "
                                                      "or the class a `goodput:` section)")
        return self

    def goodput_objectives(self) -> list[dict[str, float] | None]:
        """The goodput objectives of each workload class, by class index: the class's own `goodput`
        over the scenario's, field by field ({"ttft_ms": 500.0, ...}, in GOODPUT_OBJECTIVES' order);
        None for a class with none."""
        top = self.goodput.objectives() if self.goodput is not None else {}
        out: list[dict[str, float] | None] = []
        for cls in self.workload.effective_classes():
            merged = {**top, **(cls.goodput.objectives() if cls.goodput is not None else {})}
            out.append({k: merged[k] for k in GOODPUT_OBJECTIVES if k in merged} or None)
        return out

    @model_validator(mode="after")
    def _requests_fit_limits(self) -> Scenario:
        self.workload.check_sizes(self.limits.max_body_bytes)
        return self

    @model_validator(mode="after")
    def _classes_fit_their_protocol(self) -> Scenario:
        for i, cls in enumerate(self.workload.effective_classes()):
            where: DataPath = ("workload", "classes", i) if self.workload.classes else ("target",)
            protocol = cls.protocol or self.target.protocol
            spec = PROTOCOLS[protocol]
            if cls.url is not None and cls.protocol is None:
                try:
                    spec.check_url(cls.url)
                except ValueError as exc:
                    raise ProblemAt((*where, "url"), str(exc)) from None
            if spec.needs_model and (cls.model or self.target.model) is None:
                raise ProblemAt(where, f"protocol {protocol} needs a model name (target.model or the class's model)")
            if cls.agent is not None and (not spec.sessions or (protocol == "openai" and (cls.openai or self.target.openai).api != "chat")):
                raise ProblemAt((*where, "agent"), f"agents call tools: they need protocol openai (api: chat), "
                                                    f"openai-responses or anthropic-messages, not {protocol}"
                                                    + (" with api: completions" if protocol == "openai" else ""))
            if cls.agent is not None and cls.agent.carry_reasoning and protocol != "openai":
                raise ProblemAt((*where, "agent", "carry_reasoning"), f"{protocol} cannot carry reasoning: its API takes "
                                "reasoning back only as the items the server signed or encrypted, which latscope does not keep")
            if cls.session is not None and not spec.sessions:
                raise ProblemAt((*where, "session"), f"sessions are conversations of text turns: they need protocol "
                                                      f"openai, openai-responses or anthropic-messages, not {protocol}")
            if cls.session is not None and cls.session.carry_reasoning and protocol != "openai":
                raise ProblemAt((*where, "session", "carry_reasoning"), f"{protocol} cannot carry reasoning: its API takes "
                                "reasoning back only as the items the server signed or encrypted, which latscope does not keep")
            _batch_fields_fit(cls, protocol, where)
            if spec.needs_tensors and not cls.tensors:
                raise ProblemAt(where, f"protocol {protocol} needs tensors (the inputs to send)")
            if cls.protocol is not None and cls.url is None and not _takes(spec, self.target.url):
                raise ProblemAt(where, f"a class that switches to {protocol} needs its own url ({spec.url_example})")
            self._credentials_once(cls, where)
        return self

    def _credentials_once(self, cls: WorkloadClass, where: DataPath) -> None:
        """URL userinfo becomes basic authentication (endpoint()); with an Authorization header or an
        api_key as well, one would silently replace the other."""
        url_path = (*where, "url") if cls.url is not None else ("target", "url")
        if split_credentials(cls.url or self.target.url)[1] is None:
            return
        if self.target.api_key is not None:
            raise ProblemAt(url_path, "the URL holds user:password@ (sent as basic authentication) and target.api_key is "
                                      "set too: give the credentials once")
        if any(name.lower() == "authorization" for name in (*self.target.headers, *cls.headers)):
            raise ProblemAt(url_path, "the URL holds user:password@ (sent as basic authentication) and an Authorization "
                                      "header is given too: give the credentials once")

    def endpoint(self, cls: int) -> Endpoint:
        """Where and how requests of workload class `cls` go: the class's settings over the target's,
        then the protocol's defaults (protocols.PROTOCOLS)."""
        c, t = self.workload.effective_classes()[cls], self.target
        protocol = c.protocol or t.protocol
        spec = PROTOCOLS[protocol]
        model = c.model or t.model
        openai, kserve = c.openai or t.openai, c.kserve or t.kserve
        if c.path is not None:
            path = c.path
        elif t.path or spec.default_path is None:
            path = t.path
        else:
            path = spec.default_path(model, openai, kserve)
        url, basic_auth = split_credentials(c.url or t.url)  # never sent in the Host header
        return Endpoint(
            protocol=protocol,
            url=url,
            method=c.method or spec.default_method or t.method,
            path=path,
            headers={**t.headers, **c.headers, **({"Authorization": basic_auth} if basic_auth else {})},
            timeout=t.timeout,
            model=model,
            api_key=t.api_key,
            openai=openai,
            kserve=kserve,
            request_id_header=t.request_id_header,
            anthropic=c.anthropic or t.anthropic,
            embeddings=c.embeddings or t.embeddings,
            rerank=c.rerank or t.rerank,
        )

    def problem(self, path: DataPath, message: str) -> ScenarioError:
        """The error for a problem found after validation, about the field at `path` (a file it
        names does not load; the plan it makes is too big): "file:LINE: dotted.path: message", as
        the loader words its own, so the user is sent to the line to change and not only told
        what is wrong with, say, a trace file."""
        if self._origin is None:  # built without the loader (Scenario(...), model_validate)
            return ScenarioError(f"invalid scenario: {dotted(path)}: {message}")
        return self._origin.error(path, message)

    @contextmanager
    def about(self, path: DataPath) -> Iterator[None]:
        """Within it, a ScenarioError (a file the field at `path` names does not load) is reraised
        as Scenario.problem: the data file's own message, after the scenario's file:line:field."""
        try:
            yield
        except ScenarioError as exc:
            raise self.problem(path, str(exc)) from None

    @property
    def templates(self) -> dict[DataPath, str]:
        """Each string as written before `${VAR}` interpolation, by data path (the loader's record):
        what redaction writes back instead of the environment's values."""
        return self._templates

    @property
    def source(self) -> Path | None:
        """The file this scenario was loaded from (None when built from a dict)."""
        return self._source

    @property
    def base_dir(self) -> Path:
        """The folder relative paths in the scenario are resolved against."""
        return self._base_dir

    def use_files(self, base_dir: Path, files: dict[str, Path]) -> None:
        """Resolve relative paths against `base_dir`, and each file named in `files` (as written
        in the scenario) to its local copy: a distributed run's node, whose scenario came as text."""
        self._base_dir, self._files = base_dir, dict(files)

    def resolve_path(self, p: str) -> Path:
        """`p` (e.g. a trace file) as an absolute path: relative paths count from `base_dir`."""
        if p in self._files:
            return self._files[p]
        path = Path(p).expanduser()
        return path if path.is_absolute() else self._base_dir / path


def _batch_fields_fit(cls: WorkloadClass, protocol: str, where: DataPath) -> None:
    """`batch` and `query_tokens` belong to the batch protocols (rerank alone has a query); those send
    no max_tokens, so an output_tokens there would be a length nothing asks for."""
    fields = {"batch": BATCH_PROTOCOLS, "query_tokens": ("rerank",)}
    for name, protocols in fields.items():
        if getattr(cls, name) is not None and protocol not in protocols:
            raise ProblemAt((*where, name), f"`{name}` is for protocol {' or '.join(protocols)}, not {protocol}")
    if protocol in BATCH_PROTOCOLS and cls.output_tokens is not None:
        raise ProblemAt((*where, "output_tokens"), f"protocol {protocol} generates no text: it has no output_tokens "
                                                   "(give batch and prompt_tokens: the items of each request and their length)")


def _takes(spec: ProtocolSpec, url: str) -> bool:
    """Whether `url` is a URL of `spec`'s protocol."""
    try:
        spec.check_url(url)
    except ValueError:
        return False
    return True

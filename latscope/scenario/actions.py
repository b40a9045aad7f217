"""The `actions:` section: things done to the system under test at set times of the run (a command,
an HTTP call, a restart of the launched target); latscope/run/actions.py carries them out."""

from __future__ import annotations

from typing import Annotated, Any, Sequence

from pydantic import ConfigDict, Field, field_validator, model_serializer, model_validator

from latscope.scenario.base import (NAME_RE, SECRET_BY_NAME, URL_CREDENTIALS, DataPath, Duration, Headers, Model,
                                    PositiveDuration, ProblemAt, ProcessText, check_http_url, check_method)
from latscope.scenario.phases import Phase


class ActionWhen(Model):
    """An action's time given as "when phase `phase` starts, plus `after`"."""

    phase: str = Field(min_length=1)
    after: Duration = 0.0


class HttpCall(Model):
    """An HTTP request an action makes (an admin API, a webhook). `json` is sent as JSON, `body` as
    is; `expect` lists the status codes that count as success (default: any 2xx)."""

    model_config = ConfigDict(populate_by_name=True)

    method: str | None = None  # default: POST with a json/body, GET without
    url: Annotated[str, URL_CREDENTIALS]
    headers: Annotated[Headers, SECRET_BY_NAME] = {}
    json_: Any = Field(None, alias="json")  # "json" would shadow BaseModel.json
    body: str | None = None
    expect: list[Annotated[int, Field(ge=100, le=599)]] = []

    @field_validator("method")
    @classmethod
    def _method(cls, method: str | None) -> str | None:
        return None if method is None else check_method(method)

    @field_validator("url")
    @classmethod
    def _url(cls, url: str) -> str:
        return check_http_url(url)

    @model_validator(mode="after")
    def _one_body(self) -> HttpCall:
        if self.json_ is not None and self.body is not None:
            raise ValueError("give json (sent as JSON) or body (sent as is), not both")
        if self.method is None:
            self.method = "GET" if self.json_ is None and self.body is None else "POST"
        return self


ACTION_KINDS = ("command", "http", "restart")


class Action(Model):
    """Something done at one time of the run: a shell command (run without a shell), an HTTP call,
    or a restart of the launched target. `at` counts from the run's start (t=0, the first intended
    send); `when` from a phase's start. Its start and outcome go to events.jsonl."""

    name: str
    at: Duration | None = None
    when: ActionWhen | None = None
    command: ProcessText | list[ProcessText] | None = None  # a string is split with shlex; `python` means latscope's interpreter
    env: Annotated[dict[ProcessText, ProcessText], SECRET_BY_NAME] = {}  # added to the command's environment
    cwd: ProcessText | None = None  # the command's folder, relative to the scenario file's folder
    http: HttpCall | None = None
    restart: bool = False  # restart target.launch
    timeout: PositiveDuration = 30.0

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not NAME_RE.fullmatch(name):
            raise ValueError("an action name may use only letters, digits, '_', '.' and '-'")
        return name

    @field_validator("command")
    @classmethod
    def _command_not_empty(cls, command: str | list[str] | None) -> str | list[str] | None:
        if command is not None and not (command.strip() if isinstance(command, str) else command):
            raise ValueError("the command is empty")
        return command

    @property
    def kind(self) -> str:
        """"command", "http" or "restart" (the scenario checks there is exactly one)."""
        return "command" if self.command is not None else "http" if self.http is not None else "restart"

    @model_serializer(mode="wrap")
    def _without_unset(self, handler: Any) -> dict:
        # The resolved scenario.yaml shows an action as written: no `when: null`, `restart: false`, ...
        unset = {"at": None, "when": None, "command": None, "http": None, "restart": False, "env": {}, "cwd": None}
        return {k: v for k, v in handler(self).items() if k not in unset or v != unset[k]}


def check_actions(actions: Sequence[Action], phases: Sequence[Phase], launched: bool) -> None:
    """Each of a scenario's `actions` has one time and one kind, names one of its `phases`, can restart
    a target (`launched`: the scenario launches one), and falls inside the planned run. Problems name
    the field they are about. (It takes the parts it checks, not the Scenario, so that this module
    never imports schema.py, which imports it.)"""
    names = [p.name for p in phases]
    durations = [p.duration for p in phases]
    starts = {p.name: sum(durations[:i]) if None not in durations[:i] else None for i, p in enumerate(phases)}
    total = None if None in durations else sum(durations)
    for i, action in enumerate(actions):
        where: DataPath = ("actions", i)
        if action.at is not None and action.when is not None:
            raise ProblemAt((*where, "when"), "give `at` (seconds from the run's start) or `when` (a phase start), not both")
        if action.at is None and action.when is None:
            raise ProblemAt(where, "needs a time: `at: 20s` (from the run's start) or `when: {phase: NAME, after: 2s}`")
        kinds = [k for k in ACTION_KINDS if getattr(action, k) not in (None, False)]
        if len(kinds) != 1:
            got = f"got {' and '.join(kinds)}" if kinds else "got none"
            raise ProblemAt(where, f"give exactly one of command, http or restart: true ({got})")
        if (action.env or action.cwd is not None) and action.command is None:
            raise ProblemAt((*where, "env" if action.env else "cwd"), "env and cwd apply to a command action only")
        if action.restart and not launched:
            raise ProblemAt((*where, "restart"), "restart needs a launched target (target.launch); this scenario has none")
        if action.when is not None and action.when.phase not in names:
            raise ProblemAt((*where, "when", "phase"), f"{action.when.phase!r} is not a phase (known: {', '.join(names)})")
        planned = action.at if action.at is not None else (
            None if starts[action.when.phase] is None else starts[action.when.phase] + action.when.after)
        if total is not None and planned is not None and planned > total:
            field_path = (*where, "at") if action.at is not None else (*where, "when", "after")
            raise ProblemAt(field_path, f"the action would never run: it is planned at {planned:g} s and the phases end at {total:g} s")

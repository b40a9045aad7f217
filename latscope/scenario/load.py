"""From a YAML file to a validated `Scenario`, and every problem on the way as a message that names
the file, the line and the field:

    read file -> parse YAML (keeping line numbers) -> --set overrides -> ${VAR} interpolation
              -> pydantic validation -> Scenario

e.g.

    invalid scenario scenarios/burst.yaml (1 problem):
    scenarios/burst.yaml:33: phases[1].arrival.rate: Input should be greater than 0 (got -5)

pydantic reports *where* in the data a problem is (its error `loc`), not where in the file; so the
YAML is composed into a node tree (each node keeps its `start_mark`) and the `loc` is walked down
that tree to find the line. Values written by `--set` have no line and say so instead. Nothing here
does I/O beyond reading the file.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import UnionType
from typing import Any, NoReturn, Sequence, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from latscope.errors import ScenarioError
from latscope.scenario.base import REFERENCE, UNSAFE, DataPath, ProblemAt, dotted, model_field, unwrap
from latscope.scenario.phases import ARRIVAL_TYPES
from latscope.scenario.redact import is_secret, redact_url
from latscope.scenario.schema import Scenario
from latscope.scenario.workload import LENGTH_DISTS


def load_scenario(path: str | Path, overrides: Sequence[str] = ()) -> Scenario:
    """Read, override, interpolate and validate the scenario file at `path`.

    Raises ScenarioError, one line per problem, each naming the file, line and field.
    """
    label = str(path)
    path = Path(path)
    text = _read_text(path, label)

    root, data = _parse_yaml(text, label)
    if not isinstance(data, dict):
        found = "the file is empty" if data is None else f"found {_yaml_type(data)}"
        raise ScenarioError(f"{label}: a scenario must be a mapping of fields (name:, target:, phases:, ...); {found}")
    data, set_by = _apply_overrides(data, overrides)
    if data.get("name") is None:
        data["name"] = re.sub(r"[^A-Za-z0-9_.-]", "_", path.stem) or "scenario"

    scenario = _build(data, _Origin(label, root, set_by))
    scenario._source = path
    scenario._base_dir = path.absolute().parent
    return scenario


def scenario_from_dict(data: dict, source: str = "<dict>", overrides: Sequence[str] = ()) -> Scenario:
    """A scenario from already-parsed data (programmatic use: latscope.api, tests). `source` labels
    error messages; `overrides` are applied as `--set` ones are to a file (and named in errors so).

    Interpolation and error messages are as for a file, without line numbers. Relative paths resolve
    against the current directory. A missing name becomes "scenario". `data` is not changed.
    """
    if not isinstance(data, dict):
        raise ScenarioError(f"{source}: a scenario must be a mapping of fields; found {_yaml_type(data)}")
    data, set_by = _apply_overrides(data, overrides)  # a copy, even without overrides
    if data.get("name") is None:
        data["name"] = "scenario"
    return _build(data, _Origin(source, set_by=set_by))


def _build(data: dict, origin: _Origin) -> Scenario:
    """Interpolate and validate; shared by load_scenario and scenario_from_dict."""
    data, templates = _interpolate(data, origin)
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as exc:
        _raise_problems(origin, _validation_problems(exc, data, origin, templates))
    scenario._templates = templates
    scenario._origin = origin
    return scenario


def _read_text(path: Path, label: str) -> str:
    """The file's text, at most MAX_FILE_BYTES of it: PyYAML parses about a megabyte a second, so a
    50 MB body would hold `validate` for a minute before saying anything."""
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_FILE_BYTES + 1)
        if len(raw) > MAX_FILE_BYTES:
            raise ScenarioError(f"{label}: the scenario file is over {MAX_FILE_BYTES >> 20} MiB, the limit; a scenario "
                                "describes the load, large inputs belong in a dataset (workload.classes[].dataset) "
                                "or a .npy file (tensors[].npy)")
        return raw.decode("utf-8")
    except FileNotFoundError:
        raise ScenarioError(f"scenario file not found: {label}") from None
    except IsADirectoryError:
        raise ScenarioError(f"cannot read scenario file {label}: it is a directory") from None
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ScenarioError(f"{label}:{line}: the file is not UTF-8 text (byte 0x{raw[exc.start]:02x})") from None
    except OSError as exc:
        raise ScenarioError(f"cannot read scenario file {label}: {exc.strerror or exc}") from None


# ---- YAML -----------------------------------------------------------------------------------------


# What a scenario file may make. Every step after parsing (copying, interpolation, validation, a
# body's JSON) walks the data in full, so these bound all of them: the file's size, how deep values
# nest (composing recurses once per level), and how many values the document holds once its aliases
# are expanded (a "billion laughs" file is ten lines of aliases standing for 10^9 values).
MAX_FILE_BYTES = 4 << 20
MAX_DEPTH = 100
MAX_VALUES = 100_000
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class _Loader(yaml.SafeLoader):
    """SafeLoader that keeps dates as strings (`name: 2024-06-01` is a name, and a date object in a
    request body could not be sent as JSON), and refuses a document nested deeper than MAX_DEPTH or
    holding more than MAX_VALUES values with its aliases expanded, at the line where it goes over."""

    def __init__(self, text: str, label: str = "--set"):
        super().__init__(text)
        self.label = label
        self._depth = self._values = 0
        self._sizes: dict[int, int] = {}  # id of an anchored node -> values it stands for (once composed)

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            node = self.anchors.get(event.anchor)  # None: PyYAML reports the undefined alias
            if node is not None:
                if id(node) not in self._sizes:
                    self._refuse(event, f"alias *{event.anchor} is used inside the value it names (a recursive structure)")
                self._count(self._sizes[id(node)], event, f"with its aliases expanded, the file holds more than "
                                                          f"{MAX_VALUES:,} values (an alias bomb?)")
            return super().compose_node(parent, index)
        if self._depth >= MAX_DEPTH:
            self._refuse(event, f"values nested more than {MAX_DEPTH} levels deep")
        self._depth, before = self._depth + 1, self._values
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        self._count(1, event, f"more than {MAX_VALUES:,} values; a scenario describes the load, large inputs "
                              "belong in a dataset or a .npy file")
        if event.anchor is not None:
            self._sizes[id(node)] = self._values - before
        return node

    def _count(self, values: int, event: yaml.Event, message: str) -> None:
        self._values += values
        if self._values > MAX_VALUES:
            self._refuse(event, message)

    def _refuse(self, event: yaml.Event, message: str) -> NoReturn:
        raise ScenarioError(f"{self.label}:{event.start_mark.line + 1}: {message}")

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        try:
            return super().construct_yaml_int(node)
        except ValueError:  # int() reads at most sys.get_int_max_str_digits() (4,300) decimal digits
            raise _LongInteger(node) from None


class _LongInteger(yaml.constructor.ConstructorError):
    """An integer with more digits than Python reads from text: PyYAML's int() would raise a bare
    ValueError (a traceback); this names the node, so the message can name its line and field."""

    def __init__(self, node: yaml.ScalarNode):
        digits = sum(c.isdigit() for c in node.value)
        super().__init__(None, None, f"an integer of {digits:,} digits, more than the {sys.get_int_max_str_digits():,} "
                                     "Python reads", node.start_mark)
        self.node = node


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)
_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _parse_yaml(text: str, label: str) -> tuple[yaml.Node | None, Any]:
    """The node tree (for line numbers) and the data built from it, from one parse."""
    try:
        loader = _Loader(text, label)
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow (NUL, other controls)
        line = text.count("\n", 0, exc.position) + 1
        raise ScenarioError(f"{label}:{line}: invalid YAML: character U+{exc.character:04X} is not allowed in a YAML "
                            "file (a NUL byte or another control character)") from None
    try:
        root = loader.get_single_node()
        if root is None:
            return None, None
        _check_duplicate_keys(root, label)
        return root, loader.construct_document(root)
    except _LongInteger as exc:
        raise ScenarioError(_Origin(label, root).problem(_node_path(root, exc.node), exc.problem)[1]) from None
    except yaml.MarkedYAMLError as exc:
        raise ScenarioError(_yaml_error_message(exc, label)) from None
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{label}: invalid YAML: {exc}") from None
    finally:
        loader.dispose()


def parse_yaml(text: str, label: str) -> Any:
    """The data of a YAML document a user wrote (a gate file): the scenario loader's parse, with its
    bounds (nesting, aliases), duplicate-key check and messages, as ScenarioError naming `label`."""
    return _parse_yaml(text, label)[1]


def _node_path(root: yaml.Node, target: yaml.Node) -> DataPath:
    """The data path of `target` in the tree under `root` (keys as written; () when not found)."""
    seen: set[int] = set()

    def walk(node: yaml.Node, path: DataPath) -> DataPath | None:
        if node is target:
            return path
        if id(node) in seen:  # an alias: walked already
            return None
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            children = [(k.value if isinstance(k, yaml.ScalarNode) else "?", v) for k, v in node.value]
        elif isinstance(node, yaml.SequenceNode):
            children = list(enumerate(node.value))
        else:
            return None
        return next((found for key, child in children if (found := walk(child, (*path, key))) is not None), None)

    return walk(root, ()) or ()


def _yaml_error_message(exc: yaml.MarkedYAMLError, label: str) -> str:
    mark = exc.problem_mark or exc.context_mark
    where = f"{label}:{mark.line + 1}:{mark.column + 1}" if mark else label
    message = exc.problem or exc.context or "cannot parse"
    if exc.context and exc.problem:
        started = f" started at line {exc.context_mark.line + 1}" if exc.context_mark else ""
        message += f" ({exc.context}{started})"
    if "\\t" in message or "\t" in message:
        message += "; YAML indentation must use spaces, not tabs"
    return f"{where}: invalid YAML: {message}"


def _check_duplicate_keys(node: yaml.Node, label: str, seen: set[int] | None = None) -> None:
    """PyYAML silently keeps the last of two equal keys; a second `phases:` is almost always a mistake."""
    seen = set() if seen is None else seen
    if id(node) in seen:  # an alias: already checked
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        first_line: dict[str, int] = {}
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                line = key.start_mark.line + 1
                if key.value in first_line:
                    raise ScenarioError(f"{label}:{line}: duplicate key {key.value!r} (first at line {first_line[key.value]})")
                first_line[key.value] = line
            _check_duplicate_keys(value, label, seen)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _check_duplicate_keys(item, label, seen)


def _yaml_type(value: Any) -> str:
    return {list: "a list", str: "a string", int: "a number", float: "a number", bool: "a boolean"}.get(
        type(value), type(value).__name__
    )


def _copy_tree(value: Any) -> Any:
    """A copy of nested dicts and lists. Unlike deepcopy it does not keep YAML aliases shared, so
    `--set` on one alias does not change the other."""
    if isinstance(value, dict):
        return {k: _copy_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy_tree(v) for v in value]
    return value


# ---- --set overrides ------------------------------------------------------------------------------


def apply_overrides(data: dict, overrides: Sequence[str]) -> dict:
    """A copy of `data` with each `key.path=value` override applied, in order.

    Paths are dotted, with integer indices for lists (`phases.0.arrival.rate=50`). The value is read
    as YAML, so `50` is an int, `true` a bool, `[1, 2]` a list and `null` None. Missing mapping keys
    are created; an index out of range or a path through a scalar is a ScenarioError.
    """
    return _apply_overrides(data, overrides)[0]


def _apply_overrides(data: dict, overrides: Sequence[str]) -> tuple[dict, dict[DataPath, str]]:
    """apply_overrides, also returning which data path each override wrote (for error messages)."""
    data = _copy_tree(data)
    set_by: dict[DataPath, str] = {}
    for override in overrides:
        key, eq, raw = override.partition("=")
        if not eq or not key.strip():
            raise ScenarioError(f"--set {override!r}: expected key.path=value, e.g. phases.0.arrival.rate=50")
        shown = f"{key.strip()}=…"  # messages name the key, never the value: it may be a secret
        try:
            loader = _Loader(raw, f"--set {shown!r}")
            try:
                value = loader.get_single_data()
            finally:
                loader.dispose()
        except _LongInteger as exc:
            raise ScenarioError(f"--set {shown!r}: the value is {exc.problem}") from None
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or exc
            raise ScenarioError(f"--set {shown!r}: the value is not valid YAML ({problem}); quote it") from None
        path = _set_path(data, key.strip(), value, shown)
        # A later override of a parent replaces what earlier ones wrote below it.
        set_by = {p: o for p, o in set_by.items() if p[: len(path)] != path}
        set_by[path] = shown
    return data, set_by


def _set_path(data: dict, key: str, value: Any, shown: str) -> DataPath:
    parts = key.split(".")
    if any(not part for part in parts):
        raise ScenarioError(f"--set {shown!r}: empty component in the key path {key!r}")
    node: Any = data
    path: list[str | int] = []
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        where = ".".join(parts[:i]) or "the scenario"
        if isinstance(node, dict):
            step: str | int = part
            if last:
                node[step] = value
            elif not isinstance(node.get(step), (dict, list)):
                if node.get(step) is not None:
                    raise ScenarioError(f"--set {shown!r}: {'.'.join(parts[: i + 1])} is {_yaml_type(node[step])}, not a mapping or list")
                node[step] = {}  # create the missing mapping
        elif isinstance(node, list):
            if not re.fullmatch(r"\d+", part):
                raise ScenarioError(f"--set {shown!r}: {where} is a list; expected an index, not {part!r}")
            step = int(part)
            if step >= len(node):
                raise ScenarioError(f"--set {shown!r}: index {step} is out of range ({where} has {len(node)} item{'s' * (len(node) != 1)})")
            if last:
                node[step] = value
        else:
            raise ScenarioError(f"--set {shown!r}: {where} is {_yaml_type(node)}, not a mapping or list")
        path.append(step)
        if not last:
            node = node[step]
    return tuple(path)


# ---- ${VAR} interpolation -------------------------------------------------------------------------

def _interpolate(data: Any, origin: _Origin) -> tuple[Any, dict[DataPath, str]]:
    """A copy of `data` with `${VAR}` and `${VAR:-default}` replaced from the environment in every
    string, and the original of each string that changed (keyed by data path)."""
    templates: dict[DataPath, str] = {}
    problems: list[tuple[DataPath, str]] = []

    def substitute(text: str, path: DataPath) -> str:
        def one(match: re.Match) -> str:
            if match.group(0) == "$${":
                return "${"
            name = match.group("name")
            if name is None:
                problems.append((path, "malformed ${...}: expected ${NAME} or ${NAME:-default} (write $${ for a literal ${)"))
                return match.group(0)
            value = os.environ.get(name)
            if value is None or (value == "" and match.group("default") is not None):
                if match.group("default") is not None:
                    return match.group("default")
                problems.append((path, f"environment variable {name} is not set (write ${{{name}:-default}} to give it a default)"))
                return match.group(0)
            return value

        result = REFERENCE.sub(one, text)
        if result != text:
            templates[path] = text
        return result

    def walk(value: Any, path: DataPath) -> Any:
        if isinstance(value, str):
            return substitute(value, path) if "${" in value else value
        if isinstance(value, dict):
            return {k: walk(v, (*path, k)) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v, (*path, i)) for i, v in enumerate(value)]
        return value

    data = walk(data, ())
    if problems:
        _raise_problems(origin, [origin.problem(path, message) for path, message in problems])
    return data, templates


# ---- error messages that point into the file ------------------------------------------------------


@dataclass
class _Origin:
    """Where a scenario's values came from: enough to point a problem at a line or a --set."""

    label: str  # the file as the user named it, or scenario_from_dict's `source`
    root: yaml.Node | None = None  # the composed YAML (None when built from a dict)
    set_by: dict[DataPath, str] = field(default_factory=dict)  # data path -> the --set that wrote it ("key=…")

    def problem(self, path: DataPath, message: str) -> tuple[float, str]:
        """(sort key, message line): "file:LINE: dotted.path: message"."""
        # The value was written by a --set, or by one at or below `path` where the file has nothing.
        override = next((self.set_by[path[:n]] for n in range(len(path), 0, -1) if path[:n] in self.set_by), None)
        line, found = (None, False) if override or self.root is None else _line_of(self.root, path)
        if override is None and not found:
            override = next((o for p, o in self.set_by.items() if p[: len(path)] == path), None)
        if override:
            where = f"{self.label} (from --set {override})"
        else:
            where = f"{self.label}:{line}" if line else self.label
        # A mapping key may hold a line break (a hostile header name): escaped, it cannot forge a line.
        field_name = dotted(path).encode("unicode_escape").decode("ascii") if _CONTROL.search(dotted(path)) else dotted(path)
        return (line if line else math.inf), f"{where}: {field_name + ': ' if field_name else ''}{message}"

    def error(self, path: DataPath, message: str) -> ScenarioError:
        """A problem found after validation (a file the field names, the plan it makes) as the
        loader's own error: Scenario.problem."""
        return _problems_error(self, [self.problem(path, message)])

    def __getstate__(self) -> dict:
        # Workers get the scenario pickled; they need no line numbers (the parent checked it all).
        return {**self.__dict__, "root": None}

    def __deepcopy__(self, memo: dict) -> _Origin:
        return self  # never changed after loading: a copied scenario (capacity steps) shares it


def _problems_error(origin: _Origin, problems: list[tuple[float, str]]) -> ScenarioError:
    lines = list(dict.fromkeys(message for _, message in sorted(problems, key=lambda p: p[0])))
    header = f"invalid scenario {origin.label} ({len(lines)} problem{'s' * (len(lines) != 1)}):"
    return ScenarioError("\n".join([header, *lines]))


def _raise_problems(origin: _Origin, problems: list[tuple[float, str]]) -> NoReturn:
    raise _problems_error(origin, problems)


def _line_of(root: yaml.Node, path: DataPath) -> tuple[int, bool]:
    """The 1-based line of the deepest part of `path` found in the YAML tree, and whether all of
    `path` was found.

    A mapping key's own line is used (so `timout:` points at itself and a block value at its key);
    a part that is not there (a missing field) leaves the line of its parent.
    """
    node, line = root, root.start_mark.line + 1
    for item in path:
        if isinstance(node, yaml.MappingNode):
            pair = next(((k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == str(item)), None)
            if pair is None:
                return line, False
            line, node = pair[0].start_mark.line + 1, pair[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(item, int) and item < len(node.value):
            node = node.value[item]
            line = node.start_mark.line + 1
        else:
            return line, False
    return line, True


def _data_path(data: Any, loc: tuple[str | int, ...]) -> DataPath:
    """pydantic's error `loc` as a path into the data.

    pydantic puts union member tags in `loc`: the discriminator value ('phases', 0, 'arrival',
    'poisson', 'rate'), or a type for plain unions ('command', 'list[str]', 1). Those are not in
    the data and are dropped; a last item that is not in the data is a missing field and is kept.
    """
    path: list[str | int] = []
    node = data
    for i, item in enumerate(loc):
        if isinstance(node, dict) and item in node:
            path.append(item)
            node = node[item]
        elif isinstance(node, list) and isinstance(item, int) and 0 <= item < len(node):
            path.append(item)
            node = node[item]
        elif isinstance(node, dict) and i == len(loc) - 1 and item != node.get("type"):
            path.append(item)  # a missing field
            node = None
        # else: a union tag
    return tuple(path)


def _validation_problems(exc: ValidationError, data: dict, origin: _Origin, templates: dict[DataPath, str]) -> list[tuple[float, str]]:
    """One message line per pydantic error, rewritten where pydantic's own text is unhelpful."""
    problems = []
    for error in exc.errors(include_url=False):
        path = _data_path(data, error["loc"])
        kind, message = error["type"], error["msg"]
        show_input = kind != "missing"
        if kind == "missing":
            message = "required field is missing"
        elif kind == "extra_forbidden":
            allowed = _allowed_fields(error["loc"][:-1])
            close = difflib.get_close_matches(str(path[-1]), allowed, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            message = f"unknown field ({hint}allowed: {', '.join(allowed)})"
            show_input = False
        elif kind in ("union_tag_invalid", "union_tag_not_found"):
            ctx = error.get("ctx", {})
            tag = ctx.get("discriminator", "'type'").strip("'")
            known = LENGTH_DISTS if tag == "dist" else ARRIVAL_TYPES
            expected = ", ".join(re.findall(r"'([^']*)'", ctx.get("expected_tags", ""))) or ", ".join(known)
            if kind == "union_tag_invalid":
                path = (*path, tag)
                message = f"unknown {tag} {ctx['tag']!r} (allowed: {expected})"
            else:
                message = f"missing {tag!r} (one of: {expected})"
            show_input = False
        elif kind == UNSAFE:  # never echoed: the value may be a secret, or came from the environment
            show_input = False
            names = [m.group("name") for m in REFERENCE.finditer(templates.get(path, "")) if m.group("name")]
            message += f" (the value comes from ${{{'}, ${'.join(names)}}})" if names else ""
        elif kind == "value_error":
            message = message.removeprefix("Value error, ")
            cause = error.get("ctx", {}).get("error")
            if isinstance(cause, ProblemAt):  # a check across fields that knows which field is wrong
                path, message, show_input = cause.path, cause.message, False
        if show_input and not isinstance(error["input"], (dict, list)):
            message += f" (got {_show(error['input'], path, templates)})"
        problems.append(origin.problem(path, message))
    return problems


def _allowed_fields(loc: tuple[str | int, ...]) -> list[str]:
    """The field names (aliases) of the model that pydantic's `loc` points into, following model
    fields, list items, dict values and union tags from Scenario down."""
    tp: Any = Scenario
    for item in loc:
        tp = unwrap(tp)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            field = model_field(tp, item)
            tp = field.annotation if field is not None else None
        elif get_origin(tp) is list:
            tp = get_args(tp)[0]
        elif get_origin(tp) is dict:
            tp = get_args(tp)[1]
        elif get_origin(tp) in (Union, UnionType):  # a discriminated union: `item` is the tag
            tp = next((m for m in get_args(tp) if _type_tag(m) == item), None)
        else:
            return []
    tp = unwrap(tp)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [f.alias or name for name, f in tp.model_fields.items()]
    return []


def _type_tag(model: Any) -> str | None:
    """The `type` literal of an arrival model; None for anything else."""
    type_field = getattr(model, "model_fields", {}).get("type")
    return type_field.default if type_field else None


def _show(value: Any, path: DataPath, templates: dict[DataPath, str]) -> str:
    """A rejected value for an error message, without leaking secrets."""
    if path in templates:
        shown = "<redacted>" if is_secret(path) else redact_url(str(value))
        return f"{templates[path]} = {shown if len(shown) <= 80 else shown[:77] + '...'!r}"
    if isinstance(value, str):
        text = "<redacted>" if is_secret(path) else redact_url(value)
        return repr(text if len(text) <= 80 else text[:77] + "...")
    if value is None or isinstance(value, bool):
        return "null" if value is None else str(value).lower()  # as YAML writes them
    return repr(value)

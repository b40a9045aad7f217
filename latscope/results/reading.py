"""Reading a results directory's files, checked: the one place where a damaged file becomes a
ResultsError that names it and says what is wrong, instead of a traceback somewhere in the report.

A results directory outlives the code that wrote it and travels between machines, so a reader
cannot assume its files are what the writer made: a disk fills, a copy is cut short, a person edits
a file. Each file is checked once, where it is read, for the shapes every reader relies on (a
mapping where a reader calls .get, a number where it formats one); what passes is safe to read
with plain dict access. Checks are only as strict as the readers need: a key a reader does not
know is let through (keys are added, never renamed), and a key an older latscope did not write may
be missing.

    read_json(path)            JSON, bounded: no NaN/Infinity (latscope never writes them), at most
                               MAX_DEPTH levels deep (a file nested 100,000 deep is refused, not a
                               RecursionError)
    check_summary(data, path)  summary.json's shapes (SUMMARY_SHAPE) and schema_version
    read_scenario(run_dir)     scenario.yaml as a mapping; {} when the run has none

events.jsonl is read by events.read_events, histograms.hlog by hlog.py (a malformed interval line
is a ValueError naming its line); both with the same rule: refuse, naming the file and the line.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import yaml

from latscope.errors import ResultsError
from latscope.results.schema import ROW_STATS, SCENARIO, SCHEMA_VERSION, TURN_COUNTERS, TURN_METRICS

# Deeper than any JSON file latscope writes (summary.json is about 6 levels), shallow enough that no
# reader's recursion (json.dumps, copies) can hit Python's limit on what passes.
MAX_DEPTH = 64

# -- shapes ------------------------------------------------------------------------------------------
# A shape is data: "int", "number" (int or float, finite; never a bool), "str", "bool", "map" (any
# mapping), "any", each with a trailing "?" when null is allowed too; [shape]: a list of that shape;
# {key: shape}: a mapping whose listed keys have those shapes where present (a key written "name!"
# must be present), and "*": the shape of every other key's value; (None, shape): null or that shape.

_COUNTS = {k: "int" for k in ("scheduled", "sent", "completed", "errors", "dropped", "late", "cancelled",
                                "not_sent", "unaccounted", "empty")}
_ROW = {"count": "int", **{stat: "number?" for stat in ROW_STATS[1:]}}
_CACHE = (None, {"cached_tokens": "int", "prompt_tokens": "int", "hit_rate": "number?"})
# tokens.<class>.counts (run/token_counts.py): where the counts came from, the server's against the plan
_TOKEN_COUNTS = {"prompt": {"source": "str", "mean_difference": "number?", "worst_difference": "int?",
                            **{k: "int" for k in ("from_usage", "from_plan", "checked", "differ")}},
                 "output": {"source": "str", "mean_shortfall": "number?", "hint": "str?",
                            **{k: "int" for k in ("from_usage", "by_tokenizer", "from_chunks", "uncounted", "checked",
                                                  "short", "long")}}}
# a session class's turn (summary.json sessions.<class>.by_turn.<turn>): its counters and metrics
_TURN = {**{counter: "int" for counter in TURN_COUNTERS}, "hit_rate": "number?", **{m: _ROW for m in TURN_METRICS}}

# cold_start's entries (analysis/coldstart.py): what the cold-start panel formats
_COLD = {"kind": "str", "label": "str", "metric": "str", "class": "str", "replica": "str", "warmup": "bool", "cold": "bool",
         "cold_by": "str?", "first_count": "int", "steady_count": "int", "affected_requests": "int?",
         **{key: "number?" for key in ("at_s", "launched_at_s", "ready_s", "first_response_s", "first_response_latency_ms",
                                       "steady_s", "first_p50_ms", "first_p99_ms", "first_max_ms", "first_until_s",
                                       "steady_p50_ms", "steady_p99_ms", "steady_max_ms", "steady_from_s", "slowdown_p50",
                                       "peers_slowdown_p50", "time_to_steady_s", "steady_ceiling_ms", "slow_for_s",
                                       "suffered_s")}}

SUMMARY_SHAPE: dict[str, Any] = {
    "schema_version!": "int",
    "scenario": "str",
    "started_at": "str",
    "duration_s": "number",
    "partial": "bool",
    "abort_reason": "str?",
    "validity": "str",
    "validity_reasons": ["str"],
    "requests": _COUNTS,
    "requests_by_class": {"*": _COUNTS},
    "warmup_requests": _COUNTS,
    "throughput": {"*": "number?"},
    "metrics": {"*": {"*": _ROW}},  # metric -> class -> ROW_STATS
    "tokens": {"*": {"prompt_tokens": "int", "output_tokens": "int", "output_tokens_per_s": "number?",
                     "output_count_source": "str?", "prefix_cache": _CACHE, "reasoning_tokens": "int",
                     "counts": _TOKEN_COUNTS}},
    "batch": {"*": {"protocol": "str", "unit": "str", "completed": "int", "items": "int", "items_per_request": "number",
                    "items_per_s": "number", "input_tokens": "int", "input_tokens_per_s": "number"}},
    "errors": {"*": "int"},
    "error_examples": {"*": ["str"]},
    "goodput": {"*": {"good": "int", "total": "int", "fraction": "number?", "rps": "number?",
                      "output_tokens_per_s": "number?", "objectives": "map"}},
    "load": {"model": "str"},
    "sessions": {"*": {**{counter: "int" for counter in ("started", "completed", "abandoned", "cut", "turns_not_sent")},
                       "duration": (None, _ROW), "prefix_cache": _CACHE, "by_turn": {"*": _TURN}}},
    "agents": {"*": {"jobs": {"*": "int"}, **{m: (None, _ROW) for m in ("job_time", "job_model_time", "job_tool_time")},
                     **{k: "number?" for k in ("rounds_mean", "requests_mean", "context_tokens_mean", "cached_share")},
                     "tool_calls": {"count": "int", "invalid_json": "int"},
                     "goodput": {"good": "int", "total": "int", "fraction": "number?", "rps": "number?"}}},
    "slo": [{"metric": "str", "class": "str", "stat": "str", "limit": "number?", "value": "number?",
             "passed": "bool", "reason": "str"}],
    "phases": [{"name!": "str", "start_s!": "number", "duration_s!": "number", "warmup": "bool"}],
    # requests.parquet (null: output.requests off; absent in a directory written before it)
    "request_records": (None, {"file": "str", "rows": "int", "sampled": "bool", "fraction": "number", "max_rows": "int?"}),
    "generator": {"workers": "int", "interval_s": "number?", "clamped_values": {"*": "int"},
                  "target_ready_after_s": "number?", "target_launched_at_s": "number?", "target_ready_at_s": "number?",
                  "distributed": "map", "nodes": ["map"]},
    "environment": {"gpus": ["any"]},
    "cold_start": {"first_n": "int", "target_launch": (None, {**_COLD, "first_count": "int?", "steady_count": "int?"}),
                   "restarts": ["map"], "scale_up": ["map"], "scale_from_zero": ["map"], "starts": [_COLD]},
}


def _kind(value: Any) -> str:
    """A value as a message shows it: a scalar as written (cut short), a container by its kind."""
    if isinstance(value, (list, dict)):
        return "a list" if isinstance(value, list) else "a mapping"
    text = json.dumps(value) if not isinstance(value, float) or math.isfinite(value) else str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _scalar_ok(value: Any, kind: str) -> bool:
    if kind == "any":
        return True
    if kind == "map":
        return isinstance(value, dict)
    if kind == "bool" or isinstance(value, bool):
        return kind == "bool" and isinstance(value, bool)
    if isinstance(value, int):  # what numpy, pandas and plotly's JSON take: a 64-bit integer
        return kind in ("int", "number") and -2**63 <= value < 2**63
    if kind == "number":
        return isinstance(value, float) and math.isfinite(value)
    return kind == "str" and isinstance(value, str)


_WORDS = {"int": "an integer", "number": "a number", "str": "a string", "bool": "true or false", "map": "a mapping",
          "any": "a value"}


def shape_problem(value: Any, shape: Any, where: str) -> str | None:
    """What is wrong with `value` against `shape` (see above), as "where: is X, not Y"; None when
    nothing. The first problem only: one line is what the user reads."""
    if isinstance(shape, tuple):
        return None if value is None else shape_problem(value, shape[1], where)
    if isinstance(shape, str):
        nullable = shape.endswith("?")
        kind = shape.rstrip("?")
        if (value is None and nullable) or (value is not None and _scalar_ok(value, kind)):
            return None
        if kind in ("int", "number") and type(value) is int:
            return f"{where} is {_kind(value)}, past a 64-bit integer's range"
        return f"{where} is {_kind(value)}, not {_WORDS[kind]}{' or null' if nullable else ''}"
    if isinstance(shape, list):
        if not isinstance(value, list):
            return f"{where} is {_kind(value)}, not a list"
        for i, item in enumerate(value):
            if (problem := shape_problem(item, shape[0], f"{where}[{i}]")) is not None:
                return problem
        return None
    if not isinstance(value, dict):
        return f"{where} is {_kind(value)}, not a mapping"
    fields = {key.rstrip("!"): sub for key, sub in shape.items() if key != "*"}
    for key in (key.rstrip("!") for key in shape if key.endswith("!")):
        if key not in value:
            return f"{where + ': ' if where else ''}`{key}` is missing"
    for key, item in value.items():
        sub = fields.get(key, shape.get("*"))
        if sub is not None and (problem := shape_problem(item, sub, f"{where}.{key}" if where else str(key))) is not None:
            return problem
    return None


# -- reading -----------------------------------------------------------------------------------------


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number (latscope never writes it)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of a float's range")
    return value


def _depth_over(data: Any, limit: int) -> bool:
    """Whether `data` nests containers more than `limit` deep (iteratively: no recursion to overflow)."""
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            if depth > limit:
                return True
            stack.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict) else value))
    return False


def read_text(path: Path) -> str:
    """The UTF-8 text of a results file; ResultsError naming it when it cannot be read or is not UTF-8."""
    try:
        return path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise ResultsError(f"{path}: unreadable ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise ResultsError(f"{path}: unreadable (not UTF-8 text: byte {exc.start}; the file is damaged)") from None


def read_json(path: Path) -> Any:
    """The JSON document at `path`; ResultsError naming it when it cannot be read, is not UTF-8 JSON,
    holds NaN or Infinity, or nests more than MAX_DEPTH levels."""
    text = read_text(path)
    try:
        data = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
    except RecursionError:
        raise ResultsError(f"{path}: not a latscope file (nested deeper than JSON can be read)") from None
    except ValueError as exc:
        raise ResultsError(f"{path}: unreadable (not valid JSON: {exc})") from None
    if _depth_over(data, MAX_DEPTH):
        raise ResultsError(f"{path}: not a latscope file (nested more than {MAX_DEPTH} levels deep)")
    return data


def check_summary(data: Any, path: Path) -> dict:
    """`data` (summary.json's, from `path`) when it has the shapes the readers rely on; ResultsError
    naming the file and the first key that is wrong, or a schema_version newer than this latscope."""
    if not isinstance(data, dict) or "schema_version" not in data:
        raise ResultsError(f"{path}: not a latscope summary (no schema_version)")
    version = data["schema_version"]
    if isinstance(version, bool) or not isinstance(version, int):
        raise ResultsError(f"{path}: schema_version is {_kind(version)}, not an integer")
    if version > SCHEMA_VERSION:
        raise ResultsError(f"{path}: schema_version {version} is newer than this latscope reads ({SCHEMA_VERSION}); "
                           "upgrade latscope")
    if (problem := shape_problem(data, SUMMARY_SHAPE, "")) is not None:
        raise ResultsError(f"{path}: damaged summary: {problem}")
    return data


def read_scenario(run_dir: Path) -> dict:
    """scenario.yaml of the results directory at `run_dir` (the scenario as it ran, secrets redacted):
    {} when the run has none (a saved baseline may not); ResultsError naming it when it is not YAML
    or not a mapping. It is not checked as a scenario: one written by an older latscope need not
    validate against today's schema."""
    path = Path(run_dir) / SCENARIO
    if not path.exists():
        return {}
    text = read_text(path)
    try:
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f":{mark.line + 1}" if mark else ""
        raise ResultsError(f"{path}{where}: not YAML ({exc.problem or exc.context or 'cannot parse'})") from None
    except (yaml.YAMLError, ValueError) as exc:  # ValueError: an integer too long to convert
        raise ResultsError(f"{path}: not YAML ({exc})") from None
    except RecursionError:
        raise ResultsError(f"{path}: not a latscope scenario (nested deeper than YAML can be read)") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        kind = "list" if isinstance(data, list) else "scalar " + _kind(data)
        raise ResultsError(f"{path}: not a scenario (a YAML {kind}, not a mapping)")
    return data

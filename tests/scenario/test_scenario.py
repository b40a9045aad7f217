"""The scenario schema and loader: defaults, durations, overrides, interpolation, redaction, and
error messages that name the file, the line and the field."""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import pytest
import yaml

from latscope.errors import ScenarioError
from latscope.scenario import (
    ARRIVAL_TYPES,
    BurstArrival,
    Scenario,
    Slo,
    WorkloadClass,
    apply_overrides,
    load_scenario,
    redacted_yaml,
    scenario_from_dict,
    scenario_json_schema,
)

from conftest import MINIMAL


FULL = """\
description: every arrival type
seed: 42
target:
  url: https://example.com:8443
  method: post
  path: /v1/infer
  headers: {X-Request-Source: latscope}
  timeout: 250ms
  launch:
    command: [python, -m, latscope.builtin_target]
    ready_url: http://127.0.0.1:8765/health
    env: {PORT: 8765}
    cwd: server
workload:
  body: {inputs: hello}
  content_type: application/json
  classes:
    - {name: small, weight: 3}
    - {name: large, path: /v1/large, headers: {X-Size: large}, body: "big"}
phases:
  - {name: constant, duration: 5, warmup: true, arrival: {type: constant, rate: 10}}
  - {name: poisson, duration: 1m30s, arrival: {type: poisson, rate: 2.5}}
  - name: burst
    duration: 1h
    arrival: {type: burst, base_rate: 0, burst_rate: 400, burst_length: 1.5s, period: 10s, spacing: even}
  - {name: mmpp, duration: 2m, arrival: {type: mmpp, base_rate: 5, burst_rate: 50, mean_burst_length: 500ms, mean_gap: 3s}}
  - {name: ramp, duration: 30s, arrival: {type: ramp, from_rate: 0, to_rate: 100}}
  - {name: steps, duration: 30s, arrival: {type: steps, rates: [1, 2, 0], step: 10s}}
  - {name: spike, duration: 30s, arrival: {type: spike, base_rate: 1, spike_rate: 100, at: 0, length: 2s}}
  - {name: quiet, duration: 2s, arrival: {type: idle}}
  - {name: users, duration: 10s, arrival: {type: users, users: 8, ramp: 2s}}
  - {name: trace, arrival: {type: trace, file: data/trace.csv, speedup: 10, start: 1m}}
slos:
  - {class: small, stat: p99.9, limit_ms: 100}
  - {stat: max, limit_ms: 1000, metric: service_time}
limits: {max_in_flight: 5, max_requests: 1000, overflow: drop}
output: {dir: out, interval: 500ms, save_schedule: false}
validity: {degraded_send_lag_p99_ms: 2, invalid_send_lag_p99_ms: 20}
"""


def write(tmp_path: Path, text: str, name: str = "scenario.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def error_of(path: Path, overrides: tuple[str, ...] = ()) -> str:
    with pytest.raises(ScenarioError) as info:
        load_scenario(path, overrides)
    return str(info.value)


# ---- a valid scenario ------------------------------------------------------------------------------


def test_full_scenario_with_every_arrival_type_loads(tmp_path):
    path = write(tmp_path, FULL, name="every-type.yaml")
    s = load_scenario(path)

    assert s.name == "every-type"  # no name: the file's stem
    assert s.source == path and s.base_dir == tmp_path.absolute()
    assert s.resolve_path(s.phases[-1].arrival.file) == tmp_path.absolute() / "data" / "trace.csv"
    assert s.resolve_path("/abs/x.csv") == Path("/abs/x.csv")
    assert [p.arrival.type for p in s.phases] == list(ARRIVAL_TYPES)

    t = s.target
    assert (t.method, t.timeout, t.protocol) == ("POST", 0.25, "http")
    assert t.launch.command == ["python", "-m", "latscope.builtin_target"]
    assert t.launch.env == {"PORT": "8765"} and t.launch.ready_timeout == 60.0

    durations = [p.duration for p in s.phases]
    assert durations == [5.0, 90.0, 3600.0, 120.0, 30.0, 30.0, 30.0, 2.0, 10.0, None]
    assert isinstance(durations[0], float)
    burst = s.phases[2].arrival
    assert isinstance(burst, BurstArrival) and (burst.burst_length, burst.period, burst.spacing) == (1.5, 10.0, "even")
    assert s.phases[3].arrival.mean_burst_length == 0.5
    assert s.phases[4].arrival.spacing == "poisson"
    assert (s.phases[8].arrival.users, s.phases[8].arrival.ramp) == (8, 2.0)
    assert s.phases[9].arrival.start == 60.0 and s.phases[9].arrival.time_column is None

    assert [c.name for c in s.workload.effective_classes()] == ["small", "large"]
    assert s.workload.classes[0].weight == 3.0 and s.workload.classes[0].body is None
    assert s.slos[0].class_ == "small" and s.slos[1].class_ == "all" and s.slos[1].metric == "service_time"
    assert (s.limits.max_in_flight, s.limits.max_requests, s.limits.overflow) == (5, 1000, "drop")
    assert (s.output.dir, s.output.interval, s.output.save_schedule) == ("out", 0.5, False)
    assert s.validity.invalid_loop_lag_p99_ms == 50.0 and s.validity.degraded_send_lag_p99_ms == 2.0
    # Workers receive the scenario pickled; the private attributes must survive.
    assert pickle.loads(pickle.dumps(s)).base_dir == s.base_dir


def test_defaults_are_filled_in(tmp_path):
    s = load_scenario(write(tmp_path, MINIMAL))
    assert s.name == "t" and s.description == "" and s.seed == 0
    assert (s.target.method, s.target.path, s.target.headers, s.target.timeout, s.target.launch) == ("GET", "", {}, 30.0, None)
    assert s.phases[0].warmup is False and s.phases[0].duration == 1.0
    assert (s.limits.max_in_flight, s.limits.max_requests, s.limits.overflow) == (10000, None, "queue")
    assert (s.output.dir, s.output.interval, s.output.save_schedule) == ("results", 1.0, True)
    assert s.validity.invalid_send_lag_p99_ms == 10.0 and s.slos == []
    assert s.workload.effective_classes() == [WorkloadClass(name="default")]
    assert s.workload.classes == []


@pytest.mark.parametrize(
    ("written", "seconds"),
    [(5, 5.0), (0.5, 0.5), ("250ms", 0.25), ("30s", 30.0), ("2m", 120.0), ("1h", 3600.0),
     ("1.5s", 1.5), ("1m30s", 90.0), ("1h2m3s4ms", 3723.004), ("10", 10.0)],
)
def test_durations_parse(written, seconds):
    data = yaml.safe_load(MINIMAL)
    data["phases"][0]["duration"] = written
    assert scenario_from_dict(data).phases[0].duration == pytest.approx(seconds)


@pytest.mark.parametrize(("written", "expected"), [("-5s", "cannot be negative"), (-1, "cannot be negative"),
                                                    ("5 parsecs", "expected a duration like 30s"),
                                                    ("s", "expected a duration"), (True, "expected a duration")])
def test_bad_durations_are_rejected(written, expected):
    data = yaml.safe_load(MINIMAL)
    data["target"]["timeout"] = written
    with pytest.raises(ScenarioError, match=expected):
        scenario_from_dict(data, source="mine")


def test_slo_class_alias_works_both_ways():
    assert Slo.model_validate({"class": "x", "stat": "p99", "limit_ms": 1}).class_ == "x"
    assert Slo(class_="y", stat="p50", limit_ms=1).class_ == "y"
    assert Slo(stat="p50", limit_ms=1).model_dump(by_alias=True)["class"] == "all"


def test_scenario_from_dict_resolves_paths_from_the_cwd_and_does_not_touch_its_input(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    data = yaml.safe_load(MINIMAL)
    del data["name"]
    s = scenario_from_dict(data)
    assert s.source is None and s.base_dir == tmp_path and s.name == "scenario"
    assert "name" not in data


# ---- errors name the file, the line and the field ---------------------------------------------------


def test_unknown_field_names_file_line_path_and_allowed_fields(tmp_path):
    path = write(tmp_path, MINIMAL.replace("  url: http://127.0.0.1:9\n", "  url: http://127.0.0.1:9\n  timout: 3\n"))
    message = error_of(path)
    assert message.startswith(f"invalid scenario {path} (1 problem):\n")
    assert (f"{path}:4: target.timout: unknown field (did you mean 'timeout'? "
            "allowed: protocol, url, method, path, headers, timeout, model, api_key, request_id_header, openai, kserve, "
            "anthropic, embeddings, rerank, launch)") in message


def test_unknown_field_in_an_arrival_lists_that_arrivals_fields(tmp_path):
    path = write(tmp_path, MINIMAL.replace("{type: constant, rate: 5}", "\n      type: poisson\n      rate: 5\n      burst: 3"))
    assert f"{path}:10: phases[0].arrival.burst: unknown field (allowed: type, rate)" in error_of(path)


def test_negative_rate_names_the_line_of_the_rate_key(tmp_path):
    text = MINIMAL.replace("    arrival: {type: constant, rate: 5}\n", "    arrival:\n      type: constant\n\n      rate: -5\n")
    path = write(tmp_path, text)
    assert f"{path}:10: phases[0].arrival.rate: Input should be greater than 0 (got -5)" in error_of(path)


def test_every_problem_is_reported_once_in_file_order(tmp_path):
    text = MINIMAL.replace("rate: 5", "rate: 0") + "limits: {max_in_flight: 0, overflow: spill}\n"
    text = text.replace("url: http://127.0.0.1:9", "url: ftp://127.0.0.1:9")
    message = error_of(write(tmp_path, text))
    lines = message.splitlines()
    assert "(4 problems)" in lines[0] and len(lines) == 5
    assert [re.match(r".*?:(\d+):", line).group(1) for line in lines[1:]] == ["3", "7", "8", "8"]
    assert "target.url: expected an http:// or https:// URL with a host" in lines[1]
    assert "limits.overflow: Input should be 'queue' or 'drop' (got 'spill')" in lines[4]


def test_unknown_arrival_type_names_allowed_types_and_line(tmp_path):
    path = write(tmp_path, MINIMAL.replace("type: constant", "type: exponential"))
    message = error_of(path)
    assert (f"{path}:7: phases[0].arrival.type: unknown type 'exponential' "
            "(allowed: constant, poisson, burst, mmpp, ramp, steps, spike, idle, users, trace)") in message


def test_missing_arrival_type_is_explained(tmp_path):
    path = write(tmp_path, MINIMAL.replace("type: constant, ", ""))
    assert f"{path}:7: phases[0].arrival: missing 'type' (one of: constant, poisson," in error_of(path)


@pytest.mark.parametrize(
    ("broken", "line"),
    [("  url: http://127.0.0.1:9\n", "\turl: http://127.0.0.1:9\n"),  # a tab
     ("{type: constant, rate: 5}", "{type: constant, rate: 5")],  # an unclosed bracket
)
def test_bad_yaml_names_file_line_and_column(tmp_path, broken, line):
    path = write(tmp_path, MINIMAL.replace(broken, line))
    message = error_of(path)
    assert re.match(rf"{re.escape(str(path))}:\d+:\d+: invalid YAML: ", message), message
    if "\t" in line:
        assert message.startswith(f"{path}:3:1:") and "tabs" in message
    else:
        assert "expected ',' or '}'" in message and "flow mapping started at line 7" in message


def test_missing_file_duplicate_keys_and_non_mapping_documents(tmp_path):
    assert f"scenario file not found: {tmp_path / 'nope.yaml'}" in error_of(tmp_path / "nope.yaml")
    dup = write(tmp_path, MINIMAL + "target: {url: http://x}\n", "dup.yaml")
    assert error_of(dup) == f"{dup}:8: duplicate key 'target' (first at line 2)"
    assert "must be a mapping" in error_of(write(tmp_path, "- a\n- b\n", "list.yaml"))
    assert "the file is empty" in error_of(write(tmp_path, "# nothing\n", "empty.yaml"))


def test_missing_required_field_names_the_parents_line(tmp_path):
    path = write(tmp_path, "# a comment\n" + MINIMAL.replace("  url: http://127.0.0.1:9\n", "  method: get\n"))
    assert f"{path}:3: target.url: required field is missing" in error_of(path)


def test_errors_from_a_dict_have_no_line():
    data = yaml.safe_load(MINIMAL)
    data["phases"][0]["arrival"]["rate"] = -1
    with pytest.raises(ScenarioError) as info:
        scenario_from_dict(data, source="api")
    assert str(info.value).splitlines()[1] == "api: phases[0].arrival.rate: Input should be greater than 0 (got -1)"


# ---- ${VAR} interpolation and the redacted dump -----------------------------------------------------

SECRETS = """\
name: secrets
target:
  url: http://bob:hunter2@127.0.0.1:9/v1?api_key=k3y&model=m
  headers:
    Proxy-Authorization: "Bearer ${API_KEY}"  # not Authorization: the URL's user:password@ is that
    X-Model: "${MODEL:-llama}"
    Cookie: session=literal-cookie
  launch:
    command: ["${PYTHON:-python3}", -m, server]
    env: {HF_TOKEN: plain-token, PORT: "${PORT:-8000}"}
workload:
  classes:
    - {name: a, headers: {X-Api-Key: literal-class-key}}
phases:
  - name: p
    duration: ${DURATION}
    arrival: {type: poisson, rate: "${RATE:-5}"}
"""


def test_interpolation_with_defaults_and_the_redacted_dump(tmp_path, monkeypatch):
    monkeypatch.setenv("API_KEY", "sk-very-secret")
    monkeypatch.setenv("DURATION", "2m")
    monkeypatch.setenv("RATE", "")  # set but empty: ${RATE:-5} takes the default, as in a shell
    monkeypatch.delenv("MODEL", raising=False)
    monkeypatch.delenv("PORT", raising=False)
    s = load_scenario(write(tmp_path, SECRETS))

    assert s.target.headers == {"Proxy-Authorization": "Bearer sk-very-secret", "X-Model": "llama", "Cookie": "session=literal-cookie"}
    assert s.phases[0].duration == 120.0 and s.phases[0].arrival.rate == 5.0
    assert s.target.launch.env["PORT"] == "8000"

    dump = redacted_yaml(s)
    for secret in ("sk-very-secret", "hunter2", "k3y", "literal-cookie", "plain-token", "literal-class-key"):
        assert secret not in dump
    resolved = yaml.safe_load(dump)
    headers = resolved["target"]["headers"]
    assert headers == {"Proxy-Authorization": "Bearer ${API_KEY}", "X-Model": "${MODEL:-llama}", "Cookie": "<redacted>"}
    assert resolved["target"]["url"] == "http://bob:<redacted>@127.0.0.1:9/v1?api_key=<redacted>&model=m"
    assert resolved["target"]["launch"]["env"] == {"HF_TOKEN": "<redacted>", "PORT": "${PORT:-8000}"}
    assert resolved["target"]["launch"]["command"] == ["${PYTHON:-python3}", "-m", "server"]
    assert resolved["workload"]["classes"][0]["headers"] == {"X-Api-Key": "<redacted>"}
    assert resolved["phases"][0]["duration"] == "${DURATION}"
    # Resolved: defaults filled in, `class` written by its alias.
    assert resolved["limits"]["max_in_flight"] == 10000 and resolved["output"]["interval"] == 1.0


def test_literal_authorization_header_is_redacted_and_slo_class_dumped_by_alias(tmp_path):
    text = MINIMAL.replace("  url: http://127.0.0.1:9\n", "  url: http://127.0.0.1:9\n  headers: {Authorization: Bearer abc}\n")
    s = load_scenario(write(tmp_path, text + "slos: [{stat: p99, limit_ms: 5}]\n"))
    dump = yaml.safe_load(redacted_yaml(s))
    assert dump["target"]["headers"]["Authorization"] == "<redacted>" and "abc" not in redacted_yaml(s)
    assert dump["slos"] == [{"metric": "latency", "class": "all", "stat": "p99", "limit_ms": 5.0}]


def test_a_secret_default_in_a_template_is_redacted(tmp_path, monkeypatch):
    monkeypatch.delenv("API_KEY", raising=False)
    text = MINIMAL.replace("  url: http://127.0.0.1:9\n", "  url: http://127.0.0.1:9\n  headers: {X-Api-Key: '${API_KEY:-fallback-secret}'}\n")
    dump = redacted_yaml(load_scenario(write(tmp_path, text)))
    assert "fallback-secret" not in dump and "${API_KEY:-<redacted>}" in dump


def test_missing_variable_names_file_line_field_and_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("API_KEY", "x")
    monkeypatch.delenv("DURATION", raising=False)
    path = write(tmp_path, SECRETS)
    message = error_of(path)
    assert f"{path}:16: phases[0].duration: environment variable DURATION is not set" in message
    assert message.startswith(f"invalid scenario {path} (1 problem):")


def test_escaped_and_malformed_references(tmp_path, monkeypatch):
    monkeypatch.setenv("DURATION", "1")
    data = yaml.safe_load(MINIMAL)
    data["description"] = "costs $${PRICE}"
    s = scenario_from_dict(data)
    assert s.description == "costs ${PRICE}"
    assert yaml.safe_load(redacted_yaml(s))["description"] == "costs $${PRICE}"  # round-trips
    data["description"] = "${not a var}"
    with pytest.raises(ScenarioError, match=r"description: malformed \$\{\.\.\.\}"):
        scenario_from_dict(data)


# ---- --set overrides --------------------------------------------------------------------------------


def test_apply_overrides_types_values_follows_indices_and_creates_keys():
    data = yaml.safe_load(MINIMAL)
    out = apply_overrides(data, [
        "phases.0.arrival.rate=50",
        "phases.0.duration=1.5",
        "phases.0.warmup=true",
        "target.url=http://127.0.0.1:9000",
        "target.headers.X-Mode=fast",
        "workload.classes=[{name: a}, {name: b}]",
        "workload.classes.1.weight=2",
        "description=",
    ])
    assert out["phases"][0]["arrival"]["rate"] == 50 and isinstance(out["phases"][0]["arrival"]["rate"], int)
    assert out["phases"][0]["duration"] == 1.5 and out["phases"][0]["warmup"] is True
    assert out["target"] == {"url": "http://127.0.0.1:9000", "headers": {"X-Mode": "fast"}}
    assert out["workload"]["classes"] == [{"name": "a"}, {"name": "b", "weight": 2}]
    assert out["description"] is None
    assert data["phases"][0]["arrival"]["rate"] == 5  # the input is not modified


@pytest.mark.parametrize(
    ("override", "expected"),
    [("phases.3.duration=1", "index 3 is out of range (phases has 1 item)"),
     ("phases.first.duration=1", "phases is a list; expected an index, not 'first'"),
     ("target.url.host=x", "target.url is a string, not a mapping or list"),
     ("phases.0.arrival.rate.x=1", "phases.0.arrival.rate is a number"),
     ("phases.0.arrival.rate", "expected key.path=value"),
     ("a..b=1", "empty component")],
)
def test_bad_overrides_name_the_override(override, expected):
    with pytest.raises(ScenarioError) as info:
        apply_overrides(yaml.safe_load(MINIMAL), [override])
    key, eq, _ = override.partition("=")
    shown = f"{key}=…" if eq else override  # the value is never echoed: it may be a secret
    assert f"--set {shown!r}" in str(info.value) and expected in str(info.value)


def test_an_invalid_value_from_set_says_so_instead_of_a_line(tmp_path):
    path = write(tmp_path, MINIMAL)
    message = error_of(path, ("phases.0.arrival.rate=-5", "limits.max_in_flight=1"))
    assert (f"{path} (from --set phases.0.arrival.rate=…): phases[0].arrival.rate: "
            "Input should be greater than 0 (got -5)") in message
    assert "(1 problem)" in message


def test_set_overrides_apply_to_the_loaded_scenario(tmp_path):
    s = load_scenario(write(tmp_path, MINIMAL), ["phases.0.arrival={type: poisson, rate: 7}", "target.launch=null", "seed=9"])
    assert (s.phases[0].arrival.type, s.phases[0].arrival.rate, s.seed) == ("poisson", 7.0, 9)


# ---- JSON Schema --------------------------------------------------------------------------------------


def test_json_schema_describes_phases_and_arrival_types():
    schema = scenario_json_schema()
    assert schema["$schema"].startswith("https://json-schema.org/") and schema["title"] == "latscope scenario"
    assert "phases" in schema["properties"] and "target" in schema["required"]
    arrival = schema["$defs"]["Phase"]["properties"]["arrival"]
    assert set(arrival["discriminator"]["mapping"]) == set(ARRIVAL_TYPES)
    consts = {schema["$defs"][ref["$ref"].split("/")[-1]]["properties"]["type"]["const"] for ref in arrival["oneOf"]}
    assert consts == set(ARRIVAL_TYPES) == {"constant", "poisson", "burst", "mmpp", "ramp", "steps", "spike", "idle", "users", "trace"}
    assert "class" in schema["$defs"]["Slo"]["properties"]
    assert schema["$defs"]["Target"]["additionalProperties"] is False


# ---- cross-field rules --------------------------------------------------------------------------------


def _phase_error(arrival: str, duration: str = "duration: 10\n    ") -> str:
    data = yaml.safe_load(MINIMAL.replace("duration: 1\n    ", duration).replace("{type: constant, rate: 5}", arrival))
    with pytest.raises(ScenarioError) as info:
        scenario_from_dict(data)
    return str(info.value)


def test_duplicate_phase_names_rejected():
    data = yaml.safe_load(MINIMAL)
    data["phases"].append(dict(data["phases"][0]))
    with pytest.raises(ScenarioError, match=r"phases: phase names must be unique; repeated: p"):
        scenario_from_dict(data)


@pytest.mark.parametrize(("classes", "expected"), [
    ([{"name": "all"}], r"workload.classes\[0\].name: 'all' is reserved"),
    ([{"name": "a"}, {"name": "a"}], "class names must be unique"),
    ([{"name": "a b"}], "only letters, digits"),
])
def test_bad_class_names_rejected(classes, expected):
    data = yaml.safe_load(MINIMAL)
    data["workload"] = {"classes": classes}
    with pytest.raises(ScenarioError, match=expected):
        scenario_from_dict(data)


def test_burst_period_must_exceed_burst_length():
    message = _phase_error("{type: burst, base_rate: 1, burst_rate: 9, burst_length: 10s, period: 10s}")
    assert "phases[0].arrival.period: period (10 s) must be longer than burst_length (10 s)" in message


def test_ramp_cannot_be_all_zero_and_validity_thresholds_are_ordered():
    assert "cannot both be 0" in _phase_error("{type: ramp, from_rate: 0, to_rate: 0}")
    data = yaml.safe_load(MINIMAL)
    data["validity"] = {"degraded_loop_lag_p99_ms": 60}
    with pytest.raises(ScenarioError, match="validity.invalid_loop_lag_p99_ms: must be at least degraded_loop_lag_p99_ms"):
        scenario_from_dict(data)


def test_phase_without_duration_rejected_unless_it_is_a_trace():
    assert "phases[0]: duration is required" in _phase_error("{type: poisson, rate: 5}", duration="")
    data = yaml.safe_load(MINIMAL.replace("duration: 1\n    ", "").replace("{type: constant, rate: 5}", "{type: trace, file: t.csv}"))
    s = scenario_from_dict(data)
    assert s.phases[0].duration is None and s.phases[0].arrival.speedup == 1.0


def test_slo_on_an_unknown_class_is_rejected():
    data = yaml.safe_load(MINIMAL)
    data["slos"] = [{"class": "smal", "stat": "p99", "limit_ms": 5}]
    with pytest.raises(ScenarioError, match=r"class 'smal' is not a workload class \(known: all, default\)"):
        scenario_from_dict(data)


def test_direct_construction_validates_too():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="phases"):
        Scenario.model_validate({"target": {"url": "http://x"}, "phases": []})


# -- protocols and workload classes --------------------------------------------------------------

PROTOCOLS = MINIMAL.replace("  url: http://127.0.0.1:9\n", "  url: http://127.0.0.1:9\n  protocol: openai\n  model: m\n")


def test_endpoint_resolves_class_settings_over_the_target():
    s = scenario_from_dict({
        "target": {"url": "http://127.0.0.1:9", "protocol": "openai", "model": "llm", "api_key": "k",
                   "headers": {"X-A": "1"}, "openai": {"api": "completions"}},
        "phases": [{"name": "p", "duration": 1, "arrival": {"type": "constant", "rate": 1}}],
        "workload": {"classes": [
            {"name": "text"},
            {"name": "chat", "openai": {"api": "chat", "stream": False}, "headers": {"X-B": "2"}},
            {"name": "json", "protocol": "kserve-v2", "model": "enc", "tensors": [{"name": "x", "shape": [1, 4]}]},
            {"name": "grpc", "protocol": "kserve-v2-grpc", "url": "grpc://127.0.0.1:8001", "model": "enc",
             "kserve": {"version": "2"}, "tensors": [{"name": "x", "shape": [1, 4]}]},
        ]},
    })
    text, chat, json_, grpc = (s.endpoint(i) for i in range(4))
    assert (text.path, text.method, text.model, text.api_key) == ("/v1/completions", "POST", "llm", "k")
    assert chat.path == "/v1/chat/completions" and chat.openai.stream is False and chat.headers == {"X-A": "1", "X-B": "2"}
    assert (json_.protocol, json_.path, json_.url) == ("kserve-v2", "/v2/models/enc/infer", "http://127.0.0.1:9")
    assert (grpc.protocol, grpc.url, grpc.path) == ("kserve-v2-grpc", "grpc://127.0.0.1:8001", "/v2/models/enc/versions/2/infer")


@pytest.mark.parametrize(
    "classes, expected",
    [
        ("    - {name: g, protocol: kserve-v2-grpc, url: 'http://h:1', tensors: [{name: a, shape: [1]}]}\n",
         r":12: workload.classes\[0\].url: kserve-v2-grpc needs a grpc://host:port"),
        ("    - {name: g, protocol: kserve-v2, tensors: []}\n", r":12: workload.classes\[0\]: protocol kserve-v2 needs tensors"),
        ("    - {name: g, protocol: kserve-v2-grpc, tensors: [{name: a, shape: [1]}]}\n",
         r":12: workload.classes\[0\]: a class that switches to kserve-v2-grpc needs its own url"),
        ("    - {name: z, prompt_tokens: {dist: uniform, min: 5, max: 2}}\n", r":12: workload.classes\[0\].prompt_tokens.uniform: max \(2\) must be at least min \(5\)"),
        ("    - {name: z, prompt_tokens: 0}\n", r":12: workload.classes\[0\].prompt_tokens: Input should be greater than or equal to 1"),
        ("    - {name: z, prompt_tokens: {mean: 3}}\n", r":12: workload.classes\[0\].prompt_tokens: missing 'dist' \(one of: fixed, uniform, normal, lognormal, empirical\)"),
        ("    - {name: z, prompt_tokens: 5, dataset: {file: a.jsonl}}\n", r":12: workload.classes\[0\]: .*prompt_tokens .* or a dataset, not both"),
        ("    - {name: t, tensors: [{name: a}]}\n", r":12: workload.classes\[0\].tensors\[0\]: .*give a shape"),
    ],
)
def test_protocol_and_workload_problems_name_line_and_field(tmp_path, classes, expected):
    path = tmp_path / "s.yaml"
    path.write_text(PROTOCOLS + "workload:\n  classes:\n" + classes)
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    assert re.search(expected, str(info.value)), str(info.value)


def test_non_http_protocol_without_a_model_is_refused_at_the_target():
    with pytest.raises(ScenarioError, match=r"target: protocol openai needs a model name"):
        scenario_from_dict({"target": {"url": "http://127.0.0.1:9", "protocol": "openai"},
                            "phases": [{"name": "p", "duration": 1, "arrival": {"type": "constant", "rate": 1}}]})


def test_grpc_target_url_must_be_grpc(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(MINIMAL.replace("  url: http://127.0.0.1:9\n", "  protocol: kserve-v2-grpc\n  url: http://127.0.0.1:9\n  model: m\n"))
    with pytest.raises(ScenarioError, match=r"s.yaml:4: target.url: kserve-v2-grpc needs a grpc://host:port"):
        load_scenario(path)


def test_api_key_is_redacted_unless_it_came_from_the_environment(tmp_path, monkeypatch):
    path = tmp_path / "s.yaml"
    path.write_text(PROTOCOLS.replace("  model: m\n", "  model: m\n  api_key: sk-literal-secret\n"))
    assert "sk-literal-secret" not in redacted_yaml(load_scenario(path)) and "api_key: <redacted>" in redacted_yaml(load_scenario(path))
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    path.write_text(PROTOCOLS.replace("  model: m\n", "  model: m\n  api_key: ${OPENAI_API_KEY}\n"))
    scenario = load_scenario(path)
    assert scenario.target.api_key == "sk-from-env"
    dumped = redacted_yaml(scenario)
    assert "sk-from-env" not in dumped and "${OPENAI_API_KEY}" in dumped


# -- goodput --------------------------------------------------------------------------------------

GOODPUT = MINIMAL + """\
workload:
  classes:
    - {name: chat, goodput: {itl_ms: 50, latency_ms: 2000}}
    - {name: batch}
"""


def test_goodput_objectives_per_class_override_the_scenarios_field_by_field(tmp_path):
    s = load_scenario(write(tmp_path, GOODPUT + "goodput: {ttft_ms: 500, itl_ms: 80}\n"
                                    "slos:\n  - {metric: goodput, class: chat, stat: fraction, min: 0.99}\n"))
    assert s.goodput_objectives() == [{"ttft_ms": 500.0, "itl_ms": 50.0, "latency_ms": 2000.0}, {"ttft_ms": 500.0, "itl_ms": 80.0}]
    slo = s.slos[0]
    assert (slo.metric, slo.stat, slo.threshold, slo.bound) == ("goodput", "fraction", 0.99, "min")
    # The resolved scenario.yaml: objectives as written (no nulls), the shorthand as limit + direction, reloadable.
    dumped = yaml.safe_load(redacted_yaml(s))
    assert dumped["goodput"] == {"ttft_ms": 500.0, "itl_ms": 80.0}
    assert dumped["workload"]["classes"][1].get("goodput") is None
    assert dumped["slos"] == [{"metric": "goodput", "class": "chat", "stat": "fraction", "limit": 0.99, "direction": "min"}]
    assert scenario_from_dict(dumped).goodput_objectives() == s.goodput_objectives()
    # Only a class's own objectives: the other class has none.
    alone = load_scenario(write(tmp_path, GOODPUT, name="alone.yaml"))
    assert alone.goodput_objectives() == [{"itl_ms": 50.0, "latency_ms": 2000.0}, None]
    assert scenario_from_dict(yaml.safe_load(MINIMAL)).goodput is None
    assert scenario_from_dict(yaml.safe_load(MINIMAL)).goodput_objectives() == [None]


@pytest.mark.parametrize("extra, expected", [
    ("slos:\n  - {metric: goodput, stat: fraction, min: 0.99}\n",
     r"s.yaml:9: slos\[0\]: a goodput SLO needs goodput objectives: add a `goodput:` section"),
    ("goodput: {}\n", r"s.yaml:8: goodput: .*give at least one objective: ttft_ms, tpot_ms, itl_ms, latency_ms or ttfot_ms"),
    ("goodput: {ttft_ms: 0}\n", r"s.yaml:8: goodput.ttft_ms: Input should be greater than 0"),
    ("goodput: {ttft: 5}\n", r"s.yaml:8: goodput.ttft: unknown field"),
    ("goodput: {ttft_ms: 5}\nslos:\n  - {metric: goodput, stat: fraction, min: 0.99, limit: 0.9}\n",
     r"s.yaml:10: slos\[0\]: .*`min: X` is short for the limit X with direction min: give it without limit"),
    ("goodput: {ttft_ms: 5}\nslos:\n  - {metric: goodput, stat: rps, min: 1, max: 2}\n",
     r"slos\[0\]: .*give `min:` or `max:`, not both"),
    ("goodput: {ttft_ms: 5}\nslos:\n  - {metric: goodput, stat: rps, max: 2, direction: min}\n",
     r"slos\[0\]: .*`max: X` is short for the limit X with direction max: give it without direction"),
    ("goodput: {ttft_ms: 5}\nslos:\n  - {stat: fraction, min: 0.9}\n",
     r"slos\[0\]: .*stat fraction is a goodput statistic: write metric: goodput"),
    ("goodput: {ttft_ms: 5}\nslos:\n  - {metric: goodput, stat: p99, limit_ms: 5}\n",
     r"slos\[0\]: .*metric goodput takes stat fraction .* or rps .*, not p99"),
    ("goodput: {ttft_ms: 5}\nslos:\n  - {metric: goodput, stat: fraction, limit: 99}\n",
     r"slos\[0\]: .*a goodput fraction limit is a fraction between 0 and 1"),
    ("goodput: {ttft_ms: 5}\nslos:\n  - {metric: goodput, stat: rps, limit_ms: 5}\n",
     r"slos\[0\]: .*stat rps takes `limit` \(req/s\), not limit_ms"),
])
def test_goodput_and_its_slos_are_checked_with_file_line_and_field(tmp_path, extra, expected):
    path = write(tmp_path, MINIMAL + extra, name="s.yaml")
    message = error_of(path)
    assert re.search(expected, message), message


def test_a_goodput_slo_on_a_class_without_objectives_names_its_class(tmp_path):
    path = write(tmp_path, GOODPUT + "slos:\n  - {metric: goodput, class: batch, stat: rps, min: 5}\n", name="s.yaml")
    assert re.search(r"s.yaml:13: slos\[0\].class: class 'batch' has no goodput objectives", error_of(path)), error_of(path)
    bad_class = write(tmp_path, MINIMAL + "workload:\n  classes:\n    - {name: c, goodput: {}}\n", name="c.yaml")
    assert re.search(r"c.yaml:10: workload.classes\[0\].goodput: .*give at least one objective", error_of(bad_class))


def test_min_max_shorthand_for_any_statistic_and_the_json_schema():
    assert Slo.model_validate({"stat": "p99", "max": 250}).model_dump(by_alias=True) == {
        "metric": "latency", "class": "all", "stat": "p99", "limit_ms": 250.0, "direction": "max"}
    assert Slo.model_validate({"stat": "throughput", "min": 40}).threshold == 40
    assert Slo.model_validate({"metric": "goodput", "stat": "rps", "limit": 3}).bound == "min"  # goodput: min by default
    schema = scenario_json_schema()
    assert {"min", "max"} <= set(schema["$defs"]["Slo"]["properties"]) and "goodput" in schema["properties"]
    assert set(schema["$defs"]["Goodput"]["properties"]) == {"ttft_ms", "tpot_ms", "itl_ms", "latency_ms", "ttfot_ms"}

"""Hostile scenarios: every malformed file found so far (tests/scenario/corpus/, one file a case, its
first line `# expect: LINE: field: message`, then any `# also: text` lines the message must hold too,
e.g. a trace file's own line) is refused with file:line:field, never a traceback, quickly and in
little memory; header injection, URL credentials and secrets from the environment.

Most cases run in this process (load, plan, payloads: what `latscope validate` does); the costly
ones, and a few `run`s, go through the real command line, where the time and peak memory of each
are measured on its own process."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from latscope.errors import ScenarioError
from latscope.plan import build_plan, check_plan_size
from latscope.protocols.http import request_prefix
from latscope.scenario import load_scenario, redacted_yaml
from latscope.workload import Payloads

from conftest import MINIMAL, REPO

CORPUS = Path(__file__).parent / "corpus"
CASES = sorted(CORPUS.glob("*.yaml"))
# Each of these once took a traceback, gigabytes or minutes: measured on a process of its own.
COSTLY = ["billion_laughs", "billion_laughs_in_body", "constant_1e7_for_1h", "duration_1e9s", "nested_flow_5000_deep",
          "prompt_tokens_1e9", "ramp_to_1e9", "rate_1e12", "tensor_shape_4tb", "burst_1e9_cycles"]
# Cases `validate` once accepted and `run` then crashed on (a worker's or the collector's traceback) or
# ran wrong (an input_length past 2^31 wrapped to a few tokens): both commands refuse them, exit 2.
RUN_CRASHED = ["mooncake_id_over_capacity", "mooncake_gap_1e13s", "mooncake_input_length_2e31",
               "mooncake_input_length_2e32", "idle_phase_1e13s", "seed_5000_digits"]
SECONDS, RSS_MB = 5.0, 512


def expected(case: Path) -> str:
    first = case.read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith("# expect: "), f"{case.name}: the first line must say what the error names"
    return first.removeprefix("# expect: ")


def also(case: Path) -> list[str]:
    """The `# also: ` lines after the first: more the message must hold."""
    return [line.removeprefix("# also: ") for line in case.read_text(encoding="utf-8").splitlines()[1:]
            if line.startswith("# also: ")]


def validate_in_process(path: Path, overrides: tuple[str, ...] = ()) -> str:
    """What `latscope validate` checks, here: the ScenarioError's message."""
    with pytest.raises(ScenarioError) as info:
        scenario = load_scenario(path, overrides)
        build_plan(scenario)
        Payloads(scenario)
    return str(info.value)


# Runs `latscope` in a child of its own and reports that child's peak RSS (RUSAGE_CHILDREN of a fresh
# process counts only its one child), its address space capped at 3 GB so that a regression fails
# the test rather than the machine.
_MEASURE = """
import resource, subprocess, sys
cap = lambda: resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
done = subprocess.run(sys.argv[1:], preexec_fn=cap, timeout=60)
print(f"\\npeak_rss_kb={resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}", file=sys.stderr)
sys.exit(done.returncode)
"""


def latscope(*args: str, env: dict | None = None) -> tuple[subprocess.CompletedProcess, float, float]:
    """(result, seconds, peak RSS in MB) of `latscope ARGS` run in a process of its own."""
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", _MEASURE, sys.executable, "-m", "latscope.cli", *args],
                            capture_output=True, text=True, cwd=REPO, timeout=90, stdin=subprocess.DEVNULL,
                            env={**os.environ, **(env or {})})
    seconds = time.perf_counter() - start
    stderr, _, rss = result.stderr.rpartition("\npeak_rss_kb=")
    result.stderr = stderr
    return result, seconds, int(rss) / 1024


# ---- the corpus ----------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_every_corpus_case_is_refused_naming_file_line_and_field(case):
    message = validate_in_process(case)
    assert f"{case}:{expected(case)}" in message, message
    assert all(text in message for text in also(case)), message
    assert "Traceback" not in message


def test_the_corpus_names_every_case_the_issue_lists():
    stems = {p.stem for p in CASES}
    assert set(COSTLY) <= stems
    assert {"seed_negative", "seed_too_big", "nul_byte", "header_value_crlf", "url_crlf", "trace_file_empty",
            "dataset_not_json", "lengths_file_no_lengths", "npy_not_npy"} <= stems
    assert set(RUN_CRASHED) <= stems


@pytest.mark.parametrize("stem", COSTLY)
def test_costly_cases_exit_2_fast_and_small_through_validate(stem):
    case = CORPUS / f"{stem}.yaml"
    result, seconds, rss_mb = latscope("validate", str(case))
    assert result.returncode == 2, result.stderr
    assert f"{case}:{expected(case)}" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert seconds < SECONDS and rss_mb < RSS_MB, (seconds, rss_mb)


def test_a_50_mb_body_is_refused_before_it_is_parsed(tmp_path):
    path = tmp_path / "big_body.yaml"
    path.write_text(MINIMAL + 'workload:\n  body: "' + "x" * 50_000_000 + '"\n')
    result, seconds, rss_mb = latscope("validate", str(path))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"{path}: the scenario file is over 4 MiB, the limit" in result.stderr
    assert seconds < SECONDS and rss_mb < RSS_MB, (seconds, rss_mb)


@pytest.mark.parametrize("stem", ["rate_1e12", "billion_laughs", "header_value_crlf", "tensor_shape_4tb"])
def test_run_exits_2_too_and_writes_nothing(stem, tmp_path):
    case = CORPUS / f"{stem}.yaml"
    result, seconds, _ = latscope("run", str(case), "--quiet", "--out", str(tmp_path / "out"))
    assert result.returncode == 2, result.stderr
    assert f"{case}:{expected(case)}" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists() and seconds < SECONDS


@pytest.mark.parametrize("command", ["validate", "run"])
@pytest.mark.parametrize("stem", RUN_CRASHED)
def test_what_run_crashed_on_is_exit_2_in_validate_and_run_alike(stem, command, tmp_path):
    case = CORPUS / f"{stem}.yaml"
    result, seconds, rss_mb = latscope(command, str(case), *(("--quiet", "--out", str(tmp_path / "out")) if
                                                             command == "run" else ()))
    assert result.returncode == 2, result.stderr
    assert f"{case}:{expected(case)}" in result.stderr and all(text in result.stderr for text in also(case))
    assert "Traceback" not in result.stderr + result.stdout and not (tmp_path / "out").exists()
    assert seconds < SECONDS and rss_mb < RSS_MB, (seconds, rss_mb)


def test_a_50_mb_line_of_hash_ids_is_refused_before_it_is_parsed(tmp_path):
    """input_length 2^32 + 7 with all of its 8,388,609 ids: a 58 MB line (it peaked at ~470-620 MB being
    parsed whole, and the length wrapped to 7 tokens). Now the line is read only as far as the most ids a
    request may hold (limits.max_prompt_tokens / 512 = 1,954), for validate and run alike."""
    trace = tmp_path / "trace.jsonl"
    blocks = -(-(2**32 + 7) // 512)
    with trace.open("wb") as file:
        file.write(b'{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]}\n')
        file.write(b'{"timestamp": 5, "input_length": %d, "output_length": 1, "hash_ids": [' % (2**32 + 7))
        file.write(b"12345, " * (blocks - 1) + b"12345]}\n")
    assert trace.stat().st_size > 50_000_000
    path = tmp_path / "scenario.yaml"
    path.write_text(MINIMAL.replace("    duration: 1\n", "").replace(
        "arrival: {type: constant, rate: 5}", f"arrival: {{type: trace, format: mooncake, file: {trace}}}"))
    for command in ("validate", "run"):
        out = ("--quiet", "--out", str(tmp_path / "out")) if command == "run" else ()
        result, seconds, rss_mb = latscope(command, str(path), *out)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert (f"{path}:6: phases[0].arrival.file: trace file {trace}: line 2: the line is over 45,130 bytes, more "
                "than its hash_ids can take; a request may have at most 1,954 hash_ids") in result.stderr, result.stderr
        assert seconds < SECONDS and rss_mb < RSS_MB, (seconds, rss_mb)
    assert not (tmp_path / "out").exists()


def test_a_5000_digit_integer_in_a_set_value_or_a_gate_file_is_a_line_not_a_traceback(tmp_path):
    """Python reads at most 4,300 digits into an int (sys.get_int_max_str_digits); PyYAML's int() then raised
    a bare ValueError. The scenario file is the corpus's seed_5000_digits; --set and gate files parse the same way."""
    digits = "1234567890" * 500
    result, _, _ = latscope("validate", str(write(tmp_path, MINIMAL)), "--set", f"seed={digits}")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "--set 'seed=…': the value is an integer of 5,000 digits, more than the 4,300 Python reads" in result.stderr
    assert digits[:50] not in result.stderr
    gate = tmp_path / "gate.yaml"
    gate.write_text(f"slos:\n  - {{stat: p99, limit_ms: 250}}\nmin_capacity_rps: {digits}\n")
    result, _, _ = latscope("gate", str(tmp_path), "--slo", str(gate))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert f"{gate}:3: min_capacity_rps: an integer of 5,000 digits, more than the 4,300 Python reads" in result.stderr


# ---- the limits are the user's to move --------------------------------------------------------------


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    return path


def test_an_hour_at_a_few_thousand_per_second_is_within_the_default_limits(tmp_path):
    path = write(tmp_path, MINIMAL.replace("duration: 1", "duration: 1h").replace("rate: 5", "rate: 2700"))
    check_plan_size(load_scenario(path))  # ~9.7 M requests: passes, without building the plan


def test_the_limits_are_configurable(tmp_path):
    big = MINIMAL.replace("rate: 5", "rate: 20000000")
    assert "limits.max_planned_requests" in validate_in_process(write(tmp_path, big))
    check_plan_size(load_scenario(write(tmp_path, big + "limits: {max_planned_requests: 30000000}\n")))
    small = MINIMAL + "limits: {max_body_bytes: 10}\nworkload: {body: {text: hello world}}\n"
    assert "workload.body: the body is 22 bytes as sent; the limit is 10" in validate_in_process(write(tmp_path, small))


# ---- YAML that is ordinary still loads -------------------------------------------------------------


def test_ordinary_aliases_and_merge_keys_still_load(tmp_path):
    text = MINIMAL + "workload:\n  classes:\n    - {name: a, headers: &h {X-Team: infra}}\n    - {name: b, headers: *h}\n"
    scenario = load_scenario(write(tmp_path, text))
    assert scenario.workload.classes[1].headers == {"X-Team": "infra"}


def test_nesting_just_under_the_limit_loads(tmp_path):
    body = "[" * 95 + "]" * 95
    scenario = load_scenario(write(tmp_path, MINIMAL + f"workload: {{body: {body}}}\n"))
    depth, value = 0, scenario.workload.body
    while value:
        depth, value = depth + 1, value[0]
    assert depth == 94


# ---- header injection: the file, --set, ${ENV} --------------------------------------------------------


def test_a_header_from_the_environment_with_crlf_names_the_variable_never_the_value(tmp_path):
    path = write(tmp_path, MINIMAL.replace("  url: http://127.0.0.1:9\n",
                                           "  url: http://127.0.0.1:9\n  headers: {X-Api-Key: '${EVIL_KEY}'}\n"))
    result, _, _ = latscope("validate", str(path), env={"EVIL_KEY": "sk-leaked-value\r\nX-Injected: 1"})
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"{path}:4: target.headers.X-Api-Key: a header value cannot contain CR" in result.stderr
    assert "${EVIL_KEY}" in result.stderr
    assert "sk-leaked-value" not in result.stderr + result.stdout and "X-Injected" not in result.stderr


def test_set_cannot_inject_a_header_or_a_url_either(tmp_path):
    path = write(tmp_path, MINIMAL)
    message = validate_in_process(path, ('target.headers.X-A="a\\r\\nX-Injected: 1"',))
    assert "(from --set target.headers.X-A=…)" in message and "target.headers.X-A: a header value cannot contain CR" in message
    assert "X-Injected" not in message, "the value given with --set is never echoed (it may be a secret)"
    message = validate_in_process(path, ('target.url="http://127.0.0.1:9/\\nGET /admin"',))
    assert "target.url: a URL cannot contain LF" in message


# ---- URL credentials ----------------------------------------------------------------------------------


USERINFO = """\
name: creds
target:
  url: "http://bob:${PASS}@127.0.0.1:9/v1?api_key=${PASS}&x=1"
workload:
  classes:
    - {name: a}
    - {name: b, url: "http://carol:class-pass@127.0.0.1:9/"}
phases: [{name: p, duration: 1, arrival: {type: constant, rate: 5}}]
"""


def test_url_userinfo_becomes_basic_auth_and_leaves_the_host_header(tmp_path, monkeypatch):
    monkeypatch.setenv("PASS", "hunter2-secret")
    scenario = load_scenario(write(tmp_path, USERINFO))
    for cls, user in ((0, "bob:hunter2-secret"), (1, "carol:class-pass")):
        endpoint = scenario.endpoint(cls)
        assert "@" not in endpoint.url
        assert endpoint.headers["Authorization"] == "Basic " + base64.b64encode(user.encode()).decode()
        head = request_prefix(endpoint).decode("latin-1")  # what the http client writes on the wire
        assert "\r\nHost: 127.0.0.1:9\r\n" in head and user not in head and f"{user.split(':')[0]}:" not in head


def test_validate_and_scenario_yaml_never_show_url_passwords(tmp_path):
    path = write(tmp_path, USERINFO)
    result, _, _ = latscope("validate", str(path), env={"PASS": "hunter2-secret"})
    assert result.returncode == 0, result.stderr
    assert "hunter2-secret" not in result.stdout and "class-pass" not in result.stdout
    assert "api_key=<redacted>" in result.stdout
    os.environ["PASS"] = "hunter2-secret"
    try:
        dump = redacted_yaml(load_scenario(path))
    finally:
        del os.environ["PASS"]
    assert "hunter2-secret" not in dump and "class-pass" not in dump
    assert yaml.safe_load(dump)["workload"]["classes"][1]["url"] == "http://carol:<redacted>@127.0.0.1:9/"

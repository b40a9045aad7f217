"""Reading capacity.json (analysis/capacity_gate.py `read_capacity`, the one home where it is read):
a file it cannot trust is refused with one line naming it and what is wrong — `latscope gate` and
`latscope report` exit 2, never pass (exit 0), never a traceback — and a schema 1 file (which
counted a rate undecided twice as a fail) is still read, its upper end taken from its real fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO
from latscope.analysis.capacity_gate import confident_ends, minimum_check, read_capacity, regression_check
from latscope.analysis.gate import FAIL, INCONCLUSIVE, PASS
from latscope.errors import ResultsError


def capacity(**change) -> dict:
    """A schema 2 capacity.json of a search that stopped on its undecided band."""
    steps = [{"index": 1, "dir": "steps/001-100", "rate_rps": 100.0, "look": 1, "verdict": "pass", "counted_as": "pass"},
             {"index": 2, "dir": "steps/002-200", "rate_rps": 200.0, "look": 1, "verdict": "fail", "counted_as": "fail"},
             {"index": 3, "dir": "steps/003-150", "rate_rps": 150.0, "look": 3, "verdict": "undecided", "counted_as": "undecided"}]
    doc = {"schema_version": 2, "scenario": "s", "precision": 0.05, "confidence": 0.95, "max_rate_rps": 100.0,
           "bracket": {"low_rps": 100.0, "high_rps": 200.0, "undecided_low_rps": 150.0, "undecided_high_rps": 150.0},
           "undecided_rps": [150.0], "stopped": "undecided_band", "message": "capacity at least 100 req/s", "exit_code": 0,
           "slos": [], "steps": steps}
    doc.update(change)
    return doc


def write(directory: Path, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "capacity.json").write_text(text)
    return directory


BAD = {
    "nan": (json.dumps(capacity()).replace('"max_rate_rps": 100.0', '"max_rate_rps": NaN'), "is not a JSON number"),
    "infinity": (json.dumps(capacity()).replace('"high_rps": 200.0', '"high_rps": Infinity'), "is not a JSON number"),
    "future": (json.dumps(capacity(schema_version=99)), "schema_version 99 is from a newer latscope"),
    "steps_string": (json.dumps(capacity(steps="three")), "`steps` must be a list of objects"),
    "steps_not_objects": (json.dumps(capacity(steps=[1, "x"])), "`steps` must be a list of objects"),
    "negative": (json.dumps(capacity(bracket={"low_rps": -5, "high_rps": 200.0})), "bracket.low_rps -5 is not a rate"),
    "string_rate": (json.dumps(capacity(bracket={"low_rps": "fast", "high_rps": 200.0})), "bracket.low_rps 'fast' is not a rate"),
    "inverted": (json.dumps(capacity(bracket={"low_rps": 300.0, "high_rps": 200.0})), "is not below bracket.high_rps"),
    "bracket_list": (json.dumps(capacity(bracket=[1, 2])), "`bracket` must be an object"),
    "deep": ("[" * 100_000 + "]" * 100_000, "nested deeper than JSON can be read"),
    "not_object": ("[1, 2]", "expected a JSON object"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_read_capacity_refuses_a_file_it_cannot_trust_naming_it_and_what_is_wrong(tmp_path, case):
    text, words = BAD[case]
    directory = write(tmp_path / case, text)
    with pytest.raises(ResultsError) as caught:
        read_capacity(directory)
    message = str(caught.value)
    assert message.startswith(f"{directory / 'capacity.json'}: ") and words in message and "\n" not in message


def latscope(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "latscope", *args], cwd=REPO, env={**os.environ, "NO_COLOR": "1"},
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("case", ["nan", "future", "steps_not_objects", "deep"])
def test_gate_and_report_refuse_it_with_exit_2_and_one_line(tmp_path, case):
    text, words = BAD[case]
    directory = write(tmp_path / case, text)
    slo = tmp_path / "gate.yaml"
    slo.write_text(yaml.safe_dump({"min_capacity_rps": 50}))
    for res in (latscope("gate", str(directory), "--slo", str(slo)), latscope("report", str(directory))):
        assert res.returncode == 2, res.stdout + res.stderr
        assert "Traceback" not in res.stderr and words in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert not (directory / "capacity.html").exists()


def test_an_undecided_band_is_no_failure_for_the_gate():
    cap = capacity()
    assert minimum_check(cap, 90).status == PASS  # the confident low reaches it
    assert minimum_check(cap, 200).status == FAIL  # the SLOs failed with confidence at 200
    assert minimum_check(cap, 150).status == INCONCLUSIVE  # between the ends, 100 % apart: the data cannot tell
    assert minimum_check(capacity(bracket={"low_rps": 100.0, "high_rps": 104.0}), 102).status == PASS  # within 5 %
    # a regression only when the new search fails with confidence where the baseline passed with confidence
    base = capacity(max_rate_rps=180.0, bracket={"low_rps": 180.0, "high_rps": 400.0})
    assert regression_check(cap, base).status == PASS  # new [100, 200) overlaps the baseline's [180, 400)
    assert regression_check(capacity(bracket={"low_rps": 100.0, "high_rps": 170.0}), base).status == FAIL


def test_a_schema_1_file_is_still_read_its_undecided_twice_fail_not_taken_for_a_fail(tmp_path):
    # schema 1: 150 was undecided twice and "counted as a fail (conservative)": its high_rps was 150
    old = capacity(schema_version=1, bracket={"low_rps": 100.0, "high_rps": 150.0}, stopped="precision")
    old["steps"][2].update(look=None, longer=True, counted_as="fail")
    del old["undecided_rps"]
    directory = write(tmp_path / "old", json.dumps(old))
    cap = read_capacity(directory)
    assert confident_ends(cap) == (100.0, 200.0)  # the real fail is at 200
    assert minimum_check(cap, 160).status != FAIL  # v1 would have failed it: the SLOs never failed at 150 with confidence
    res = latscope("report", str(directory))
    assert res.returncode == 0 and (directory / "capacity.html").is_file(), res.stdout + res.stderr

"""The scenario's `telemetry:` section: defaults, errors located by file and line, redaction."""

from __future__ import annotations

import pytest

from latscope.errors import ScenarioError
from latscope.scenario import load_scenario, redacted_yaml

from conftest import MINIMAL


def write(tmp_path, telemetry: str):
    path = tmp_path / "s.yaml"
    path.write_text(MINIMAL + "telemetry:\n" + telemetry)
    return path


def test_defaults_sample_host_and_nvml_when_it_starts(tmp_path):
    (tmp_path / "s.yaml").write_text(MINIMAL)
    t = load_scenario(tmp_path / "s.yaml").telemetry
    assert (t.interval, t.nvml, t.host, t.prometheus) == (0.25, "auto", True, [])


def test_sources_with_shipped_and_inline_mappings(tmp_path, monkeypatch):
    monkeypatch.setenv("GPU_HOST", "10.1.2.3")
    path = write(tmp_path, """\
  interval: 500ms
  nvml: false
  prometheus:
    - {name: dcgm, url: "http://user:hunter2@${GPU_HOST}:9400/metrics", mapping: dcgm, timeout: 1s}
    - name: mine
      url: http://127.0.0.1:9/metrics
      mapping: {jobs: {metric: jobs_s, rate: true, device_label: node}}
""")
    scenario = load_scenario(path)
    dcgm, mine = scenario.telemetry.prometheus
    assert scenario.telemetry.interval == 0.5 and scenario.telemetry.nvml is False
    assert dcgm.url == "http://user:hunter2@10.1.2.3:9400/metrics" and dcgm.mapping == "dcgm" and dcgm.timeout == 1.0
    assert mine.mapping["jobs"].rate is True and mine.mapping["jobs"].device_label == "node"
    text = redacted_yaml(scenario)
    assert "${GPU_HOST}" in text and "hunter2" not in text


@pytest.mark.parametrize("telemetry, line, message", [
    ("  prometheus:\n    - {url: 'http://h/metrics', mapping: dgcm}\n", 10,
     "telemetry.prometheus[0].mapping: expected one of dcgm, triton, reference-server, vllm, sglang, tgi, llama.cpp or an inline mapping"),
    ("  prometheus:\n    - url: http://h/metrics\n      mapping: {a: {metric: x, scal: 2}}\n", 11,
     "telemetry.prometheus[0].mapping: a.scal: Extra inputs are not permitted"),
    ("  nvml: maybe\n", 9, "telemetry.nvml: Input should be 'auto', True or False"),
    ("  prometheus:\n    - {name: host, url: 'http://h/metrics'}\n", 9, "'host' is the name of a built-in telemetry source"),
    ("  prometheus:\n    - {url: 'http://h/a'}\n    - {url: 'http://h/b'}\n", 9, "prometheus source names must be unique"),
    ("  interval: 1ms\n", 9, "telemetry.interval"),
])
def test_errors_name_the_line(tmp_path, telemetry, line, message):
    path = write(tmp_path, telemetry)
    with pytest.raises(ScenarioError) as exc:
        load_scenario(path)
    assert f"{path}:{line}: " in str(exc.value) and message in str(exc.value)


def test_the_scenario_names_exactly_the_shipped_mappings():
    """The scenario (which imports nothing from telemetry/) lists the shipped mappings' names for
    validation; telemetry/mappings.py ships them: the two lists are one set of names."""
    from latscope.scenario.telemetry import PROMETHEUS_MAPPINGS
    from latscope.telemetry.mappings import MAPPINGS

    assert tuple(MAPPINGS) == PROMETHEUS_MAPPINGS

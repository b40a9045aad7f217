"""The pieces of a starter that need no server: every preset survives being pointed elsewhere, values
from a server cannot break the YAML, an input's metadata becomes a tensor latscope can send, and an
HTTP/2 frame is told from other bytes."""

from __future__ import annotations

import pytest
import yaml

from latscope.init.presets import PRESETS_DIR, preset_names, preset_protocol, preset_text, retarget
from latscope.init.probe import Input, _http2_frame
from latscope.init.starters import Endpoint, scalar, starter_text, tensor_line
from latscope.scenario import scenario_from_dict

from conftest import REPO


def test_the_presets_ship_in_the_package_and_scenarios_presets_points_there():
    assert PRESETS_DIR == REPO / "latscope" / "presets"
    assert set(preset_names()) == {"fraud_scoring", "recommendation", "ivr_routing", "clinical_alert",
                                   "document_intake", "streaming_chat"}
    link = REPO / "scenarios" / "presets"
    assert link.is_symlink() and link.resolve() == PRESETS_DIR


@pytest.mark.parametrize("name", preset_names())
def test_every_preset_retargets_to_a_url_keeping_its_comments(name):
    text = preset_text(name)
    protocol = preset_protocol(text)
    out, changes = retarget(text, "http://10.0.0.7:9000", protocol, "my-model", None)
    scenario = scenario_from_dict(yaml.safe_load(out))
    assert scenario.target.url == "http://10.0.0.7:9000" and scenario.target.launch is None
    assert scenario.target.model == "my-model" and scenario.target.protocol == protocol
    assert f"# {name}: " in out and "reference_server serve" not in out.split("\nname:")[1]
    assert changes[:2] == ["target.url: http://10.0.0.7:9000", "target.launch: removed (the endpoint runs already)"]


def test_a_kserve_preset_takes_the_models_own_inputs_when_their_names_differ():
    inputs = [Input("pixels", "FP32", (-1, 3, 224, 224))]
    out, changes = retarget(preset_text("fraud_scoring"), "grpc://10.0.0.7:8001", "kserve-v2-grpc", "resnet", inputs)
    scenario = scenario_from_dict(yaml.safe_load(out))
    assert scenario.target.protocol == "kserve-v2-grpc"
    assert [(t.name, t.datatype, t.shape) for t in scenario.workload.classes[0].tensors] == [("pixels", "FP32", [1, 3, 224, 224])]
    assert changes[-1] == "workload tensors: the model's inputs (pixels)"


@pytest.mark.parametrize("value", ["decoder", "meta-llama/Llama-3-8B", "1.0", "true", "null", "a: b", "#x", "it's", '"q"'])
def test_a_value_from_the_server_reads_back_as_itself(value):
    assert yaml.safe_load(f"k: {scalar(value)}") == {"k": value}


def test_input_metadata_becomes_a_tensor_latscope_can_send():
    assert tensor_line(Input("input_ids", "INT64", (-1, -1)), reference=False) == \
        "        - {name: input_ids, datatype: INT64, shape: [1, 16], low: 0, high: 100}"
    assert tensor_line(Input("attention_mask", "INT32", (1, -1)), reference=False).endswith("low: 1, high: 2}")
    text = tensor_line(Input("text", "BYTES", (1,)), reference=False)  # latscope sends numbers only: said so
    assert "datatype: FP32" in text and "# CHANGE: the model takes BYTES" in text


def test_a_starter_for_unknown_inputs_still_validates_and_says_to_change_them():
    text = starter_text(Endpoint("kserve-v2", "http://10.0.0.7:8000", model=None, inputs=None), ["header"], "x.yaml")
    scenario = scenario_from_dict(yaml.safe_load(text))
    assert scenario.target.model == "MODEL" and "# CHANGE: the model's inputs" in text
    assert text.startswith("# header\n#\n# What to change first:")


def test_an_http2_settings_frame_is_told_from_other_bytes():
    assert _http2_frame(b"\x00\x00\x18\x04\x00\x00\x00\x00\x00\x00\x04\x00@")  # what grpc answered HTTP/1.1 with
    assert not _http2_frame(b"HTTP/1.1 200 OK\r\n") and not _http2_frame(b"\x00\x00") and not _http2_frame(b"SSH-2.0-x\r\n")

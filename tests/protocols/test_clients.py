"""The protocol table (latscope/scenario/protocols.py) and the client factory agree: every row's
client is importable and speaks the `Client` interface, and make_client builds each protocol's
client from its row alone."""

from __future__ import annotations

import inspect

from latscope.protocols import client_class, make_client
from latscope.scenario import PROTOCOLS, Target, scenario_from_dict


def test_every_protocol_of_the_table_has_a_client_and_the_schema_accepts_it():
    assert set(PROTOCOLS) == {"http", "openai", "openai-responses", "anthropic-messages", "kserve-v2", "kserve-v2-grpc",
                              "openai-embeddings", "rerank"}
    assert set(Target.model_json_schema()["properties"]["protocol"]["enum"]) == set(PROTOCOLS)
    for name, spec in PROTOCOLS.items():
        cls = client_class(name)
        assert all(inspect.iscoroutinefunction(getattr(cls, m)) for m in ("open", "send", "close")), name
        takes = list(inspect.signature(cls).parameters)
        assert takes == (["scenario", "classes", "payloads"] if spec.payloads else ["scenario", "classes"]), name


def test_make_client_routes_each_class_to_its_protocols_client():
    data = {"target": {"url": "http://127.0.0.1:9", "model": "m"},
            "workload": {"classes": [{"name": "plain"}, {"name": "chat", "protocol": "openai"},
                                     {"name": "enc", "protocol": "kserve-v2-grpc", "url": "grpc://127.0.0.1:9",
                                      "tensors": [{"name": "x", "shape": [1, 4]}]}]},
            "phases": [{"name": "p", "duration": 1, "arrival": {"type": "constant", "rate": 1}}]}
    client = make_client(scenario_from_dict(data))
    assert [type(c).__name__ for c in client._by_class] == ["HttpClient", "OpenAIClient", "KServeGrpcClient"]

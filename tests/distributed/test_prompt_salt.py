"""A distributed run's machines build the master's prompts: the run's prompt salt (drawn once, by the
master: workload.with_run_salt) travels to every node in the setup frame's overrides."""

from __future__ import annotations

import socket

import yaml

from latscope import results
from latscope.distributed.remote import RemotePool
from latscope.plan import build_plan
from latscope.records import Request
from latscope.scenario import load_scenario
from latscope.workload import Payloads, with_run_salt


def test_every_node_loads_the_masters_salt_and_builds_the_same_prompts(tmp_path):
    path = tmp_path / "dist.yaml"
    path.write_text(yaml.safe_dump({
        "name": "dist", "seed": 4, "target": {"url": "http://127.0.0.1:9", "protocol": "openai", "model": "m"},
        "workload": {"classes": [{"name": "c", "prompt_tokens": 30}]},
        "phases": [{"name": "p", "duration": 1, "arrival": {"type": "constant", "rate": 5}}]}))
    overrides = ("phases.0.arrival.rate=8",)
    master = with_run_salt(load_scenario(path, overrides))
    events = results.EventLog(tmp_path / "events.jsonl")
    ours, theirs = socket.socketpair()
    try:
        pool = RemotePool(ours, path, overrides, master, build_plan(master), events, expect=1, on_node_loss="abort",
                          master_timeout_s=5)
        node = load_scenario(path, pool.overrides)  # what a node does with the setup frame (node.py setup)
    finally:
        ours.close(), theirs.close(), events.close()
    assert isinstance(master.prompt_salt, int) and node.prompt_salt == master.prompt_salt
    assert node.phases[0].arrival.rate == 8  # the user's overrides still apply
    requests = [Request(i, 0, 0, False, prompt_tokens=30, item=i * 1009) for i in range(20)]
    prompts = [[Payloads(s).get(r).prompt for r in requests] for s in (master, node, load_scenario(path))]
    assert prompts[0] == prompts[1] != prompts[2]  # the node's are the master's, not the seed's alone

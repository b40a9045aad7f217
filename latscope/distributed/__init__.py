"""Distributed runs: one scenario, one plan, one results directory, the load sent from many machines.

Locust's master/worker engine carries the run (membership, heartbeats, missing-worker detection, the
deployments people already use); latscope measures, in plain processes beside Locust's:

    master machine                                    each load machine
    Locust master (gevent) ── locustfile.py ──────▶   Locust worker (gevent) ── locustfile.py
      │ socketpair, frames                              │ socketpair, frames
    coordinator = `latscope run --relay-fd`           node (node.py): P engines (engine.py),
      (run/orchestrator.py with remote.RemotePool):     their interval reports merged, one frame
      plan, collector, results directory                per interval

| module | holds |
| --- | --- |
| locustfile.py | the only module that imports locust: the relays, the roster, clock pings, lost workers |
| frames.py | how frames are carried (length + msgpack); what the relays import of latscope |
| wire.py | the frames' contents: interval reports (lossless sparse HDR), the plan (no pickle) |
| clock.py | a node's clock offset from min-RTT pings, its error bound and drift |
| remote.py | the coordinator's pool: roster, setup, t0 per node, reports onto one clock, nodes.parquet |
| node.py | a load machine's engines, merged per interval; it stops when its relay falls silent |
| launch.py | `latscope run --distributed`, `latscope worker`, `latscope locustfile` |
"""

"""Stage timing inside a reference server replica, for benchmarks/handoff.py. Not part of the server.

Python imports `sitecustomize` at start-up from any directory on PYTHONPATH; handoff.py puts this
directory there, with LATSCOPE_PROBE_OUT naming a file, when it launches the server. Every Python
process started with that environment then patches the server's modules, the replica included (the
supervisor starts it with the same environment). The patches only read perf_counter_ns at the edges
of functions that every version of the server has (the KServe v2 handler, body read, decode, the
batcher's submit, batch run and backend call), so the same probe times the server before and after a
change. At exit each replica writes one JSON line per request:

    handler    handler entered (aiohttp has parsed the request line and headers); on the lean infer path
               (infer_path.py, servers after issue 34) the answer started, the whole request parsed
    body       the body read (on the lean path: the same instant as handler)
    decoded    the request decoded and validated (v2.decode_request)
    enqueued   the request put on the batcher's queue
    taken      its batch formed: the inference side took it (queue wait + batch formation + wake-up)
    compute0   the backend call started (after batch assembly: padding, concatenation)
    compute1   the backend call returned
    delivered  its result handed to the event loop (after the batch's outputs were split)
    resumed    the handler running again with its result (the hand-off back to the event loop)
    returned   the handler returned its response (encode + Server-Timing)
"""

from __future__ import annotations

import os

OUT = os.environ.get("LATSCOPE_PROBE_OUT")


def _install(out: str) -> None:
    import atexit
    import contextvars
    import json
    import threading
    import time

    from reference_server import batcher as batcher_module
    from reference_server import http_server

    now = time.perf_counter_ns
    records: list[dict[str, int]] = []
    current: contextvars.ContextVar[dict | None] = contextvars.ContextVar("probe", default=None)
    in_batch = threading.local()

    lean = hasattr(http_server.V2Routes, "answer_infer")  # both HTTP paths answer with it (issue 34 on)
    original_infer = http_server.V2Routes.answer_infer if lean else http_server.V2Routes.infer
    original_read = http_server.read_body
    original_decode = http_server.v2.decode_request
    original_pending = batcher_module.Batcher._pending
    original_submit = batcher_module.Batcher.submit
    original_run = batcher_module.Batcher._run
    original_init = batcher_module.Batcher.__init__
    original_deliver = batcher_module.Batcher.__dict__["_deliver"]

    async def infer(self, *args):
        record = {"handler": now()}
        if lean:
            record["body"] = record["handler"]
        current.set(record)
        response = await original_infer(self, *args)
        record["returned"] = now()
        if (response[0] if lean else response.status) == 200:
            records.append(record)
        return response

    async def read_body(*args, **kwargs):
        body = await original_read(*args, **kwargs)
        if (record := current.get()) is not None:
            record["body"] = now()
        return body

    def decode_request(*args, **kwargs):
        decoded = original_decode(*args, **kwargs)
        if (record := current.get()) is not None:
            record["decoded"] = now()
        return decoded

    def pending(self, inputs):
        p = original_pending(self, inputs)
        p.probe = current.get() or {}
        return p

    async def submit(self, inputs):
        record = current.get()
        result = await original_submit(self, inputs)
        if record is not None:
            record["resumed"] = now()
        return result

    def run(self, batch):
        taken = now()
        in_batch.times = {}
        for p in batch:
            p.probe.setdefault("taken", taken)  # a batch re-run alone keeps its first times
        original_run(self, batch)

    def deliver(*args):
        handed = args[-2]  # (pending, value) or (batch, values), after self where _deliver is a method
        stamp = now()
        for p in handed if isinstance(handed, list) else [handed]:
            p.probe.update(enqueued=p.enqueued_ns, delivered=stamp, **in_batch.times)
        target = original_deliver.__func__ if isinstance(original_deliver, staticmethod) else original_deliver
        target(*args)

    def init(self, run_fn, *args, **kwargs):
        def timed(inputs):
            in_batch.times = {"compute0": now()}
            try:
                return run_fn(inputs)
            finally:
                in_batch.times["compute1"] = now()
        original_init(self, timed, *args, **kwargs)

    setattr(http_server.V2Routes, "answer_infer" if lean else "infer", infer)
    http_server.read_body = read_body
    http_server.v2.decode_request = decode_request
    batcher_module.Batcher._pending = pending
    batcher_module.Batcher.submit = submit
    batcher_module.Batcher._run = run
    batcher_module.Batcher._deliver = staticmethod(deliver) if isinstance(original_deliver, staticmethod) else deliver
    batcher_module.Batcher.__init__ = init

    def dump() -> None:
        with open(out, "a") as f:
            for record in records:
                f.write(json.dumps(record) + "\n")

    atexit.register(dump)


if OUT:
    _install(OUT)

"""The naive baseline for benchmarks/reference_server.py: what most people write first.

A plain aiohttp handler that parses the KServe v2 JSON request and calls ONNX Runtime once per
request, on the event loop, with no batching: the same model file and the same URL as the reference
server, so the benchmark can drive both with the same latscope scenario.

    python benchmarks/naive_server.py --model encoder.onnx --port 8100
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import onnxruntime as ort
from aiohttp import web


def make_app(model: str, threads: int) -> web.Application:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    output_names = [o.name for o in session.get_outputs()]

    async def infer(request: web.Request) -> web.Response:
        body = await request.json()
        feeds = {t["name"]: np.asarray(t["data"], dtype=np.int64).reshape(t["shape"]) for t in body["inputs"]}
        results = session.run(output_names, feeds)
        outputs = [{"name": n, "datatype": "FP32", "shape": list(r.shape), "data": r.ravel().tolist()}
                   for n, r in zip(output_names, results)]
        return web.json_response({"model_name": request.match_info["model"], "outputs": outputs})

    async def ready(request: web.Request) -> web.Response:
        return web.json_response({"ready": True})

    app = web.Application()
    app.router.add_post("/v2/models/{model}/infer", infer)
    app.router.add_get("/v2/health/ready", ready)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    args = parser.parse_args()
    web.run_app(make_app(args.model, args.threads), host="127.0.0.1", port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()

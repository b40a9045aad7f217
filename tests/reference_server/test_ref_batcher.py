"""The dynamic batcher with a fake backend: grouping, padding, splitting, overload and failure isolation."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from reference_server.batcher import Batcher, InferenceFailed, Overloaded, RequestTooLarge
from reference_server.signature import Signature, TensorSpec

TOKENS = Signature(
    inputs=(TensorSpec("input_ids", "INT64", ("batch", "sequence")),
            TensorSpec("attention_mask", "INT64", ("batch", "sequence"))),
    outputs=(TensorSpec("pooled", "FP32", ("batch", 1)), TensorSpec("per_token", "FP32", ("batch", "sequence"))))


class FakeBackend:
    """Records the shape of every batch; 'pooled' = masked sum of ids, 'per_token' = ids (so padding shows)."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.batches: list[dict[str, tuple[int, ...]]] = []
        self.fail_on = fail_on

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.batches.append({name: a.shape for name, a in inputs.items()})
        if "input_ids" not in inputs:
            return {"y": inputs["x"] * 2}
        ids, mask = inputs["input_ids"], inputs["attention_mask"]
        if self.fail_on is not None and (ids == self.fail_on).any():
            raise RuntimeError("poisoned input")
        return {"pooled": (ids * mask).sum(axis=1, keepdims=True).astype(np.float32),
                "per_token": ids.astype(np.float32)}


def tokens(length: int, start: int = 1, rows: int = 1) -> dict[str, np.ndarray]:
    ids = np.tile(np.arange(start, start + length, dtype=np.int64), (rows, 1))
    return {"input_ids": ids, "attention_mask": np.ones_like(ids)}


def run_concurrently(batcher: Batcher, requests: list[dict[str, np.ndarray]]) -> list:
    async def main():
        batcher.start()
        try:
            return await asyncio.gather(*(batcher.submit(r) for r in requests), return_exceptions=True)
        finally:
            await asyncio.to_thread(batcher.stop)

    return asyncio.run(main())


def make(backend: FakeBackend, signature: Signature = TOKENS, **kwargs) -> Batcher:
    options = {"max_batch_size": 8, "max_queue_delay_us": 200_000, "max_queue": 64, **kwargs}
    return Batcher(backend.run, signature, **options)


def test_pads_within_a_length_bucket_and_gives_each_request_its_own_slice():
    backend = FakeBackend()
    requests = [tokens(5, start=1), tokens(7, start=10), tokens(3, start=20), tokens(20, start=30, rows=2)]
    results = run_concurrently(make(backend), requests)
    # 5 and 7 share bucket 8 (padded to 7); 3 (bucket 4) and 20 (bucket 32) run apart.
    assert sorted(b["input_ids"] for b in backend.batches) == [(1, 3), (2, 7), (2, 20)]
    for request, result in zip(requests, results):
        ids = request["input_ids"]
        np.testing.assert_array_equal(result.outputs["per_token"], ids)  # cut back to its own length
        np.testing.assert_array_equal(result.outputs["pooled"][:, 0], ids.sum(axis=1))
    assert [r.batch_size for r in results] == [2, 2, 1, 2]
    assert all(r.queue_ns > 0 and r.compute_ns > 0 for r in results)


def test_rows_per_run_never_exceed_max_batch_size():
    backend = FakeBackend()
    results = run_concurrently(make(backend, max_batch_size=4), [tokens(4, rows=3) for _ in range(3)])
    assert [b["input_ids"][0] for b in backend.batches] == [3, 3, 3]
    assert all(r.batch_size == 3 for r in results)


def test_generic_model_concatenates_only_identical_trailing_shapes():
    signature = Signature(inputs=(TensorSpec("x", "FP32", ("n", "k")),), outputs=(TensorSpec("y", "FP32", ("n", "k")),))
    backend = FakeBackend()
    requests = [{"x": np.full((1, 3), i, np.float32)} for i in range(3)] + [{"x": np.ones((2, 5), np.float32)}]
    results = run_concurrently(make(backend, signature), requests)
    assert sorted(b["x"] for b in backend.batches) == [(2, 5), (3, 3)]  # no padding without an attention_mask
    for request, result in zip(requests, results):
        np.testing.assert_array_equal(result.outputs["y"], request["x"] * 2)


def test_model_without_shared_batch_axis_runs_each_request_alone():
    signature = Signature(inputs=(TensorSpec("x", "FP32", (1, 3)),), outputs=(TensorSpec("y", "FP32", (1, 3)),))
    backend = FakeBackend()
    batcher = make(backend, signature, max_batch_size=32)
    assert batcher.max_rows == 1
    results = run_concurrently(batcher, [{"x": np.ones((1, 3), np.float32)} for _ in range(4)])
    assert len(backend.batches) == 4 and all(r.batch_size == 1 for r in results)


def test_full_queue_rejects_at_once_and_oversized_requests_are_refused():
    started, release = threading.Event(), threading.Event()
    backend = FakeBackend()

    def blocking_run(inputs):
        started.set()
        release.wait(10)
        return backend.run(inputs)

    batcher = Batcher(blocking_run, TOKENS, max_batch_size=1, max_queue_delay_us=0, max_queue=1)

    async def main():
        batcher.start()
        running = asyncio.ensure_future(batcher.submit(tokens(4)))
        await asyncio.to_thread(started.wait, 10)  # the inference thread is busy with the first request
        queued = asyncio.ensure_future(batcher.submit(tokens(4)))
        await asyncio.sleep(0.01)  # the second fills the queue (size 1)
        with pytest.raises(Overloaded):
            await batcher.submit(tokens(4))
        with pytest.raises(RequestTooLarge):
            await batcher.submit(tokens(4, rows=2))
        release.set()
        done = await asyncio.gather(running, queued)
        await asyncio.to_thread(batcher.stop)
        return done

    assert [r.batch_size for r in asyncio.run(main())] == [1, 1]


def test_a_failing_request_does_not_fail_its_batch_neighbours():
    backend = FakeBackend(fail_on=-1)
    requests = [tokens(4, start=1), {"input_ids": np.full((1, 4), -1, np.int64),
                                     "attention_mask": np.ones((1, 4), np.int64)}, tokens(4, start=5)]
    results = run_concurrently(make(backend), requests)
    assert isinstance(results[1], InferenceFailed) and "poisoned input" in str(results[1])
    assert [r.batch_size for r in (results[0], results[2])] == [1, 1]  # re-run alone after the batch failed
    np.testing.assert_array_equal(results[2].outputs["per_token"], requests[2]["input_ids"])


def test_a_batch_wakes_the_event_loop_once_not_once_per_request():
    """Each wake-up from the inference thread is a write to the loop's self-pipe, after which the loop and
    the inference thread take turns at the GIL: one per batch, however many requests it holds."""
    backend = FakeBackend()
    batcher = make(backend)
    wakeups = []

    async def main():
        loop = asyncio.get_running_loop()
        original = loop.call_soon_threadsafe
        loop.call_soon_threadsafe = lambda *args, **kwargs: (wakeups.append(args), original(*args, **kwargs))[1]
        batcher.start()
        try:
            results = await asyncio.gather(*(batcher.submit(tokens(4, start=i)) for i in range(5)))
            return results, len(wakeups)  # counted before stop(), whose to_thread wakes the loop too
        finally:
            await asyncio.to_thread(batcher.stop)

    results, woken = asyncio.run(main())
    assert len(backend.batches) == 1 and [r.batch_size for r in results] == [5] * 5
    assert woken == 1

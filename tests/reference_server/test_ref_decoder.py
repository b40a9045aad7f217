"""The built-in decoder (deterministic build, KV cache equal to a full recomputation, left-padded batches, the
decode step graph equal to the prefill graph) and the continuous-batching generator on top of it, in process on
a small configuration."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import numpy as np
import pytest

from reference_server.backends.onnxruntime import OnnxRuntimeBackend
from reference_server.batcher import Overloaded
from reference_server.decoder import (DecoderConfig, build_decoder, cached_decode_step, cached_decoder, empty_cache,
                                      past_names, present_names)
from reference_server.generation import ContextTooLong, GenerationFailed, Generator
from reference_server.signature import TensorSpec, read_signature

SMALL = DecoderConfig(layers=2, hidden=64, heads=4, ffn=128, vocab=1024, max_context=256)
RNG = np.random.default_rng(7)
PROMPTS = [RNG.integers(0, SMALL.vocab, n) for n in (5, 17, 9, 30)]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> Path:
    path, _ = cached_decoder(SMALL, tmp_path_factory.mktemp("decoder"))
    return path


@pytest.fixture(scope="module")
def backend(model_path) -> OnnxRuntimeBackend:
    backend = OnnxRuntimeBackend(model_path, threads=1)
    backend.load()
    return backend


@pytest.fixture(scope="module")
def run(backend):
    return backend.run


@pytest.fixture(scope="module")
def step(model_path):
    """The decode step graph's run, in place (generation.RunIntoFn)."""
    backend = OnnxRuntimeBackend(cached_decode_step(SMALL, model_path.parent)[0], threads=1)
    backend.load()
    return backend.run_into


def prefill(run, ids: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Last-position logits [vocab] and the cache (as past_* inputs) of one unpadded sequence."""
    out = run({"input_ids": ids[None], "position_ids": np.arange(ids.size)[None],
               "attention_mask": np.ones((1, ids.size), np.int64), **empty_cache(SMALL, 1)})
    return out["logits"][0], dict(zip(past_names(SMALL.layers), (out[n] for n in present_names(SMALL.layers))))


def decode_one(run, token: int, position: int, past: dict[str, np.ndarray]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """One decode step of one sequence through the prefill graph."""
    out = run({"input_ids": np.array([[token]]), "position_ids": np.array([[position]]),
               "attention_mask": np.ones((1, position + 1), np.int64), **past})
    return out["logits"][0], dict(zip(past_names(SMALL.layers), (out[n] for n in present_names(SMALL.layers))))


def greedy_alone(run, prompt: np.ndarray, n: int) -> list[int]:
    logits, past = prefill(run, prompt)
    tokens = [int(logits.argmax())]
    for i in range(n - 1):
        logits, past = decode_one(run, tokens[-1], prompt.size + i, past)
        tokens.append(int(logits.argmax()))
    return tokens


# --- the graph -----------------------------------------------------------------------------------------

def test_building_twice_gives_byte_identical_onnx_and_cache_is_reused(tmp_path):
    first, reused_first = cached_decoder(SMALL, tmp_path / "a")
    second, reused_second = cached_decoder(SMALL, tmp_path / "b")
    assert not reused_first and not reused_second
    assert first.read_bytes() == second.read_bytes() == build_decoder(SMALL).SerializeToString()
    again, reused = cached_decoder(SMALL, tmp_path / "a")
    assert reused and again == first
    other, _ = cached_decoder(DecoderConfig(layers=1, hidden=64, heads=4, ffn=128, vocab=1024), tmp_path / "a")
    assert other != first and first.name.startswith("decoder-")


def test_signature(model_path):
    sig = read_signature(model_path)
    d = SMALL.head_dim
    assert sig.inputs[:3] == (TensorSpec("input_ids", "INT64", ("batch", "sequence")),
                              TensorSpec("position_ids", "INT64", ("batch", "sequence")),
                              TensorSpec("attention_mask", "INT64", ("batch", "total_sequence")))
    assert sig.inputs[3:] == tuple(TensorSpec(n, "FP32", ("batch", SMALL.heads, "past_sequence", d))
                                   for n in past_names(SMALL.layers))
    assert sig.outputs == (TensorSpec("logits", "FP32", ("batch", SMALL.vocab)),
                           *(TensorSpec(n, "FP32", ("batch", SMALL.heads, "total_sequence", d))
                             for n in present_names(SMALL.layers)))
    assert sig.dim_limits == {"total_sequence": SMALL.max_context}


def test_kv_cache_decode_equals_full_recomputation(run):
    ids = RNG.integers(0, SMALL.vocab, 24)
    logits, past = prefill(run, ids[:10])
    np.testing.assert_allclose(logits, prefill(run, ids[:10])[0], atol=1e-6)
    assert past["past_key_0"].shape == (1, SMALL.heads, 10, SMALL.head_dim)
    for i in range(10, 24):  # feed the rest one token at a time; each step must match a full run of the prefix
        logits, past = decode_one(run, int(ids[i]), i, past)
        full, _ = prefill(run, ids[:i + 1])
        np.testing.assert_allclose(logits, full, atol=1e-4, rtol=1e-4)
    assert past["past_value_1"].shape == (1, SMALL.heads, 24, SMALL.head_dim)
    assert np.std(logits) > 0.01  # not a degenerate graph


def test_left_padded_batch_matches_each_sequence_alone(run):
    prompts = PROMPTS[:3]
    width = max(p.size for p in prompts)
    ids, positions, mask = (np.zeros((3, width), np.int64) for _ in range(3))
    for i, p in enumerate(prompts):
        ids[i, width - p.size:], positions[i, width - p.size:], mask[i, width - p.size:] = p, np.arange(p.size), 1
    out = run({"input_ids": ids, "position_ids": positions, "attention_mask": mask, **empty_cache(SMALL, 3)})
    alone = [greedy_alone(run, p, 6) for p in prompts]
    for i, p in enumerate(prompts):
        np.testing.assert_allclose(out["logits"][i], prefill(run, p)[0], atol=1e-4, rtol=1e-4)
    tokens = [[int(t)] for t in out["logits"].argmax(-1)]
    lengths = [p.size for p in prompts]
    for _ in range(5):
        mask = np.concatenate([mask, np.ones((3, 1), np.int64)], axis=1)
        out = run({"input_ids": np.array([[t[-1]] for t in tokens]), "position_ids": np.array([[n] for n in lengths]),
                   "attention_mask": mask,
                   **dict(zip(past_names(SMALL.layers), (out[n] for n in present_names(SMALL.layers))))})
        lengths = [n + 1 for n in lengths]
        for t, new in zip(tokens, out["logits"].argmax(-1)):
            t.append(int(new))
    assert tokens == alone


def test_the_decode_step_graph_gives_the_prefill_graphs_logits_and_writes_one_column_per_row_in_place(run, step):
    """Rows of different lengths in one buffer with room to spare: each row's logits are its own decode step's
    through the prefill graph (alone, unpadded), its new key and value land at column length, in place, and no
    other column changes."""
    lengths = [5, 17, 9, 30]
    capacity = 40
    cache = [np.zeros((4, SMALL.heads, capacity, SMALL.head_dim), np.float32) for _ in past_names(SMALL.layers)]
    for a in cache:
        a[:] = RNG.standard_normal(a.shape)  # garbage past each row's length: must be neither read nor written
    alone = []
    for i, n in enumerate(lengths):
        ids = RNG.integers(0, SMALL.vocab, n + 1)
        _, past = prefill(run, ids[:n])
        for a, p in zip(cache, past.values()):
            a[i, :, :n] = p[0]
        logits, present = decode_one(run, int(ids[n]), n, past)
        alone.append((int(ids[n]), logits, present))
    before = [a.copy() for a in cache]
    counts = np.array(lengths, np.int32)
    out = step({"input_ids": np.array([[t] for t, _, _ in alone]), "position_ids": counts[:, None].astype(np.int64),
                "seqlens_k": counts, "total_sequence_length": np.array(counts.max() + 1, np.int32),
                **dict(zip(past_names(SMALL.layers), cache))}, dict(zip(present_names(SMALL.layers), cache)))
    for i, (n, (_, logits, present)) in enumerate(zip(lengths, alone)):
        np.testing.assert_allclose(out["logits"][i], logits, atol=1e-5, rtol=1e-5)
        for a, was, p in zip(cache, before, present.values()):
            np.testing.assert_allclose(a[i, :, n], p[0, :, n], atol=1e-6)  # the new column, in place
            np.testing.assert_array_equal(np.delete(a[i], n, axis=1), np.delete(was[i], n, axis=1))
    assert set(out) == {"logits"}


# --- the generator -------------------------------------------------------------------------------------

class Recorder:
    def __init__(self) -> None:
        self.steps: list[int] = []
        self.prefills: list[int] = []
        self.lock = threading.Lock()

    def on_prefill(self, rows: int, tokens: int, ns: int) -> None:
        with self.lock:
            self.prefills.append(rows)

    def on_step(self, rows: int, ns: int) -> None:
        with self.lock:
            self.steps.append(rows)


def make_generator(run, step, recorder: Recorder | None = None, **kwargs) -> Generator:
    recorder = recorder or Recorder()
    kwargs = {"max_sequences": 8, "max_waiting": 16, **kwargs}
    generator = Generator(run, step, SMALL, on_prefill=recorder.on_prefill, on_step=recorder.on_step, **kwargs)
    generator.start()
    return generator


async def collect(generation) -> list[int]:
    tokens = []
    while batch := await generation.tokens():
        tokens.extend(t.id for t in batch)
    return tokens


def test_generator_batches_sequences_and_matches_running_them_alone(run, step):
    """Rows joining and leaving (the last row moved into the hole) change no token: each sequence gets what it
    gets alone through the prefill graph."""
    lengths = [12, 3, 20, 7]
    expected = [greedy_alone(run, p, n) for p, n in zip(PROMPTS, lengths)]
    recorder = Recorder()
    generator = make_generator(run, step, recorder)

    async def main():
        together = [generator.submit(p, n) for p, n in zip(PROMPTS[:2], lengths[:2])]
        first = asyncio.create_task(collect(together[0]))
        while together[0].generated < 4:  # the others join while the first two are decoding
            await asyncio.sleep(0.001)
        late = [generator.submit(p, n) for p, n in zip(PROMPTS[2:], lengths[2:])]
        rest = await asyncio.gather(*(collect(g) for g in [*together[1:], *late]))
        return [await first, *rest], [*together, *late]

    try:
        tokens, generations = asyncio.run(main())
    finally:
        generator.stop()
    assert tokens == expected
    assert [len(t) for t in tokens] == lengths  # no end-of-sequence: exactly max_tokens each
    assert max(recorder.steps) >= 2, recorder.steps  # decode steps were shared
    for g in generations:
        assert g.enqueued_ns <= g.prefill_start_ns < g.first_token_ns <= g.last_token_ns
        assert g.prefill_ns > 0 and g.queue_ns >= 0 and g.decode_ns >= 0
    assert generator.active() == 0 and generator.waiting() == 0


def test_the_decode_batch_grows_in_columns_while_sequences_decode_and_changes_no_token(run, step):
    """A row longer than the batch's first columns (kv_batch.MIN_COLUMNS) joining while ten others decode: the
    arrays grow under running rows, their caches carried over."""
    from reference_server.kv_batch import MIN_COLUMNS

    prompts = [RNG.integers(0, SMALL.vocab, n) for n in (4, 9, 13, 6, 21, 3, 11, 8, 15, 5)]
    long_prompt, long_n = RNG.integers(0, SMALL.vocab, 40), MIN_COLUMNS - 20  # reaches 40 + 108 = 148 columns
    expected = [greedy_alone(run, p, 30) for p in prompts] + [greedy_alone(run, long_prompt, long_n)]
    recorder = Recorder()
    generator = make_generator(run, step, recorder, max_sequences=16)

    async def main():
        early = [generator.submit(p, 30) for p in prompts]
        while early[0].generated < 5:
            await asyncio.sleep(0.001)
        late = generator.submit(long_prompt, long_n)
        return await asyncio.gather(*(collect(g) for g in [*early, late]))

    try:
        assert asyncio.run(main()) == expected
    finally:
        generator.stop()
    assert max(recorder.steps) == len(prompts) + 1


def test_a_failed_decode_step_fails_its_sequences_and_the_generator_keeps_serving(run, step):
    calls = {"n": 0}

    def flaky(inputs, outputs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("step boom")
        return step(inputs, outputs)

    generator = make_generator(run, flaky)

    async def main():
        with pytest.raises(GenerationFailed, match="decode step failed: step boom"):
            await collect(generator.submit(PROMPTS[0], 6))
        return await collect(generator.submit(PROMPTS[1], 6))

    try:
        assert asyncio.run(main()) == greedy_alone(run, PROMPTS[1], 6)
    finally:
        generator.stop()


def test_a_cost_factor_takes_that_many_runs_per_token_and_changes_no_token(run, step):
    """An adapter's factor f (generation.py, cost factors): alone, n tokens take ceil(f) prefill runs and, in
    the decode batch, f steps per token after the first (the credit the prefill left over carried on); mixed
    in one batch with others (factors 3, 1.5 and 1), every sequence still gets exactly the tokens it gets alone."""
    lengths = [9, 11, 14]
    expected = [greedy_alone(run, p, n) for p, n in zip(PROMPTS, lengths)]

    def alone(factor: float, n: int) -> tuple[list[int], Recorder]:
        recorder = Recorder()
        generator = make_generator(run, step, recorder)
        try:
            return asyncio.run(collect_one(generator, PROMPTS[0], n, factor)), recorder
        finally:
            generator.stop()

    async def collect_one(generator, prompt, n, factor):
        return await collect(generator.submit(prompt, n, factor=factor))

    tokens, recorder = alone(3, 9)
    assert tokens == expected[0]
    assert (len(recorder.prefills), len(recorder.steps)) == (3, 3 * 8)
    tokens, recorder = alone(1.5, 9)  # prefill: 2 runs, credit 0.5 left; then 1.5 + 1.5 * 7 = 12 steps, rounded up
    assert tokens == expected[0]
    assert (len(recorder.prefills), len(recorder.steps)) == (2, 12)

    recorder = Recorder()
    generator = make_generator(run, step, recorder)

    async def mixed():
        generations = [generator.submit(p, n, factor=f) for p, n, f in zip(PROMPTS, lengths, (3, 1.5, 1))]
        return await asyncio.gather(*(collect(g) for g in generations))

    try:
        assert asyncio.run(mixed()) == expected
    finally:
        generator.stop()
    assert len(recorder.steps) == 3 * (lengths[0] - 1)  # the slowest row set the length of the run
    assert max(recorder.steps) == 3  # they decoded together


def test_generator_bounds_sequences_and_queue_and_cancels(run, step):
    recorder = Recorder()
    generator = make_generator(run, step, recorder, max_sequences=2, max_waiting=2)

    async def main():
        running = [generator.submit(PROMPTS[0], 200) for _ in range(2)]
        while generator.active() < 2:
            await asyncio.sleep(0.001)
        waiting = [generator.submit(PROMPTS[1], 3) for _ in range(2)]
        with pytest.raises(Overloaded):
            generator.submit(PROMPTS[1], 3)
        with pytest.raises(ContextTooLong):
            generator.submit(PROMPTS[0], SMALL.max_context)
        for g in running:  # the clients go away: their slots free up for the waiting ones
            g.cancel()
        done = await asyncio.wait_for(asyncio.gather(*(collect(g) for g in waiting)), 30)
        return running, done

    try:
        running, done = asyncio.run(main())
    finally:
        generator.stop()
    assert [len(t) for t in done] == [3, 3]
    assert all(g.generated < 200 for g in running)
    assert max(recorder.steps) <= 2


def test_generator_reports_failures_and_keeps_serving(run, step):
    calls = {"n": 0}

    def flaky(inputs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("boom")
        return run(inputs)

    generator = make_generator(flaky, step)

    async def main():
        with pytest.raises(GenerationFailed, match="boom"):
            await collect(generator.submit(PROMPTS[0], 4))
        return await collect(generator.submit(PROMPTS[0], 4))

    try:
        assert asyncio.run(main()) == greedy_alone(run, PROMPTS[0], 4)
    finally:
        generator.stop()


def test_stopping_fails_what_is_left(step):
    release = threading.Event()

    def slow(inputs):
        release.wait(10)
        raise RuntimeError("never returns outputs")

    generator = Generator(slow, step, SMALL, max_sequences=1, max_waiting=4)
    generator.start()

    async def main():
        g = generator.submit(PROMPTS[0], 4)
        queued = generator.submit(PROMPTS[1], 4)
        await asyncio.sleep(0.05)
        stopper = asyncio.get_running_loop().run_in_executor(None, generator.stop)
        release.set()
        await stopper
        for each in (g, queued):
            with pytest.raises(GenerationFailed):
                await asyncio.wait_for(collect(each), 10)
        with pytest.raises(Overloaded):
            generator.submit(PROMPTS[0], 1)

    asyncio.run(main())

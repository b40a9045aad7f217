"""Chunked prefill (generation.py): a long prompt is prefilled `max_prefill_tokens` at a time between decode
steps. It changes no token (chunked, cached or not, the same ids as one run), stores exact prefix-cache blocks,
and bounds what a running stream waits for while a long prompt is admitted: one chunk and one step, not the
whole prompt's prefill. On the built-in decoder (4 layers, hidden 256), real ONNX Runtime, one thread."""

from __future__ import annotations

import asyncio
import statistics
import threading
import time

import numpy as np
import pytest

from refserver import decoder_backends
from reference_server.backends.onnxruntime import OnnxRuntimeBackend
from reference_server.decoder import DecoderConfig, empty_cache, present_names
from reference_server.generation import Generator
from reference_server.prefix_cache import BLOCK_TOKENS, PrefixCache, block_keys

CONFIG = DecoderConfig()  # the server's decoder
CHUNK = 64
RNG = np.random.default_rng(34)


@pytest.fixture(scope="module")
def backends(tmp_path_factory) -> tuple[OnnxRuntimeBackend, OnnxRuntimeBackend]:
    return decoder_backends(CONFIG, tmp_path_factory.mktemp("decoder"))


@pytest.fixture(scope="module")
def run(backends):
    return backends[0].run


def ids(n: int) -> np.ndarray:
    return RNG.integers(0, CONFIG.vocab, n)


class Costs:
    """What the generator's observers saw: (rows, tokens, ns) per prefill run, (rows, ns) per decode step, in order."""

    def __init__(self) -> None:
        self.prefills: list[tuple[int, int, int]] = []
        self.steps: list[tuple[int, int]] = []
        self.order: list[str] = []
        self.lock = threading.Lock()

    def on_prefill(self, rows: int, tokens: int, ns: int) -> None:
        with self.lock:
            self.prefills.append((rows, tokens, ns))
            self.order.append("p")

    def on_step(self, rows: int, ns: int) -> None:
        with self.lock:
            self.steps.append((rows, ns))
            self.order.append("s")


def generator(backends, costs: Costs, budget: int, cache_bytes: int = 0) -> Generator:
    g = Generator(backends[0].run, backends[1].run_into, CONFIG, max_sequences=16, max_waiting=16,
                  max_prefill_tokens=budget, prefix_cache=PrefixCache(cache_bytes), on_prefill=costs.on_prefill,
                  on_step=costs.on_step)
    g.start()
    return g


async def collect(generation) -> list[tuple[int, int]]:
    """(token id, emitted ns) of every token."""
    out = []
    while batch := await generation.tokens():
        out.extend((t.id, t.emitted_ns) for t in batch)
    return out


def test_chunks_give_the_tokens_of_one_run_and_exact_cache_blocks(backends, run):
    """p (300 tokens) in chunks of 64 while a short stream decodes, then q (p's first 200 tokens and 150 others:
    192 cached, 158 computed in chunks with a cached past): the same ids as one unchunked run each, steps
    between p's chunks, and the blocks p stored equal a plain prefill's keys and values."""
    p = ids(300)
    q = np.concatenate([p[:200], ids(150)])
    short = ids(16)

    def generate(budget: int, cache_bytes: int) -> tuple[list[list[int]], list[int], Costs, Generator]:
        costs = Costs()
        gen = generator(backends, costs, budget, cache_bytes)

        async def main():
            running = gen.submit(short, 40)
            while running.generated < 2:
                await asyncio.sleep(0.001)
            first = gen.submit(p, 6)
            tokens = [await collect(first)]
            second = gen.submit(q, 6)
            tokens.append(await collect(second))
            tokens.append(await collect(running))
            return [[t for t, _ in each] for each in tokens], [first.cached_tokens, second.cached_tokens]

        try:
            tokens, cached = asyncio.run(main())
        finally:
            gen.stop()
        return tokens, cached, costs, gen

    plain, plain_cached, plain_costs, _ = generate(4096, 0)
    chunked, cached, costs, gen = generate(CHUNK, 1 << 26)
    assert plain_cached == [0, 0] and cached == [0, 192]
    assert chunked == plain
    assert [tokens for _, tokens, _ in plain_costs.prefills if tokens > 16] == [300, 350]  # unchunked: one run each
    assert max(tokens for _, tokens, _ in costs.prefills) <= CHUNK
    assert [tokens for rows, tokens, _ in costs.prefills if tokens > 16] == [64, 64, 64, 64, 44, 64, 64, 30]
    first_chunks = costs.order.index("p", costs.order.index("p") + 1)  # p's first chunk (after short's prefill)
    assert costs.order[first_chunks:first_chunks + 10] == ["p", "s"] * 5  # a step between every two of p's chunks
    keys = block_keys(p)
    blocks = gen.prefix_cache.lookup(keys, len(keys))
    assert len(blocks) == 300 // BLOCK_TOKENS
    n = len(blocks) * BLOCK_TOKENS
    out = run({"input_ids": p[None, :n], "position_ids": np.arange(n)[None],
               "attention_mask": np.ones((1, n), np.int64), **empty_cache(CONFIG, 1)})
    expected = np.stack([out[name][0] for name in present_names(CONFIG.layers)])
    np.testing.assert_allclose(np.concatenate(blocks, axis=2), expected, atol=1e-5, rtol=1e-4)


def stalls(backends, budget: int, k: int, long_prompts: list[np.ndarray]) -> tuple[list[float], list[list[int]], Costs]:
    """k streams decode; each long prompt arrives in turn (after the last one's first token and a few steps).
    Per long prompt: the longest gap (ms) between two tokens of the running streams that overlaps its
    admission (submission to its first token); and each long prompt's token ids."""
    costs = Costs()
    gen = generator(backends, costs, budget)

    async def read(generation, times: list[int]) -> None:
        while batch := await generation.tokens():  # cancelled below: a cancelled sequence gets no end
            times.extend(t.emitted_ns for t in batch)

    async def main():
        running = [gen.submit(ids(16), 600) for _ in range(k)]
        emitted: list[list[int]] = [[] for _ in running]
        readers = [asyncio.create_task(read(g, times)) for g, times in zip(running, emitted)]
        while min(g.generated for g in running) < 3:
            await asyncio.sleep(0.001)
        windows, answers = [], []
        for prompt in long_prompts:
            sent = time.perf_counter_ns()
            answer = await collect(gen.submit(prompt, 4))
            windows.append((sent, answer[0][1]))
            answers.append([t for t, _ in answer])
            await asyncio.sleep(0.02)
        for g, reader in zip(running, readers):
            g.cancel()
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
        return windows, answers, emitted

    try:
        windows, answers, emitted = asyncio.run(main())
    finally:
        gen.stop()
    worst = []
    for start, end in windows:
        gaps = [b - a for times in emitted for a, b in zip(times, times[1:]) if b > start and a < end]
        worst.append(max(gaps) / 1e6)
    return worst, answers, costs


def test_a_long_prompt_stalls_running_streams_one_chunk_and_one_step_not_its_whole_prefill(backends):
    """8 streams decode; a 512-token prompt (4 tokens out) arrives, three times. Chunked by 64, a running stream's
    longest gap during its admission is one iteration: one 64-token chunk plus one step, the costliest being the
    step its last chunk leads to, where the long row decodes with the 8 (9 rows, 512 columns wide: the short rows
    are left-padded to it), and the Python between them. Both measured here (medians of this run's own runs);
    1.5x their sum bounds the gap on a busy machine. Unchunked, the gap holds the whole 512-token prefill (about
    8 chunks), which the same bound must not admit, or the test could not tell the two apart. Each measure is
    the median over the three arrivals (one preempted thread, or the first touch of the memory the wide batch
    needs, does not decide it). The long prompts get the same tokens either way."""
    k = 8
    prompts = [ids(512) for _ in range(3)]
    chunked, chunked_answers, costs = stalls(backends, CHUNK, k, prompts)
    chunk_ms = statistics.median(ns for rows, tokens, ns in costs.prefills if tokens == CHUNK) / 1e6
    step_ms = statistics.median(ns for rows, ns in costs.steps if rows == k + 1) / 1e6  # with the long row
    bound = 1.5 * (chunk_ms + step_ms)
    whole, whole_answers, whole_costs = stalls(backends, 4096, k, prompts)
    prefill_ms = statistics.median(ns for rows, tokens, ns in whole_costs.prefills if tokens == 512) / 1e6
    assert chunked_answers == whole_answers
    assert prefill_ms > bound, (prefill_ms, chunk_ms, step_ms)  # the bound tells chunked from unchunked
    assert statistics.median(chunked) <= bound, (chunked, chunk_ms, step_ms)
    assert statistics.median(whole) >= prefill_ms, (whole, prefill_ms)  # the stall chunking removes

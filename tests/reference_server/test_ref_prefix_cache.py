"""Prefix caching in the reference server's decoder: the block keys and the LRU bound (in process), the
generator giving the same tokens with and without the cache, and the real server reporting it
(usage.prompt_tokens_details.cached_tokens, Server-Timing, /metrics), evicting under a small budget, and
prefilling a mostly cached prompt much faster.

The rule every expectation below follows (BLOCK = 16 tokens): a prompt of n tokens whose first k tokens
are a prefix of a prompt prefilled before (and still cached) reports
    cached_tokens = BLOCK * min(k // BLOCK, (n - 1) // BLOCK)
(only full blocks are cached, and at least the last prompt token is always computed)."""

from __future__ import annotations

import asyncio
import json
import statistics
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

import refserver
from refserver import decoder_backends, metric, post_json, running_server, scrape, server_timing, wait_for
from reference_server.backends.onnxruntime import OnnxRuntimeBackend
from reference_server.decoder import DecoderConfig, empty_cache, present_names
from reference_server.generation import Generator
from reference_server.prefix_cache import BLOCK_TOKENS, PrefixCache, block_keys

MODEL = "decoder"
BLOCK = 16
SMALL = DecoderConfig(layers=2, hidden=64, heads=4, ffn=128, vocab=1024, max_context=256)

cache, logs = refserver.cache, refserver.logs


def cached_rule(shared: int, n: int) -> int:
    return BLOCK * min(shared // BLOCK, (n - 1) // BLOCK)


def ids(seed: int, n: int, vocab: int = 8192) -> list[int]:
    """n random token ids; different seeds share no prefix (their first tokens differ)."""
    out = np.random.default_rng(seed).integers(0, vocab, n).tolist()
    out[0] = seed % vocab
    return out


# --- the cache itself ----------------------------------------------------------------------------------

def test_block_keys_are_a_chain_over_the_whole_prefix():
    assert BLOCK_TOKENS == BLOCK
    a = np.array(ids(1, 70))
    keys = block_keys(a)
    assert len(keys) == 70 // BLOCK and len(set(keys)) == len(keys)
    # A prefix has the prefix's keys; a partial block has none.
    assert block_keys(a[:64]) == keys and block_keys(a[:47]) == keys[:2] and block_keys(a[:15]) == []
    b = a.copy()
    b[20] += 1  # a change in block 1 changes the key of block 1 and of every block after it
    assert block_keys(b)[0] == keys[0] and not set(block_keys(b)[1:]) & set(keys)
    c = np.concatenate([a[16:32], a[:16]])  # the same blocks in another order are other prefixes
    assert not set(block_keys(c)) & set(keys)


def test_lru_bound_evicts_the_least_recently_used_deepest_first():
    block = np.zeros((4, 4, BLOCK, 8), np.float32)  # 8 KiB
    evictions: list[int] = []
    pc = PrefixCache(3 * block.nbytes, on_evict=evictions.append)

    def store(prompt: np.ndarray) -> int:
        return pc.insert(block_keys(prompt), lambda j: block.copy())

    a, b = np.array(ids(1, 32)), np.array(ids(2, 32))
    assert store(a) == 2 and len(pc.lookup(block_keys(a), 5)) == 2
    assert len(pc.lookup(block_keys(a), 1)) == 1  # at most `limit` blocks
    assert store(b) == 2 and pc.bytes_in_use == 3 * block.nbytes
    assert evictions == [1] and pc.evicted_blocks == 1
    # a was used before b: of a's two blocks the deeper one went, its first block is still usable.
    assert len(pc.lookup(block_keys(a), 5)) == 1 and len(pc.lookup(block_keys(b), 5)) == 2
    # Storing a prompt that extends b marks b's blocks used first, so the block evicted for its third is a's,
    # although a was looked up last.
    long_b = np.concatenate([b, np.array(ids(3, 16))])
    assert len(pc.lookup(block_keys(a), 5)) == 1
    assert store(long_b) == 1 and len(pc.lookup(block_keys(long_b), 5)) == 3 and pc.lookup(block_keys(a), 5) == []
    # Lookups stop at the first miss: with block 1 of x cached but not its block 0, x finds nothing.
    x = np.array(ids(4, 32))
    assert pc.insert(block_keys(x)[1:], lambda j: block.copy()) == 1
    assert pc.lookup(block_keys(x), 5) == [] and pc.bytes_in_use == pc.capacity_bytes
    # A prompt larger than the whole budget keeps its first blocks (a parent is never evicted for its child).
    big = np.array(ids(5, 6 * BLOCK))
    assert store(big) == 3 and len(pc.lookup(block_keys(big), 9)) == 3
    assert pc.bytes_in_use == pc.capacity_bytes and pc.evicted_blocks == sum(evictions)
    off = PrefixCache(0)
    assert off.insert(block_keys(a), lambda j: block) == 0 and off.lookup(block_keys(a), 5) == [] and not off.enabled


# --- the generator: the same tokens, cached or not -------------------------------------------------------

@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[OnnxRuntimeBackend, OnnxRuntimeBackend]:
    return decoder_backends(SMALL, tmp_path_factory.mktemp("decoder"))


@pytest.fixture(scope="module")
def run(models):
    return models[0].run


@pytest.fixture(scope="module")
def step(models):
    return models[1].run_into


def assert_cached_blocks_exact(run, cache: PrefixCache, prompt: list[int]) -> int:
    """The cached blocks of `prompt` hold the keys and values of a prefill of that prefix alone; how many."""
    keys = block_keys(np.array(prompt))
    blocks = cache.lookup(keys, len(keys))
    n = len(blocks) * BLOCK
    if blocks:
        out = run({"input_ids": np.array([prompt[:n]]), "position_ids": np.arange(n)[None],
                   "attention_mask": np.ones((1, n), np.int64), **empty_cache(SMALL, 1)})
        expected = np.stack([out[name][0] for name in present_names(SMALL.layers)])  # [2 * layers, heads, n, dim]
        np.testing.assert_allclose(np.concatenate(blocks, axis=2), expected, atol=1e-5, rtol=1e-4)
    return len(blocks)


async def collect(generation) -> list[int]:
    tokens = []
    while batch := await generation.tokens():
        tokens.extend(t.id for t in batch)
    return tokens


def test_generator_gives_the_same_tokens_with_and_without_the_cache(run, step):
    base = ids(5, 120, SMALL.vocab)
    warm = base[:50]  # stores blocks 0-2 (48 tokens)
    # Submitted together: 68 and 78 share cached length 48 and bucket 32 (20 and 30 new tokens), so they are
    # prefilled in one run with the shorter row padded between its cached and new tokens; 49 computes 1 token.
    together = [base[:68], base[:78], base[:49], ids(6, 40, SMALL.vocab)]
    late = base[:100]  # joins while those decode; 68 and 78 stored block 3 meanwhile
    prompts = [warm, *together, late]

    def generate(capacity: int) -> tuple[list[list[int]], list[int], list[int]]:
        prefills: list[int] = []
        generator = Generator(run, step, SMALL, max_sequences=8, max_waiting=16, prefix_cache=PrefixCache(capacity),
                              on_prefill=lambda rows, tokens, ns: prefills.append(rows))
        caches.append(generator.prefix_cache)
        generator.start()

        async def main():
            first = generator.submit(warm, 12)
            out = [await collect(first)]
            with generator._cond:  # held: the inference thread admits all four at once
                group = [generator.submit(p, 12) for p in together]
            while group[0].generated < 3:
                await asyncio.sleep(0.001)
            last = generator.submit(late, 12)
            out += await asyncio.gather(*(collect(g) for g in [*group, last]))
            return out, [g.cached_tokens for g in [first, *group, last]]

        try:
            tokens, cached = asyncio.run(main())
        finally:
            generator.stop()
        return tokens, cached, prefills

    caches: list[PrefixCache] = []
    plain, plain_cached, _ = generate(0)
    tokens, cached, prefills = generate(1 << 24)
    assert plain_cached == [0] * 6
    assert cached == [0, 48, 48, 48, 0, 64]
    assert cached == [cached_rule(s, len(p)) for s, p in zip([0, 50, 50, 50, 0, 78], prompts)]
    assert 2 in prefills  # the two rows with the same cached length and bucket shared a prefill run
    assert tokens == plain and all(len(t) == 12 for t in tokens)
    # What was stored is what a prefill of each prefix alone computes (padded rows, gaps and all).
    assert [assert_cached_blocks_exact(run, caches[1], p) for p in prompts] == [3, 4, 4, 3, 2, 6]


def test_blocks_evicted_while_in_use_are_stored_again_from_the_right_columns(run, step):
    """A budget of 4 blocks. x and y are admitted together; y found base's two blocks cached, but x (prefilled
    first, its bucket is smaller) evicts them when it stores its own. y, prefilled in one run with y2 (same
    cached length, y computes 2 tokens fewer, so its row is [cached][padding][new]), stores them again from
    its presents; z then reads them back, and must get the tokens it gets without a cache."""
    base = ids(8, 120, SMALL.vocab)
    block_bytes = 2 * SMALL.layers * SMALL.heads * BLOCK * SMALL.head_dim * 4
    warm, x = base[:40], ids(9, 64, SMALL.vocab)
    y, y2 = base[:100], base[:32] + ids(10, 70, SMALL.vocab)
    z = base[:40]

    def generate(capacity: int) -> tuple[list[list[int]], list[int]]:
        generator = Generator(run, step, SMALL, max_sequences=8, max_waiting=16, prefix_cache=PrefixCache(capacity))
        caches.append(generator.prefix_cache)
        generator.start()

        async def main():
            out, cached = [], []
            for wave in ([warm], [x, y, y2], [z]):
                with generator._cond:  # held: the inference thread admits the wave at once
                    generations = [generator.submit(p, 6) for p in wave]
                out += await asyncio.gather(*(collect(g) for g in generations))
                cached += [g.cached_tokens for g in generations]
            return out, cached

        try:
            return asyncio.run(main())
        finally:
            generator.stop()

    caches: list[PrefixCache] = []
    plain, _ = generate(0)
    tokens, cached = generate(4 * block_bytes)
    assert cached == [0, 0, 32, 32, 32]
    assert tokens == plain
    assert assert_cached_blocks_exact(run, caches[1], z) == 2


# --- the real server -------------------------------------------------------------------------------------

def start(cache: Path, logs: Path, *flags: str):
    return running_server(logs, "--http-port", "0", "--grpc-port", "-1", "--layers", "2", "--decoder-layers", "2",
                          "--cache-dir", str(cache), *flags)


@pytest.fixture(scope="module")
def server(cache, logs) -> Iterator[str]:
    with start(cache, logs) as s:  # the default budget, 256 MiB
        yield s.url


@pytest.fixture(scope="module")
def client(server):
    openai = pytest.importorskip("openai")
    with openai.OpenAI(base_url=f"{server}/v1", api_key="x", max_retries=0, timeout=60) as c:
        yield c


def completion(url: str, prompt: list[int], **extra) -> tuple[int, dict[str, str]]:
    """cached_tokens of a non-streamed completion, and its Server-Timing entries."""
    status, headers, body = post_json(f"{url}/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 1,
                                                                **extra})
    assert status == 200, body
    usage = json.loads(body)["usage"]
    assert usage["prompt_tokens"] == len(prompt)
    return usage["prompt_tokens_details"]["cached_tokens"], server_timing(headers["Server-Timing"])


def test_same_prompt_twice_reports_the_cached_full_blocks(client, server):
    for n in (15, 16, 17, 100, 257):
        prompt = ids(100 + n, n)
        first = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2)
        second = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2)
        assert first.usage.prompt_tokens_details.cached_tokens == 0
        assert second.usage.prompt_tokens_details.cached_tokens == BLOCK * ((n - 1) // BLOCK), n
        assert second.choices[0].text == first.choices[0].text  # greedy: the same answer, cached or not
    # Streaming: in the usage chunk; and in Server-Timing as cached;desc="N" (no duration).
    prompt = ids(7, 40)
    cached, timing = completion(server, prompt)
    assert cached == 0 and timing["cached"] == "0"
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=3, stream=True,
                                            stream_options={"include_usage": True}))
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 32
    assert completion(server, prompt, stream=False)[1]["cached"] == "32"


def test_chat_turns_reuse_the_previous_turns_prompt(client):
    """A multi-turn chat: each turn's prompt starts with the previous turn's, so its full blocks are cached."""
    messages = [{"role": "system", "content": " ".join(f"rule{i}" for i in range(40))},
                {"role": "user", "content": "first question " * 5}]
    previous = 0
    for turn in range(3):
        answer = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8)
        n = answer.usage.prompt_tokens
        assert answer.usage.prompt_tokens_details.cached_tokens == cached_rule(previous, n), (turn, previous, n)
        messages += [{"role": "assistant", "content": answer.choices[0].message.content},
                     {"role": "user", "content": f"follow-up {turn} " * 7}]
        previous = n  # the toy tokenizer is one token per word: this prompt is the next one's prefix
    assert previous > 3 * BLOCK
    streamed = list(client.chat.completions.create(model=MODEL, messages=messages[:2], max_tokens=2, stream=True,
                                                   stream_options={"include_usage": True}))
    n = streamed[-1].usage.prompt_tokens
    assert streamed[-1].usage.prompt_tokens_details.cached_tokens == BLOCK * ((n - 1) // BLOCK)


def test_a_shared_prefix_reports_its_full_blocks(server):
    a = ids(11, 100)
    assert completion(server, a)[0] == 0
    for i, (shared, tail) in enumerate(((70, 30), (64, 1), (63, 40), (15, 50), (100, 20))):
        prompt = a[:shared] + ids(1000 + i, tail)
        assert completion(server, prompt)[0] == cached_rule(shared, len(prompt)), (shared, tail)


def test_metrics_count_what_usage_reports(server):
    def counters() -> tuple[float, float]:
        text = scrape(server)
        return (metric(text, "latscope_ref_prefix_cache_queries_tokens_total"),
                metric(text, "latscope_ref_prefix_cache_hits_tokens_total"))

    queries, hits = counters()
    a = ids(21, 90)
    prompts = [a, a, a[:60], ids(22, 33), a + ids(23, 40)]
    reported = [completion(server, p)[0] for p in prompts]
    assert reported == [0, 80, 48, 0, 80]
    after_queries, after_hits = counters()
    assert after_hits - hits == sum(reported)
    assert after_queries - queries == sum(map(len, prompts))
    text = scrape(server)
    assert metric(text, "latscope_ref_prefix_cache_capacity_bytes") == 256 * 2**20
    assert 0 < metric(text, "latscope_ref_prefix_cache_bytes") <= 256 * 2**20


def test_prefill_of_a_mostly_cached_prompt_is_much_faster(server):
    """800-token prompts, 768 of them cached: 32 tokens computed instead of 800, so the graph does ~25x less
    (every matmul is proportional to the tokens computed; attention is [computed x 800]). What stays is the
    per-run overhead and copying the cached keys and values in and the 800 positions' presents out: measured
    6x (2 layers: 23 vs 3.6 ms) on a 2-core machine. Asserting 2.5x leaves room for a noisy neighbour."""
    shared = ids(31, 768)
    assert completion(server, shared + ids(32, 32))[0] == 0
    uncached, cached = [], []
    for i in range(5):
        n, timing = completion(server, ids(40 + i, 800))
        assert n == 0
        uncached.append(float(timing["prefill"]))
        n, timing = completion(server, shared + ids(50 + i, 32))
        assert n == 768
        cached.append(float(timing["prefill"]))
    assert statistics.median(cached) * 2.5 < statistics.median(uncached), (cached, uncached)


def test_no_cache_reports_zero(cache, logs):
    with start(cache, logs, "--prefix-cache-mb", "0") as s:
        prompt = ids(61, 100)
        assert [completion(s.url, prompt)[0] for _ in range(3)] == [0, 0, 0]
        text = scrape(s.url)
        assert metric(text, "latscope_ref_prefix_cache_hits_tokens_total") == 0
        assert metric(text, "latscope_ref_prefix_cache_queries_tokens_total") == 300
        assert metric(text, "latscope_ref_prefix_cache_bytes") == 0
        assert metric(text, "latscope_ref_prefix_cache_capacity_bytes") == 0


def test_a_small_budget_evicts_the_least_recently_used(cache, logs):
    """--prefix-cache-mb 1 with 2 decoder layers: a block is 2 layers x key+value x 4 heads x 16 x 64 floats =
    64 KiB, so the cache holds 16 blocks (256 tokens)."""
    with start(cache, logs, "--prefix-cache-mb", "1") as s:
        def state() -> tuple[float, float]:
            text = scrape(s.url)
            held = metric(text, "latscope_ref_prefix_cache_bytes")
            assert held <= metric(text, "latscope_ref_prefix_cache_capacity_bytes") == 2**20
            return held, metric(text, "latscope_ref_prefix_cache_evicted_blocks_total")

        def settles_at(expected: tuple[float, float]) -> bool:
            # Blocks are stored right after the first token is sent, so the answer can come a moment before.
            return wait_for(lambda: state() == expected, 10, f"(bytes, evicted blocks) == {expected}")

        a, b, d = ids(71, 256), ids(72, 256), ids(73, 64)
        assert completion(s.url, a)[0] == 0
        assert settles_at((2**20, 0))  # a's 16 blocks fill it
        assert completion(s.url, d)[0] == 0  # 4 more blocks: a's 4 deepest go (a parent outlives its children)
        assert settles_at((2**20, 4))
        assert completion(s.url, a)[0] == 12 * BLOCK  # a's first 12 blocks are left; its last 4 evict d's
        assert settles_at((2**20, 8))
        assert completion(s.url, d)[0] == 0
        assert completion(s.url, b)[0] == 0  # b needs all 16 blocks: every other block goes
        assert settles_at((2**20, 4 + 4 + 4 + 16))  # d, a, d again, then b: the 12 of a and 4 of d left
        assert completion(s.url, a)[0] == 0  # a was evicted entirely
        assert completion(s.url, a)[0] == 15 * BLOCK


def test_a_second_run_finds_its_prompts_in_the_cache_only_with_the_first_runs_salt(server, tmp_path):
    """issue 30: prompts that depend on the seed alone let a second run against the same server hit the
    first run's prefix cache (99.7 % against llama.cpp's), so an A/B comparison measures the cache. Each
    run salts its prompts: a second run finds nothing cached; a run given the first run's salt (summary.json
    prompt_salt.value, as `--set prompt_salt=<value>` gives it) sends the same prompts and finds each one's
    full blocks: 32 of its 40 tokens (cached_rule), so a hit rate of 0.8. Within a run no two prompts
    share a block (each starts at its own place in the text)."""
    from latscope.run import run_scenario
    from latscope.scenario import scenario_from_dict

    def run(name: str, **extra) -> dict:
        data = {"name": name, "seed": 3, **extra,
                "target": {"protocol": "openai", "url": server, "model": MODEL, "timeout": 30,
                           "openai": {"api": "completions", "stream": False}},
                "workload": {"classes": [{"name": "c", "prompt_tokens": 40, "output_tokens": 1}]},
                "phases": [{"name": "p", "duration": 0.5, "arrival": {"type": "constant", "rate": 12}}],
                "output": {"dir": str(tmp_path), "report": False}}
        s = run_scenario(scenario_from_dict(data), workers=1).summary
        assert s["requests"]["completed"] == s["requests"]["sent"] == 6, s["errors"]
        return s

    first, second = run("first"), run("second")
    again = run("again", prompt_salt=first["prompt_salt"]["value"])
    assert first["prompt_salt"]["mode"] == second["prompt_salt"]["mode"] == "run"
    assert first["prompt_salt"]["value"] != second["prompt_salt"]["value"]
    assert again["prompt_salt"] == {"mode": "fixed", "value": first["prompt_salt"]["value"]}
    hit = {name: s["tokens"]["all"]["prefix_cache"]["hit_rate"] for name, s in
           (("first", first), ("second", second), ("again", again))}
    assert hit == {"first": 0.0, "second": 0.0, "again": 0.8}, hit

"""Prefix caching for the decoder: KV blocks of prompts already prefilled, keyed by their token prefix, LRU-bounded.

Like vLLM's automatic prefix caching (and SGLang's radix cache, at block granularity): a prompt is cut
into blocks of BLOCK_TOKENS tokens; only full blocks are cached. Block j of a prompt is keyed by a chain
hash of *all* its tokens from 0 to the end of block j:

    key_0 = blake2b(ids[0:16]),  key_j = blake2b(key_{j-1} || ids[16j:16j+16])   (int64 little-endian bytes)

so two prompts share key_j exactly when they share their first 16(j+1) tokens (barring a 128-bit
collision), and a block's key also fixes its positions (16j … 16j+15). A strong hash, not Python's
`hash()` of a tuple: that is 64 bits, unsalted for ints and easy to collide on purpose, and a collision
here would not fail loudly, it would silently serve another prompt's keys and values (wrong text, and
on a shared server another user's context: why vLLM moved to SHA-256). blake2b costs ~1 µs per block.

The value of a block is one float32 array [2 * layers, heads, BLOCK_TOKENS, head_dim]: the present key
and value of its positions for every layer, in past_names order (key_0, value_0, key_1, …). Those
depend on every earlier token (through the layers), which the chain key covers.

Contract:
- `lookup(keys, limit)` returns the arrays of the leading blocks present, walking from block 0 and
  stopping at the first key missing or after `limit` blocks: a block is only usable when every block
  before it is, so evicting a parent makes its children unreachable (they age out by LRU).
- `insert(keys, block)` stores, in order, the blocks whose key is absent (`block(j)` builds block j's
  array); it stops at the first that cannot be made room for without evicting a block of the same prompt.
- Bytes held (the sum of the arrays' nbytes) never exceed `capacity_bytes`; room is made by evicting
  the least recently used blocks (OrderedDict, oldest first). Every lookup and insert marks the prompt's
  blocks used deepest-first, so within one prompt the deepest block is evicted first and a parent
  outlives its children (vLLM does the same).
- capacity 0 turns the cache off: lookups find nothing, inserts store nothing.
Not thread-safe: the generator's inference thread owns it; other threads may read the counters.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Callable

import numpy as np

# Tokens per block. vLLM's default too: small enough that a shared prefix is reused up to its last 15
# tokens, large enough that per-block overhead (a hash, a dict entry, one numpy copy when the block
# is stored and one when it is reused) stays far below the compute it saves (a block of the default
# decoder is 128 KiB: 16 tokens x 4 layers x key+value x 256 floats).
BLOCK_TOKENS = 16
_DIGEST_BYTES = 16  # 128-bit keys


def block_keys(prompt: np.ndarray, salt: bytes = b"") -> list[bytes]:
    """The chain keys of the prompt's full blocks (len(prompt) // BLOCK_TOKENS of them). A `salt` (an adapter's
    name) starts the chain, so prompts of different adapters never share blocks (their keys and values differ
    on a real server; vLLM keys blocks by LoRA id too)."""
    ids = np.ascontiguousarray(prompt, dtype="<i8")
    keys: list[bytes] = []
    previous = salt
    for start in range(0, ids.size - BLOCK_TOKENS + 1, BLOCK_TOKENS):
        previous = hashlib.blake2b(previous + ids[start:start + BLOCK_TOKENS].tobytes(),
                                   digest_size=_DIGEST_BYTES).digest()
        keys.append(previous)
    return keys


def usable_blocks(prompt_tokens: int) -> int:
    """The most blocks a prompt may take from the cache: at least one of its tokens is always computed,
    because the next token comes from the last prompt position's logits."""
    return (prompt_tokens - 1) // BLOCK_TOKENS


class PrefixCache:
    def __init__(self, capacity_bytes: int, on_evict: Callable[[int], None] | None = None) -> None:
        if capacity_bytes < 0:
            raise ValueError("capacity_bytes must be >= 0")
        self.capacity_bytes = capacity_bytes
        self._on_evict = on_evict
        self._blocks: OrderedDict[bytes, np.ndarray] = OrderedDict()  # least recently used first
        self.bytes_in_use = 0
        self.evicted_blocks = 0

    @property
    def enabled(self) -> bool:
        return self.capacity_bytes > 0

    def __len__(self) -> int:
        return len(self._blocks)

    def lookup(self, keys: list[bytes], limit: int) -> list[np.ndarray]:
        """The arrays of the leading cached blocks among keys[:limit] (stops at the first miss)."""
        found: list[np.ndarray] = []
        for key in keys[:max(limit, 0)]:
            block = self._blocks.get(key)
            if block is None:
                break
            found.append(block)
        self._touch(keys[:len(found)])
        return found

    def insert(self, keys: list[bytes], block: Callable[[int], np.ndarray]) -> int:
        """Store the absent blocks of one prompt, in order; returns how many were stored."""
        if not self.enabled or not keys:
            return 0
        self._touch(keys)  # this prompt's present blocks move away from the eviction end
        mine = set(keys)
        stored, held = 0, 0
        for j, key in enumerate(keys):
            if key in self._blocks:
                held = j + 1
                continue
            array = block(j)
            if not self._make_room(array.nbytes, mine):
                break
            self._blocks[key] = array
            self.bytes_in_use += array.nbytes
            stored += 1
            held = j + 1
        self._touch(keys[:held])
        return stored

    def _make_room(self, nbytes: int, protected: set[bytes]) -> bool:
        """Evict least recently used blocks until nbytes more fit; never those in `protected`."""
        if nbytes > self.capacity_bytes:
            return False
        evicted = 0
        while self.bytes_in_use + nbytes > self.capacity_bytes:
            oldest = next(iter(self._blocks))
            if oldest in protected:  # everything older is gone: only this prompt's own blocks are left
                break
            self.bytes_in_use -= self._blocks.pop(oldest).nbytes
            evicted += 1
        if evicted:
            self.evicted_blocks += evicted
            if self._on_evict:
                self._on_evict(evicted)
        return self.bytes_in_use + nbytes <= self.capacity_bytes

    def _touch(self, keys: list[bytes]) -> None:
        """Mark keys (a prompt's leading blocks) used, deepest first, so block 0 ends most recently used."""
        for key in reversed(keys):
            if key in self._blocks:
                self._blocks.move_to_end(key)

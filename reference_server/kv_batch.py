"""The decoder's decode batch (generation.py): its rows and their KV cache, which the decode step updates in place.

Layout (the decode step graph's, decoder.py): per past name one array [rows, heads, capacity, head_dim]; row i's
tokens are its first `lengths[i]` columns, in position order, and a decode step writes its new key and value at
column lengths[i] of the same array (GroupQueryAttention with past and present in one buffer). So a step copies
nothing and attends to each row's own length, a joining row is written once, a leaving row is replaced by the
last one (its own columns copied). The arrays have a row for every sequence the generator may run from the start
(their pages are touched as rows are first used), and are reallocated only to grow in columns, twice as many,
never shrunk: fresh memory costs a page fault per page on first touch, slow on this kind of VM (the host takes
free pages back), and a reallocation touches all the pages the rows use at once (growing by rows mid-run
stalled every stream ~150 ms at 55 req/s); reused memory costs nothing (benchmarks/RESULTS.md, issue 34).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

Row = Any  # a generation.Generation: not imported, generation.py imports this module
MIN_COLUMNS = 128  # the first allocation's


class DecodeBatch:
    """The decode batch: its rows' Generations (row i's cache length is rows[i]._length) and the KV cache in
    `buffers` (past_names order), of which `cache()` is the part the rows use."""

    def __init__(self, layers: int, heads: int, head_dim: int, max_rows: int, max_columns: int) -> None:
        self.count, self.heads, self.head_dim = 2 * layers, heads, head_dim
        self.max_rows, self.max_columns = max_rows, max_columns
        self.rows: list[Row] = []
        self.buffers: list[np.ndarray] = []

    def __len__(self) -> int:
        return len(self.rows)

    def lengths(self) -> np.ndarray:
        """Tokens in each row's cache (int32, the decode step's seqlens_k)."""
        return np.fromiter((g._length for g in self.rows), np.int32, len(self.rows))

    def cache(self) -> list[np.ndarray]:
        """The rows' part of each buffer: its leading rows, one contiguous block (the step's past and present)."""
        return [b[:len(self.rows)] for b in self.buffers]

    def reserve(self, columns: int) -> None:
        """Room for `columns` columns (at most max_columns) in every row, keeping what the current rows hold."""
        have = self.buffers[0].shape[2] if self.buffers else 0
        if columns <= have:
            return
        shape = (self.max_rows, self.heads, max(columns, min(max(2 * have, MIN_COLUMNS), self.max_columns)),
                 self.head_dim)
        grown = [np.zeros(shape, np.float32) for _ in range(self.count)]
        n = len(self.rows)
        if n:
            used = int(self.lengths().max())
            for new, old in zip(grown, self.buffers):
                new[:n, :, :used] = old[:n, :, :used]
        self.buffers = grown

    def add(self, rows: list[Row], cache: list[np.ndarray], mask: np.ndarray) -> None:
        """Rows whose prefill just finished, with their keys and values as the prefill graph gives them: `cache`
        [rows, heads, W, head_dim] per past name, `mask` [rows, W]; a row's tokens are its attended columns, in
        position order (generation.py's layout), so they are written compactly, padding and gaps left out."""
        n = len(self.rows)
        if n + len(rows) > self.max_rows:
            raise ValueError(f"{n + len(rows)} rows in a decode batch of at most {self.max_rows}")
        columns = [np.flatnonzero(m) for m in mask]
        self.reserve(max(c.size for c in columns) + 1)
        for i, c in enumerate(columns):
            part = slice(c[0], c[-1] + 1) if c[-1] - c[0] == c.size - 1 else c  # one run of columns: no gather
            for buffer, a in zip(self.buffers, cache):
                buffer[n + i, :, :c.size] = a[i][:, part]  # a[i, :, c] would put the gathered axis first
        self.rows.extend(rows)

    def retain(self, keep: Callable[[Row], bool]) -> list[Row]:
        """Drop the rows `keep` rejects, each replaced by the last kept row (its used columns copied, so the rows
        stay one leading block); returns the dropped."""
        flags = [keep(g) for g in self.rows]
        if all(flags):
            return []
        dropped = [g for g, kept in zip(self.rows, flags) if not kept]
        n = len(self.rows) - len(dropped)
        holes = [i for i in range(n) if not flags[i]]
        movers = [i for i in range(n, len(self.rows)) if flags[i]]
        for i, j in zip(holes, movers):
            used = self.rows[j]._length
            for buffer in self.buffers:
                buffer[i, :, :used] = buffer[j, :, :used]
            self.rows[i] = self.rows[j]
        del self.rows[n:]
        return dropped

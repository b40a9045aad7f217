"""The decoder's decode batch (generation.py): its rows, their KV cache and attention mask, kept in reused
buffers.

Layout (generation.py's docstring states it in full): per layer one key and one value array [rows, heads, T,
head_dim] and a mask [rows, T]; every row left-padded, its real tokens its last columns. Why reused buffers:
on this kind of VM first-touching fresh memory costs a page fault per page (the host takes free pages back),
and copying the whole cache into new arrays whenever a row joined or left was ~40 % of the inference thread's
CPU at 40 req/s (benchmarks/RESULTS.md, issue 34).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

Row = Any  # a generation.Generation: not imported, generation.py imports this module


def _left_pad(a: np.ndarray, width: int, axis: int) -> np.ndarray:
    missing = width - a.shape[axis]
    if missing == 0:
        return a
    pad = [(0, 0)] * a.ndim
    pad[axis] = (missing, 0)
    return np.pad(a, pad)


class DecodeBatch:
    """The decode batch: its rows' Generations, the KV cache (past_names order) and the attention mask.
    The cache lives in two sets of reused flat buffers (`arena`; `home`: the set the cache is the leading part of,
    None when it is in neither): with a RunIntoFn the decode steps write their presents into them in turn, so a
    joining row is written after the others in place; a copy of the whole cache (a wider row joins, a cut) goes
    into the other set, not into new memory."""

    def __init__(self) -> None:
        self.arena: list[list[np.ndarray]] = [[], []]
        self.clear()

    def clear(self) -> None:
        self.rows: list[Row] = []
        self.cache: list[np.ndarray] = []
        self.mask = np.zeros((0, 0), np.int64)
        self.home: int | None = None

    def spare(self, shape: tuple[int, ...], count: int) -> tuple[int, list[np.ndarray]]:
        """The arena set the cache is not in, as `count` arrays of `shape`; grown by half again when too small and
        never shrunk: fresh memory costs page faults on first touch (very slow on a VM whose free pages go back to
        the host), reused memory does not."""
        other = 1 - self.home if self.home is not None else 0
        need = math.prod(shape)
        if len(self.arena[other]) != count or self.arena[other][0].size < need:
            self.arena[other] = [np.empty(need + need // 2, np.float32) for _ in range(count)]
        return other, [flat[:need].reshape(shape) for flat in self.arena[other]]

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, rows: list[Row], cache: list[np.ndarray], mask: np.ndarray) -> None:
        if not self.rows:
            self.rows, self.cache, self.mask, self.home = list(rows), cache, mask, None
            return
        width = max(self.mask.shape[1], mask.shape[1])
        old, new = len(self.rows), len(rows)
        if self.home is not None and width == self.mask.shape[1] and \
                self.arena[self.home][0].size >= (old + new) * self.cache[0][0].size:
            shape = (old + new, *self.cache[0].shape[1:])  # the cache is the leading part of its arena set: extend it
            grown = [flat[:shape[0] * self.cache[0][0].size].reshape(shape) for flat in self.arena[self.home]]
            for a, b in zip(grown, cache):
                a[old:] = _left_pad(b, width, 2)
            self.cache = grown
            self.mask = np.concatenate([self.mask, _left_pad(mask, width, 1)])
            self.rows.extend(rows)
            return
        home, grown = self.spare((old + new, *self.cache[0].shape[1:2], width, self.cache[0].shape[3]), len(self.cache))
        for a, was, joins in zip(grown, self.cache, cache):  # into reused memory, left-padded to `width`
            a[:old, :, :width - was.shape[2]] = 0
            a[:old, :, width - was.shape[2]:] = was
            a[old:, :, :width - joins.shape[2]] = 0
            a[old:, :, width - joins.shape[2]:] = joins
        self.cache, self.home = grown, home
        self.mask = np.concatenate([_left_pad(self.mask, width, 1), _left_pad(mask, width, 1)])
        self.rows.extend(rows)

    def retain(self, keep: Callable[[Row], bool]) -> list[Row]:
        """Drop the rows `keep` rejects, each replaced by the last kept row (one row copied, so a leaving row does
        not copy the whole cache), then the leading columns no remaining row attends when they are worth a cut
        (`trim`); returns the dropped."""
        flags = [keep(g) for g in self.rows]
        if all(flags):
            return []
        dropped = [g for g, kept in zip(self.rows, flags) if not kept]
        n = len(self.rows) - len(dropped)
        if not n:
            self.clear()
            return dropped
        holes = [i for i in range(n) if not flags[i]]
        movers = [i for i in range(n, len(self.rows)) if flags[i]]
        if holes:
            to, fro = np.array(holes), np.array(movers)
            for a in self.cache:
                a[to] = a[fro]
            self.mask[to] = self.mask[fro]
            for i, j in zip(holes, movers):
                self.rows[i] = self.rows[j]
        del self.rows[n:]
        self.cache = [a[:n] for a in self.cache]  # leading rows of a C-contiguous array: still contiguous
        self.mask = self.mask[:n]
        self.trim()
        return dropped

    def trim(self) -> None:
        """Cut the leading columns no row attends once they are a quarter of the width or more: the cut copies
        the whole cache, the masked columns it saves cost only attention until then."""
        first = int(np.argmax(self.mask.any(axis=0)))  # every row has its last columns set: this is a real column
        if first and 4 * first >= self.mask.shape[1]:
            self.mask = np.ascontiguousarray(self.mask[:, first:])
            shape = self.cache[0].shape
            home, cut = self.spare((shape[0], shape[1], shape[2] - first, shape[3]), len(self.cache))
            for a, was in zip(cut, self.cache):
                a[...] = was[:, :, first:]
            self.cache, self.home = cut, home

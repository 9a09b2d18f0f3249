"""Repair: from a complete packing to a lower one by overlap minimisation (anytime).

Where the search finds nothing at a capacity, the answer is the best complete packing
found so far (the greedy passes' or the search's). This phase takes that packing of height
H, asks for a lower capacity C, pushes the items above C down into it (they now overlap
others) and moves one overlapping item at a time to the offset in [0, C - size] where its
weighted overlap with the items live with it is least. An overlap weighs its bytes times
the time steps the two share (so an overlap of two long-lived items costs more than one of
two items that meet for a step). Where no overlapping item can move to a better offset,
every overlapping pair weighs once more (guided local search, after Egeblad et al. and
Imamichi et al.'s nesting searches: an item has one free coordinate here, its offset, so
its best offset is found exactly by one sweep over a piecewise-linear function). No
overlap left is a packing in C: it is pushed down (each item, by offset, to the lowest
offset free of those below it), kept, and the next capacity asked for is lower. A capacity
not reached within its share of moves is given up, and the next asks for half the step;
where not even one byte less was reached, it starts again from the best packing with the
first step (its shuffles differ).

It counts moves, and stops at `max_moves` or at `deadline`. Every packing it returns is
complete and valid, and never higher than the one it was given.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence

import numpy as np

from tensorplan.alloc.search.dfs import OutOfTime, _overlaps

# The first capacity asked for: H less this fraction of the bound. 2% against 1%: from the
# hand-overs of bench/hard_traces.py's 1,000-buffer traces and 24 greedy packings, fewer
# capacities each reached from fresh weights (pinwheel-deep 1,000 seed 3, 2.7 s: 1.110x to
# 1.054x; the 24 greedy packings, 2.5 s each: mean 1.187x to 1.154x); 3% and 4% were worse.
FIRST_STEP = 0.02
MOVES_PER_ITEM = 30  # moves a capacity gets, per item, before it is given up
# Past this many (item, item it meets) entries the tables (nine int64 per entry) would take
# hundreds of MB: no repair. The 1,000-buffer traces of bench/hard_traces.py have 50-80k.
MAX_MEETINGS = 2_000_000
SEED = 0x5EED
SIGN = np.array([[1], [-1], [-1], [1]], dtype=np.int64)  # the slope changes, per jump
INT64_SAFE = 1 << 62  # a move's sums stay below this in int64 (else Python ints)


def repair(
    lo: Sequence[int], hi: Sequence[int], size: Sequence[int], offsets: Sequence[int],
    height: int, bound: int, deadline: float, max_moves: int,
) -> tuple[list[int], int, int]:
    """(offsets, height, moves spent): a packing of items live over inclusive [lo, hi] no
    higher than (offsets, height), lower where the local search finds one within
    `max_moves` moves and before `deadline` (perf_counter seconds)."""
    best, best_h = list(offsets), height
    n = len(size)
    if best_h <= bound or n < 2 or max_moves <= 0:
        return best, best_h, 0
    items = [k for k in range(n) if size[k] > 0]
    try:
        nbrs = _overlaps(items, list(lo), [h + 1 for h in hi], deadline)
        if sum(map(len, nbrs)) > MAX_MEETINGS:
            return best, best_h, 0
        if best_h * (max(map(len, nbrs)) + 2) >= INT64_SAFE:
            return best, best_h, 0  # an item's overlap in bytes could pass int64
        ls = _Local(lo, hi, size, items, nbrs, deadline)
    except OutOfTime:
        return best, best_h, 0
    rng = random.Random(SEED)
    step = max(int(bound * FIRST_STEP), 1)
    spent = 0
    while best_h > bound and spent < max_moves and time.perf_counter() < deadline:
        cap = max(best_h - step, bound)
        moves = min(MOVES_PER_ITEM * len(items), max_moves - spent)
        found, used = ls.fit(cap, best, rng, deadline, moves)
        spent += used
        if found is not None:
            best = _down(found, size, items, nbrs)
            best_h = max((best[k] + size[k] for k in items), default=0)
        elif step > 1:
            step = max(step // 2, 1)
        else:  # not even one byte lower: again from the best, with other shuffles
            step = max(int(bound * FIRST_STEP), 1)
    return best, best_h, spent


class _Local:
    """The neighbours of each item as one flat table (numpy, int64): entry e is the pair
    (src[e], dst[e]), item k's entries are ptr[k]:ptr[k + 1] (dst sorted), shared[e] the
    time steps the two share, and back[e] the entry of the same pair seen from dst[e] (so a
    pair's weight is kept on both sides)."""

    SAFE = INT64_SAFE  # a move whose sums could pass this takes them in Python ints

    def __init__(self, lo: Sequence[int], hi: Sequence[int], size: Sequence[int],
                 items: list[int], nbrs: list[list[int]], deadline: float) -> None:
        """OutOfTime past `deadline`."""
        n = len(size)
        for k in range(n):
            nbrs[k].sort()
        if time.perf_counter() > deadline:
            raise OutOfTime
        self.items = items
        self.size = np.asarray(size, dtype=np.int64)
        deg = np.fromiter(map(len, nbrs), dtype=np.int64, count=n)
        self.ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(deg, out=self.ptr[1:])
        self.src = np.repeat(np.arange(n, dtype=np.int64), deg)
        self.dst = np.fromiter((j for nb in nbrs for j in nb), dtype=np.int64,
                               count=int(self.ptr[-1]))
        lo_, hi_ = np.asarray(lo, dtype=np.int64), np.asarray(hi, dtype=np.int64)
        src, dst = self.src, self.dst
        self.shared = np.minimum(hi_[src], hi_[dst]) - np.maximum(lo_[src], lo_[dst]) + 1
        # the entries are sorted by (src, dst): the pair (dst, src) is found by bisection
        self.back = np.searchsorted(src * n + dst, dst * n + src)
        # per entry, where the slope of src's overlap with dst changes, less dst's offset
        zs, zd = self.size[src], self.size[dst]
        m = np.minimum(zs, zd)
        self.jump = np.stack((-zs, m - zs, zd - m, zd))
        # the most a move's sums can reach, over the shared steps (times the weight factor
        # and a span of twice the capacity): past int64, its sums are taken in Python ints
        self.most_shared = int(np.add.reduceat(self.shared, self.ptr[:-1][deg > 0]).max()) \
            if len(self.shared) else 0
        self.start = self.ptr.tolist()
        self.fast = True
        self.stale = np.zeros(n, dtype=bool)  # fit's: see there
        self.largest = max((size[k] for k in items), default=0)
        most = 4 * int(deg.max(initial=0)) + 3  # a move's breakpoints, at most
        self.pos, self.d, self.f = (np.empty(most, dtype=np.int64) for _ in range(3))

    def fit(self, cap: int, start: list[int], rng: random.Random, deadline: float,
            moves: int) -> tuple[list[int] | None, int]:
        """(offsets with every item in [0, cap) and no overlap, or None, moves spent): from
        `start` with the items above cap pushed down, until `moves` or the clock run out."""
        size, items = self.size, self.items
        if self.largest > cap:
            return None, 0
        y = np.asarray(start, dtype=np.int64)
        y = np.where(y + size > cap, cap - size, y)
        # the weights: the shared time steps, times 1 + the times the pair was penalised
        weight = self.shared.copy()
        penalties = 0
        self.fast = 2 * cap * self.most_shared < self.SAFE
        # each item's overlap in bytes with the items it meets
        ov = np.zeros(len(size), dtype=np.int64)
        np.add.at(ov, self.src, self._pair_overlaps(y))
        bad = {k for k in items if ov[k] > 0}
        # an item whose sweep found no better offset, where nothing it depends on (its
        # neighbours' offsets, its weights) changed since: its next sweep would find the
        # same, so its move is counted without one
        self.stale = np.zeros(len(size), dtype=bool)
        spent = 0
        while bad:
            if spent >= moves or time.perf_counter() > deadline:
                return None, spent
            order = sorted(bad)
            rng.shuffle(order)
            improved = False
            for k in order:
                if ov[k] == 0:
                    continue
                if spent >= moves:
                    return None, spent
                spent += 1
                if self.stale[k]:
                    continue
                if self._move(k, cap, y, weight, ov, bad, rng):
                    improved = True
                    if not bad:
                        break
                # moved to the least overlap, or none less found: the same until a
                # neighbour moves or a weight changes
                self.stale[k] = True
            if not improved and bad:
                self.stale[:] = False
                self._penalise(bad, y, weight)
                penalties += 1
                self.fast = 2 * cap * self.most_shared * (1 + penalties) < self.SAFE
        return y.tolist(), spent

    def _pair_overlaps(self, y: np.ndarray, entries: np.ndarray | None = None) -> np.ndarray:
        """Every entry's overlap in bytes (0 where none), or those of `entries`."""
        src, dst, size = self.src, self.dst, self.size
        if entries is not None:
            src, dst = src[entries], dst[entries]
        ys, yd = y[src], y[dst]
        o: np.ndarray = np.minimum(ys + size[src], yd + size[dst]) - np.maximum(ys, yd)
        o[o < 0] = 0
        return o

    def _move(self, k: int, cap: int, y: np.ndarray, weight: np.ndarray, ov: np.ndarray,
              bad: set[int], rng: random.Random) -> bool:
        """Move k to an offset of least weighted overlap in [0, cap - size]; True if that is
        less than where it is."""
        s, e = self.start[k], self.start[k + 1]
        n = e - s
        yk = int(y[k])
        top = cap - int(self.size[k])
        # k's weighted overlap with j against k's offset x is a trapezoid from a - zk up to
        # b (j over [a, b)): its slope rises by w at a - zk and at b, and falls by w at
        # a - zk + m and at b - m (m the smaller size). The sum of them over the neighbours,
        # swept over the breakpoints sorted, with the ends of k's range and where k is now
        a, jump, w = y[self.dst[s:e]], self.jump[:, s:e], weight[s:e]
        if self.fast:  # into buffers sized for the item with most neighbours
            pos, d, f = self.pos[:4 * n + 3], self.d[:4 * n + 3], self.f[:4 * n + 3]
        else:  # sums past int64: in Python ints
            a, jump, w = a.astype(object), jump.astype(object), w.astype(object)
            pos = np.empty(4 * n + 3, dtype=object)
            d = np.empty(4 * n + 3, dtype=object)
            f = np.empty(4 * n + 3, dtype=object)
        np.add(a, jump, out=pos[:4 * n].reshape(4, n))
        pos[4 * n] = 0
        pos[4 * n + 1] = top
        pos[4 * n + 2] = yk
        np.multiply(w, SIGN, out=d[:4 * n].reshape(4, n))
        d[4 * n:] = 0
        # ties need no order (f is the same at tied breakpoints), and the default sort took
        # a third of a stable one's time on the 1,000-buffer traces' breakpoints
        order = np.argsort(pos)
        pos = pos[order]
        slope = np.cumsum(d[order[:-1]])  # right of each breakpoint but the last
        f[0] = 0  # nothing overlaps left of the first breakpoint
        gaps = f[1:]
        np.subtract(pos[1:], pos[:-1], out=gaps)
        np.multiply(slope, gaps, out=gaps)
        np.cumsum(gaps, out=gaps)
        now = f[pos.searchsorted(yk)]
        first, last = pos.searchsorted(0), pos.searchsorted(top, "right")
        pos, f = pos[first:last], f[first:last]
        best_f = f.min()
        if best_f >= now:
            return False
        cands = np.unique(pos[f == best_f])  # ascending, as a sweep meets them
        new = int(cands[rng.randrange(len(cands))] if len(cands) > 1 else cands[0])
        self._set(k, new, y, ov, bad)
        return True

    def _set(self, k: int, new: int, y: np.ndarray, ov: np.ndarray, bad: set[int]) -> None:
        nb = self.dst[self.start[k]:self.start[k + 1]]
        old, zk = int(y[k]), int(self.size[k])
        a = y[nb]
        b = a + self.size[nb]
        before = np.maximum(np.minimum(b, old + zk) - np.maximum(a, old), 0)
        after = np.maximum(np.minimum(b, new + zk) - np.maximum(a, new), 0)
        change = after - before
        moved = np.flatnonzero(change)
        self.stale[nb] = False  # their overlap functions changed
        if len(moved):
            js = nb[moved]
            ov[js] += change[moved]
            for j, o in zip(js.tolist(), ov[js].tolist(), strict=True):
                if o > 0:
                    bad.add(j)
                else:
                    bad.discard(j)
        y[k] = new
        total = int(after.sum())
        ov[k] = total
        if total > 0:
            bad.add(k)
        else:
            bad.discard(k)

    def _penalise(self, bad: set[int], y: np.ndarray, weight: np.ndarray) -> None:
        """Every overlapping pair weighs its shared time steps once more (both of its
        items are bad; it is taken once, from its lower item)."""
        ks = np.fromiter(bad, dtype=np.int64, count=len(bad))
        starts, counts = self.ptr[ks], self.ptr[ks + 1] - self.ptr[ks]
        # the bad items' entries: each run of `counts` from its start
        entries = np.repeat(starts - (np.cumsum(counts) - counts), counts) + \
            np.arange(int(counts.sum()), dtype=np.int64)
        over = self._pair_overlaps(y, entries) > 0
        pairs = entries[over & (self.src[entries] < self.dst[entries])]
        weight[pairs] += self.shared[pairs]
        weight[self.back[pairs]] += self.shared[pairs]


def _down(y: list[int], size: Sequence[int], items: list[int],
          nbrs: list[list[int]]) -> list[int]:
    """Each item, lowest offset first, at the lowest offset free of the items already
    moved that it meets: nothing rises (what is below an item only moved down), so the
    packing stays valid and no higher."""
    out = [0] * len(size)  # zero-size items at 0, as the search leaves them
    done = [False] * len(size)
    for k in sorted(items, key=lambda k: (y[k], k)):
        spans = sorted((out[j], out[j] + size[j]) for j in nbrs[k] if done[j])
        at, zk = 0, size[k]
        for a, b in spans:
            if a >= at + zk:
                break
            if b > at:
                at = b
        out[k] = at
        done[k] = True
    return out

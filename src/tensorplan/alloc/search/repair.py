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

from tensorplan.alloc.search.dfs import OutOfTime, _overlaps

FIRST_STEP = 0.01  # the first capacity asked for: H less this fraction of the bound
MOVES_PER_ITEM = 30  # moves a capacity gets, per item, before it is given up
# Past this many (item, item it meets) entries the tables (four per entry) would take
# hundreds of MB: no repair. The 1,000-buffer traces of bench/hard_traces.py have 50-80k.
MAX_MEETINGS = 2_000_000
SEED = 0x5EED


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
    """The neighbours of each item, the time steps they share, and where each item sits in
    its neighbours' lists (so a pair's weight is kept on both sides)."""

    def __init__(self, lo: Sequence[int], hi: Sequence[int], size: Sequence[int],
                 items: list[int], nbrs: list[list[int]], deadline: float) -> None:
        """OutOfTime past `deadline`."""
        n = len(size)
        for k in range(n):
            nbrs[k].sort()
        self.size = size
        self.items = items
        self.nbrs = nbrs
        self.shared = [[min(hi[k], hi[j]) - max(lo[k], lo[j]) + 1 for j in nbrs[k]]
                       for k in range(n)]
        # with every list sorted, the items below j in j's list come in the order this
        # loop meets them: a cursor per item gives each pair's place on the other side
        self.back = [[0] * len(nbrs[k]) for k in range(n)]
        cursor = [0] * n
        for k in range(n):
            if k % 64 == 0 and time.perf_counter() > deadline:
                raise OutOfTime
            back_k = self.back[k]
            for i, j in enumerate(nbrs[k]):
                if j > k:
                    back_k[i] = cursor[j]
                    self.back[j][cursor[j]] = i
                    cursor[j] += 1

    def fit(self, cap: int, start: list[int], rng: random.Random, deadline: float,
            moves: int) -> tuple[list[int] | None, int]:
        """(offsets with every item in [0, cap) and no overlap, or None, moves spent): from
        `start` with the items above cap pushed down, until `moves` or the clock run out."""
        size, items, nbrs = self.size, self.items, self.nbrs
        y = list(start)
        for k in items:
            if y[k] + size[k] > cap:
                y[k] = cap - size[k]
                if y[k] < 0:
                    return None, 0
        # the weights: the shared time steps, times 1 + the times the pair was penalised
        weight = [list(s) for s in self.shared]
        ov = [0] * len(size)  # each item's overlap in bytes with the items it meets
        for k in items:
            yk, zk = y[k], size[k]
            total = 0
            for j in nbrs[k]:
                o = min(yk + zk, y[j] + size[j]) - max(yk, y[j])
                if o > 0:
                    total += o
            ov[k] = total
        bad = {k for k in items if ov[k] > 0}
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
                if self._move(k, cap, y, weight[k], ov, bad, rng):
                    improved = True
                    if not bad:
                        break
            if not improved and bad:
                self._penalise(bad, y, weight)
        return y, spent

    def _move(self, k: int, cap: int, y: list[int], weight: list[int], ov: list[int],
              bad: set[int], rng: random.Random) -> bool:
        """Move k to an offset of least weighted overlap in [0, cap - size]; True if that is
        less than where it is."""
        size, nbrs = self.size, self.nbrs[k]
        zk, yk = size[k], y[k]
        top = cap - zk
        now = 0
        events: list[tuple[int, int]] = []
        add = events.append
        for j, w in zip(nbrs, weight, strict=True):
            a = y[j]
            zj = size[j]
            b = a + zj
            o = (yk + zk if yk + zk < b else b) - (yk if yk > a else a)
            if o > 0:
                now += o * w
            # k's overlap with j against k's offset: a trapezoid from a - zk up to b
            m = zk if zk < zj else zj
            add((a - zk, w))
            add((a - zk + m, -w))
            add((b - m, -w))
            add((b, w))
        events.append((0, 0))  # the ends of k's range are candidates too
        events.append((top, 0))
        events.sort()
        best_f, cands = now, []
        f = slope = 0
        prev = events[0][0]
        for pos, d in events:
            f += slope * (pos - prev)
            prev = pos
            slope += d
            if 0 <= pos <= top and f <= best_f:
                if f < best_f:
                    best_f, cands = f, [pos]
                elif f < now and (not cands or cands[-1] != pos):
                    cands.append(pos)
        if best_f >= now or not cands:
            return False
        self._set(k, cands[rng.randrange(len(cands))] if len(cands) > 1 else cands[0],
                  y, ov, bad)
        return True

    def _set(self, k: int, new: int, y: list[int], ov: list[int], bad: set[int]) -> None:
        size = self.size
        old, zk = y[k], size[k]
        total = 0
        for j in self.nbrs[k]:
            a = y[j]
            b = a + size[j]
            before = (old + zk if old + zk < b else b) - (old if old > a else a)
            after = (new + zk if new + zk < b else b) - (new if new > a else a)
            before = before if before > 0 else 0
            if after > 0:
                total += after
            else:
                after = 0
            if before != after:
                ov[j] += after - before
                if ov[j] > 0:
                    bad.add(j)
                else:
                    bad.discard(j)
        y[k] = new
        ov[k] = total
        if total > 0:
            bad.add(k)
        else:
            bad.discard(k)

    def _penalise(self, bad: set[int], y: list[int], weight: list[list[int]]) -> None:
        """Every overlapping pair weighs its shared time steps once more."""
        size, nbrs, shared, back = self.size, self.nbrs, self.shared, self.back
        for k in bad:
            yk, zk = y[k], size[k]
            for i, j in enumerate(nbrs[k]):
                if j > k and min(yk + zk, y[j] + size[j]) - max(yk, y[j]) > 0:
                    weight[k][i] += shared[k][i]
                    weight[j][back[k][i]] += shared[k][i]


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

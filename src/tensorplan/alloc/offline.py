"""Offline packing of known lifetimes on plain ints: (start, end, size) -> (chunk, offset).

Every interval is known before any is placed (inclusive [start, end], sizes already
aligned). A greedy pass takes items in some order and puts each at the lowest offset, or
in the smallest gap, where it overlaps no placed item live at the same time. Several
orders are tried (graphs: largest first, longest first, earliest first, largest area
first; raw traces: earliest first, then the same), the best is kept, then a hill climb
moves items that set the peak earlier in the order. Any result equal to the lower bound
(the peak of live bytes) ends the search: it is optimal.

Overlap lookups go through time buckets: a placed item is listed in every bucket its
interval touches, and a query counts each item once, at the first bucket both share.

When the best pass misses the bound, a search (search/improve.py) takes over from it: at most
`max_nodes` nodes and `budget_s` seconds of wall clock. `exact` (max_nodes=None) first runs
that same search with DEFAULT_MAX_NODES, so it is never worse than `offline`, then spends
the rest of its time in CP-SAT where OR-Tools is installed (search/cpsat.py), else in the same
search with no node limit, its time shared out between capacities.

Determinism: the greedy passes are bought through a fixed cost model (work units counted
by the first pass) and the search counts nodes, so where the node limit comes before the
clock (most traces with the default budget; not MiniMalloc's D and J, whose nodes are
slow) the result depends only on the input and the limits. Only a search stopped by the
clock depends on the machine.
"""

from __future__ import annotations

import bisect
import heapq
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate

from tensorplan.alloc.plan import UNLIMITED, PlanError
from tensorplan.alloc.search.improve import Improved, improve

DEFAULT_BUDGET_S = 10.0  # a wall-clock stop for the search; the node limit comes first
HEURISTIC_S = 0.05  # what the greedy passes and the hill climb may cost, at most
DEFAULT_MAX_NODES = 400_000  # ~2-8 s of search on a 500-buffer trace
UNLIMITED_NODES = 1 << 62  # exact's node limit: only the clock stops it
SEARCH_MAX_ITEMS = 5_000  # past this the default strategy keeps the greedy result
# Cost model (measured on a shared 2-core CI box): a pass costs ~0.15 us per placed item it
# looks at and ~1.8 us per item it places, so an item placed counts as 12 units.
UNIT_S = 0.15e-6
UNITS_PER_ITEM = 12
MAX_PASSES = 200  # so a tiny problem that misses the bound still returns at once

Span = tuple[int, int, int, int, int]  # (offset, offset + size, start, end, first bucket)


@dataclass(frozen=True, slots=True)
class Packed:
    offsets: list[int]
    chunks: list[int]  # chunk index per item
    chunk_sizes: list[int]
    proven: bool = False  # the total is the optimum (the bound, or a search proved it)

    @property
    def total(self) -> int:
        return sum(self.chunk_sizes)

    def key(self) -> tuple[int, int]:
        return self.total, len(self.chunk_sizes)


def load(lo: Sequence[int], hi: Sequence[int], size: Sequence[int]) -> int:
    """The lower bound: max over time of the summed sizes of live items."""
    if not size:
        return 0
    diff = [0] * (max(hi) + 2)
    for s, e, z in zip(lo, hi, size, strict=True):
        diff[s] += z
        diff[e + 1] -= z
    return max(0, max(accumulate(diff)))  # the running sum, in C


def compress(lo: list[int], hi: list[int]) -> tuple[list[int], list[int]]:
    """Times renumbered 0.. keeping their order, when they are sparse (raw traces)."""
    if not lo or (min(lo) >= 0 and max(hi) <= 4 * len(lo) + 64):
        return lo, hi
    rank = {t: i for i, t in enumerate(sorted(set(lo) | set(hi)))}
    return [rank[t] for t in lo], [rank[t] for t in hi]


def _fit(spans: list[tuple[int, int]], size: int, cap: int, best_fit: bool) -> int:
    """Offset for `size` bytes among occupied spans (offset, top); -1 if above cap."""
    spans.sort()
    pos = 0
    if best_fit:
        best, best_gap = -1, 0
        for a, top in spans:
            gap = a - pos
            if gap >= size and (best < 0 or gap <= best_gap):  # ggml's "<=": highest wins
                best, best_gap = pos, gap
            if top > pos:
                pos = top
        if best >= 0:
            return best
    else:
        for a, top in spans:
            if a - pos >= size:
                break
            if top > pos:
                pos = top
    return pos if pos + size <= cap else -1


def _first_fit(
    buckets: list[list[Span] | None], b0: int, b1: int, s: int, e: int, size: int
) -> tuple[int, int]:
    """The lowest offset where `size` bytes meet no item live in [s, e], for a query over
    time buckets b0..b1 (each sorted by offset), and how many items they hold. Each bucket
    in turn raises the offset past what it holds there, round the buckets until none
    does: then every bucket has room there, and nothing lower has room in all of them."""
    pos = seen = 0
    for b in range(b0, b1 + 1):
        items = buckets[b]
        if items is not None:
            seen += len(items)
    n = b1 - b0 + 1
    b = b0
    still = 0  # buckets in a row that left pos where it was
    while still < n:
        items = buckets[b]
        if items is not None:
            p = pos
            for o, t, ls, le, _ in items:
                if ls <= e and le >= s:
                    if o - p >= size:
                        break
                    if t > p:
                        p = t
            if p != pos:
                pos, still = p, 0
        still += 1
        b = b + 1 if b < b1 else b0
    return pos, seen


class _Chunk:
    """Items placed in one chunk, each listed in every time bucket its interval touches,
    each bucket sorted by offset. A query for [s, e] reads every item of s's bucket, and of
    each later bucket up to e's only the items that begin there, so it sees each item once
    (see _Pass.run)."""

    __slots__ = ("buckets", "cap", "top")

    def __init__(self, n_buckets: int, cap: int) -> None:
        self.buckets: list[list[Span] | None] = [None] * n_buckets
        self.cap = cap
        self.top = 0  # the chunk's size so far


class _Pass:
    """One greedy pass: items placed in a given order into chunks of `capacity` bytes."""

    def __init__(self, lo: list[int], hi: list[int], size: list[int], capacity: int):
        self.lo, self.hi, self.size, self.capacity = lo, hi, size, capacity
        n = len(size)
        length = sum(hi) - sum(lo) + n
        self.width = max(1, length // max(n, 1))  # bucket width: the mean lifetime
        self.n_buckets = (max(hi) if n else 0) // self.width + 1

    def run(self, order: Sequence[int], best_fit: bool) -> tuple[Packed, int]:
        """The packing, and the work units it cost (for the budget's cost model: every
        item of every bucket a query reads counts, wherever the query stops).

        First fit in one bucket, the common query (largest first, on graphs), walks the
        bucket up by offset and stops at the first gap that fits: the lowest offset that
        fits, as _fit would find among the same items, without listing and sorting them."""
        lo, hi, size, width = self.lo, self.hi, self.size, self.width
        offsets = [0] * len(size)
        where = [0] * len(size)
        chunks: list[_Chunk] = []
        work = UNITS_PER_ITEM * len(size)
        insort = bisect.insort
        for k in order:  # _Chunk.conflicts and .add inlined: this loop is the planner's
            sz = size[k]
            if sz == 0:
                continue  # takes no bytes: offset 0 of chunk 0 overlaps nothing
            s, e = lo[k], hi[k]
            b0, b1 = s // width, e // width
            c = -1
            while True:
                c += 1
                if c == len(chunks):
                    chunks.append(_Chunk(self.n_buckets, max(self.capacity, sz)))
                chunk = chunks[c]
                if sz > chunk.cap:
                    continue
                buckets = chunk.buckets
                items = buckets[b0]
                if not best_fit:
                    if b0 == b1:
                        pos = 0
                        if items is not None:
                            work += len(items)
                            for o, t, ls, le, _ in items:
                                if ls <= e and le >= s:
                                    if o - pos >= sz:
                                        break
                                    if t > pos:
                                        pos = t
                    else:
                        pos, seen = _first_fit(buckets, b0, b1, s, e, sz)
                        work += seen
                    if pos + sz <= chunk.cap:
                        break
                    continue
                if items is None:
                    spans = []
                else:
                    work += len(items)
                    spans = [(o, t) for (o, t, ls, le, _) in items if ls <= e and le >= s]
                for b in range(b0 + 1, b1 + 1):  # only items that begin there: seen once
                    items = buckets[b]
                    if items is not None:
                        work += len(items)
                        spans += [(o, t) for (o, t, ls, _, f) in items if f == b and ls <= e]
                pos = _fit(spans, sz, chunk.cap, best_fit) if spans else 0
                if pos >= 0:
                    break
            span = (pos, pos + sz, s, e, b0)
            for b in range(b0, b1 + 1):
                items = buckets[b]
                if items is None:
                    buckets[b] = [span]
                else:
                    insort(items, span)
            if pos + sz > chunk.top:
                chunk.top = pos + sz
            offsets[k], where[k] = pos, c
        return Packed(offsets, where, [ch.top for ch in chunks] or [0]), work

    def sweep(self, order: Sequence[int], best_fit: bool) -> tuple[Packed, int]:
        """run() for an order sorted by start, in one chunk, found faster: the placed items
        an item conflicts with are exactly those still live, kept sorted by offset, so dense
        traces cost O(live) per item instead of a scan of time buckets."""
        lo, hi, size = self.lo, self.hi, self.size
        offsets = [0] * len(size)
        live: list[tuple[int, int]] = []  # (offset, top), sorted; nonzero sizes never tie
        ending: list[tuple[int, int, int]] = []  # heap of (end, offset, top)
        top = 0
        work = UNITS_PER_ITEM * len(size)
        for k in order:
            while ending and ending[0][0] < lo[k]:
                _, o, t = heapq.heappop(ending)
                del live[bisect.bisect_left(live, (o, t))]
            sz = size[k]
            if sz == 0:
                continue
            work += len(live)
            pos = offsets[k] = _fit(live, sz, UNLIMITED, best_fit)
            if pos < 0:
                raise PlanError(f"the arena would exceed {UNLIMITED} bytes")
            span = (pos, pos + sz)
            bisect.insort(live, span)
            heapq.heappush(ending, (hi[k], *span))
            top = max(top, pos + sz)
        return Packed(offsets, [0] * len(size), [top]), work


# (order, best fit?) pairs in the order they are tried. Largest first reaches the bound
# in one pass on every model graph, on synthetic chains and on all but the smallest random
# DAGs (longest-lived first misses it on resnet50, on chains past 30k tensors and on
# DAGs); earliest first with best fit replays ggml-alloc's online choices (ties keep input
# order) and leads on raw lifetime traces.
GRAPH_ORDERS = (
    ("largest", False), ("longest", False), ("earliest", True), ("longest", True),
    ("largest", True), ("area", False), ("area", True), ("earliest", False),
)  # fmt: skip
TRACE_ORDERS = (
    ("earliest", True), ("longest", False), ("largest", False), ("longest", True),
    ("largest", True), ("area", False), ("area", True), ("earliest", False),
)  # fmt: skip


def _candidates(
    lo: list[int], hi: list[int], size: list[int], plan: Sequence[tuple[str, bool]]
) -> Iterator[tuple[list[int], bool, bool]]:
    """(order, best fit?, sorted by start?) to try; each order is sorted only when first
    needed, as most graphs stop after the first pass."""
    n = len(size)
    span, biggest = max(hi) + 2, max(size) + 1

    def length() -> list[int]:  # only for the orders that need it: most graphs stop first
        return [e - s + 1 for s, e in zip(lo, hi, strict=True)]

    keys: dict[str, Callable[[], list[int]]] = {
        "longest": lambda: [-ln * biggest - z for ln, z in zip(length(), size, strict=True)],
        "earliest": lambda: lo,
        "largest": lambda: [-z * span + s for z, s in zip(size, lo, strict=True)],
        "area": lambda: [-z * ln for z, ln in zip(size, length(), strict=True)],
    }
    made: dict[str, list[int]] = {}
    for name, best_fit in plan:
        if name not in made:
            made[name] = sorted(range(n), key=keys[name]().__getitem__)
        yield made[name], best_fit, name == "earliest"


def solve(
    lo: list[int],
    hi: list[int],
    size: list[int],
    capacity: int = UNLIMITED,
    budget_s: float = DEFAULT_BUDGET_S,
    orders: Sequence[tuple[str, bool]] = GRAPH_ORDERS,
    max_nodes: int | None = DEFAULT_MAX_NODES,
    search_above: float = 0.0,
    max_passes: int = MAX_PASSES,
) -> Packed:
    """Offsets for items live over inclusive [lo, hi] with aligned sizes, in chunks of at
    most `capacity` bytes (an item bigger than that gets a chunk of its own size).

    max_nodes=None searches until the optimum is proven or `budget_s` runs out (exact).
    The search runs only when the greedy packing is more than `search_above` (a fraction)
    above the lower bound. After the first greedy pass at most `max_passes` more run (the
    other orders, then the climb)."""
    if not size:
        return Packed([], [], [0], True)
    deadline = time.perf_counter() + budget_s
    times = lo, hi  # the search's preorders weigh lifetimes in the trace's own time steps
    lo, hi = compress(lo, hi)
    bound = load(lo, hi, size)
    heuristic_s = min(budget_s, HEURISTIC_S)
    best = _greedy(lo, hi, size, capacity, heuristic_s, orders, bound, max_passes)
    if _optimal(best, bound):
        return Packed(best.offsets, best.chunks, best.chunk_sizes, True)
    if len(best.chunk_sizes) > 1 or max_nodes == 0 or budget_s <= 0:
        return best  # several chunks: the search packs one arena; no budget: no search
    if best.total <= bound * (1 + search_above):
        return best
    if max_nodes is not None and len(size) > SEARCH_MAX_ITEMS:
        return best
    start = (best.offsets, best.total)
    # The clock is shared out like the nodes (the bound's attempt half of it), so a trace
    # whose nodes are slow still has time to bisect above the bound (MiniMalloc's D and J
    # took the whole 10 s at the bound and kept the greedy's 1.29-1.32x without this).
    # the merged problems get the same greedy passes (no search) as a start
    def greedy(lo: Sequence[int], hi: Sequence[int], size: Sequence[int]) -> list[int]:
        return solve(list(lo), list(hi), list(size), UNLIMITED, budget_s, orders, 0).offsets

    if max_nodes is not None:
        found = improve(*times, size, start, bound, max_nodes, deadline, True, greedy, True)
    else:  # exact: the default search first, so never worse than offline, then the clock
        found = improve(*times, size, start, bound, DEFAULT_MAX_NODES, deadline, True, greedy,
                        True)
        if not found.proven and time.perf_counter() < deadline:
            found = _exact_rest(lo, hi, size, found, bound, deadline)
    return Packed(found.offsets, best.chunks, [found.height], found.proven)


def _exact_rest(lo: list[int], hi: list[int], size: list[int], found: Improved, bound: int,
                deadline: float) -> Improved:
    """exact's time after the default search: CP-SAT where OR-Tools is installed (it
    proves packings at the bound that the own search does not, and improves others:
    search/cpsat.py has the numbers), else the own search with no node limit."""
    from tensorplan.alloc.search import cpsat

    if cpsat.available():
        return cpsat.improve(lo, hi, size, found, bound, deadline - time.perf_counter())
    start = (found.offsets, found.height)
    return improve(lo, hi, size, start, bound, UNLIMITED_NODES, deadline, True)


def node_limit(strategy: str, max_nodes: int | None) -> int | None:
    """The search's node limit for a strategy: max_nodes if given, else DEFAULT_MAX_NODES
    for offline and none (only the clock) for exact."""
    if max_nodes is not None:
        return max_nodes
    return None if strategy == "exact" else DEFAULT_MAX_NODES


def _greedy(
    lo: list[int],
    hi: list[int],
    size: list[int],
    capacity: int,
    budget_s: float,
    orders: Sequence[tuple[str, bool]],
    bound: int,
    max_passes: int = MAX_PASSES,
) -> Packed:
    """The best of the greedy orders, then a hill climb on it while the budget lasts (and
    at most `max_passes` passes after the first)."""
    runner = _Pass(lo, hi, size, capacity)
    best: Packed | None = None
    best_order: list[int] = []
    best_fit_wins = False
    passes = 0
    for order, best_fit, by_start in _candidates(lo, hi, size, orders):
        if by_start and capacity >= UNLIMITED:
            packed, work = runner.sweep(order, best_fit)
        else:
            packed, work = runner.run(order, best_fit)
        if best is None:
            passes = min(max_passes, int(budget_s / (work * UNIT_S)))
        else:
            passes -= 1
        if best is None or packed.key() < best.key():
            best, best_order, best_fit_wins = packed, order, best_fit
        if _optimal(best, bound) or passes <= 0:
            return best
    assert best is not None
    return _climb(runner, best, best_order, best_fit_wins, bound, passes)


def _optimal(p: Packed, bound: int) -> bool:
    return len(p.chunk_sizes) == 1 and p.total <= bound


def _climb(
    runner: _Pass, best: Packed, order: list[int], best_fit: bool, bound: int, passes: int
) -> Packed:
    """Hill climb on the order: move an item that sets the peak earlier (or swap two),
    keep the move unless the result got worse. Seeded, so deterministic."""
    rng = random.Random(len(order))
    peak_chunk = max(range(len(best.chunk_sizes)), key=best.chunk_sizes.__getitem__)
    for _ in range(passes):
        top = best.chunk_sizes[peak_chunk]
        critical = [
            k
            for k in order
            if best.chunks[k] == peak_chunk and best.offsets[k] + runner.size[k] == top
        ]
        new = list(order)
        i = order.index(rng.choice(critical)) if critical else 0
        if i > 0 and rng.random() < 0.75:
            new.insert(rng.randrange(i), new.pop(i))
        elif len(new) > 1:
            a, b = rng.randrange(len(new)), rng.randrange(len(new))
            new[a], new[b] = new[b], new[a]
        packed, _ = runner.run(new, best_fit)
        if packed.key() <= best.key():
            best, order = packed, new
            peak_chunk = max(range(len(best.chunk_sizes)), key=best.chunk_sizes.__getitem__)
            if _optimal(best, bound):
                break
    return best

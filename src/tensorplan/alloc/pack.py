"""Planning plain lifetimes, with no graph: (id, start, end, size) -> offsets in one arena.

Intervals are half-open [start, end): an interval ending at t and one starting at t may
share bytes. `offline` packs them with the same packer graphs use (greedy passes, then a
bounded search), `exact` searches until the optimum is proven or the budget ends; `ggml` replays
ggml-alloc's online best fit in time order (at each time, intervals ending there are freed
before those starting there are placed; ties in input order).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass

from tensorplan.alloc.freelist import DynAllocator, align_up
from tensorplan.alloc.offline import (
    DEFAULT_BUDGET_S,
    TRACE_ORDERS,
    compress,
    load,
    node_limit,
    solve,
)
from tensorplan.alloc.plan import STRATEGIES, UNLIMITED

Interval = tuple[Hashable, int, int, int]  # (id, start, end exclusive, size)


@dataclass(frozen=True, slots=True)
class Packing:
    offsets: dict[Hashable, int]  # in input order
    size: int  # the arena: the highest end offset
    lower_bound: int  # max over time of live aligned bytes
    proven: bool = False  # size is the optimum

    @property
    def ratio(self) -> float:
        """size / lower bound (1.0 for an empty arena)."""
        return self.size / self.lower_bound if self.lower_bound else 1.0


def pack(
    intervals: Iterable[Interval],
    alignment: int = 1,
    strategy: str = "offline",
    budget_s: float = DEFAULT_BUDGET_S,
    max_nodes: int | None = None,
) -> Packing:
    """Offsets (multiples of `alignment`) so that intervals live at the same time never
    share a byte. `max_nodes` bounds the search (deterministic; default DEFAULT_MAX_NODES
    for offline, none for exact, which stops at the optimum or after `budget_s` seconds).
    Raises ValueError for a bad interval or a repeated id."""
    if alignment <= 0:
        raise ValueError(f"alignment must be positive, got {alignment}")
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose from {STRATEGIES}")
    ids: dict[Hashable, None] = {}
    lo: list[int] = []
    hi: list[int] = []
    size: list[int] = []
    for key, start, end, n in intervals:
        if n < 0 or end <= start:
            raise ValueError(
                f"interval {key!r}: needs end > start and size >= 0, got [{start}, {end}) of {n} B"
            )
        ids[key] = None
        if len(ids) == len(lo):
            raise ValueError(f"interval id {key!r} appears twice")
        lo.append(start)
        hi.append(end - 1)  # inclusive from here on
        size.append(align_up(n, alignment))
    dense = compress(lo, hi)  # solve() takes the trace's own times: its search weighs them
    bound = load(*dense, size)
    if strategy == "ggml":
        offsets, arena = _online(*dense, size, alignment)
        proven = arena <= bound
    else:
        nodes = node_limit(strategy, max_nodes)
        packed = solve(lo, hi, size, UNLIMITED, budget_s, TRACE_ORDERS, nodes)
        offsets, arena, proven = packed.offsets, packed.total, packed.proven
    return Packing(dict(zip(ids, offsets, strict=True)), arena, bound, proven)


def _online(lo: list[int], hi: list[int], size: list[int], alignment: int) -> tuple[list[int], int]:
    if not size:
        return [], 0
    n_times = max(hi) + 1
    starting: list[list[int]] = [[] for _ in range(n_times)]
    ending: list[list[int]] = [[] for _ in range(n_times)]
    for k in range(len(size)):
        starting[lo[k]].append(k)
        ending[hi[k]].append(k)
    dyn = DynAllocator(alignment, UNLIMITED)
    offsets = [0] * len(size)
    for t in range(n_times):
        for k in starting[t]:
            offsets[k] = dyn.alloc(size[k])[1]
        for k in ending[t]:
            dyn.free(0, offsets[k], size[k])
    return offsets, sum(dyn.chunk_sizes())

"""The exact strategy's second solver: Google OR-Tools' CP-SAT, when it is installed.

The problem as constraints: an offset variable per item in [0, capacity - size], and for
every maximal set of items live at one time (an interval graph's maximal cliques:
`maximal_cliques`) a NoOverlap constraint over their byte ranges. Two items overlap in time
exactly when they share such a set, so the model is the packing problem itself; CP-SAT's
NoOverlap propagation (edge finding, energetic reasoning) and its clause learning do the
search.

Measured on the hard traces (bench/hard_traces.py, 24 traces, 10 s, 2 workers): asked
whether a packing fits at the lower bound, it proves 15/24 optimal, each within 0.1 s,
where tensorplan's own search proves 10/24, but it gives up on every grid-merge and
500-buffer guillotine and pinwheel trace; minimising from the search's packing, it
improves 7 of those by 0.1-6%. So `exact` runs both (offline.solve): the own search, then
this, and keeps the best. The default strategy never imports it: the heuristic stays
dependency-free.
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
from collections.abc import Sequence

from tensorplan.alloc.search.improve import Improved
from tensorplan.machine import cores

# The share of the time given that goes to "does a packing fit at the bound?": CP-SAT
# answered it within 0.1 s on every hard trace it answered at all.
FEASIBILITY_SHARE = 0.2
MAX_BYTES = 1 << 62  # CP-SAT's variables are 64-bit with headroom for its sums


def available() -> bool:
    """Whether OR-Tools can be imported (pip install 'tensorplan[exact]'). Any failure of
    the import (a protobuf it cannot load, say) counts as absent: it is an optional stage."""
    try:
        import ortools.sat.python.cp_model  # noqa: F401
    except Exception:  # noqa: BLE001
        return False
    return True


def maximal_cliques(lo: Sequence[int], hi: Sequence[int]) -> list[list[int]]:
    """The maximal sets of items live at one time (inclusive [lo, hi]), one per time t
    where items start and the first of the live items ends before the next start: every
    set of items live together lies within one of them."""
    order = sorted(range(len(lo)), key=lo.__getitem__)
    starts = sorted(set(lo))
    ends: list[int] = []  # a heap of the live items' last times
    times: list[int] = []
    i = 0
    for j, t in enumerate(starts):
        while i < len(order) and lo[order[i]] == t:
            heapq.heappush(ends, hi[order[i]])
            i += 1
        while ends[0] < t:
            heapq.heappop(ends)
        if j + 1 == len(starts) or ends[0] < starts[j + 1]:
            times.append(t)
    live: list[list[int]] = [[] for _ in times]
    for k, (a, b) in enumerate(zip(lo, hi, strict=True)):
        for c in range(bisect.bisect_left(times, a), bisect.bisect_right(times, b)):
            live[c].append(k)
    return live


def improve(lo: Sequence[int], hi: Sequence[int], size: Sequence[int], found: Improved,
            bound: int, seconds: float) -> Improved:
    """A packing lower than the search's `found`, or the same height proven optimal; else
    `found` itself. First whether one fits at `bound` (FEASIBILITY_SHARE of the time), then
    the lowest CP-SAT reaches from found's offsets. The nodes stay the search's."""
    if found.height >= MAX_BYTES:  # beyond CP-SAT's integer domains: keep the search's
        return found
    cliques = maximal_cliques(lo, hi)
    solved = _solve(size, cliques, bound, None, seconds * FEASIBILITY_SHARE)
    if solved is None:
        solved = _solve(size, cliques, found.height, (found.offsets, bound),
                        seconds * (1 - FEASIBILITY_SHARE))
    if solved is None or (solved.height >= found.height and not solved.proven):
        return found
    return dataclasses.replace(solved, nodes=found.nodes)


def _solve(size: Sequence[int], cliques: list[list[int]], capacity: int,
           minimise: tuple[Sequence[int], int] | None, seconds: float) -> Improved | None:
    """Offsets within `capacity`: any (minimise None), or the lowest peak from the hinted
    offsets down to the bound (minimise = (offsets, bound)); None if none was found."""
    from ortools.sat.python import cp_model

    if seconds <= 0:
        return None
    model = cp_model.CpModel()
    ys = [model.new_int_var(0, max(capacity - n, 0), f"y{k}") for k, n in enumerate(size)]
    ranges = [model.new_fixed_size_interval_var(y, n, f"r{k}") if n else None
              for k, (y, n) in enumerate(zip(ys, size, strict=True))]
    for clique in cliques:
        members = [r for k in clique if (r := ranges[k]) is not None]
        if len(members) > 1:
            model.add_no_overlap(members)
    floor = capacity
    if minimise:
        hint, floor = minimise
        peak = model.new_int_var(floor, capacity, "peak")
        for y, n, at in zip(ys, size, hint, strict=True):
            if n:
                model.add(y + n <= peak)
                model.add_hint(y, at)
        model.add_hint(peak, capacity)
        model.minimize(peak)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = seconds
    solver.parameters.num_workers = _workers()
    status = solver.solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    offsets = [int(solver.value(y)) if n else 0 for y, n in zip(ys, size, strict=True)]
    top = max((o + n for o, n in zip(offsets, size, strict=True)), default=0)
    return Improved(offsets, top, status == cp_model.OPTIMAL or top <= floor, 0)


def _workers() -> int:
    """CP-SAT's parallel portfolio on this process's cores (one worker searches alone)."""
    return min(8, cores())

"""From a heuristic packing to a better one, and where the search can, a proven optimum.

A bisection on the capacity between what is known not to fit and the best packing found:
each capacity is first tried with complete searches taking turns (MiniMalloc's round
robin: three preorders in its order and ours with the corner rule, the node limit
doubling each round), whose "infeasible" is a proof, then with the fail-first valley
search (restarted with varied try orders), whose "infeasible" is one only where every
section is full. The lower bound (peak
live bytes) is tried first: a packing there is optimal by definition.

Work is counted in search nodes and the result depends only on the input and `max_nodes`;
`deadline` (perf_counter seconds) is an extra wall-clock stop. With `split_time` (a search
bounded by the clock alone) the time is shared out like the nodes: the bound's attempt
gets half of it, each later capacity a quarter of what is left, so the bisection moves up
from the bound instead of spending every second there.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from tensorplan.alloc.search import Outcome, Problem, Status, decide
from tensorplan.alloc.valleys import find

VALLEY_NODES = 40  # per item, per valley restart: its finds took 1-30 per item
# The complete searches that take turns: (preorder, MiniMalloc's order); each finds
# packings on traces where the others do not (measured on MiniMalloc's challenging set).
TURNS = (("TWA", True), ("WAT", True), ("TAW", True), ("total", False))


@dataclass(frozen=True, slots=True)
class Improved:
    offsets: list[int]
    height: int
    proven: bool  # height is the optimum
    nodes: int  # search nodes spent


@dataclass
class _Budget:
    nodes: int
    spent: int = 0

    def left(self) -> int:
        return self.nodes - self.spent


def improve(
    lo: Sequence[int],
    hi: Sequence[int],
    size: Sequence[int],
    start: tuple[list[int], int],
    bound: int,
    max_nodes: int,
    deadline: float,
    split_time: bool = False,
) -> Improved:
    """Search below the packing `start` = (offsets, height) of items live over inclusive
    [lo, hi]; never returns a worse packing than `start`."""
    offsets, best = start
    if best <= bound:
        return Improved(offsets, best, True, 0)
    p = Problem(lo, hi, size)
    budget = _Budget(max_nodes)
    floor, proven_floor = bound, True  # capacities below `floor` are known not to fit
    while floor < best and budget.left() > 0 and time.perf_counter() <= deadline:
        cap = floor if floor == bound else (floor + best - 1) // 2
        # the bound gets half the nodes: a packing there needs no further search
        part = 2 if floor == bound else 4
        stop = deadline
        if split_time:
            now = time.perf_counter()
            stop = now + (deadline - now) / part
        out = _attempt(p, cap, max(budget.left() // part, 1), budget, stop)
        if out.status is Status.FOUND:
            assert out.offsets is not None
            offsets, best = out.offsets, out.height
        else:
            floor = cap + 1
            proven_floor = proven_floor and out.status is Status.INFEASIBLE
        if out.status is Status.ABORTED and budget.left() <= 0:
            break
    return Improved(offsets, best, best <= bound or (floor >= best and proven_floor), budget.spent)


def _attempt(p: Problem, cap: int, nodes: int, budget: _Budget, stop: float) -> Outcome:
    """Does a packing fit in `cap`? The complete searches in turn with half the nodes,
    then valley restarts with the rest; all give up at `stop` (perf_counter seconds).

    The complete searches go first because their nodes are the cheap ones (7-10 us on
    MiniMalloc's traces, where a valley node with the check by min offsets costs ~30);
    where they find nothing the valley search gets 4x the nodes it had before they came.
    (A skyline search restarted with jittered orders used to sit between the two: on the
    11 MiniMalloc traces and 16 cut rectangles it found no packing that the valley search
    did not find first, with 200k nodes each, so its nodes went to the complete searches.)"""
    out = _round_robin(p, cap, nodes // 2, budget, stop)
    if out.status is not Status.ABORTED or time.perf_counter() > stop:
        return out
    out = _valley_restarts(p, cap, nodes - out.nodes, budget, stop)
    if out.status is Status.INFEASIBLE and min(p.load, default=0) < cap:
        # only where every section is full does the valley search lose no packing: its
        # "none" elsewhere is no proof, and the bisection takes INFEASIBLE as one
        return Outcome(Status.ABORTED, None, 0, out.nodes)
    return out


def _round_robin(p: Problem, cap: int, nodes: int, budget: _Budget, stop: float) -> Outcome:
    """The complete searches in turn, each with the same node limit, doubled every round
    until one finds a packing or proves there is none, or `nodes` run out; the outcome
    carries the nodes spent in all. The first round gives each turn an eighth of `nodes`
    (so with four turns the second reaches only the first two, with a quarter each): a
    packing the round robin finds at all it found within ~15k nodes on MiniMalloc's traces,
    while the doubling from 2 per item that MiniMalloc uses spent most of the nodes on
    rounds too short to find one."""
    orders = [(p.preorder(key), canonical) for key, canonical in TURNS]
    limit, spent = max(len(p.items), nodes // 16, 32), 0
    out = Outcome(Status.ABORTED, None, 0, 0)
    while spent < nodes:
        limit *= 2
        for order, canonical in orders:
            left = nodes - spent
            if left <= 0:
                break
            out = decide(p, cap, min(limit, left), stop, order, canonical=canonical)
            spent += out.nodes
            budget.spent += out.nodes
            if out.status is not Status.ABORTED or time.perf_counter() > stop:
                return Outcome(out.status, out.offsets, out.height, spent)
    return Outcome(out.status, out.offsets, out.height, spent)


def _valley_restarts(p: Problem, cap: int, nodes: int, budget: _Budget, stop: float) -> Outcome:
    """The fail-first valley search, restarted with seeded tie orders, alternately
    branching only on corners that must be filled and on every corner (with giving its
    section up as the last try where bytes are spare); where no section is tight, every
    corner always. The outcome carries the nodes it spent in all."""
    limit = max(VALLEY_NODES * len(p.items), 64)
    order = p.preorder("total")
    none_tight = max(p.load, default=0) < cap
    # A state's subtree is the same set of tries whatever their order, so the states one
    # restart searched through in vain are dead for the next in the same mode; where every
    # section is full the two modes branch alike and share one table.
    all_full = min(p.load, default=0) >= cap
    # The check by min offsets pays where bytes are spare (grid-merge, 500 buffers: 1.044x
    # to 1.025x); where every section is full it found no packing more on the hard traces
    # and made the 500-buffer guillotine search up to 1.4x slower.
    energetic = not all_full
    dead: dict[bool, set[int]] = {}
    spent, seed = 0, 0
    out = Outcome(Status.ABORTED, None, 0, 0)
    while spent < nodes:
        every_corner = none_tight or seed % 2 == 1
        table = dead.setdefault(every_corner and not all_full, set())
        left = min(limit, nodes - spent)
        out = find(p, cap, left, stop, order, seed // 2, every_corner, table, energetic)
        spent += out.nodes
        budget.spent += out.nodes
        seed += 1
        # a tree that had no try at its root would cost no node: restarting cannot help
        if out.status is Status.FOUND or out.nodes == 0 or time.perf_counter() > stop:
            break
    return Outcome(out.status, out.offsets, out.height, spent)

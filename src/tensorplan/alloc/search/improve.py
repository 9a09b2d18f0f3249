"""From a heuristic packing to a better one, and where the search can, a proven optimum.

A bisection on the capacity between what is known not to fit and the best packing found.
Each capacity is first tried on the merged problems (merge.py: items stacked or continued
into blocks, a guess at the trace's structure whose packings are packings of the items),
then on the items themselves: complete searches taking turns (MiniMalloc's round robin:
three preorders in its order and ours with the corner rule, the node limit doubling each
round), whose "infeasible" is a proof, then the fail-first valley search (restarted with
varied try orders), whose "infeasible" is one only where every section is full. The lower
bound (peak live bytes) is tried first: a packing there is optimal by definition. Where a
bisection ends on capacities it gave up on unproven, with nodes and time left, it starts
again between the proven floor and the best packing, its restarts tie-broken afresh.

Work is counted in search nodes, and where the nodes run out before any clock stop the
result depends only on the input and `max_nodes`; `deadline` (perf_counter seconds) is an
extra wall-clock stop, and each stage of an attempt stops at its share of the time to it,
so on a trace whose nodes are slow a stage may end on its share of the clock before its
nodes, and the result then depends on the machine. With `split_time` (a search
bounded by the clock alone) the time is shared out like the nodes: the bound's attempt
gets half of it, each later capacity a quarter of what is left, so the bisection moves up
from the bound instead of spending every second there.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tensorplan.alloc.search.dfs import Outcome, OutOfTime, Problem, Status, decide
from tensorplan.alloc.search.merge import Merged, guesses
from tensorplan.alloc.search.repair import repair
from tensorplan.alloc.search.valleys import find

VALLEY_NODES = 40  # per item, per valley restart: its finds took 1-30 per item
# The same where every section is full: there the finds came at 1-5 per item (pinwheel,
# 300 and 500 buffers, at the bound), in one of the later tie orders, which 40 per item
# reached only after the bound's share of the nodes was spent
TIGHT_NODES = 10
# The complete searches that take turns: (preorder, MiniMalloc's order); each finds
# packings on traces where the others do not (measured on MiniMalloc's challenging set).
TURNS = (("TWA", True), ("WAT", True), ("TAW", True), ("total", False))
# The valley restarts' tie orders, in turn: each found packings the others did not
VALLEY_ORDERS = ("total", "TAW", "area")
BOUND_PART = 2  # the bound's attempt gets 1/BOUND_PART of the nodes (and time)
# A sweep ends where the best packing is within 1/SWEEP_GAP of the bound above a floor it
# gave up on: on a 558-buffer grid the bisection went on in ever shorter attempts (a
# quarter of the time left each) from 1.049x to 1.051x until the clock ran out.
SWEEP_GAP = 512
GUESS_SHARE = 8  # each merged problem (merge.py) gets this fraction of a capacity's nodes
# The repair (repair.py) after the search. A search still more than REPAIR_ABOVE (a
# fraction of the bound) above the bound once it has had 1 - REPAIR_SHARE of the time
# stops before its next attempt and leaves the rest to the repair: on pinwheel 1,000
# (seed 3) the bisection's last 2.5 s found nothing, the repair took 1.069x to 1.035x in
# them. A search that came nearer keeps its time (its finds there come late: pinwheel 800,
# seed 4, 1.001x at 6 s; reserving the time for the repair left 1.015x), and the repair
# gets only what it leaves. Its own work limit is REPAIR_MOVES moves per item, so where
# the moves run out first the result depends only on the input (100 ran out in 2.2 s of
# pinwheel 1,000 seed 3's 2.5 once moves cost ~20 us: the clock is the limit again).
REPAIR_SHARE = 0.3
REPAIR_ABOVE = 0.03
REPAIR_MOVES = 1000


# the caller's greedy passes: (lo, hi inclusive, sizes) -> offsets
Greedy = Callable[[Sequence[int], Sequence[int], Sequence[int]], list[int]]


@dataclass(frozen=True, slots=True)
class Improved:
    offsets: list[int]
    height: int
    proven: bool  # height is the optimum
    nodes: int  # search nodes spent


@dataclass
class _Guess:
    """A merged problem and the highest capacity it found no packing in: below that it
    is not tried again (a packing that did not turn up there is rarer still lower)."""

    merged: Merged
    problem: Problem
    failed: int = -1


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
    greedy: Greedy | None = None,
    repairs: bool = False,
) -> Improved:
    """Search below the packing `start` = (offsets, height) of items live over inclusive
    [lo, hi]; never returns a worse packing than `start`. `greedy` (the caller's greedy
    passes: offsets for items over inclusive [lo, hi] with sizes) also packs each merged
    problem before the search, and the lowest of those packings is where it starts.
    `repairs`: where the search ends unproven, the repair (repair.py) goes on from its best
    packing, with REPAIR_SHARE of the time kept back from the search for it."""
    offsets, best = start
    if best <= bound:
        return Improved(offsets, best, True, 0)
    now = time.perf_counter()
    # past this, a search still more than REPAIR_ABOVE above the bound hands over
    handover = now + (deadline - now) * (1 - REPAIR_SHARE) if repairs else float("inf")
    found = _bisect(lo, hi, size, (offsets, best), bound, max_nodes, deadline, split_time,
                    greedy, handover)
    if not repairs or found.proven or time.perf_counter() > deadline:
        return found
    offsets, height, _ = repair(lo, hi, size, found.offsets, found.height, bound, deadline,
                                REPAIR_MOVES * len(size))
    if height >= found.height:
        return found
    return Improved(offsets, height, height <= bound, found.nodes)


def _bisect(
    lo: Sequence[int],
    hi: Sequence[int],
    size: Sequence[int],
    start: tuple[list[int], int],
    bound: int,
    max_nodes: int,
    deadline: float,
    split_time: bool,
    greedy: Greedy | None,
    handover: float,
) -> Improved:
    """improve's search: the greedy passes on the merged problems, then the bisection,
    which ends early where it is past `handover` (perf_counter seconds) and its best
    packing is still more than REPAIR_ABOVE above the bound."""
    offsets, best = start
    try:  # building the problems of a dense trace can take longer than the whole budget
        p = Problem(lo, hi, size, deadline)
        merged = [_Guess(m, Problem(m.lo, m.hi, m.size, deadline))
                  for m in guesses(lo, hi, size)]
    except OutOfTime:
        return Improved(offsets, best, False, 0)
    if greedy is not None:
        offsets, best = _greedy_on_guesses(merged, size, (offsets, best), greedy, deadline)
        if best <= bound:
            return Improved(offsets, best, True, 0)
    budget = _Budget(max_nodes)
    known = bound  # capacities below `known` are proven not to fit
    sweep = 0  # a bisection that gave up on capacities unproven starts again, varied
    while best > known and budget.left() > 0 and time.perf_counter() <= deadline:
        floor, spent = known, budget.spent  # below `floor`: proven, or given up this sweep
        while floor < best and budget.left() > 0 and time.perf_counter() <= deadline:
            if floor > known and best - floor <= bound // SWEEP_GAP:
                break  # finer steps above a floor given up on cost time, not bytes
            first = sweep == 0 and floor == bound
            if time.perf_counter() > handover and best - bound > bound * REPAIR_ABOVE:
                return Improved(offsets, best, best <= known, budget.spent)  # the repair's turn
            cap = floor if first else (floor + best - 1) // 2
            # the bound gets half the nodes: a packing there needs no further search
            part = BOUND_PART if first else 4
            stop = _share(deadline, part) if split_time else deadline
            out = _attempt(p, merged, cap, max(budget.left() // part, 1), budget, stop, sweep,
                           cap > bound)
            if out.status is Status.FOUND:
                assert out.offsets is not None
                offsets, best = out.offsets, out.height
                continue
            if out.status is Status.INFEASIBLE:  # a proof for every capacity up to cap
                known = max(known, cap + 1)
            floor = cap + 1
        if budget.spent == spent:
            break  # nothing searched: another sweep would not either
        sweep += 1
    return Improved(offsets, best, best <= known, budget.spent)


def _greedy_on_guesses(
    merged: list[_Guess], size: Sequence[int], start: tuple[list[int], int], greedy: Greedy,
    deadline: float,
) -> tuple[list[int], int]:
    """The lowest of `start` and the greedy packings of the merged problems. Where the
    search finds nothing above the bound this is what the user gets, and blocks that
    rebuild part of the trace's rectangles pack tighter than its pieces: on the cut
    rectangles 1.12x instead of 1.32x (pinwheel, 800 buffers), 1.00x instead of 1.46x
    (guillotine, 800), at ~0.1 s a problem."""
    offsets, best = start
    for g in merged:
        if time.perf_counter() > deadline:
            break
        m = g.merged
        out = m.expand(greedy(m.lo, m.hi, m.size))
        height = max([o + z for o, z in zip(out, size, strict=True)], default=0)
        if height < best:
            offsets, best = out, height
    return offsets, best


def _attempt(
    p: Problem, merged: list[_Guess], cap: int, nodes: int, budget: _Budget, stop: float,
    sweep: int = 0, above: bool = False,
) -> Outcome:
    """Does a packing fit in `cap`? First the merged problems (guessed structure, each with
    1/GUESS_SHARE of the nodes: a packing of one is one of p; their "none" proves
    nothing), then p itself with the rest; all give up at `stop` (perf_counter seconds).
    `above`: cap is above the lower bound."""
    spent = 0
    for g in merged:
        if cap <= g.failed:
            continue
        share = _share(stop, GUESS_SHARE)
        out = _search(g.problem, cap, max(nodes // GUESS_SHARE, 1), budget, share)
        spent += out.nodes
        if out.status is Status.FOUND:
            assert out.offsets is not None
            return Outcome(Status.FOUND, g.merged.expand(out.offsets), out.height, spent)
        g.failed = cap
        if time.perf_counter() > stop:
            return Outcome(Status.ABORTED, None, 0, spent)
    # the complete searches on the items found packings only at the bound and only where
    # some section had bytes to spare (elsewhere the valley search is complete too)
    full = min(p.load, default=0) >= cap
    out = _search(p, cap, max(nodes - spent, 1), budget, stop, sweep, 4 if above or full else 2)
    return Outcome(out.status, out.offsets, out.height, spent + out.nodes)


def _search(
    p: Problem, cap: int, nodes: int, budget: _Budget, stop: float, sweep: int = 0,
    part: int = 2,
) -> Outcome:
    """The complete searches in turn with 1/part of the nodes, then valley restarts with
    the rest. (Above the bound, and where every section is full, the items' complete
    searches get a quarter: on the 24 cut rectangles and MiniMalloc's 11 they found no
    packing there, the valley search all.)

    The complete searches go first because their nodes are the cheap ones (7-10 us on
    MiniMalloc's traces, where a valley node with the check by min offsets costs ~30);
    where they find nothing the valley search gets 4x the nodes it had before they came.
    (A skyline search restarted with jittered orders used to sit between the two: on the
    11 MiniMalloc traces and 16 cut rectangles it found no packing that the valley search
    did not find first, with 200k nodes each, so its nodes went to the complete searches.)"""
    out = _round_robin(p, cap, nodes // part, budget, _share(stop, part))
    if out.status is not Status.ABORTED or time.perf_counter() > stop:
        return out
    rest = _valley_restarts(p, cap, nodes - out.nodes, budget, stop, sweep)
    spent = out.nodes + rest.nodes
    if rest.status is Status.INFEASIBLE and min(p.load, default=0) < cap:
        # only where every section is full does the valley search lose no packing: its
        # "none" elsewhere is no proof, and the bisection takes INFEASIBLE as one
        return Outcome(Status.ABORTED, None, 0, spent)
    return Outcome(rest.status, rest.offsets, rest.height, spent)


def _share(stop: float, part: int) -> float:
    """A stop 1/part of the way from now to `stop`: a stage gets the share of the time it
    gets of the nodes (where the clock comes first, the first stage took all of it: on a
    500-buffer grid the complete searches spent an attempt's whole time, where the valley
    search, never reached, finds a packing at 1.04x in 3k nodes)."""
    now = time.perf_counter()
    return now + (stop - now) / part


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


def _valley_restarts(
    p: Problem, cap: int, nodes: int, budget: _Budget, stop: float, sweep: int = 0
) -> Outcome:
    """The fail-first valley search, restarted with tie orders from three preorders in
    turn (then the same, jittered: valleys.py), alternately branching only on corners
    that must be filled and on every corner (with giving its section up as the last try
    where bytes are spare), each order in both; where no section is tight, every corner
    always; where every section is full (the modes branch alike), one short run per order
    (TIGHT_NODES). A mode whose tree a run searched through is not run again: its tree
    is the same whatever the order. The outcome carries the nodes it spent in all."""
    limit = max(VALLEY_NODES * len(p.items), 64)
    tight_limit = max(TIGHT_NODES * len(p.items), 64)
    orders = [p.preorder(key) for key in VALLEY_ORDERS]
    none_tight = max(p.load, default=0) < cap
    # A state's subtree is the same set of tries whatever their order, so the states one
    # restart searched through in vain are dead for the next in the same mode; where every
    # section is full the two modes branch alike and share one table.
    all_full = min(p.load, default=0) >= cap
    # The check by min offsets: where bytes are spare it took the 500-buffer grid-merge
    # from 1.044x to 1.025x; where every section is full it costs up to 1.4x per node
    # (500-buffer guillotine) but prunes runs into finds: with the short, preordered
    # runs there the 500-buffer pinwheel (seed 1) reached the bound in 3 row orders of 3,
    # without it in 1, and the 300-buffer one (seed 2) was proven.
    energetic = True
    dead: dict[bool, set[int]] = {}
    spent, seed = 0, 0
    out = Outcome(Status.ABORTED, None, 0, 0)
    base = 0x5EED * sweep  # a later sweep's restarts tie-break afresh
    exhausted: set[bool] = set()  # the modes whose whole tree a run searched in vain
    while spent < nodes:
        every_corner = none_tight or seed % 2 == 1
        if every_corner in exhausted:
            seed += 1  # the other mode's turn
            continue
        table = dead.setdefault(every_corner and not all_full, set())
        left = min(tight_limit if all_full else limit, nodes - spent)
        # restart r: preorder r mod 3 (the tie order), jittered from its second round on
        # (every round, in a later sweep); where the two modes differ, each order runs in
        # both
        run = seed if none_tight or all_full else seed // 2
        order = orders[run % len(orders)]
        jitter = run // len(orders)
        out = find(p, cap, left, stop, order, base + jitter, every_corner, table, energetic)
        spent += out.nodes
        budget.spent += out.nodes
        seed += 1
        # a tree that had no try at its root would cost no node: restarting cannot help
        if out.status is Status.FOUND or out.nodes == 0 or time.perf_counter() > stop:
            break
        if out.status is Status.INFEASIBLE:
            # every later run in this mode would say so again, in a node or two each, and
            # the last one, cut short by the nodes, would turn the answer into ABORTED
            exhausted.add(every_corner)
            if all_full or none_tight or len(exhausted) == 2:
                break
    return Outcome(out.status, out.offsets, out.height, spent)

"""A skyline search that fills the most constrained valley first, for finding packings.

The skyline is each section's floor: below it every byte is decided (an item, or given
up). A *valley* is a run of sections at one floor f with higher (or no) neighbours on both
sides. In a section with no byte to spare (floor + bytes left = capacity), nothing below
the capacity may stay empty, so the point at height f on a valley's left edge must be the
bottom-left corner of an item that starts there and ends inside the valley; likewise its
right edge needs an item ending there. Every such corner is a constraint any packing meets.

So at each node the search lists the corners of every valley and branches on the one with
the fewest candidate items (fail first): none left means this branch is dead long before
the lowest-leftmost rule would notice, one is a forced move. Where no valley has a
mandatory corner, it fills the lowest valley's left corner or gives that stretch up, as
the plain skyline does; with `every_corner` it treats every corner as binding instead,
giving up only the corner's own section as the last try where bytes are spare.

Candidates are tried in a value order that prefers items closing the valley exactly (the
item reaches the far wall) and items whose top is flush with the neighbouring floor, then
the caller's order (seed 0) or, on restarts, that order with each rank nudged by seeded
Gaussian noise. Where every section is tight the branching loses no packing, so
"infeasible" is a proof there; elsewhere giving a stretch up loses packings and
"infeasible" means only that this tree had none.
"""

from __future__ import annotations

import random

from tensorplan.alloc.search.dfs import Outcome, Problem, Status, Undo, _Search

# (first section, stop section, floor, side: 1 left corner, -1 right corner, 0 open valley)
Spot = tuple[int, int, int, int]
ZOBRIST_SEED = 18  # fixed, so restarts sharing a table code the placed sets alike
JITTER = 0.05  # a restart's tie ranks move by this part of the item count (a Gaussian's sd)
MAX_DEAD = 1 << 18  # dead states remembered (hashes, ~80 B each: ~20 MB) before a reset


class Valleys(_Search):
    """Fail-first skyline search: the most constrained valley corner is filled next."""

    MONOTONE = False  # valleys are filled in any order

    def __init__(
        self,
        p: Problem,
        capacity: int,
        order: list[int],
        seed: int = 0,
        every_corner: bool = False,
        dead: set[int] | None = None,
        energetic: bool = False,
    ) -> None:
        super().__init__(p, capacity, order)
        self.every_corner = every_corner
        self.energetic = energetic
        self.dead: set[int] = set() if dead is None else dead
        # the placed set as an XOR of fixed random 64-bit codes (one per item): an int's
        # own hash is taken mod 2^61 - 1, so bit sets like {k, k + 61} and {k + 1} collide
        codes = random.Random(ZOBRIST_SEED)
        self.code = [codes.getrandbits(64) for _ in range(p.n)]
        self.placed_code = 0
        n_sec = p.n_sections
        self.starts: list[list[int]] = [[] for _ in range(n_sec + 1)]
        self.ends: list[list[int]] = [[] for _ in range(n_sec + 1)]
        for k in sorted(p.items, key=self.try_key.__getitem__):
            self.starts[p.first[k]].append(k)
            self.ends[p.stop[k]].append(k)
        rng = random.Random(seed)
        # ties in the value order: the caller's order, jittered on restarts (seed > 0). A
        # preorder's rank, nudged, found packings a uniform shuffle did not: on grid-merge
        # and pinwheel traces 8 of 54 jittered runs found one, 1 of 40 shuffled runs did
        spread = JITTER * len(p.items) if seed else 0.0
        self.tie = [0.0] * p.n
        for k in p.items:
            self.tie[k] = self.try_key[k] + (rng.gauss(0.0, spread) if seed else 0.0)

    def _first(self) -> list[int]:
        return self._next(-1)

    def _state_key(self) -> int:
        """What decides the rest of the search: the items placed and the skyline (the
        candidates, their order and every check depend on nothing else that matters; the
        offsets inside a column only feed min offsets, which prune, never add, tries)."""
        return hash((self.placed_code, tuple(self.floor)))

    def _exhausted(self) -> None:
        if len(self.dead) >= MAX_DEAD:
            self.dead.clear()  # a bound on memory; forgetting only costs nodes
        self.dead.add(self._state_key())

    def _known_dead(self) -> bool:
        return self._state_key() in self.dead

    def _place(self, k: int, o: int) -> tuple[Undo, bool, bool]:
        self.placed_code ^= self.code[k]
        return super()._place(k, o)

    def _restore(self, undo: Undo) -> None:
        if undo[0] >= 0:
            self.placed_code ^= self.code[undo[0]]
        super()._restore(undo)

    def _next(self, k: int) -> list[int]:
        self.spot, cands = self._choose()
        return cands or []  # None, a dead end: no try here

    def _step(self, k: int, spot: tuple[int, ...]) -> tuple[Undo, bool, bool]:
        if k >= 0:
            undo, _, ok = self._place(k, spot[2])
            return undo, False, ok  # no hatless pruning: its argument assumes rising offsets
        undo = self._give_up(spot)
        return undo, False, self._fits(undo[2])

    def _choose(self) -> tuple[Spot, list[int] | None]:
        """The corner to branch on and its candidates in value order; None: a dead end."""
        floor, left, cap = self.floor, self.left, self.cap
        s0, n_sec = self.s0, self.s1  # the part's sections: its edges are walls
        best: Spot | None = None
        best_cands: list[int] = []
        lowest: tuple[int, int, int] | None = None  # open valley: (floor, first, stop)
        s = s0
        while s < n_sec:
            if not left[s]:
                s += 1
                continue
            f = floor[s]
            b = s + 1
            while b < n_sec and left[b] and floor[b] == f:
                b += 1
            a = s
            s = b
            if (a > s0 and left[a - 1] and floor[a - 1] < f) or (
                b < n_sec and left[b] and floor[b] < f
            ):
                continue  # a step, not a valley
            tight_l = f + left[a] >= cap
            tight_r = f + left[b - 1] >= cap
            if not (tight_l or tight_r or self.every_corner):
                if lowest is None or f < lowest[0]:
                    lowest = (f, a, b)
                continue
            for side, tight in ((1, tight_l), (-1, tight_r)):
                if not (tight or self.every_corner):
                    continue
                cands = self._corner_items(a, b, f, side)
                if not tight:
                    cands.append(-1)  # the corner may stay empty: give its section up
                if not cands:
                    return (a, b, f, side), None
                if best is None or len(cands) < len(best_cands):
                    best, best_cands = (a, b, f, side), cands
                    if len(cands) == 1:
                        return best, best_cands
        if best is not None:
            return best, self._value_order(best, best_cands)
        if lowest is None:
            return (0, 0, 0, 0), None
        f, a, b = lowest
        spot = (a, b, f, 0)
        cands = self._value_order(spot, self._corner_items(a, b, f, 1))
        cands.append(-1)  # bytes to spare here: leaving them empty is a try
        return spot, cands

    def _corner_items(self, a: int, b: int, f: int, side: int) -> list[int]:
        """Unplaced items at the valley's left (side 1) or right (-1) corner that fit."""
        off, size, cap, first, stop = self.off, self.p.size, self.cap - f, self.p.first, self.p.stop
        if side == 1:
            return [k for k in self.starts[a] if off[k] < 0 and stop[k] <= b and size[k] <= cap]
        return [k for k in self.ends[b] if off[k] < 0 and first[k] >= a and size[k] <= cap]

    def _value_order(self, spot: Spot, cands: list[int]) -> list[int]:
        if cands and cands[-1] < 0:
            return [*self._value_order(spot, cands[:-1]), -1]
        a, b, f, side = spot
        floor, left, n_sec = self.floor, self.left, self.s1
        size, first, stop, tie = self.p.size, self.p.first, self.p.stop, self.tie
        left_h = floor[a - 1] if a > self.s0 and left[a - 1] else -1
        right_h = floor[b] if b < n_sec and left[b] else -1

        def key(k: int) -> tuple[int, int, float]:
            top = f + size[k]
            closes = (stop[k] == b) if side >= 0 else (first[k] == a)
            flush = top == left_h or top == right_h
            return (0 if closes else 1, 0 if flush else 1, tie[k])

        return sorted(cands, key=key)

    def _give_up(self, spot: tuple[int, ...]) -> Undo:
        """Raise the open valley (side 0), or only its corner's section, to the lower
        higher neighbour (or by the smallest item there)."""
        a, b, f, side = spot
        if side == 1:
            b = a + 1
        elif side == -1:
            a = b - 1
        return self._raise_stretch(a, b, f)


def find(
    p: Problem,
    capacity: int,
    max_nodes: int,
    deadline: float,
    order: list[int],
    seed: int = 0,
    every_corner: bool = False,
    dead: set[int] | None = None,
    energetic: bool = False,
) -> Outcome:
    """One fail-first skyline search for a packing within `capacity`. `dead` (shared by
    the caller between searches of one capacity and mode) holds the states searched
    through in vain; a restart skips them whatever its try order. `energetic` adds the
    check by min offsets (dfs.py) at every placement that raises one."""
    if not p.items:
        return Outcome(Status.FOUND, [0] * p.n, 0, 0)
    v = Valleys(p, capacity, order, seed, every_corner, dead, energetic)
    return v.run(max_nodes, deadline)

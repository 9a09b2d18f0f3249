"""Exact packing by depth-first search over canonical solutions, on plain ints.

The decision problem: can items live over inclusive [lo, hi] with sizes be placed in
`capacity` bytes? Ideas after MiniMalloc (Moffitt, ASPLOS'23), in our own code:

- Canonical solutions. Any packing can be pushed down until each item rests at 0 or on an
  item live at the same time; listing those items by offset, each one sits at its *min
  offset*: the highest top of the items listed before it that it meets. So the search only
  branches on which item comes next, placed at its min offset, offsets never decreasing
  (ties broken by a fixed preorder).
- Dominance. If some unplaced item could still fit entirely below the candidate's offset
  (its min offset + size <= that offset), the candidate would leave a gap that item fits
  in; the packing with the item moved down is found on another branch. Skip.
- Cross-section inference. Time is cut into sections where the set of live items is
  constant. Each section has a floor (the top of what is placed there, and at least the
  lowest min offset of what is left, and at least the current offset as offsets never
  decrease) and the bytes still to place there. floor + bytes left > capacity: prune.
- Hatless pruning. An item that meets no unplaced item changes nothing for the rest; if
  the subtree after it fails, its siblings fail too.
- Dynamic decomposition. Where no unplaced item crosses a section boundary any more, the
  two sides share nothing left to decide: each side is searched on its own and the part
  fails if any side does, so a dead end on one side never sends the search back through
  the choices of the other (without it, the search tried every combination of the two).

The search counts nodes (placements tried). `max_nodes` makes it stop deterministically;
a deadline (perf_counter seconds) is an extra wall-clock stop.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum


class Status(Enum):
    FOUND = "found"
    INFEASIBLE = "infeasible"  # the whole tree was searched: no packing fits
    ABORTED = "aborted"  # out of nodes or time before an answer


@dataclass(frozen=True, slots=True)
class Outcome:
    status: Status
    offsets: list[int] | None  # per item, when FOUND
    height: int  # the packing's highest top, when FOUND
    nodes: int  # placements tried


class Problem:
    """What the search precomputes once per trace: sections, overlaps, preorder.

    Zero-size items take no bytes and are left out (offset 0)."""

    def __init__(self, lo: Sequence[int], hi: Sequence[int], size: Sequence[int],
                 deadline: float = float("inf")) -> None:
        """OutOfTime past `deadline`: the overlap lists of a dense trace are quadratic (20,000
        items took 50 s before any search, whatever the budget)."""
        self.n = len(size)
        self.size = list(size)
        items = [k for k in range(self.n) if size[k] > 0]
        cuts = sorted({lo[k] for k in items} | {hi[k] + 1 for k in items})
        # item k lives in sections [first[k], stop[k]) of the cut points
        self.first = [bisect.bisect_left(cuts, lo[k]) for k in range(self.n)]
        self.stop = [bisect.bisect_left(cuts, hi[k] + 1) for k in range(self.n)]
        self.n_sections = max(len(cuts) - 1, 0)
        self.members: list[list[int]] = [[] for _ in range(self.n_sections)]
        for k in items:
            for s in range(self.first[k], self.stop[k]):
                self.members[s].append(k)
        self.overlaps = _overlaps(items, self.first, self.stop, deadline)
        self.items = items
        self.load = [sum(size[k] for k in m) for m in self.members]
        self.lifetime = [hi[k] - lo[k] + 1 for k in range(self.n)]  # in time steps

    def preorder(self, key: str) -> list[int]:
        """Items in a tie-break order. "total", "width", "area": the busiest section first,
        then the longest lifetime in sections, then the largest area (or led by one of the
        others). "WAT", "TAW", "TWA": MiniMalloc's three, in time steps: W the lifetime,
        A the size x lifetime, T the busiest section, compared in the letters' order."""
        busiest = [max(self.load[self.first[k] : self.stop[k]], default=0) for k in range(self.n)]
        if key in ("total", "width", "area"):
            width = [self.stop[k] - self.first[k] for k in range(self.n)]
            area = [width[k] * self.size[k] for k in range(self.n)]
            keys = {
                "total": lambda k: (-busiest[k], -width[k], -area[k], k),
                "width": lambda k: (-width[k], -area[k], -busiest[k], k),
                "area": lambda k: (-area[k], -busiest[k], -width[k], k),
            }
            return sorted(self.items, key=keys[key])
        life = self.lifetime
        by = {"W": life, "A": [life[k] * self.size[k] for k in range(self.n)], "T": busiest}
        a, b, c = (by[ch] for ch in key)
        return sorted(self.items, key=lambda k: (-a[k], -b[k], -c[k], k))


class OutOfTime(Exception):
    """A Problem's deadline passed while it was being built."""


def _overlaps(items: list[int], first: list[int], stop: list[int],
              deadline: float = float("inf")) -> list[list[int]]:
    """For every item, the items sharing a section with it (a sweep over start sections)."""
    out: list[list[int]] = [[] for _ in range(len(first))]
    live: list[int] = []
    for n, k in enumerate(sorted(items, key=first.__getitem__)):
        if n % 64 == 0 and time.perf_counter() > deadline:
            raise OutOfTime
        live = [j for j in live if stop[j] > first[k]]
        for j in live:
            out[j].append(k)
            out[k].append(j)
        live.append(k)
    return out


Undo = tuple[int, list[tuple[int, int]], list[tuple[int, int]]]  # item, min offsets, floors


class _Frame:
    """One level of the search: the candidates for the next item, the one being tried, and
    where they were listed for (a variant's `spot`, what its tries need)."""

    __slots__ = ("cands", "spot", "i", "undo", "parts", "hatless")

    def __init__(self, cands: list[int], spot: tuple[int, ...]) -> None:
        self.cands, self.spot = cands, spot
        self.i = 0
        self.undo: Undo | None = None
        self.parts: list[Undo] = []  # the placements of the pieces the try split off
        self.hatless = False


class _Search:
    """The state of one decision search: offsets, min offsets, section floors and bytes
    left, changed in place on the way down and restored on the way back."""

    # Offsets never decrease down a branch, so whatever is left goes above the last one.
    MONOTONE = True

    def __init__(self, p: Problem, capacity: int, order: list[int]) -> None:
        self.p, self.cap = p, capacity
        # Canonical order among items at one offset: by start (they never meet), which the
        # corner rule needs; `order` only decides which candidate is tried first.
        self.order = sorted(p.items, key=lambda k: (p.first[k], k))
        self.rank = [0] * p.n
        for r, k in enumerate(self.order):
            self.rank[k] = r
        self.try_key = [0] * p.n
        for r, k in enumerate(order):
            self.try_key[k] = r
        self.off = [-1] * p.n
        self.min_off = [0] * p.n
        self.floor = [0] * p.n_sections
        self.left = list(p.load)
        self.placed = 0
        self.energetic = False  # the check by min offsets below; off by default
        self.spot: tuple[int, ...] = ()  # set by variants as they list candidates
        # unplaced items across each boundary between sections s and s + 1
        self.cuts = [0] * max(p.n_sections - 1, 0)
        for k in p.items:
            for s in range(p.first[k], p.stop[k] - 1):
                self.cuts[s] += 1
        self.zero: list[int] = []  # boundaries the last placement left uncrossed
        # the part being searched: sections [s0, s1), its items in canonical order, and
        # the count of placed items at which it is done
        self.s0, self.s1, self.part, self.goal = 0, p.n_sections, self.order, len(p.items)
        self.kept: list[Undo] = []  # a part found: its placements, in the order made
        self.nodes, self.max_nodes, self.deadline = 0, 0, 0.0

    def run(self, max_nodes: int, deadline: float) -> Outcome:
        self.nodes, self.max_nodes, self.deadline = 0, max_nodes, deadline
        if max(self.left, default=0) > self.cap:
            return self._outcome(Status.INFEASIBLE, 0)
        zero = [s + 1 for s, c in enumerate(self.cuts) if c == 0]
        status = self._split(zero)[0] if zero else None
        if status is None:
            status = self._dfs()
        return self._outcome(status, self.nodes)

    def _dfs(self) -> Status:
        """Depth-first search of the current part. FOUND leaves its items placed, their
        undo records in `kept`; otherwise the state is as it was (unless ABORTED)."""
        stack = [_Frame(self._first(), self.spot)]
        while stack:
            fr = stack[-1]
            if fr.undo is not None:  # back from the subtree under fr's last try: it failed
                self._unwind(fr.parts)
                fr.parts = []
                self._restore(fr.undo)
                fr.undo = None
                if fr.hatless:
                    stack.pop()
                    continue
            if fr.i == len(fr.cands):
                stack.pop()
                self._exhausted()
                continue
            k = fr.cands[fr.i]
            fr.i += 1
            self.nodes += 1
            if self.nodes > self.max_nodes or (
                self.nodes & 255 == 0 and time.perf_counter() > self.deadline
            ):
                self.nodes -= 1
                return Status.ABORTED
            self.zero = []
            fr.undo, fr.hatless, ok = self._step(k, fr.spot)
            if not ok:
                continue
            if self.placed == self.goal:
                self._keep(stack)
                return Status.FOUND
            if self._known_dead():
                continue
            if self.zero:
                status, fr.parts = self._split(self.zero)
                if status is Status.FOUND:
                    self._keep(stack)
                    return status
                if status is Status.ABORTED:
                    return status
                if status is Status.INFEASIBLE:
                    self._exhausted()
                    continue
            cands = self._next(k)
            if cands:
                stack.append(_Frame(cands, self.spot))
            else:
                self._exhausted()
        return Status.INFEASIBLE

    def _keep(self, stack: list[_Frame]) -> None:
        """The part is done: its placements, with those of any pieces split off on the
        way, in the order they were made, go to `kept`."""
        self.kept = [u for f in stack for u in (f.undo, *f.parts) if u is not None]

    def _split(self, zero: list[int]) -> tuple[Status | None, list[Undo]]:
        """The current part falls apart at the section boundaries `zero`: search every
        piece that has items left on its own. None where only one piece has any (the part
        goes on as it is); FOUND with the pieces' placements, else their status."""
        first = self.p.first
        edges = [self.s0, *sorted(zero), self.s1]
        pieces: list[list[int]] = [[] for _ in range(len(edges) - 1)]
        for k in self.part:
            if self.off[k] < 0:
                pieces[bisect.bisect_right(edges, first[k]) - 1].append(k)
        if sum(1 for items in pieces if items) < 2:
            return None, []
        outer = self.s0, self.s1, self.part, self.goal
        done: list[Undo] = []
        status = Status.FOUND
        for i, items in enumerate(pieces):
            if not items:
                continue
            self.s0, self.s1, self.part = edges[i], edges[i + 1], items
            self.goal = self.placed + len(items)
            status = self._dfs()
            if status is not Status.FOUND:
                break
            done += self.kept
        self.s0, self.s1, self.part, self.goal = outer
        if status is Status.INFEASIBLE:
            self._unwind(done)
            done = []
        return status, done

    def _unwind(self, undos: list[Undo]) -> None:
        for undo in reversed(undos):
            self._restore(undo)

    def _first(self) -> list[int]:
        return self._candidates(0, -1)

    def _exhausted(self) -> None:
        """Called where the subtree under the current state was searched through in vain
        (a variant may remember the state)."""

    def _known_dead(self) -> bool:
        """Whether the current state was already searched through in vain."""
        return False

    def _step(self, k: int, spot: tuple[int, ...]) -> tuple[Undo, bool, bool]:
        return self._place(k, self.min_off[k])

    def _next(self, k: int) -> list[int]:
        return self._candidates(self.off[k], self.rank[k])

    def _candidates(self, o: int, rank: int) -> list[int]:
        """Unplaced items that may come next after one placed at `o` with preorder rank
        `rank`: canonical (offsets never decrease) and leaving no gap another item fits."""
        off, min_off, size, rk = self.off, self.min_off, self.p.size, self.rank
        corner = self._corner()
        if corner is not None:
            s, f = corner
            first = self.p.first
            cands = [
                k
                for k in self.p.members[s]
                if off[k] < 0 and first[k] == s and min_off[k] == f and (f > o or rk[k] > rank)
            ]
            cands.sort(key=self.try_key.__getitem__)
            return cands
        rest = [k for k in self.part if off[k] < 0]
        lowest_top = min([min_off[k] + size[k] for k in rest])
        cands = [
            k for k in rest if o <= min_off[k] < lowest_top and (min_off[k] > o or rk[k] > rank)
        ]
        tk = self.try_key
        cands.sort(key=lambda k: (min_off[k], tk[k]))  # lowest first; ties in the try order
        return cands

    def _corner(self) -> tuple[int, int] | None:
        """(section, floor) of the lowest-leftmost point still to fill, when that section
        has no byte to spare: the point must be covered, by an item starting there."""
        floor, left = self.floor, self.left
        lowest, at = -1, -1
        for s in range(self.s0, self.s1):
            f = floor[s]
            if left[s] and (at < 0 or f < lowest):
                lowest, at = f, s
        if at < 0 or lowest + left[at] < self.cap:
            return None
        return at, lowest

    def _place(self, k: int, o: int) -> tuple[Undo, bool, bool]:
        """Put item k at o; returns the undo record, whether k met no unplaced item, and
        whether the state passes the cross-section check."""
        p, off, min_off, floor, left = self.p, self.off, self.min_off, self.floor, self.left
        sz = p.size[k]
        top = o + sz
        off[k] = o
        self.placed += 1
        raised: list[tuple[int, int]] = []
        hatless = True
        for j in p.overlaps[k]:
            if off[j] < 0:
                hatless = False
                if min_off[j] < top:
                    raised.append((j, min_off[j]))
                    min_off[j] = top
        floors: list[tuple[int, int]] = []
        for s in range(p.first[k], p.stop[k]):
            floors.append((s, floor[s]))
            floor[s] = top
            left[s] -= sz
        cuts = self.cuts
        for s in range(p.first[k], p.stop[k] - 1):
            cuts[s] -= 1
            if not cuts[s]:
                self.zero.append(s + 1)
        undo = (k, raised, floors)
        if top > self.cap or (self.MONOTONE and o + max(left[self.s0 : self.s1]) > self.cap):
            return undo, hatless, False
        ok = self._raise_floors(k, raised, floors)
        if ok and self.energetic and raised:
            ok = self._energetic(raised)
        return undo, hatless, ok

    def _energetic(self, raised: list[tuple[int, int]]) -> bool:
        """An unplaced item goes at or above its min offset, so in every section the items
        whose min offset is at least h must fit between h and the capacity. Checked where
        a raised item now hangs above the section's floor.

        A placement raises min offsets to its top and no higher, so only thresholds h up
        to top can have got worse, and for those the items at or above h weigh at most
        the section's bytes left: where top + bytes left fits, so does every such h (the
        rest held before, as every state the search reaches passed this check)."""
        p, off, min_off, size, cap = self.p, self.off, self.min_off, self.p.size, self.cap
        first, stop, floor, left = p.first, p.stop, self.floor, self.left
        top = min_off[raised[0][0]]
        room = cap - top
        sections = {
            s
            for j, _ in raised
            for s in range(first[j], stop[j])
            if floor[s] < top and left[s] > room
        }
        for s in sections:
            f = floor[s]
            above = [(min_off[j], size[j]) for j in p.members[s] if off[j] < 0 and min_off[j] > f]
            if top + sum([z for _, z in above]) <= cap and all(h <= top for h, _ in above):
                continue  # every threshold (at most top) passes: no need to sort
            above.sort(reverse=True)
            acc = 0
            for h, z in above:
                acc += z
                if h + acc > cap:
                    return False
        return True

    def _raise_floors(
        self, k: int, raised: list[tuple[int, int]], floors: list[tuple[int, int]]
    ) -> bool:
        """A section's bytes below its lowest unplaced min offset are lost: raise its floor
        there, then check floor + bytes left <= capacity where anything changed.

        Only a section where a raised item could sit at the floor before and no longer
        can may lose bytes: it must have met the floor (old min offset <= floor) and now be
        above it (new min offset, the placed top, > floor)."""
        if not raised:
            return self._fits(floors)
        p, off, min_off, floor, left, cap = (
            self.p, self.off, self.min_off, self.floor, self.left, self.cap
        )  # fmt: skip
        top = min_off[raised[0][0]]
        for s in self._touched(k, raised, top):
            if left[s] == 0:
                continue
            f = floor[s]
            for j in p.members[s]:
                if min_off[j] <= f and off[j] < 0:
                    break  # an item can still sit at the floor: nothing lost here
            else:
                floors.append((s, f))
                f = floor[s] = min([min_off[j] for j in p.members[s] if off[j] < 0])
            if f + left[s] > cap:
                return False
        return self._fits(floors)

    def _fits(self, floors: list[tuple[int, int]]) -> bool:
        """Whether every section whose floor was raised (`floors`: (section, old floor))
        still has room for its bytes left."""
        return all(self.floor[s] + self.left[s] <= self.cap for s, _ in floors)

    def _touched(self, k: int, raised: list[tuple[int, int]], top: int) -> list[int]:
        """The sections where a raised item met the floor (old min offset <= floor) and is
        now above it (floor < top); k's own sections are at top.

        Every raised item meets k, so on each side of k it covers the sections from k out
        to its own end: sweeping inwards from the farthest, the lowest old min offset of
        the items reaching a section is a running minimum. (Walking every raised item's
        whole lifetime was the costliest line of the search on long-lived items.)"""
        first, stop, floor = self.p.first, self.p.stop, self.floor
        a, b = first[k], stop[k]
        out: list[int] = []
        for side in (-1, 1):
            # (how many sections past k's edge the item reaches, its old min offset)
            if side < 0:
                reach = [(a - first[j], old) for j, old in raised if first[j] < a]
            else:
                reach = [(stop[j] - b, old) for j, old in raised if stop[j] > b]
            reach.sort(reverse=True)
            lowest, i = top, 0
            for d in range(reach[0][0] if reach else 0, 0, -1):
                while i < len(reach) and reach[i][0] >= d:
                    lowest = min(lowest, reach[i][1])
                    i += 1
                s = a - d if side < 0 else b - 1 + d
                if lowest <= floor[s] < top:
                    out.append(s)
        return out

    def _raise_stretch(self, a: int, b: int, f: int) -> Undo:
        """Give sections [a, b) at floor f up: raise them to the lower of their higher
        unfinished neighbours in the part, or by the smallest item left in section a."""
        floor, left = self.floor, self.left
        higher = [
            floor[s]
            for s in (a - 1, b)
            if self.s0 <= s < self.s1 and left[s] and floor[s] > f
        ]
        up = (
            min(higher)
            if higher
            else f + min([self.p.size[k] for k in self.p.members[a] if self.off[k] < 0])
        )
        floors = [(s, floor[s]) for s in range(a, b) if left[s]]
        for s, _ in floors:
            floor[s] = up
        return (-1, [], floors)

    def _restore(self, undo: Undo) -> None:
        k, raised, floors = undo
        p = self.p
        for s, f in reversed(floors):
            self.floor[s] = f
        if k < 0:
            return  # a skipped gap: floors only
        sz = p.size[k]
        for s in range(p.first[k], p.stop[k]):
            self.left[s] += sz
        for s in range(p.first[k], p.stop[k] - 1):
            self.cuts[s] += 1
        for j, m in reversed(raised):
            self.min_off[j] = m
        self.off[k] = -1
        self.placed -= 1

    def _outcome(self, status: Status, nodes: int) -> Outcome:
        if status is not Status.FOUND:
            return Outcome(status, None, 0, nodes)
        offsets = [max(o, 0) for o in self.off]
        height = max([o + z for o, z in zip(offsets, self.p.size, strict=True)], default=0)
        return Outcome(status, offsets, height, nodes)


class _Canonical(_Search):
    """The complete search in MiniMalloc's order: no corner rule; items at one offset go in
    the try order, so the preorder decides which packings are met first (the corner rule
    needs them by start). Which preorder finds a packing quickly differs from trace to
    trace; improve.py takes turns between three."""

    def __init__(self, p: Problem, capacity: int, order: list[int]) -> None:
        super().__init__(p, capacity, order)
        self.rank = self.try_key

    def _corner(self) -> tuple[int, int] | None:
        return None


def decide(
    p: Problem,
    capacity: int,
    max_nodes: int,
    deadline: float,
    order: list[int] | None = None,
    canonical: bool = False,
) -> Outcome:
    """Search for a packing of `p` within `capacity` bytes, trying candidates in `order`
    (default: the "total" preorder); canonical=True searches in MiniMalloc's order (no
    corner rule). Both are complete: INFEASIBLE is a proof."""
    if not p.items:
        return Outcome(Status.FOUND, [0] * p.n, 0, 0)
    kind = _Canonical if canonical else _Search
    return kind(p, capacity, order or p.preorder("total")).run(max_nodes, deadline)

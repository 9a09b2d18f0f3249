"""An independent checker for plans, and the lower bound (docs/allocator.md rule 10).

It imports nothing from the planners: it re-derives which tensors need memory, their live
intervals and which in-place handoffs are legal from the contract's words, then checks a
plan against them: placements complete and aligned, inside their chunks, chunks within the
max size, no two live tensors sharing a byte except an in-place handoff, and the planned
size at least the lower bound.

Times: 0 is graph start, node k runs at k + 1, and len(nodes) is the last step (tensors
pinned to the end live through it).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from tensorplan.alloc.plan import Plan, PlanError
from tensorplan.graph import Graph
from tensorplan.tensor import Flag, Tensor


class _HasAlignment(Protocol):
    @property
    def alignment(self) -> int: ...


_INPUT, _OUTPUT, _PARAM = int(Flag.INPUT), int(Flag.OUTPUT), int(Flag.PARAM)  # `.real & BIT`
# tests are ~50x cheaper than IntFlag's own operators


def _round(n: int, a: int) -> int:
    return (n + a - 1) // a * a


@dataclass
class _Oracle:
    """Who needs memory in a graph and when, for planner `owner`."""

    graph: Graph
    owner: object | None
    born: dict[Tensor, int] = field(default_factory=dict)  # step a tensor first exists
    readers: dict[Tensor, list[int]] = field(default_factory=dict)
    life: dict[Tensor, tuple[int, int]] = field(default_factory=dict)  # planned roots only
    views_until: dict[Tensor, int] = field(default_factory=dict)  # root -> last view step
    pinned: set[Tensor] = field(default_factory=set)

    def __post_init__(self) -> None:
        nodes = self.graph.nodes
        last = len(nodes)
        for k in range(len(nodes) - 1, -1, -1):
            self.born[nodes[k]] = k + 1  # the earliest occurrence wins
        for leaf in self.graph.leafs:
            self.born[leaf] = 0
        for k, node in enumerate(nodes):
            for src in node.srcs:
                self.readers.setdefault(src, []).append(k + 1)
        for t in self.born:
            root = t.view_src
            if root is None or not self.planned(root):
                continue
            used = self.readers.get(t)
            until = last if t.flags.real & _OUTPUT or not used else max(used)
            self.views_until[root] = max(self.views_until.get(root, -1), until)
            if t.flags.real & _OUTPUT:
                self.pinned.add(root)
        for t, b in self.born.items():
            if t.view_src is None and self.planned(t):
                start = 0 if t.op is None or t.flags.real & _INPUT else b
                ends = [*self.readers.get(t, []), self.views_until.get(t, -1)]
                end = max(ends)
                if end < 0 or t.flags.real & _OUTPUT or t in self.pinned:
                    end = last
                self.life[t] = (start, max(start, end))

    def planned(self, t: Tensor) -> bool:
        """A root this planner must give memory: in the graph, not a weight, not placed
        by anyone else."""
        if t not in self.born or t.view_src is not None or t.flags.real & _PARAM:
            return False
        return t.buffer is None or (self.owner is not None and t.placed_by is self.owner)

    def handoff_ok(self, parent: Tensor, node: Tensor) -> bool:
        """May `node` write over `parent`'s bytes (docs/allocator.md rule 5)?"""
        if node.op is None or not node.op.inplace or node.flags.real & _INPUT:
            return False
        if parent not in self.life or node not in self.life or node.srcs.count(parent) != 1:
            return False
        if parent.flags.real & _OUTPUT or parent in self.pinned:
            return False
        if parent.buffer_id != node.buffer_id or not node.same_layout(parent):
            return False
        step = self.born[node]
        return (
            max(self.readers[parent]) == step
            and self.views_until.get(parent, -1) < step
            and self.life[node][0] == step
        )

    def handoffs(self) -> dict[Tensor, Tensor]:
        """node -> parent for every legal in-place handoff (first legal src by index)."""
        out: dict[Tensor, Tensor] = {}
        for node in self.life:
            for src in node.srcs:
                if self.handoff_ok(src, node):
                    out[node] = src
                    break
        return out


def _alignments(spec: int | Sequence[int | _HasAlignment]) -> list[int]:
    if isinstance(spec, int):
        return [spec]
    return [a if isinstance(a, int) else a.alignment for a in spec]


def lower_bound(
    graph: Graph, alignments: int | Sequence[int | _HasAlignment], owner: object | None = None
) -> list[int]:
    """Per buffer id: the max over steps of the aligned bytes of live planned tensors, a
    legal in-place handoff counted once at the step where both are live."""
    aligns = _alignments(alignments)
    oracle = _Oracle(graph, owner)
    last = len(graph.nodes)
    delta = [[0] * (last + 2) for _ in aligns]
    for t, (start, end) in oracle.life.items():
        if t.buffer_id >= len(aligns):
            raise PlanError(f"{t!r}: buffer id {t.buffer_id} has no alignment given")
        size = _round(t.nbytes, aligns[t.buffer_id])
        delta[t.buffer_id][start] += size
        delta[t.buffer_id][end + 1] -= size
    for node in oracle.handoffs():
        size = _round(node.nbytes, aligns[node.buffer_id])
        step = oracle.born[node]
        delta[node.buffer_id][step] -= size
        delta[node.buffer_id][step + 1] += size
    peaks = []
    for d in delta:
        running, best = 0, 0
        for x in d:
            running += x
            best = max(best, running)
        peaks.append(best)
    return peaks


def violations(plan: Plan, graph: Graph) -> list[str]:
    """Every way `plan` breaks the contract for `graph`; empty when it holds."""
    oracle = _Oracle(graph, plan.owner)
    found: list[str] = []
    for t in oracle.life:
        if t not in plan.placements:
            found.append(f"{t!r} needs memory but has no placement")
    for t in plan.placements:
        if t not in oracle.life:
            found.append(f"{t!r} has a placement but is a view, external or not in the graph")
    found += _check_bounds(plan)
    if not found:
        found += _check_overlaps(plan, oracle)
    lb = lower_bound(graph, [s.alignment for s in plan.specs], plan.owner)
    for bid, (size, bound) in enumerate(zip(plan.sizes, lb, strict=True)):
        if size < bound:
            found.append(f"buffer {bid}: planned {size} B is below the lower bound {bound} B")
    return found


def verify(plan: Plan, graph: Graph) -> None:
    """Raise PlanError naming the first violations of the allocator contract, if any."""
    found = violations(plan, graph)
    if found:
        more = f" (and {len(found) - 5} more)" if len(found) > 5 else ""
        raise PlanError("; ".join(found[:5]) + more)


def _check_bounds(plan: Plan) -> list[str]:
    found = []
    biggest: dict[tuple[int, int], int] = {}
    for t, p in plan.placements.items():
        if p.buffer_id != t.buffer_id or not 0 <= p.buffer_id < len(plan.specs):
            found.append(f"{t!r} placed in buffer {p.buffer_id}, wants {t.buffer_id}")
            continue
        align = plan.specs[p.buffer_id].alignment
        chunks = plan.chunk_sizes[p.buffer_id]
        if p.size < t.nbytes or p.size % align or p.offset % align:
            found.append(f"{t!r}: offset {p.offset} / size {p.size} not aligned to {align}")
        if not 0 <= p.chunk < len(chunks) or p.offset < 0 or p.offset + p.size > chunks[p.chunk]:
            found.append(
                f"{t!r} at chunk {p.chunk} [{p.offset}, {p.offset + p.size}) "
                f"outside its buffer's chunks {chunks}"
            )
            continue
        key = (p.buffer_id, p.chunk)
        biggest[key] = max(biggest.get(key, 0), p.size)
    for bid, chunks in enumerate(plan.chunk_sizes):
        limit = plan.specs[bid].max_size
        for c, size in enumerate(chunks):
            if size > max(limit, biggest.get((bid, c), 0)):
                found.append(f"buffer {bid} chunk {c} is {size} B, over the max size {limit} B")
    return found


def _check_overlaps(plan: Plan, oracle: _Oracle) -> list[str]:
    """Sweep time; each tensor entering is checked against the live ones in its chunk."""
    last = len(oracle.graph.nodes)
    enter: list[list[Tensor]] = [[] for _ in range(last + 1)]
    leave: list[list[Tensor]] = [[] for _ in range(last + 1)]
    for t, (start, end) in oracle.life.items():
        if plan.placements[t].size:
            enter[start].append(t)
            leave[end].append(t)
    live: dict[tuple[int, int], list[tuple[int, int, int]]] = {}
    who: dict[int, Tensor] = {}
    found: list[str] = []
    for step in range(last + 1):
        for t in enter[step]:
            p = plan.placements[t]
            row = live.setdefault((p.buffer_id, p.chunk), [])
            top = p.offset + p.size
            j = bisect.bisect_left(row, (top, -1, -1)) - 1
            while j >= 0 and row[j][1] > p.offset:
                other = who[row[j][2]]
                same = row[j][0] == p.offset and plan.placements[other].size == p.size
                if not (same and oracle.handoff_ok(other, t)):
                    found.append(f"{t!r} overlaps live {other!r} at step {step}")
                j -= 1
            who[id(t)] = t
            bisect.insort(row, (p.offset, top, id(t)))
        for t in leave[step]:
            p = plan.placements[t]
            row = live[(p.buffer_id, p.chunk)]
            del row[bisect.bisect_left(row, (p.offset, p.offset + p.size, id(t)))]
    return found

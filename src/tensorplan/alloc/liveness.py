"""Live intervals and in-place decisions for one graph, grouped into blocks of bytes.

Time: step 0 is graph start, node i runs at step i + 1, and the last step n = len(nodes)
doubles as "end of graph". Intervals are inclusive: a tensor is live from the step that
produces it (0 for leafs and INPUT tensors) to the last step that reads it or any view of
it (DESIGN contract 1, 4, 6). Nothing past the end is read, so a tensor pinned to step n
is intact after the graph ran: OUTPUT tensors, roots of OUTPUT views, and tensors nobody
in the graph reads (a graph's results, ggml's rule for the last node).

A block is a planned root plus the chain of nodes that took its bytes in place (contract
5): all share one offset, so the planner places blocks, not tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from tensorplan.alloc.freelist import align_up
from tensorplan.alloc.plan import BufferSpec, PlanError
from tensorplan.graph import Graph
from tensorplan.tensor import Flag, Op, Tensor

# why a node did not take a parent's bytes (one per candidate, for logs and tests)
OP_NOT_INPLACE = "op not in-place"
NODE_IS_INPUT = "node is an input"
PARENT_EXTERNAL = "parent external"
PARENT_VIEW = "parent is a view"
PARENT_OUTPUT = "parent is an output"
BUFFER_DIFFERS = "buffer differs"
LAYOUT_DIFFERS = "layout differs"
OTHER_READER = "parent has another reader"
LIVE_VIEWS = "parent has live views"

Refusal = tuple[Tensor | None, str]  # (parent or None for the node itself, reason)

# Flags as plain ints, tested as `t.flags.real & BIT`: IntFlag's own `&` builds a new enum
# member and costs ~2.5 us, more than everything else the planner does per tensor.
INPUT, OUTPUT, PARAM = int(Flag.INPUT), int(Flag.OUTPUT), int(Flag.PARAM)


def op_allows_inplace(op: Op) -> bool:
    return op.inplace


def owns(t: Tensor, owner: object | None) -> bool:
    """May a planner acting for `owner` place root t? Not weights, not tensors someone
    else placed (contract 2); its own earlier placements are planned again."""
    if t.flags.real & PARAM:
        return False
    return t.buffer is None or (owner is not None and t.placed_by is owner)


class Block(NamedTuple):
    """A run of bytes: a NamedTuple, not a frozen dataclass, as there is one per planned
    tensor and building a tuple costs a third as much."""

    tensors: tuple[Tensor, ...]  # the root, then each node that took its bytes in place
    buffer_id: int
    start: int
    end: int  # inclusive: the last member's end (each starts where the previous ends)
    size: int  # aligned bytes


@dataclass(frozen=True, slots=True)
class Liveness:
    n_steps: int
    blocks: tuple[Block, ...]
    inplace: Mapping[Tensor, Tensor]  # node -> parent it took over
    refusals: Mapping[Tensor, tuple[Refusal, ...]]  # node -> why each candidate was refused

    def lower_bound(self, n_buffers: int) -> list[int]:
        """Max over steps of the aligned bytes of live blocks, per buffer id."""
        diffs = [[0] * (self.n_steps + 2) for _ in range(n_buffers)]
        for b in self.blocks:
            d = diffs[b.buffer_id]
            d[b.start] += b.size
            d[b.end + 1] -= b.size
        result = []
        for d in diffs:
            load = peak = 0
            for x in d:
                load += x
                peak = max(peak, load)
            result.append(peak)
        return result


class _Analysis:
    """One pass over a graph; `run` returns its Liveness."""

    def __init__(self, graph: Graph, owner: object | None, can_inplace: Callable[[Op], bool]):
        self.graph, self.owner, self.can_inplace = graph, owner, can_inplace
        self.end_step = len(graph.nodes)
        self.step: dict[Tensor, int] = {}  # first step each graph tensor exists at
        self.roots: dict[Tensor, int] = {}  # planned root -> start step, leafs then nodes
        self.views: dict[Tensor, Tensor] = {}  # view of a planned root -> that root
        self.direct: dict[Tensor, int] = {}  # root -> last step reading it directly
        self.view_end: dict[Tensor, int] = {}  # root -> last step any of its views is live
        self.pinned: set[Tensor] = set()  # roots of OUTPUT views
        self.ends: dict[Tensor, int] = {}

    def classify(self) -> None:
        step = self.step
        for t in self.graph.leafs:
            step.setdefault(t, 0)
        for i, t in enumerate(self.graph.nodes):
            step.setdefault(t, i + 1)
        for t, s in step.items():
            r = t.view_src
            if r is None:
                if owns(t, self.owner):
                    self.roots[t] = 0 if t.op is None or t.flags.real & INPUT else s
            elif r in step and owns(r, self.owner):
                self.views[t] = r
            # else: a view of an external tensor, or of one outside this graph: not ours

    def reads(self) -> None:
        roots, views, direct, step = self.roots, self.views, self.direct, self.step
        view_read: dict[Tensor, int] = {}
        for i, t in enumerate(self.graph.nodes):
            for p in t.srcs:
                if p in roots:
                    direct[p] = i + 1
                elif p in views:
                    view_read[p] = i + 1
                elif p not in step:
                    raise PlanError(f"{p!r}, read by {t!r}, is not in the graph")
        for v, r in views.items():
            if v.flags.real & OUTPUT:
                self.pinned.add(r)
                e = self.end_step
            else:
                e = view_read.get(v, self.end_step)  # an unread view is a result
            if e > self.view_end.get(r, -1):
                self.view_end[r] = e
        for r, start in roots.items():
            e = max(direct.get(r, -1), self.view_end.get(r, -1))
            if r.flags.real & OUTPUT or r in self.pinned or e < 0:
                e = self.end_step
            self.ends[r] = max(e, start)

    def refusal(self, t: Tensor, p: Tensor, s: int) -> str | None:
        """Why node t (at step s) may not take parent p's bytes; None if it may."""
        if p not in self.roots:
            return PARENT_VIEW if p.view_src is not None else PARENT_EXTERNAL
        if p.flags.real & OUTPUT or p in self.pinned:
            return PARENT_OUTPUT
        if p.buffer_id != t.buffer_id:
            return BUFFER_DIFFERS
        if not t.same_layout(p):
            return LAYOUT_DIFFERS
        if self.direct[p] != s or t.srcs.count(p) > 1:
            return OTHER_READER
        if self.view_end.get(p, -1) >= s:
            return LIVE_VIEWS
        return None

    def parent(self, t: Tensor, refused: list[Refusal]) -> Tensor | None:
        """The first src whose bytes node t takes in place (ggml: first by index)."""
        assert t.op is not None
        if not self.can_inplace(t.op):
            refused.append((None, OP_NOT_INPLACE))
            return None
        if t.flags.real & INPUT:
            refused.append((None, NODE_IS_INPUT))  # its bytes are set before any node runs
            return None
        for p in t.srcs:
            reason = self.refusal(t, p, self.step[t])
            if reason is None:
                return p
            refused.append((p, reason))
        return None

    def run(self, specs: Sequence[BufferSpec]) -> Liveness:
        self.classify()
        self.reads()
        group: dict[Tensor, list[Tensor]] = {}
        chains: list[list[Tensor]] = []
        inplace: dict[Tensor, Tensor] = {}
        refusals: dict[Tensor, tuple[Refusal, ...]] = {}
        for t in self.roots:
            if not 0 <= t.buffer_id < len(specs):
                raise PlanError(f"{t!r} has buffer id {t.buffer_id}, not in [0, {len(specs)})")
            p = None
            if t.op is not None:
                refused: list[Refusal] = []
                p = self.parent(t, refused)
                if refused:
                    refusals[t] = tuple(refused)
            if p is None:
                group[t] = chain = [t]
                chains.append(chain)
            else:
                inplace[t] = p
                group[t] = group[p]
                group[t].append(t)
        return Liveness(self.end_step, self.blocks(chains, specs), inplace, refusals)

    def blocks(self, chains: list[list[Tensor]], specs: Sequence[BufferSpec]) -> tuple[Block, ...]:
        out = []
        ends, roots = self.ends, self.roots
        aligns = [s.alignment for s in specs]
        for chain in chains:
            first = chain[0]
            bid = first.buffer_id
            size = align_up(first.nbytes, aligns[bid])
            out.append(Block(tuple(chain), bid, roots[first], ends[chain[-1]], size))
        return tuple(out)


def analyze(
    graph: Graph,
    specs: Sequence[BufferSpec],
    owner: object | None = None,
    can_inplace: Callable[[Op], bool] = op_allows_inplace,
) -> Liveness:
    """Blocks of the tensors `owner` plans in `graph`, with their live intervals."""
    return _Analysis(graph, owner, can_inplace).run(specs)

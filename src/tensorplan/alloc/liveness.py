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
_REFUSED_OP: tuple[Refusal, ...] = ((None, OP_NOT_INPLACE),)
_REFUSED_INPUT: tuple[Refusal, ...] = ((None, NODE_IS_INPUT),)
_ROOT, _VIEW, _OTHER = 0, 1, 2  # what a graph tensor is to the planner

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
                if load > peak:  # not max(): a call per step
                    peak = load
            result.append(peak)
        return result


class _Analysis:
    """One pass over a graph; `run` returns its Liveness.

    Each graph tensor gets an index (its place in step order: leafs, then nodes) from one
    dict, and every per-tensor fact is a list indexed by it: at 100k tensors a dict lookup
    is a cache miss, and the lookups, not the arithmetic, set the planning time, so each
    src read costs one lookup whatever it is (root, view, weight)."""

    def __init__(self, graph: Graph, owner: object | None, can_inplace: Callable[[Op], bool]):
        self.graph, self.owner, self.can_inplace = graph, owner, can_inplace
        self.end_step = len(graph.nodes)
        self.tensors: list[Tensor] = []  # index -> tensor
        self.pos: dict[Tensor, int] = {}  # tensor -> index
        self.step: list[int] = []  # first step each tensor exists at
        self.kind: list[int] = []  # _ROOT (planned), _VIEW (of a planned root) or _OTHER
        self.roots_of: list[int] = []  # a view's root
        self.start: list[int] = []  # a root's start step
        self.last: list[int] = []  # last step reading the tensor directly, -1 if none
        self.view_end: list[int] = []  # root -> last step any of its views is live
        self.pinned: list[bool] = []  # roots of OUTPUT views
        self.roots: list[int] = []  # planned roots, in step order
        self.views: list[int] = []  # views of planned roots

    def index(self) -> None:
        graph = self.graph
        tensors = [*graph.leafs, *graph.nodes]
        pos = dict(zip(tensors, range(len(tensors)), strict=True))
        if len(pos) == len(tensors):  # leafs and nodes distinct: the rule
            self.tensors, self.pos = tensors, pos
            self.step = [0] * len(graph.leafs) + list(range(1, len(graph.nodes) + 1))
            return
        first = dict.fromkeys(graph.leafs, 0)  # a tensor listed twice exists from its first
        for i, t in enumerate(graph.nodes, 1):
            first.setdefault(t, i)
        self.tensors = list(first)
        self.pos = dict(zip(self.tensors, range(len(first)), strict=True))
        self.step = list(first.values())

    def classify(self) -> None:
        """Which tensors are planned roots and which are views of them, in step order."""
        tensors, pos, step, owner = self.tensors, self.pos, self.step, self.owner
        n = len(tensors)
        start, roots, views = [0] * n, self.roots, self.views
        roots_of = [0] * n
        for k, t in enumerate(tensors):
            r = t.view_src
            if r is None:
                if owns(t, owner):
                    roots.append(k)
                    if t.op is not None and not t.flags.real & INPUT:
                        start[k] = step[k]
            else:
                j = pos.get(r)
                if j is not None and owns(r, owner):
                    views.append(k)
                    roots_of[k] = j
            # else: a view of an external tensor, or of one outside this graph: not ours
        kind = [_OTHER] * n
        for k in roots:
            kind[k] = _ROOT
        self.kind, self.start, self.roots_of = kind, start, roots_of

    def reads(self) -> None:
        """The last step reading each tensor directly, then each root's last step with its
        views and whether an OUTPUT view pins it."""
        pos, n, end_step = self.pos, len(self.tensors), self.end_step
        last = self.last = [-1] * n
        for i, t in enumerate(self.graph.nodes, 1):
            for p in t.srcs:
                j = pos.get(p)
                if j is None:
                    raise PlanError(f"{p!r}, read by {t!r}, is not in the graph")
                last[j] = i
        tensors, roots_of = self.tensors, self.roots_of
        view_end, pinned = self.view_end, self.pinned = [-1] * n, [False] * n
        for k in self.views:
            r = roots_of[k]
            if tensors[k].flags.real & OUTPUT:
                pinned[r] = True
                e = end_step
            else:
                e = last[k] if last[k] >= 0 else end_step  # an unread view is a result
            if e > view_end[r]:
                view_end[r] = e

    def end(self, k: int) -> int:
        """Root k's last live step: its last read, direct or through a view, or the end of
        the graph for an OUTPUT root, a pinned root and one nobody reads."""
        e = self.last[k]
        if self.view_end[k] > e:
            e = self.view_end[k]
        if e < 0 or self.pinned[k] or self.tensors[k].flags.real & OUTPUT:
            e = self.end_step
        return e if e > self.start[k] else self.start[k]

    def refusal(self, t: Tensor, p: Tensor, s: int) -> str | None:
        """Why node t (at step s) may not take parent p's bytes; None if it may."""
        j = self.pos[p]
        if self.kind[j] != _ROOT:
            return PARENT_VIEW if p.view_src is not None else PARENT_EXTERNAL
        if p.flags.real & OUTPUT or self.pinned[j]:
            return PARENT_OUTPUT
        if p.buffer_id != t.buffer_id:
            return BUFFER_DIFFERS
        if not t.same_layout(p):
            return LAYOUT_DIFFERS
        if self.last[j] != s or t.srcs.count(p) > 1:
            return OTHER_READER
        if self.view_end[j] >= s:
            return LIVE_VIEWS
        return None

    def parent(self, t: Tensor, s: int, refused: list[Refusal]) -> Tensor | None:
        """The first src whose bytes node t (at step s; an in-place op, not an input)
        takes in place (ggml: first by index)."""
        for p in t.srcs:
            reason = self.refusal(t, p, s)
            if reason is None:
                return p
            refused.append((p, reason))
        return None

    def run(self, specs: Sequence[BufferSpec]) -> Liveness:
        self.index()
        self.classify()
        self.reads()
        tensors, pos, step = self.tensors, self.pos, self.step
        chain_of = [0] * len(tensors)  # a root -> its block's number
        chains: list[list[Tensor]] = []  # per block: its root, then each in-place node
        firsts: list[int] = []  # per block: its root's index
        lasts: list[int] = []  # per block: its last member's index
        inplace: dict[Tensor, Tensor] = {}
        refusals: dict[Tensor, tuple[Refusal, ...]] = {}
        default_rule = self.can_inplace is op_allows_inplace  # then read op.inplace directly
        n_specs = len(specs)
        for k in self.roots:
            t = tensors[k]
            if not 0 <= t.buffer_id < n_specs:
                raise PlanError(f"{t!r} has buffer id {t.buffer_id}, not in [0, {n_specs})")
            p = None
            op = t.op
            if op is None:
                pass
            elif not (op.inplace if default_rule else self.can_inplace(op)):
                refusals[t] = _REFUSED_OP  # the common case: one shared tuple
            elif t.flags.real & INPUT:
                refusals[t] = _REFUSED_INPUT  # its bytes are set before any node runs
            else:
                refused: list[Refusal] = []
                p = self.parent(t, step[k], refused)
                if refused:
                    refusals[t] = tuple(refused)
            if p is None:
                chain_of[k] = len(chains)
                chains.append([t])
                firsts.append(k)
                lasts.append(k)
            else:
                inplace[t] = p
                c = chain_of[k] = chain_of[pos[p]]
                chains[c].append(t)
                lasts[c] = k
        blocks = self.blocks(chains, firsts, lasts, specs)
        return Liveness(self.end_step, blocks, inplace, refusals)

    def blocks(
        self,
        chains: list[list[Tensor]],
        firsts: list[int],
        lasts: list[int],
        specs: Sequence[BufferSpec],
    ) -> tuple[Block, ...]:
        start, end = self.start, self.end
        aligns = [s.alignment for s in specs]
        nbytes: dict[tuple[tuple[int, ...], tuple[int, ...], int], int] = {}  # by layout
        out = []
        for chain, f, la in zip(chains, firsts, lasts, strict=True):
            root = chain[0]
            bid = root.buffer_id
            a = aligns[bid]
            layout = (root.shape, root.strides, root.dtype.itemsize)
            n = nbytes.get(layout)
            if n is None:  # Tensor.nbytes costs ~0.8 us; most blocks repeat a layout
                n = nbytes[layout] = root.nbytes
            size = -(-n // a) * a  # align_up, inlined
            out.append(Block(tuple(chain), bid, start[f], end(la), size))
        return tuple(out)


def analyze(
    graph: Graph,
    specs: Sequence[BufferSpec],
    owner: object | None = None,
    can_inplace: Callable[[Op], bool] = op_allows_inplace,
) -> Liveness:
    """Blocks of the tensors `owner` plans in `graph`, with their live intervals."""
    return _Analysis(graph, owner, can_inplace).run(specs)

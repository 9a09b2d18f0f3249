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
from itertools import accumulate

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


@dataclass(frozen=True, slots=True)
class Liveness:
    """Blocks as columns, one list per field indexed by block number: at 100k tensors an
    object per block cost more to build, and to scan at the next garbage collection, than
    the arithmetic on it."""

    n_steps: int
    members: list[Tensor]  # every planned tensor, in step order
    block_of: list[int]  # members[i] -> the number of its block
    buffer_id: list[int]  # per block
    start: list[int]  # per block: its root's first live step
    end: list[int]  # per block, inclusive: its last member's last live step
    size: list[int]  # per block: aligned bytes
    inplace: Mapping[Tensor, Tensor]  # node -> parent it took over
    refusals: Mapping[Tensor, tuple[Refusal, ...]]  # node -> why each candidate was refused

    def __len__(self) -> int:
        return len(self.size)

    def lower_bound(self, n_buffers: int) -> list[int]:
        """Max over steps of the aligned bytes of live blocks, per buffer id."""
        diffs = [[0] * (self.n_steps + 2) for _ in range(n_buffers)]
        if n_buffers == 1:
            d = diffs[0]
            for s, e, z in zip(self.start, self.end, self.size, strict=True):
                d[s] += z
                d[e + 1] -= z
        else:
            for b, s, e, z in zip(self.buffer_id, self.start, self.end, self.size, strict=True):
                d = diffs[b]
                d[s] += z
                d[e + 1] -= z
        return [max(accumulate(d)) for d in diffs]  # never below 0: d[0] >= 0, sums end at 0


class _Analysis:
    """One pass over a graph; `run` returns its Liveness.

    Each graph tensor gets an index (its place in step order: leafs, then nodes) from one
    dict, and every per-tensor fact is a list indexed by it: at 100k tensors a dict lookup
    is a cache miss, and the lookups, not the arithmetic, set the planning time, so each
    src read costs one lookup whatever it is (root, view, weight)."""

    def __init__(
        self,
        graph: Graph,
        owner: object | None,
        can_inplace: Callable[[Op], bool],
        explain: bool,
    ):
        self.graph, self.owner, self.can_inplace = graph, owner, can_inplace
        self.explain = explain  # record why each in-place candidate was refused
        self.end_step = len(graph.nodes)
        self.tensors: list[Tensor] = []  # index -> tensor
        self.pos: dict[Tensor, int] = {}  # tensor -> index
        self.step: list[int] = []  # first step each tensor exists at
        self.planned = bytearray()  # 1 for a planned root
        self.pinned = bytearray()  # 1 for a root live to the end: OUTPUT, or an OUTPUT's root
        self.roots: list[int] = []  # planned roots, in step order
        self.views: list[int] = []  # views of planned roots
        self.view_root: list[int] = []  # views[i]'s root
        self.last: list[int] = []  # last step reading the tensor directly, -1 if none
        self.view_end: list[int] = []  # root -> last step any of its views is live

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
        """Which tensors are planned roots (and which of those are pinned) and which are
        views of them, in step order. owns() inlined: it is called once per tensor."""
        pos, owner = self.pos, self.owner
        n = len(self.tensors)
        roots, views, view_root = self.roots, self.views, self.view_root
        planned = self.planned = bytearray(n)
        pinned = self.pinned = bytearray(n)
        for k, t in enumerate(self.tensors):
            r = t.view_src
            if r is None:
                f = t.flags.real
                if f & PARAM:
                    continue
                if t.buffer is None or (owner is not None and t.placed_by is owner):
                    roots.append(k)
                    planned[k] = 1
                    if f & OUTPUT:
                        pinned[k] = 1
            else:
                j = pos.get(r)
                if j is not None and owns(r, owner):
                    views.append(k)
                    view_root.append(j)
            # else: a view of an external tensor, or of one outside this graph: not ours

    def reads(self) -> None:
        """The last step reading each tensor directly, then each root's last step through
        its views and whether an OUTPUT view pins it."""
        pos, n, end_step = self.pos, len(self.tensors), self.end_step
        last = self.last = [-1] * n
        t = p = None
        try:
            for i, t in enumerate(self.graph.nodes, 1):
                for p in t.srcs:
                    last[pos[p]] = i
        except KeyError:
            raise PlanError(f"{p!r}, read by {t!r}, is not in the graph") from None
        tensors, pinned = self.tensors, self.pinned
        view_end = self.view_end = [-1] * n
        for k, r in zip(self.views, self.view_root, strict=True):
            if tensors[k].flags.real & OUTPUT:
                pinned[r] = 1
                e = end_step
            else:
                e = last[k] if last[k] >= 0 else end_step  # an unread view is a result
            if e > view_end[r]:
                view_end[r] = e

    def refusal(self, t: Tensor, p: Tensor, s: int) -> str | None:
        """Why node t (at step s) may not take parent p's bytes; None if it may. The
        explanation of run()'s test, which checks the same facts in a faster order."""
        j = self.pos[p]
        if not self.planned[j]:
            return PARENT_VIEW if p.view_src is not None else PARENT_EXTERNAL
        if self.pinned[j]:
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

    def run(self, specs: Sequence[BufferSpec]) -> Liveness:
        self.index()
        self.classify()
        self.reads()
        tensors, pos, step, roots = self.tensors, self.pos, self.step, self.roots
        planned, pinned, last, view_end = self.planned, self.pinned, self.last, self.view_end
        explain = self.explain
        chain_of = [0] * len(tensors)  # a planned tensor -> its block's number
        buffer_ids: list[int] = []  # per block, as Liveness has them
        starts: list[int] = []
        sizes: list[int] = []
        lasts: list[int] = []  # per block: its last member's index
        last_starts: list[int] = []  # per block: its last member's first step
        inplace: dict[Tensor, Tensor] = {}
        refusals: dict[Tensor, tuple[Refusal, ...]] = {}
        default_rule = self.can_inplace is op_allows_inplace  # then read op.inplace directly
        aligns = [s.alignment for s in specs]
        n_specs = len(specs)
        nbytes: dict[tuple[tuple[int, ...], tuple[int, ...], int], int] = {}  # by layout
        for k in roots:
            t = tensors[k]
            bid = t.buffer_id
            if not 0 <= bid < n_specs:
                raise PlanError(f"{t!r} has buffer id {bid}, not in [0, {n_specs})")
            op = t.op
            s = 0
            if op is not None and not t.flags.real & INPUT:
                s = step[k]
                if op.inplace if default_rule else self.can_inplace(op):
                    srcs = t.srcs
                    for p in srcs:  # the first src whose bytes t may take (ggml: by index)
                        j = pos[p]
                        if (
                            last[j] == s
                            and planned[j]
                            and not pinned[j]
                            and view_end[j] < s
                            and p.buffer_id == bid
                            and p.shape == t.shape
                            and p.strides == t.strides
                            and (p.dtype is t.dtype or p.dtype == t.dtype)
                            and srcs.count(p) == 1
                        ):
                            inplace[t] = p
                            c = chain_of[k] = chain_of[j]
                            lasts[c], last_starts[c] = k, s
                            break
                    else:
                        if explain:
                            refusals[t] = tuple((p, self.refusal(t, p, s) or "") for p in srcs)
                        p = None
                    if p is not None:
                        if explain and srcs[0] is not p:
                            refusals[t] = tuple(
                                (q, self.refusal(t, q, s) or "") for q in srcs[: srcs.index(p)]
                            )
                        continue
                elif explain:
                    refusals[t] = _REFUSED_OP  # the common case: one shared tuple
            elif op is not None and explain:  # an INPUT: its bytes are set before any node
                may = op.inplace if default_rule else self.can_inplace(op)
                refusals[t] = _REFUSED_INPUT if may else _REFUSED_OP
            chain_of[k] = len(lasts)
            layout = (t.shape, t.strides, t.dtype.itemsize)
            n = nbytes.get(layout)
            if n is None:  # Tensor.nbytes costs ~0.8 us; most blocks repeat a layout
                n = nbytes[layout] = t.nbytes
            a = aligns[bid]
            buffer_ids.append(bid)
            starts.append(s)
            sizes.append(-(-n // a) * a)  # align_up, inlined
            lasts.append(k)
            last_starts.append(s)
        end_step = self.end_step
        ends = []
        for k, s in zip(lasts, last_starts, strict=True):
            e = last[k]
            if view_end[k] > e:
                e = view_end[k]
            if e < 0 or pinned[k]:  # nobody reads it, or it must outlive the graph
                e = end_step
            ends.append(e if e > s else s)
        return Liveness(
            end_step,
            [tensors[k] for k in roots],
            [chain_of[k] for k in roots],
            buffer_ids,
            starts,
            ends,
            sizes,
            inplace,
            refusals,
        )


def analyze(
    graph: Graph,
    specs: Sequence[BufferSpec],
    owner: object | None = None,
    can_inplace: Callable[[Op], bool] = op_allows_inplace,
    explain: bool = True,
) -> Liveness:
    """Blocks of the tensors `owner` plans in `graph`, with their live intervals.
    explain=False leaves `refusals` empty (the planner asks for them only to log them)."""
    return _Analysis(graph, owner, can_inplace, explain).run(specs)

"""Live intervals and in-place decisions for one graph, grouped into blocks of bytes.

Time: step 0 is graph start, node i runs at step i + 1, and the last step n = len(nodes)
doubles as "end of graph". Intervals are inclusive: a tensor is live from the step that
produces it (0 for leafs and INPUT tensors) to the last step that reads it or any view of
it (docs/allocator.md rules 1, 4, 6). Nothing past the end is read, so a tensor pinned to step n
is intact after the graph ran: OUTPUT tensors, roots of OUTPUT views, and tensors nobody
in the graph reads (a graph's results, ggml's rule for the last node).

A block is a planned root plus the chain of nodes that took its bytes in place (contract
5): all share one offset, so the planner places blocks, not tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate, compress

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
    else placed (docs/allocator.md rule 2); its own earlier placements are planned again."""
    if t.flags.real & PARAM:
        return False
    return t.buffer is None or (owner is not None and t.placed_by is owner)


@dataclass(frozen=True, slots=True)
class Liveness:
    """Blocks as columns, one list per field indexed by block number: at 100k tensors an
    object per block cost more to build, and to scan at the next garbage collection, than
    the arithmetic on it."""

    n_steps: int
    tensors: list[Tensor]  # the graph's tensors, by index (leafs, then nodes)
    planned: list[int]  # the index of every planned tensor, in step order
    block_of: list[int]  # planned[i] -> the number of its block
    buffer_id: list[int]  # per block
    start: list[int]  # per block: its root's first live step
    end: list[int]  # per block, inclusive: its last member's last live step
    size: list[int]  # per block: aligned bytes
    inplace: Mapping[Tensor, Tensor]  # node -> parent it took over
    refusals: Mapping[Tensor, tuple[Refusal, ...]]  # node -> why each candidate was refused

    def __len__(self) -> int:
        return len(self.size)

    @property
    def members(self) -> list[Tensor]:
        """Every planned tensor, in step order."""
        return [self.tensors[k] for k in self.planned]

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
    """Two passes over a graph; `run` returns its Liveness.

    Each graph tensor gets an index (its place in step order: leafs, then nodes) from one
    dict, and every per-tensor fact is a list indexed by it. At 100k tensors each first
    touch of a tensor is a cache miss, so the first pass reads all the plan needs from a
    tensor at once (its kind, its reads, its size, a number for its buffer id and layout),
    and the second, over the nodes that may run in place, decides on those lists alone.
    (Gathering the reads with C loops, map and chain over all srcs, was slower.)"""

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
        self.in_order = True  # `pos` is filled by scan(), in step order
        self.last: list[int] = []  # last step reading the tensor directly, -1 if none
        # filled by scan():
        self.roots: list[int] = []  # planned roots' indices, in step order
        self.root_of: list[int] = []  # a planned root's index -> its place in `roots`
        self.starts: list[int] = []  # per root: first live step
        self.sizes: list[int] = []  # per root: aligned bytes
        self.layout: list[int] = []  # a planned root's layout number, -1 for other tensors
        self.layout_bid: list[int] = []  # layout number -> buffer id
        self.pinned = bytearray()  # 1 for a root live to the end: OUTPUT, or an OUTPUT's root
        self.view_end: list[int] = []  # root -> last step any of its views is live
        self.cand: list[int] = []  # nodes that may run in place ...
        self.cand_srcs: list[list[int]] = []  # ... and their srcs' indices
        self.refusals: dict[Tensor, tuple[Refusal, ...]] = {}

    def index(self, in_order: bool) -> None:
        """Every tensor's index and first step. in_order: assume the rule (leafs and nodes
        distinct, every src and view root listed before its reader, as Graph.build lists
        them) and let scan() fill `pos` as it goes, while each tensor is in cache: a
        separate pass over 100k tensors to build it cost a tenth of the plan. scan()
        raises _OutOfOrder if the graph breaks the rule, and analyze() starts over."""
        graph = self.graph
        n_leafs, n_nodes = len(graph.leafs), len(graph.nodes)
        if in_order:
            self.tensors = [*graph.leafs, *graph.nodes]
            self.step = [0] * n_leafs + list(range(1, n_nodes + 1))
            return
        first = dict.fromkeys(graph.leafs, 0)  # a tensor listed twice exists from its first
        for i, t in enumerate(graph.nodes, 1):
            first.setdefault(t, i)
        self.tensors = list(first)
        self.pos = dict(zip(self.tensors, range(len(first)), strict=True))
        self.step = list(first.values())
        self.in_order = False

    def scan(self, specs: Sequence[BufferSpec]) -> None:
        """The pass over tensors, in step order. A root's layout number is equal to
        another's exactly when both have the same buffer id, dtype, shape and strides
        (docs/allocator.md rule 5's test, without touching the tensors again). owns() is inlined."""
        tensors, pos, step, owner = self.tensors, self.pos, self.step, self.owner
        n = len(tensors)
        explain, refusals = self.explain, self.refusals
        default_rule = self.can_inplace is op_allows_inplace  # then read op.inplace directly
        aligns = [s.alignment for s in specs]
        n_specs = len(specs)
        roots, starts, sizes, cand = self.roots, self.starts, self.sizes, self.cand
        root_of, layout = [0] * n, [-1] * n
        layouts: dict[tuple[object, ...], int] = {}
        layout_size: list[int] = []  # layout number -> aligned bytes
        layout_bid = self.layout_bid
        pinned = bytearray(n)
        views: list[int] = []  # views of planned roots
        view_root: list[int] = []  # views[i]'s root
        strays: list[Tensor] = []  # view roots not (yet) seen
        last = [-1] * n  # last step reading the tensor directly, -1 if none
        cand_srcs = self.cand_srcs
        try:
            for k, t in enumerate(tensors):
                s = step[k]
                pos[t] = k  # in order: what came before is all there is to read
                r = t.view_src
                if r is not None:
                    j = pos.get(r)
                    if j is None:
                        strays.append(r)  # outside the graph, or (out of order) later
                    elif owns(r, owner):
                        views.append(k)
                        view_root.append(j)
                    # else: a view of an external tensor or of one outside this graph
                elif not (f := t.flags.real) & PARAM and (
                    t.buffer is None or (owner is not None and t.placed_by is owner)
                ):
                    bid = t.buffer_id
                    if not 0 <= bid < n_specs:
                        raise PlanError(f"{t!r} has buffer id {bid}, not in [0, {n_specs})")
                    dt = t.dtype
                    key = (bid, t.shape, t.strides, dt.name, dt.itemsize)  # DType's eq
                    lay = layouts.get(key)
                    if lay is None:  # Tensor.nbytes costs ~0.8 us; most roots repeat a layout
                        a = aligns[bid]
                        lay = layouts[key] = len(layout_size)
                        layout_size.append(-(-t.nbytes // a) * a)  # align_up, inlined
                        layout_bid.append(bid)
                    layout[k] = lay
                    root_of[k] = len(roots)
                    roots.append(k)
                    sizes.append(layout_size[lay])
                    if f & OUTPUT:
                        pinned[k] = 1
                    op = t.op
                    if op is None or f & INPUT:  # an INPUT's bytes are set before any node
                        starts.append(0)
                        if op is not None and explain:
                            may = op.inplace if default_rule else self.can_inplace(op)
                            refusals[t] = _REFUSED_INPUT if may else _REFUSED_OP
                    else:
                        starts.append(s)
                        if op.inplace if default_rule else self.can_inplace(op):
                            js = [pos[p] for p in t.srcs]
                            cand.append(k)
                            cand_srcs.append(js)
                            if s:
                                for j in js:
                                    last[j] = s
                            continue  # its reads are counted
                        if explain:
                            refusals[t] = _REFUSED_OP  # the common case: one shared tuple
                if s:
                    for p in t.srcs:
                        last[pos[p]] = s
            if len(tensors) < len(self.graph.leafs) + len(self.graph.nodes):
                self.reread(last)  # some tensor is listed twice
            if self.in_order and (len(pos) < n or any(r in pos for r in strays)):
                raise _OutOfOrder  # a tensor listed twice, or a view before its root
        except KeyError:
            if self.in_order:
                raise _OutOfOrder from None  # perhaps a src listed after its reader
            for t in self.graph.nodes:
                for p in t.srcs:
                    if p not in pos:
                        raise PlanError(f"{p!r}, read by {t!r}, is not in the graph") from None
            raise
        end_step = self.end_step
        view_end = [-1] * n
        for k, j in zip(views, view_root, strict=True):
            if tensors[k].flags.real & OUTPUT:
                pinned[j] = 1
                e = end_step
            else:
                e = last[k] if last[k] >= 0 else end_step  # an unread view is a result
            if e > view_end[j]:
                view_end[j] = e
        self.root_of, self.layout, self.pinned, self.view_end = root_of, layout, pinned, view_end
        self.last = last

    def reread(self, last: list[int]) -> None:
        """Reads at a tensor's later listings (scan() reads only at its first)."""
        pos, step = self.pos, self.step
        for i, t in enumerate(self.graph.nodes, 1):
            if step[pos[t]] != i:
                for p in t.srcs:
                    j = pos[p]
                    if i > last[j]:
                        last[j] = i

    def refusal(self, t: Tensor, p: Tensor, s: int) -> str | None:
        """Why node t (at step s) may not take parent p's bytes; None if it may. The
        explanation of decide()'s test, which checks the same facts on lists."""
        j = self.pos[p]
        if self.layout[j] < 0:
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

    def decide(self) -> Liveness:
        """Each candidate takes the bytes of its first src that it may take (ggml: first
        by index), joining that src's block; then the blocks."""
        tensors, roots, root_of, starts = self.tensors, self.roots, self.root_of, self.starts
        layout, pinned, last, view_end = self.layout, self.pinned, self.last, self.view_end
        step, explain = self.step, self.explain
        head = list(range(len(roots)))  # a root's place -> its block root's place
        is_block = bytearray(b"\x01") * len(roots)  # by root place: does it start a block
        last_member = roots[:]  # by block root place: its last member's index ...
        last_start = starts[:]  # ... and that member's first step
        inplace: dict[Tensor, Tensor] = {}
        for k, js in zip(self.cand, self.cand_srcs, strict=True):
            s = step[k]
            lay = layout[k]
            for i, j in enumerate(js):
                if (
                    last[j] == s
                    and layout[j] == lay
                    and not pinned[j]
                    and view_end[j] < s
                    and js.count(j) == 1
                ):
                    r, h = root_of[k], head[root_of[j]]
                    head[r], is_block[r] = h, 0
                    last_member[h], last_start[h] = k, s
                    inplace[tensors[k]] = tensors[j]
                    if explain and i:
                        self.explain_refused(k, s, js[:i])
                    break
            else:
                if explain:
                    self.explain_refused(k, s, js)
        end_step = self.end_step
        ends = []
        block_ends = zip(
            compress(last_member, is_block), compress(last_start, is_block), strict=True
        )
        for k, s in block_ends:
            e = last[k]
            if view_end[k] > e:
                e = view_end[k]
            if e < 0 or pinned[k]:  # nobody reads it, or it must outlive the graph
                e = end_step
            ends.append(e if e > s else s)
        rank = list(accumulate(is_block))  # a root's place -> 1 + its block's number
        layout_bid = self.layout_bid
        return Liveness(
            end_step,
            tensors,
            roots,
            [rank[h] - 1 for h in head],
            [layout_bid[layout[k]] for k in compress(roots, is_block)],
            list(compress(starts, is_block)),
            ends,
            list(compress(self.sizes, is_block)),
            inplace,
            self.refusals,
        )

    def explain_refused(self, k: int, s: int, js: list[int]) -> None:
        t, tensors = self.tensors[k], self.tensors
        self.refusals[t] = tuple((tensors[j], self.refusal(t, tensors[j], s) or "") for j in js)

    def run(self, specs: Sequence[BufferSpec], in_order: bool) -> Liveness:
        self.index(in_order)
        self.scan(specs)
        return self.decide()


class _OutOfOrder(Exception):
    """The graph lists a tensor twice, or a src or view root after its reader."""


def analyze(
    graph: Graph,
    specs: Sequence[BufferSpec],
    owner: object | None = None,
    can_inplace: Callable[[Op], bool] = op_allows_inplace,
    explain: bool = True,
) -> Liveness:
    """Blocks of the tensors `owner` plans in `graph`, with their live intervals.
    explain=False leaves `refusals` empty (the planner asks for them only to log them)."""
    try:
        return _Analysis(graph, owner, can_inplace, explain).run(specs, in_order=True)
    except _OutOfOrder:
        return _Analysis(graph, owner, can_inplace, explain).run(specs, in_order=False)

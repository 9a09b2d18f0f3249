"""The `ggml` strategy: ggml-alloc's online planner, rule for rule.

Three passes: place every leaf in leaf order; count each tensor's children (one per read)
and views, placing INPUT tensors; then walk the nodes in order: place the node (over a
parent's bytes when the in-place rule allows) before releasing parents, and free a
parent once its children and views both reach zero. Offsets come from `DynAllocator`.

Deviations from ggml, each needed for the allocator contract:
- a leaf view (`ops.ref`) of a tensor planned here counts as a view and keeps its root
  alive; ggml counts view nodes only, so the root could be reused under the leaf view;
- an OUTPUT view pins its root; ggml tests only the root's own OUTPUT flag;
- a node never takes a parent's bytes across buffer ids, and an INPUT node never takes
  any; every tensor is planned in its own `buffer_id` (ggml passes ids per position);
- ggml's `free_extra_space` has nothing to do: in place requires the same layout, hence
  the same size; there is no limit on free blocks or chunks.
"""

from __future__ import annotations

from collections.abc import Sequence

from tensorplan.alloc.freelist import DynAllocator, align_up
from tensorplan.alloc.liveness import INPUT, OUTPUT, owns
from tensorplan.alloc.plan import BufferSpec, Placement
from tensorplan.graph import Graph
from tensorplan.tensor import Tensor

# ggml_op_can_inplace (early 2024): SCALE, ADD, SUB, MUL, DIV, SQRT, UNARY, RMS_NORM, SOFT_MAX.
# Not LayerNorm (ggml's NORM), matmul, cont, cast, concat, im2col, get_rows.
INPLACE_OPS = frozenset(
    {"add", "sub", "mul", "div", "scale", "sqrt", "neg", "exp", "tanh", "gelu", "silu", "relu",
     "rms_norm", "softmax"}
)  # fmt: skip


class _Rec:
    """ggml's hash_node: per-tensor counters and the address once placed."""

    __slots__ = ("children", "views", "allocated", "chunk", "offset", "size")

    def __init__(self) -> None:
        self.children = self.views = 0
        self.allocated = False
        self.chunk = self.offset = self.size = 0


class _Sim:
    def __init__(self, graph: Graph, specs: Sequence[BufferSpec], owner: object | None):
        self.graph, self.specs, self.owner = graph, specs, owner
        self.dyn = [DynAllocator(s.alignment, s.max_size) for s in specs]
        self.recs: dict[Tensor, _Rec] = {}
        self.pinned: set[Tensor] = set()  # roots of OUTPUT views
        self.placed: dict[Tensor, Placement] = {}
        self.inplace: dict[Tensor, Tensor] = {}

    def rec(self, t: Tensor) -> _Rec:
        r = self.recs.get(t)
        if r is None:
            r = self.recs[t] = _Rec()
        return r

    def alloc(self, t: Tensor) -> None:
        if t.view_src is not None or not owns(t, self.owner):
            return  # views and external tensors get no memory
        r = self.rec(t)
        if r.allocated:
            return
        r.allocated = True
        r.size = align_up(t.nbytes, self.specs[t.buffer_id].alignment)
        p = self.inplace_parent(t)
        if p is not None:
            pr = self.recs[p]
            r.chunk, r.offset = pr.chunk, pr.offset
            pr.allocated = False  # p is never freed: its bytes are t's now
            self.inplace[t] = p
        else:
            r.chunk, r.offset = self.dyn[t.buffer_id].alloc(r.size)
        self.placed[t] = Placement(t.buffer_id, r.chunk, r.offset, r.size)

    def inplace_parent(self, t: Tensor) -> Tensor | None:
        if t.op is None or t.op.name not in INPLACE_OPS or t.flags.real & INPUT:
            return None
        for p in t.srcs:
            pr = self.recs.get(p)
            if pr is None or not pr.allocated:
                continue  # external, a view, or already freed
            if p.flags.real & OUTPUT or p in self.pinned or p.buffer_id != t.buffer_id:
                continue
            if t.same_layout(p) and pr.children == 1 and pr.views == 0:
                return p
        return None

    def free(self, t: Tensor) -> None:
        if t.flags.real & OUTPUT or t in self.pinned:
            return  # outputs are never freed
        r = self.recs[t]
        self.dyn[t.buffer_id].free(r.chunk, r.offset, r.size)
        r.allocated = False

    def count(self) -> None:
        """Children, views and OUTPUT pins; INPUT tensors placed before any node."""
        for v in dict.fromkeys([*self.graph.leafs, *self.graph.nodes]):
            if v.view_src is not None:
                self.rec(v.view_src).views += 1
                if v.flags.real & OUTPUT:
                    self.pinned.add(v.view_src)
        for node in self.graph.nodes:
            if node.flags.real & INPUT:
                self.alloc(node)
            for src in node.srcs:
                self.rec(src).children += 1
                if src.flags.real & INPUT:
                    self.alloc(src)

    def release(self, p: Tensor) -> None:
        """One read of p is done; free p (or its root, for a view) when none remain."""
        pr = self.recs[p]
        pr.children -= 1
        if pr.children or pr.views:
            return
        root = p.view_src
        if root is not None:
            rr = self.recs[root]
            rr.views -= 1
            if rr.views == 0 and rr.children == 0 and rr.allocated:
                self.free(root)
        elif pr.allocated:
            self.free(p)

    def run(self) -> None:
        for leaf in self.graph.leafs:
            self.alloc(leaf)
        self.count()
        for node in self.graph.nodes:
            for src in node.srcs:
                self.alloc(src)
            self.alloc(node)
            for src in node.srcs:
                self.release(src)


def simulate(
    graph: Graph, specs: Sequence[BufferSpec], owner: object | None = None
) -> tuple[dict[Tensor, Placement], tuple[tuple[int, ...], ...], dict[Tensor, Tensor]]:
    """(placements, chunk sizes per buffer id, in-place node -> parent) as ggml plans."""
    sim = _Sim(graph, specs, owner)
    sim.run()
    chunk_sizes = tuple(tuple(d.chunk_sizes() or [0]) for d in sim.dyn)
    return sim.placed, chunk_sizes, sim.inplace

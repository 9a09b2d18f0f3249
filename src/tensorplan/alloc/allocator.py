"""GraphAllocator: plans a graph, owns the buffers, binds tensors (docs/allocator.md rule 8).

    >>> from tensorplan import ops
    >>> from tensorplan.alloc import GraphAllocator
    >>> from tensorplan.graph import Graph
    >>> class Buf:
    ...     def __init__(self, size): self.size = size
    >>> class Cpu:
    ...     name, alignment, max_size = "cpu", 64, 1 << 40
    ...     def alloc_buffer(self, size): return Buf(size)
    >>> x = ops.input((256,))
    >>> y = ops.gelu(ops.add(x, x)).set_output()
    >>> galloc = GraphAllocator([Cpu()])
    >>> g = Graph.build(y)
    >>> galloc.reserve(g)          # plan only: sizes per buffer type, nothing bound
    [2048]
    >>> galloc.alloc_graph(g)      # buffers made, every planned tensor bound
    True
    >>> y.offset == g.nodes[0].offset   # gelu ran in place over the add
    True
    >>> galloc.needs_realloc(g)
    False

One allocator per graph, as in ggml: re-planning reuses the same buffers, so tensors of an
earlier graph it planned are overwritten unless that graph is planned again.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from tensorplan.alloc.liveness import owns
from tensorplan.alloc.offline import DEFAULT_BUDGET_S
from tensorplan.alloc.plan import STRATEGIES, Plan
from tensorplan.alloc.planner import plan_graph
from tensorplan.graph import Graph
from tensorplan.tensor import Buffer, BufferType, Tensor

log = logging.getLogger("tensorplan.alloc")

Fingerprint = list[tuple[object, ...]]


def fingerprint(graph: Graph, owner: object | None) -> Fingerprint:
    """Everything the planner reads, per tensor in graph order: identity, inputs, flags,
    buffer id, layout, view root and offset, and whether its root is external. Equal
    fingerprints give equal plans (planning is deterministic)."""
    return [
        (
            t,
            t.srcs,
            t.flags.real,
            t.buffer_id,
            t.shape,
            t.strides,
            t.dtype,
            t.view_src,
            t.view_offset,
            owns(t.root, owner),
        )
        for ts in (graph.leafs, graph.nodes)
        for t in ts
    ]


class GraphAllocator:
    """Plans graphs for a list of buffer types (a tensor picks one by `buffer_id`).

    `strategy` is "offline" (default), "exact" or "ggml". `max_nodes` bounds offline's
    search in nodes (default DEFAULT_MAX_NODES; exact: none), so plans do not depend on the
    clock; `budget_s` is a wall-clock stop besides. Buffer ids share no memory, even when
    they use the same type.
    """

    def __init__(
        self,
        buffer_types: Sequence[BufferType],
        strategy: str = "offline",
        budget_s: float = DEFAULT_BUDGET_S,
        max_nodes: int | None = None,
    ) -> None:
        if not buffer_types:
            raise ValueError("GraphAllocator needs at least one buffer type")
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {strategy!r}; choose from {STRATEGIES}")
        self.buffer_types = tuple(buffer_types)
        self.strategy = strategy
        self.budget_s = budget_s
        self.max_nodes = max_nodes
        self.plan: Plan | None = None
        self._planned_for: Fingerprint | None = None
        self._buffers: list[list[Buffer]] = [[] for _ in self.buffer_types]

    # ---- planning ---------------------------------------------------------------------
    def reserve(self, graph: Graph) -> list[int]:
        """Plan `graph` and return the planned bytes per buffer type. Binds no tensor and
        allocates no buffer; a later alloc_graph of the same graph reuses this plan."""
        self._replan(graph, fingerprint(graph, self))
        assert self.plan is not None
        return self.plan.sizes

    def needs_realloc(self, graph: Graph) -> bool:
        """True unless the stored plan was made for exactly this graph: the same tensors
        (by identity) in the same order, with the same inputs, flags, layouts, buffer ids
        and external tensors. A plan is never reused for a different graph."""
        return self.plan is None or self._planned_for != fingerprint(graph, self)

    def alloc_graph(self, graph: Graph) -> bool:
        """Plan if needed, grow buffers the plan outgrew (they never shrink), and bind every
        planned tensor and every view whose root has a buffer. Always returns True:
        unlike ggml with several buffers, re-planning here is always automatic."""
        key = fingerprint(graph, self)
        if self.plan is None or self._planned_for != key:
            self._replan(graph, key)
        assert self.plan is not None
        self._grow(self.plan)
        self._bind(self.plan, graph)
        return True

    def buffer_size(self, i: int) -> int:
        """Bytes of buffer type i: its buffers once allocated, else the planned size."""
        if self._buffers[i]:
            return sum(b.size for b in self._buffers[i])
        return self.plan.sizes[i] if self.plan is not None else 0

    @property
    def buffers(self) -> tuple[tuple[Buffer, ...], ...]:
        """[buffer id][chunk] -> the buffer allocated for it (empty before alloc_graph)."""
        return tuple(tuple(bufs) for bufs in self._buffers)

    # ---- internals --------------------------------------------------------------------
    def _replan(self, graph: Graph, key: Fingerprint) -> None:
        self.plan = plan_graph(
            graph, self.buffer_types, self.strategy, self.budget_s, self, self.max_nodes
        )
        self._planned_for = key

    def _grow(self, plan: Plan) -> None:
        for bid, sizes in enumerate(plan.chunk_sizes):
            buft, bufs = self.buffer_types[bid], self._buffers[bid]
            for chunk, size in enumerate(sizes):
                if chunk < len(bufs) and bufs[chunk].size >= size:
                    continue
                old = bufs[chunk].size if chunk < len(bufs) else 0
                log.debug("%s buffer %d chunk %d: %d -> %d B", buft.name, bid, chunk, old, size)
                buf = buft.alloc_buffer(size)
                if chunk < len(bufs):
                    bufs[chunk] = buf
                else:
                    bufs.append(buf)

    def _bind(self, plan: Plan, graph: Graph) -> None:
        for t, p in plan.placements.items():
            t.place(self._buffers[p.buffer_id][p.chunk], p.offset, by=self)
        for ts in (graph.leafs, graph.nodes):
            for t in ts:
                if t.view_src is not None:
                    _bind_view(t, self)


def _bind_view(view: Tensor, owner: object) -> None:
    """Bind a view to its root's bytes. A root with no buffer (a weight not loaded yet, a
    tensor of a graph not allocated yet) leaves the view unbound, as ggml does."""
    root = view.view_src
    assert root is not None
    if root.buffer is None:
        return
    offset = root.offset + view.view_offset
    if view.buffer is not root.buffer or view.offset != offset:
        view.place(root.buffer, offset, by=owner)

"""A fake buffer type and invariant checkers over *bound* tensors (llama.cpp's test-alloc).

The checkers look only at what alloc_graph bound (tensor.buffer / tensor.offset) and use a
liveness oracle written here, independently of both the planners and alloc.verify.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tensorplan.graph import Graph
from tensorplan.tensor import Flag, Tensor


class FakeBuffer:
    def __init__(self, size: int, buft: FakeBufferType) -> None:
        self.size = size
        self.buft = buft

    def __repr__(self) -> str:
        return f"FakeBuffer({self.buft.name}, {self.size})"


@dataclass(eq=False)
class FakeBufferType:
    """Counts every buffer it hands out; no memory behind it."""

    name: str = "fake"
    alignment: int = 8
    max_size: int = 1 << 62
    allocated: list[int] = field(default_factory=list)

    def alloc_buffer(self, size: int) -> FakeBuffer:
        self.allocated.append(size)
        return FakeBuffer(size, self)


class PresetBuffer:
    """A buffer the caller made itself (a dedicated buffer for a persistent tensor)."""

    def __init__(self, size: int) -> None:
        self.size = size


# ---- the oracle ------------------------------------------------------------------------------
def birth(graph: Graph, t: Tensor) -> int:
    """Step that writes t: 0 for leafs and INPUT tensors, else 1 + its node index."""
    if t.op is None or Flag.INPUT in t.flags:
        return 0
    return graph.nodes.index(t) + 1


def last_use(graph: Graph, root: Tensor) -> int:
    """Last step that reads root or a view of it; len(nodes) when something pins it."""
    end = len(graph.nodes)
    family = [root] + [v for v in [*graph.leafs, *graph.nodes] if v.view_src is root]
    if any(Flag.OUTPUT in t.flags for t in family):
        return end
    readers = [k + 1 for k, node in enumerate(graph.nodes) if any(s in family for s in node.srcs)]
    unread_views = [v for v in family[1:] if not any(v in n.srcs for n in graph.nodes)]
    if not readers or unread_views:
        return end
    return max(readers)


def may_share(graph: Graph, first: Tensor, second: Tensor) -> bool:
    """May `second` (born no earlier) take bytes of `first`? Only once first is dead, or
    as an in-place handoff at first's last use."""
    b = birth(graph, second)
    end = last_use(graph, first)
    if end < b:
        return True
    return (
        end == b
        and second.op is not None
        and second.op.inplace
        and second.srcs.count(first) == 1
        and second.same_layout(first)
        and second.offset == first.offset
        and Flag.OUTPUT not in first.flags
    )


# ---- checkers --------------------------------------------------------------------------------
def planned_tensors(graph: Graph, owner: object) -> list[Tensor]:
    return [t for t in [*graph.leafs, *graph.nodes] if t.view_src is None and t.placed_by is owner]


def check_all_allocated(graph: Graph) -> None:
    """Every tensor has bytes, views at their root's; only a weight not loaded yet or a
    tensor outside the graph may lack them (and then its views too)."""
    members = set([*graph.leafs, *graph.nodes])
    for t in members:
        root = t.root
        if root.buffer is None:
            assert Flag.PARAM in root.flags or root not in members, f"{t!r} was not allocated"
            assert t.buffer is None, f"{t!r} bound though its root is not"
        elif t.view_src is not None:
            assert t.buffer is root.buffer and t.offset == root.offset + t.view_offset, t


def check_no_overlap(graph: Graph, owner: object) -> None:
    planned = planned_tensors(graph, owner)
    for i, a in enumerate(planned):
        for b in planned[i + 1 :]:
            if a.buffer is not b.buffer or not a.nbytes or not b.nbytes:
                continue
            if a.offset >= b.offset + b.nbytes or b.offset >= a.offset + a.nbytes:
                continue
            first, second = (a, b) if birth(graph, a) <= birth(graph, b) else (b, a)
            if birth(graph, first) == birth(graph, second):
                raise AssertionError(f"{a!r} and {b!r} are born together but overlap")
            assert may_share(graph, first, second), f"{second!r} overlaps live {first!r}"


def check_max_size(graph: Graph, owner: object) -> None:
    """Every tensor ends within its buffer type's max size, unless a tensor in the same
    buffer is itself bigger (it gets a chunk of its own size, which others may share)."""
    planned = planned_tensors(graph, owner)
    for t in planned:
        buft = t.buffer.buft  # type: ignore[union-attr]
        biggest = max(u.nbytes for u in planned if u.buffer is t.buffer)
        biggest = -(-biggest // buft.alignment) * buft.alignment  # as the planner sizes it
        assert t.offset + t.nbytes <= max(buft.max_size, biggest), t
        assert t.offset % buft.alignment == 0, t


def check_all(graph: Graph, owner: object) -> None:
    check_all_allocated(graph)
    check_no_overlap(graph, owner)
    check_max_size(graph, owner)

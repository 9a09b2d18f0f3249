"""Several graphs run in sequence and hand tensors to each other.

A stage is a graph; a *handoff* is a tensor one stage produces and later stages read
(Whisper: the encoder result, the cross-attention K/V). Later stages read it through
`ops.ref`, a leaf view, so to them it is external. Three ways keep it alive (docs/plan-modes.md):

- `dedicated`: the producer copies it into a persistent tensor of its own buffer;
- `output`: it is flagged OUTPUT in the producer's compute buffer; each stage plans alone;
- `joint`: all stages are planned as one timeline in one arena; the handoff stays live
  from its producer to its last reader, everything else shares memory.

Stages that never run at the same time and hand nothing to each other (the decoder's
prompt and step graphs, say) can share one compute buffer: `group=` names such a set.
A stage added with `joint=False` stays off the joint timeline and is planned with its
group even in joint mode: graphs run only now and then (word alignment) whose OUTPUT
tensors would otherwise stay pinned across the whole joint arena.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from tensorplan import ops
from tensorplan.alloc import BufferType, GraphAllocator
from tensorplan.graph import Graph
from tensorplan.tensor import Buffer, Flag, Tensor

log = logging.getLogger("tensorplan.pipeline")

PLAN_MODES = ("dedicated", "output", "joint")


class SharedArena:
    """A BufferType whose buffers are one backing allocation, for allocators whose graphs
    never run at the same time. Reserve every user's size first, then allocate."""

    def __init__(self, inner: BufferType) -> None:
        self.inner = inner
        self.name = f"{inner.name}-shared"
        self.alignment = inner.alignment
        self.max_size = inner.max_size
        self.capacity = 0
        self.backing: Buffer | None = None

    def reserve(self, size: int) -> None:
        self.capacity = max(self.capacity, size)

    def alloc_buffer(self, size: int) -> Buffer:
        if self.backing is None or self.backing.size < size:
            # a user that grows past the reserved capacity gets fresh memory; earlier users
            # keep the old backing alive through their tensors, so nothing is corrupted
            self.backing = self.inner.alloc_buffer(max(size, self.capacity))
        return self.backing


@dataclass
class Stage:
    name: str
    graph: Graph
    group: str | None = None
    allocator: GraphAllocator | None = None
    joint: bool = True  # on the joint timeline (in joint mode)


@dataclass
class Pipeline:
    buffer_type: BufferType
    mode: str = "joint"
    strategy: str = "offline"
    stages: dict[str, Stage] = field(default_factory=dict)
    persistent: list[Tensor] = field(default_factory=list)
    joint_allocator: GraphAllocator | None = None
    arenas: dict[str, SharedArena] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.mode not in PLAN_MODES:
            raise ValueError(f"unknown plan mode {self.mode!r}; choose from {PLAN_MODES}")

    # ---- building ------------------------------------------------------------------
    def handoff(
        self, t: Tensor, make_persistent: object, read_repeatedly: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """Make t readable by later stages. Returns (what later stages `ref`, the node
        the producer must compute: the copy in dedicated mode, else None).
        `make_persistent(shape, dtype, name) -> Tensor` allocates a dedicated tensor.
        `read_repeatedly`: its readers run many times per producer run (the decoder
        steps reading cross K/V), so even the joint timeline must never reuse its bytes;
        otherwise the joint plan keeps it alive exactly until its last reader's step."""
        if self.mode == "dedicated":
            dst = make_persistent(t.shape, t.dtype, f"{t.name}.persistent")  # type: ignore[operator]
            self.persistent.append(dst)
            return dst, ops.copy_into(t, dst, name=f"{t.name}.copy")
        if self.mode == "output" or read_repeatedly:
            t.flags |= Flag.OUTPUT
        return t, None

    def add(self, name: str, outputs: Sequence[Tensor], group: str | None = None,
            joint: bool = True) -> Stage:
        stage = Stage(name, Graph.build(list(outputs)), group, joint=joint)
        self.stages[name] = stage
        return stage

    def on_timeline(self, stage: Stage) -> bool:
        """Whether `stage` is planned inside the joint arena."""
        return self.mode == "joint" and stage.joint

    # ---- planning ---------------------------------------------------------------------
    def allocate(self) -> None:
        """Plan and bind every stage (once; plans are reused across runs)."""
        alone = [s for s in self.stages.values() if not self.on_timeline(s)]
        if self.mode == "joint":
            joint = joint_graph([s.graph for s in self.stages.values() if s.joint])
            self.joint_allocator = GraphAllocator([self.buffer_type], strategy=self.strategy)
            self.joint_allocator.alloc_graph(joint)
        for stage in alone:
            buft: BufferType = self.buffer_type
            if stage.group is not None:
                buft = self.arenas.setdefault(stage.group, SharedArena(self.buffer_type))
            stage.allocator = GraphAllocator([buft], strategy=self.strategy)
        for stage in alone:  # size every shared arena before binding any
            if stage.group is not None and stage.allocator is not None:
                self.arenas[stage.group].reserve(stage.allocator.reserve(stage.graph)[0])
        for stage in alone:
            assert stage.allocator is not None
            stage.allocator.alloc_graph(stage.graph)

    def compute_bytes(self) -> dict[str, int]:
        """Planned compute bytes per stage (per shared group; the joint arena as one)."""
        sizes: dict[str, int] = {}
        if self.joint_allocator is not None:
            sizes["joint"] = self.joint_allocator.buffer_size(0)
        for stage in self.stages.values():
            if self.on_timeline(stage):
                continue
            assert stage.allocator is not None
            key = stage.group or stage.name
            sizes[key] = max(sizes.get(key, 0), stage.allocator.buffer_size(0))
        return sizes


def joint_graph(graphs: Sequence[Graph]) -> Graph:
    """All stages on one timeline: nodes in stage order, then the leafs of every stage."""
    nodes: list[Tensor] = []
    leafs: list[Tensor] = []
    outputs: list[Tensor] = []
    for g in graphs:
        nodes.extend(g.nodes)
        leafs.extend(g.leafs)
        outputs.extend(g.outputs)
    return Graph(nodes, leafs, outputs)

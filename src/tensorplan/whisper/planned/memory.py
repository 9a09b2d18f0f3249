"""How much memory a planned Whisper model holds besides its weights, and where.

`memory_report(model)` reads the model's pipeline (docs/plan-modes.md): each
graph's compute buffer with its lower bound (`alloc.lower_bound`, the checker that shares
no code with the planner), the KV caches, the dedicated handoff copies, the weights and the
bytes copied per window. `whisper_cpp_reference(dims)` gives whisper.cpp's buffers for the
same dims (its measured 1.8.5 buffers, or the closed forms of its allocator), and
`arena_layout(model)` puts every planned tensor on a step x offset plane for
`tensorplan plan --png`.

Every byte is counted once: the cross-attention K/V that output and joint modes keep as
OUTPUT tensors inside a compute buffer are taken out of that buffer's row (and its lower
bound) and shown on the kv cross row. MB is 1e6 bytes, as whisper.cpp prints it.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from tensorplan import alloc
from tensorplan.alloc import GraphAllocator
from tensorplan.graph import Graph
from tensorplan.pipeline import Pipeline, Stage, joint_graph
from tensorplan.tensor import Flag, Tensor
from tensorplan.whisper.model_files.ct2_weights import ModelDims as Dims
from tensorplan.whisper.planned.model import WhisperModel

MB = 1_000_000
WINDOW_STAGES = ("conv", "encoder", "cross")  # run once per 30 s window (the decoder per token)
COMPUTE, STAGE, KV, PERSISTENT = "compute", "stage", "kv", "persistent"  # Row.kind
# a buffer a session binds only when it first needs it (word alignment), not in the total
ON_DEMAND = "on demand"


@dataclass(frozen=True, slots=True)
class Row:
    """One line of a report. `bytes` is None for a STAGE row: a graph planned inside the
    joint arena, shown for its lower bound; its bytes are the arena's. KV and PERSISTENT
    rows are tensors outside the planner: their lower bound is their size."""

    name: str
    kind: str
    bytes: int | None
    lower_bound: int
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.bytes is None or self.lower_bound == 0:
            return None
        return self.bytes / self.lower_bound


@dataclass(frozen=True, slots=True)
class MemoryReport:
    plan: str
    strategy: str
    rows: tuple[Row, ...]  # compute rows (and joint STAGE rows), then kv self, kv cross, persistent
    kv_self_bytes: int
    kv_cross_bytes: int  # dedicated: persistent copies; output/joint: OUTPUT tensors of cross
    persistent_bytes: int  # other handoff copies (dedicated: embd_conv, embd_enc)
    weights_bytes: int  # PARAM tensors as held (their dtype), each counted once
    n_weights: int
    copy_bytes_per_window: int  # written by copy_into nodes of the once-per-window graphs
    decoder_worst: str  # the stage name of the largest decoder graph

    @property
    def compute_bytes(self) -> int:
        return sum(r.bytes or 0 for r in self.rows if r.kind == COMPUTE)

    @property
    def total_non_weight_bytes(self) -> int:
        return (self.compute_bytes + self.kv_self_bytes + self.kv_cross_bytes
                + self.persistent_bytes)

    @property
    def total_lower_bound(self) -> int:
        return sum(r.lower_bound for r in self.rows if r.bytes is not None and r.kind != ON_DEMAND)

    @property
    def on_demand_bytes(self) -> int:
        """Compute bytes bound only by a session's first word alignment."""
        return sum(r.bytes or 0 for r in self.rows if r.kind == ON_DEMAND)


@dataclass(frozen=True, slots=True)
class ReferenceRow:
    name: str
    bytes: int
    source: str


class LoadedModel(Protocol):
    """What the reports read of the API's `Whisper` (which sits above): its planned model."""

    @property
    def model(self) -> WhisperModel: ...


# ---- the report -----------------------------------------------------------------------------
def memory_report(model: WhisperModel | LoadedModel) -> MemoryReport:
    """The memory of a loaded (planned) model, per buffer, against its lower bounds."""
    m = model if isinstance(model, WhisperModel) else model.model
    pipe = m.pipeline
    kv_cross = _roots(t for pair in m.kv_cross for t in pair)
    kv_self = _roots(t for pair in m.kv_self for t in pair)
    other = [t for t in _roots(pipe.persistent) if t not in kv_cross]
    stages = _measure(pipe, kv_cross)
    kv_cross_bytes = sum(_held_size(t) for t in kv_cross)
    rows = _compute_rows(pipe, stages, kv_cross)
    rows += [
        Row("kv self", KV, _size(kv_self), _size(kv_self), _describe(kv_self)),
        Row("kv cross", KV, kv_cross_bytes, kv_cross_bytes, _where(pipe, kv_cross)),
        Row("persistent", PERSISTENT, _size(other), _size(other),
            ", ".join(t.name for t in other) or "no handoff copies"),
    ]
    weights = _weights(pipe)
    decoder = stages.get("decoder")
    return MemoryReport(
        plan=pipe.mode,
        strategy=pipe.strategy,
        rows=tuple(rows),
        kv_self_bytes=_size(kv_self),
        kv_cross_bytes=kv_cross_bytes,
        persistent_bytes=_size(other),
        weights_bytes=_size(weights),
        n_weights=len(weights),
        copy_bytes_per_window=sum(
            n.nbytes for name in WINDOW_STAGES if name in pipe.stages
            for n in pipe.stages[name].graph.nodes if n.op is not None and n.op.name == "copy_into"
        ),
        decoder_worst=_worst(decoder).stage.name if decoder else "",
    )


@dataclass(frozen=True, slots=True)
class _Measured:
    """One stage: its own plan's size (0 in joint mode), its lower bound, and the cross
    K/V bytes it holds as planned OUTPUT tensors."""

    stage: Stage
    planned: int
    bound: int
    held: int


def _measure(pipe: Pipeline, kv_cross: list[Tensor]) -> dict[str, list[_Measured]]:
    """Every stage measured, grouped by the compute buffer they share (their group, else
    their own name), in pipeline order."""
    groups: dict[str, list[_Measured]] = {}
    for stage in pipe.stages.values():
        owner = _owner(pipe, stage)
        assert owner.plan is not None
        planned = owner.plan.sizes[0] if owner is stage.allocator else 0
        m = _Measured(stage, planned, _bound(stage.graph, owner),
                      _held(stage.graph, owner, kv_cross))
        groups.setdefault(stage.group or stage.name, []).append(m)
    return groups


def _worst(group: Sequence[_Measured]) -> _Measured:
    """The stage needing the most memory: by its own plan, then by its lower bound."""
    return max(group, key=lambda m: (m.planned, m.bound))


def _compute_rows(pipe: Pipeline, groups: dict[str, list[_Measured]],
                  kv_cross: list[Tensor]) -> list[Row]:
    rows = []
    buffers = pipe.compute_bytes()
    joint = pipe.joint_allocator
    for key, group in groups.items():
        shared = f"{len(group)} graphs share it, worst {_worst(group).stage.name}"
        note = shared if len(group) > 1 else ""
        bound = max(m.bound - m.held for m in group)
        if joint is not None and pipe.on_timeline(group[0].stage):
            rows.append(Row(key, STAGE, None, bound,
                            "; ".join(filter(None, ["planned in the joint arena", note]))))
        else:
            held = sum(m.held for m in group)
            kind = COMPUTE if group[0].stage.joint else ON_DEMAND
            if kind == ON_DEMAND:
                note = "; ".join(filter(None, [note, "word timestamps only, bound on first use"]))
            rows.append(Row(key, kind, buffers[key] - held, bound,
                            "; ".join(filter(None, [note, _excluded(buffers[key], held)]))))
    if joint is not None:
        timeline = _timeline(pipe)
        graph = joint_graph([s.graph for s in timeline])
        held = _held(graph, joint, kv_cross)
        size = buffers["joint"]
        rows.append(Row("joint arena", COMPUTE, size - held, _bound(graph, joint) - held,
                        "; ".join(filter(None, [f"{len(timeline)} graphs on one timeline",
                                                _excluded(size, held)]))))
    return rows


def _excluded(size: int, held: int) -> str:
    """The note of a buffer whose cross K/V are counted on the kv cross row instead."""
    return f"buffer {size / MB:.2f} less kv cross {held / MB:.2f} (own row)" if held else ""


def _timeline(pipe: Pipeline) -> list[Stage]:
    """The stages planned inside the joint arena, in order."""
    return [s for s in pipe.stages.values() if pipe.on_timeline(s)]


def _owner(pipe: Pipeline, stage: Stage) -> GraphAllocator:
    owner = stage.allocator or pipe.joint_allocator
    if owner is None or owner.plan is None:
        raise ValueError(f"stage {stage.name} is not planned yet (Pipeline.allocate)")
    return owner


def _bound(graph: Graph, owner: GraphAllocator) -> int:
    assert owner.plan is not None
    return alloc.lower_bound(graph, [s.alignment for s in owner.plan.specs], owner)[0]


def _held(graph: Graph, owner: GraphAllocator, tensors: Iterable[Tensor]) -> int:
    """Planned bytes of `tensors` that `owner` placed as nodes of `graph`."""
    assert owner.plan is not None
    nodes = set(graph.nodes)
    return sum(owner.plan.placements[t].size for t in tensors
               if t in nodes and t in owner.plan.placements)


def _held_size(t: Tensor) -> int:
    """Bytes a tensor holds: its planned (aligned) size if a graph allocator placed it."""
    owner = t.placed_by
    if isinstance(owner, GraphAllocator) and owner.plan is not None and t in owner.plan.placements:
        return owner.plan.placements[t].size
    return t.nbytes


def _where(pipe: Pipeline, kv_cross: list[Tensor]) -> str:
    if not kv_cross:
        return ""
    if all(t.placed_by is None for t in kv_cross):
        return "persistent copies"
    if pipe.joint_allocator is not None:
        return "OUTPUT tensors in the joint arena"
    return "OUTPUT tensors in the cross buffer"


def _roots(tensors: Iterable[Tensor]) -> list[Tensor]:
    """Distinct root tensors, in first-seen order."""
    return list(dict.fromkeys(t.root for t in tensors))


def _size(tensors: Iterable[Tensor]) -> int:
    return sum(t.nbytes for t in tensors)


def _describe(tensors: Sequence[Tensor]) -> str:
    shapes = sorted({(t.shape, t.dtype.name) for t in tensors})
    return ", ".join(f"{sum(1 for t in tensors if (t.shape, t.dtype.name) == s)} x "
                     f"{s[0]} {s[1]}" for s in shapes)


def _weights(pipe: Pipeline) -> list[Tensor]:
    """Every PARAM root the graphs read, once (a weight used twice is held once)."""
    return _roots(t for s in pipe.stages.values() for t in s.graph.leafs
                  if t.root.has(Flag.PARAM))


# ---- whisper.cpp ----------------------------------------------------------------------------
# bytes of graph metadata whisper.cpp adds to each compute line (ggml's graph overhead)
META_HEAD = 1_589_936
MEASURED_TINY_EN = (  # whisper.cpp 1.8.5, tiny.en, CPU, as printed (MB)
    ("kv self", 3.15), ("kv cross", 9.44), ("kv pad", 2.36), ("compute conv", 13.21),
    ("compute encode", 17.72), ("compute cross", 3.89), ("compute decode", 95.91),
)
MEASURED = "measured: whisper.cpp 1.8.5 tiny.en CPU (its default flash attention: encode 17.72)"


def whisper_cpp_reference(dims: Dims, flash_attn: bool = False) -> tuple[ReferenceRow, ...]:
    """whisper.cpp's buffers for these dims: the measured 1.8.5 figures for tiny and
    tiny.en, else the closed-form HEAD-era formulas (flash attention off unless asked)."""
    if _is_tiny(dims):
        return tuple(ReferenceRow(name, round(mb * MB), MEASURED) for name, mb in MEASURED_TINY_EN)
    fa = "on" if flash_attn else "off"
    source = f"formula: whisper.cpp's allocator, HEAD, flash attention {fa}"
    return tuple(ReferenceRow(name, n, source)
                 for name, n in whisper_cpp_formula(dims, flash_attn).items())


def whisper_cpp_formula(dims: Dims, flash_attn: bool = False) -> dict[str, int]:
    """whisper.cpp's buffers in bytes: its CPU compute buffers (one buffer, ggml-alloc v3+)
    and its HEAD-era float16 KV caches, in closed form."""
    n, e, mels = dims.n_audio_ctx, dims.n_audio_state, dims.n_mels
    layers, d, t = dims.n_text_layer, dims.n_text_state, dims.n_text_ctx
    u = n * e * 4  # one f32 (n_audio_ctx, n_audio_state) activation
    attention = 7 * u if flash_attn else dims.n_audio_head * n * n * 4 + 4 * u
    return {
        "kv self": 2 * layers * _pad(t, 256) * d * 2,
        "kv cross": 2 * layers * _pad(n, 256) * d * 2,
        "kv pad": e * _pad(n, 256) * 2 * 2,
        "compute conv": META_HEAD + 2 * n * mels * 4 + 3 * mels * 2 * n * 2 + 2 * (2 * n * e * 4),
        "compute encode": META_HEAD + attention,
        "compute cross": META_HEAD + u,
        "compute decode": META_HEAD + t * (dims.n_vocab + 2 * e) * 4,
    }


def _is_tiny(dims: Dims) -> bool:
    return (dims.n_audio_state, dims.n_audio_layer, dims.n_text_state, dims.n_text_layer,
            dims.n_mels, dims.n_audio_ctx, dims.n_text_ctx) == (384, 4, 384, 4, 80, 1500, 448)


def _pad(n: int, to: int) -> int:
    return -(-n // to) * to


# ---- the arena as boxes on a step x offset plane ----------------------------------------------
@dataclass(frozen=True, slots=True)
class Box:
    """One planned tensor: live from x `first` to `last` (inclusive) at [offset, offset+size)."""

    graph: str  # the buffer group of the graph it belongs to
    name: str
    first: int
    last: int
    offset: int
    size: int
    kv_cross: bool = False  # a cross-attention K/V kept as a planned OUTPUT tensor


@dataclass(frozen=True, slots=True)
class Span:
    """One graph's steps on the x axis, with its buffer's size and lower bound."""

    graph: str
    first: int
    last: int
    buffer_bytes: int
    lower_bound: int
    kv_cross_bytes: int = 0  # of buffer_bytes: the cross K/V planned in it (the kv cross row)


@dataclass(frozen=True, slots=True)
class ArenaLayout:
    plan: str
    strategy: str
    boxes: tuple[Box, ...]
    spans: tuple[Span, ...]  # side by side; joint: one arena, the same size on every span
    outside: tuple[tuple[str, int], ...] = ()  # (name, bytes) held beside the planned buffers

    @property
    def buffers(self) -> tuple[Span, ...]:
        """One span per buffer (the joint arena appears on every span; count it once)."""
        return self.spans[:1] if self.plan == "joint" else self.spans

    @property
    def total_bytes(self) -> int:
        """The report's total_non_weight_bytes: the buffers drawn plus what is beside them."""
        return sum(s.buffer_bytes for s in self.buffers) + sum(n for _, n in self.outside)


def arena_layout(model: WhisperModel | LoadedModel) -> ArenaLayout:
    """Every planned tensor of the conv, encoder, cross and worst-case decoder graphs, in
    timeline order. Separate buffers stand side by side, each with its own offsets; the
    joint arena is one timeline with the other decoder graphs' steps left out."""
    m = model if isinstance(model, WhisperModel) else model.model
    pipe = m.pipeline
    kv_cross = _roots(t for pair in m.kv_cross for t in pair)
    shown = [_worst(group) for group in _measure(pipe, kv_cross).values()
             if group[0].stage.joint]  # word alignment: bound on demand, not drawn
    if pipe.joint_allocator is not None:
        boxes, spans = _joint_boxes(pipe, [s.stage for s in shown if pipe.on_timeline(s.stage)],
                                    kv_cross)
    else:
        boxes, spans = _separate_boxes(pipe, shown, kv_cross)
    return ArenaLayout(pipe.mode, pipe.strategy, tuple(boxes), tuple(spans),
                       _outside(m, kv_cross))


def _outside(m: WhisperModel, kv_cross: list[Tensor]) -> tuple[tuple[str, int], ...]:
    """What the report counts that no planned buffer holds: the KV self cache always, the
    cross K/V when they are persistent copies (dedicated), the other handoff copies."""
    copies = [t for t in kv_cross if t.placed_by is None]
    other = [t for t in _roots(m.pipeline.persistent) if t not in kv_cross]
    held = (("kv self", _size(_roots(t for pair in m.kv_self for t in pair))),
            ("kv cross copies", _size(copies)), ("handoff copies", _size(other)))
    return tuple((name, n) for name, n in held if n)


def _separate_boxes(pipe: Pipeline, shown: list[_Measured],
                    kv_cross: list[Tensor]) -> tuple[list[Box], list[Span]]:
    boxes, spans, base = [], [], 0
    cross = set(kv_cross)
    for m in shown:
        owner = _owner(pipe, m.stage)
        assert owner.plan is not None
        key = m.stage.group or m.stage.name
        live = live_steps(m.stage.graph)
        for t, p in owner.plan.placements.items():
            first, last = live[t]
            boxes.append(Box(key, t.name, base + first, base + last, p.offset, p.size,
                             t in cross))
        n = len(m.stage.graph.nodes)
        spans.append(Span(key, base, base + n, m.planned, m.bound, m.held))
        base += n + 1
    return boxes, spans


def _joint_boxes(pipe: Pipeline, shown: list[Stage],
                 kv_cross: list[Tensor]) -> tuple[list[Box], list[Span]]:
    owner = pipe.joint_allocator
    assert owner is not None and owner.plan is not None
    graph = joint_graph([s.graph for s in _timeline(pipe)])
    held, cross = _held(graph, owner, kv_cross), set(kv_cross)
    kept: list[int] = [0]  # the joint steps shown, in order; x is an index into it
    spans: list[Span] = []
    group_of: dict[Tensor, str] = {}
    arena, bound = owner.plan.sizes[0], _bound(graph, owner)
    step = 0
    for stage in _timeline(pipe):
        key = stage.group or stage.name
        for t in stage.graph.tensors():
            group_of.setdefault(t, key)
        n = len(stage.graph.nodes)
        if stage in shown:
            first = len(kept) if spans else 0  # the first graph also owns step 0, graph start
            spans.append(Span(key, first, len(kept) + n - 1, arena, bound, held))
            kept += range(step + 1, step + n + 1)
        step += n
    live = live_steps(graph)
    boxes = []
    for t, p in owner.plan.placements.items():
        first, last = live[t]
        x0 = bisect.bisect_left(kept, first)
        x1 = bisect.bisect_right(kept, last) - 1
        if x0 <= x1:
            boxes.append(Box(group_of[t], t.name, x0, x1, p.offset, p.size, t in cross))
    return boxes, spans


def live_steps(graph: Graph) -> dict[Tensor, tuple[int, int]]:
    """(first, last) step of every root tensor of `graph`, inclusive, derived here from the
    graph alone (not from the planner). Step 0 is graph start, node i runs at step i + 1.
    A root lives from the step producing it (0 for leafs and INPUT tensors) to the last
    step reading it or any view of it; OUTPUT tensors, roots of OUTPUT views and tensors
    nobody reads (a graph's results) stay to the end, len(graph.nodes)."""
    end = len(graph.nodes)
    born: dict[Tensor, int] = {t: 0 for t in graph.leafs}
    for i, t in enumerate(graph.nodes):
        born.setdefault(t, i + 1)
    read: dict[Tensor, int] = {}
    for i, t in enumerate(graph.nodes):
        for src in t.srcs:
            read[src] = i + 1
    view_end: dict[Tensor, int] = {}  # root -> last step any view of it is live
    for t in born:
        if t.view_src is not None:
            stop = end if t.has(Flag.OUTPUT) or t not in read else read[t]
            view_end[t.view_src] = max(view_end.get(t.view_src, -1), stop)
    spans: dict[Tensor, tuple[int, int]] = {}
    for t, s in born.items():
        if t.view_src is None:
            stop = max(read.get(t, -1), view_end.get(t, -1))
            if stop < 0 or t.has(Flag.OUTPUT):
                stop = end
            first = 0 if t.op is None or t.has(Flag.INPUT) else s
            spans[t] = (first, max(stop, first))
    return spans

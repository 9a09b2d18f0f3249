"""The backend contract: buffer types hand out Buffers, executors run planned graphs over them.

A planned tensor is a view at (buffer, offset) with its dtype, shape and byte strides. An
executor makes that view once per plan, reuses it across runs, and runs every node's kernel
into its planned output, so executing a graph allocates no tensor-sized memory.

Plans can be made once and run by many executors: plan against a `TemplateBufferType`,
whose buffers have a size but no bytes, then give each executor real buffers of those
sizes (`Backend.executor(bindings)`). Weights (PARAM leafs in real buffers) are shared by
every executor; each executor's arenas and caches are its own. This is how one loaded
model serves many independent sessions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from tensorplan import dtype as dt
from tensorplan.dtype import DType
from tensorplan.graph import Graph
from tensorplan.tensor import Buffer, BufferType, Tensor


class TemplateBuffer:
    """A buffer with a size and no bytes: a slot a plan refers to, which each executor
    binds to a real buffer of its own."""

    __slots__ = ("name", "size")

    def __init__(self, size: int, name: str = "") -> None:
        self.size, self.name = size, name

    def __repr__(self) -> str:
        return f"TemplateBuffer({self.name or '?'}: {self.size} B)"


class TemplateBufferType:
    """Plans against `inner`'s alignment and size limit, handing out TemplateBuffers."""

    def __init__(self, inner: BufferType) -> None:
        self.inner = inner
        self.name = f"{inner.name}-template"
        self.alignment = inner.alignment
        self.max_size = inner.max_size
        self.made: list[TemplateBuffer] = []

    def alloc_buffer(self, size: int) -> TemplateBuffer:
        if not 0 <= size <= self.max_size:
            raise ValueError(f"{self.name}: cannot plan {size} B (max {self.max_size} B)")
        buf = TemplateBuffer(size, f"{self.name}#{len(self.made)}")
        self.made.append(buf)
        return buf

    def persistent(self, shape: Sequence[int], dtype: DType | str, name: str = "") -> Tensor:
        """A tensor alone in a template buffer: a KV cache or a cross-graph result that
        every executor holds zeroed in memory of its own."""
        t = Tensor(tuple(shape), dt.dtype(dtype), name=name)
        t.place(self.alloc_buffer(t.nbytes), 0)
        return t


def templates_of(tensors: Sequence[Tensor]) -> list[TemplateBuffer]:
    """The distinct template buffers `tensors` (or their view roots) live in, in order."""
    found: dict[int, TemplateBuffer] = {}
    for t in tensors:
        buf = t.root.buffer
        if isinstance(buf, TemplateBuffer):
            found.setdefault(id(buf), buf)
    return list(found.values())


class Executor(Protocol):
    """Runs planned graphs over one set of buffers. Tensors must be placed (by an allocator
    or the caller) before `set`, `get` or `compute` touch them; a missing placement, or a
    template buffer this executor was not given, is a ValueError. One executor is used by
    one thread at a time; executors of one backend may run on different threads at once."""

    def set(self, t: Tensor, value: Any) -> None:
        """Copy `value` (array-like of t's shape) into t's bytes. Raises ValueError on a
        shape mismatch and TypeError when the value's dtype cannot become t's."""
        ...

    def get(self, t: Tensor) -> Any:
        """A host copy of t's current value."""
        ...

    def compute(self, graph: Graph) -> None:
        """Run graph.nodes in order, each into its planned output."""
        ...

    def copy_slots(self, t: Tensor, n_slots: int, sources: Sequence[int], n_rows: int,
                   targets: Sequence[int] | None = None) -> None:
        """t's first axis is n_slots equal runs of rows (a KV cache of n_slots sequences):
        slot targets[i] (default: i) takes the first `n_rows` rows of slot sources[i], all
        at once (sources may repeat and overlap the destinations)."""
        ...


class Backend(Executor, Protocol):
    """Makes weights and executors. As an Executor itself it runs over real buffers only
    (tests, one-off graphs); `executor(bindings)` gives one over template buffers."""

    @property
    def buffer_type(self) -> BufferType: ...

    def param(self, value: Any, name: str = "") -> Tensor:
        """A PARAM leaf holding `value` in a buffer of its own (external to every plan),
        readable by every executor of this backend."""
        ...

    def persistent(self, shape: Sequence[int], dtype: DType, name: str = "") -> Tensor:
        """A zeroed, placed tensor in a real buffer of its own."""
        ...

    def executor(self, bindings: Mapping[TemplateBuffer, Buffer] | None = None) -> Executor:
        """An executor whose template buffers are `bindings`' real ones (each made by
        `buffer_type.alloc_buffer(template.size)`)."""
        ...


class RunsItsOwn:
    """A backend is also an executor over real buffers (tests, one-off graphs): these
    delegate to the executor it keeps for that, `self._own`."""

    _own: Any

    @property
    def views_made(self) -> int:
        """Views its own executor made so far (steady runs of one plan add none)."""
        return int(self._own.views_made)

    def set(self, t: Tensor, value: Any) -> None:
        self._own.set(t, value)

    def get(self, t: Tensor) -> Any:
        return self._own.get(t)

    def copy_slots(self, t: Tensor, n_slots: int, sources: Sequence[int], n_rows: int,
                   targets: Sequence[int] | None = None) -> None:
        self._own.copy_slots(t, n_slots, sources, n_rows, targets)

    def compute(self, graph: Graph) -> None:
        self._own.compute(graph)


def bind_templates(buffer_type: BufferType,
                   templates: Sequence[TemplateBuffer]) -> dict[TemplateBuffer, Buffer]:
    """A zeroed real buffer for every template: one executor's memory."""
    return {t: buffer_type.alloc_buffer(t.size) for t in templates}


__all__ = ["Backend", "Buffer", "BufferType", "Executor", "RunsItsOwn", "TemplateBuffer",
           "TemplateBufferType", "bind_templates", "templates_of"]

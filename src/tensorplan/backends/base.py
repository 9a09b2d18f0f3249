"""The backend contract: buffer types hand out Buffers, backends run planned graphs over them.

A planned tensor is a view at (buffer, offset) with its dtype, shape and byte strides. A
backend makes that view once per plan, reuses it across runs, and runs every node's kernel
into its planned output, so executing a graph allocates no tensor-sized memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from tensorplan.dtype import DType
from tensorplan.graph import Graph
from tensorplan.tensor import Buffer, Tensor


class BufferType(Protocol):
    """Where a buffer lives and how big it may be; what GraphAllocator plans against."""

    @property
    def name(self) -> str: ...

    @property
    def alignment(self) -> int:
        """Every planned offset and size is a multiple of this many bytes."""
        ...

    @property
    def max_size(self) -> int:
        """The largest single allocation; the planner splits bigger plans into chunks."""
        ...

    def alloc_buffer(self, size: int) -> Buffer:
        """A new buffer of `size` bytes whose base address is `alignment`-aligned."""
        ...


class Backend(Protocol):
    """Executes planned graphs. Tensors must be placed (by an allocator or the caller)
    before `set`, `get` or `compute` touch them; a missing placement is a ValueError."""

    @property
    def buffer_type(self) -> BufferType: ...

    def set(self, t: Tensor, value: Any) -> None:
        """Copy `value` (array-like of t's shape) into t's bytes. Raises ValueError on a
        shape mismatch and TypeError when the value's dtype cannot become t's."""
        ...

    def get(self, t: Tensor) -> Any:
        """A host copy of t's current value."""
        ...

    def param(self, value: Any, name: str = "") -> Tensor:
        """A PARAM leaf holding `value` in a buffer of its own (external to every plan)."""
        ...

    def persistent(self, shape: Sequence[int], dtype: DType, name: str = "") -> Tensor:
        """A zeroed, placed tensor in a dedicated buffer: KV caches, cross-graph results."""
        ...

    def compute(self, graph: Graph) -> None:
        """Run graph.nodes in order, each into its planned output."""
        ...

"""Tensor metadata: shape, dtype, byte strides, producing op, view root, flags, placement.

Axis order is numpy's: shape[-1] is the innermost (fastest-moving) axis. Strides are in
bytes. A Tensor holds no data and computes nothing; a backend binds it to bytes at
(buffer, offset) once the allocator has placed it.

Views are one level deep: `view_src` is always the root tensor that owns the bytes, and
`view_offset` is the byte offset of the view inside that root.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any, Protocol

from tensorplan.dtype import DType


class Flag(enum.IntFlag):
    NONE = 0
    INPUT = 1  # set by the caller before compute; placed before any node runs
    OUTPUT = 2  # read after compute; never freed or overwritten within its graph
    PARAM = 4  # a weight: always external to the graph planner


@dataclass(frozen=True, slots=True)
class Op:
    """What a node computes. `inplace` says the backend may write dst over its first
    same-layout source (dst is src); the allocator decides whether it actually does."""

    name: str
    inplace: bool = False
    is_view: bool = False  # the node's result aliases its source's bytes


class Buffer(Protocol):
    """The allocator-facing face of one backend allocation."""

    @property
    def size(self) -> int: ...


class BufferType(Protocol):
    """Where buffers live and how they are made: what an allocator plans against and a
    backend implements (one protocol for both layers)."""

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


def contiguous_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    strides = []
    acc = itemsize
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(strides))


def extent(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> int:
    """Bytes spanned from the first element to the end of the last (ggml_nbytes's rule)."""
    if any(n == 0 for n in shape):
        return 0
    return itemsize + sum((n - 1) * s for n, s in zip(shape, strides, strict=True))


@dataclass(eq=False, slots=True)
class Tensor:
    shape: tuple[int, ...]
    dtype: DType
    strides: tuple[int, ...] = ()
    op: Op | None = None  # None: a leaf (input, weight, or a view of an earlier graph's tensor)
    srcs: tuple[Tensor, ...] = ()
    params: dict[str, Any] = field(default_factory=dict)
    view_src: Tensor | None = None  # the root owning the bytes, never itself a view
    view_offset: int = 0
    flags: Flag = Flag.NONE
    name: str = ""
    buffer_id: int = 0  # which of the allocator's buffer types plans this tensor
    buffer: Buffer | None = None  # placement: set by an allocator or by the caller
    offset: int = 0
    placed_by: object | None = None  # the allocator that set `buffer`; None = external

    def __post_init__(self) -> None:
        self.shape = tuple(int(n) for n in self.shape)
        if any(n < 0 for n in self.shape):
            raise ValueError(f"negative dimension in shape {self.shape}")
        if not self.strides:
            self.strides = contiguous_strides(self.shape, self.dtype.itemsize)
        if len(self.strides) != len(self.shape):
            raise ValueError(f"strides {self.strides} do not match shape {self.shape}")
        if self.view_src is not None and self.view_src.view_src is not None:
            raise ValueError("view_src must be a root tensor (views are one level deep)")

    # ---- sizes and layout -------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return extent(self.shape, self.strides, self.dtype.itemsize)

    @property
    def is_contiguous(self) -> bool:
        return self.strides == contiguous_strides(self.shape, self.dtype.itemsize)

    @property
    def is_view(self) -> bool:
        return self.view_src is not None

    @property
    def root(self) -> Tensor:
        return self.view_src if self.view_src is not None else self

    def same_layout(self, other: Tensor) -> bool:
        return (
            self.dtype == other.dtype
            and self.shape == other.shape
            and self.strides == other.strides
        )

    # ---- flags ------------------------------------------------------------------
    def set_input(self) -> Tensor:
        self.flags |= Flag.INPUT
        return self

    def set_output(self) -> Tensor:
        self.flags |= Flag.OUTPUT
        return self

    def has(self, flag: Flag) -> bool:
        return bool(self.flags & flag)

    # ---- placement --------------------------------------------------------------
    @property
    def is_placed(self) -> bool:
        return self.buffer is not None

    def place(self, buffer: Buffer, offset: int, by: object | None = None) -> None:
        end = offset + self.nbytes
        if offset < 0 or end > buffer.size:
            name = self.name or "?"
            raise ValueError(f"tensor {name} [{offset}, {end}) fits no {buffer.size} B buffer")
        self.buffer, self.offset, self.placed_by = buffer, offset, by

    def __repr__(self) -> str:
        op = self.op.name if self.op else "leaf"
        view = f" view_of={self.view_src.name or '?'}+{self.view_offset}" if self.view_src else ""
        return (
            f"Tensor({self.name or '?'}: {op} {self.dtype} {self.shape}{view} flags={self.flags!r})"
        )

"""What a planner hands back: where every planned tensor lives. Values only, no behaviour.

A plan places each tensor that needs memory at (buffer id, chunk, offset). A buffer id is
an index into the allocator's buffer types; a chunk is one backend buffer of that type
(plans bigger than the type's max size are split into several). Views and external
tensors have no placement: a view is bound through its root, an external tensor keeps
whatever placement it already has.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from tensorplan.tensor import Tensor

UNLIMITED = 1 << 62  # a max size no buffer reaches
STRATEGIES = ("offline", "ggml", "exact")  # exact: offline, searching until proven


class PlanError(Exception):
    """A graph that cannot be planned, or a plan that breaks the allocator contract."""


class SizedBufferType(Protocol):
    """The two numbers a planner needs from a buffer type."""

    @property
    def alignment(self) -> int: ...

    @property
    def max_size(self) -> int: ...


@dataclass(frozen=True, slots=True)
class BufferSpec:
    alignment: int = 1
    max_size: int = UNLIMITED  # bytes per chunk

    def __post_init__(self) -> None:
        if self.alignment <= 0:
            raise ValueError(f"alignment must be positive, got {self.alignment}")
        if self.max_size <= 0:
            raise ValueError(f"max_size must be positive, got {self.max_size}")


def buffer_specs(types: Sequence[SizedBufferType | int] | int) -> tuple[BufferSpec, ...]:
    """Buffer types, or bare alignments (unlimited size), as specs; at least one."""
    items: Sequence[SizedBufferType | int] = [types] if isinstance(types, int) else types
    specs = tuple(
        BufferSpec(t) if isinstance(t, int) else BufferSpec(t.alignment, t.max_size) for t in items
    )
    if not specs:
        raise ValueError("a plan needs at least one buffer type")
    return specs


class Placement(NamedTuple):
    """Where a planned tensor lives. A NamedTuple, not a frozen dataclass: one is built per
    block and a tuple costs half as much (a frozen dataclass sets each field through
    object.__setattr__)."""

    buffer_id: int
    chunk: int
    offset: int
    size: int  # bytes reserved: nbytes rounded up to the alignment


@dataclass(frozen=True, slots=True)
class Plan:
    strategy: str
    specs: tuple[BufferSpec, ...]
    placements: Mapping[Tensor, Placement]  # planned tensors only; read-only mapping
    chunk_sizes: tuple[tuple[int, ...], ...]  # [buffer id][chunk] -> bytes
    lower_bound: tuple[int, ...]  # per buffer id (docs/allocator.md rule 10)
    inplace: Mapping[Tensor, Tensor]  # node -> the parent whose bytes it took
    owner: object | None = None  # the allocator whose own placements count as planned

    @property
    def sizes(self) -> list[int]:
        """Planned bytes per buffer id (all chunks together)."""
        return [sum(c) for c in self.chunk_sizes]

    @property
    def total(self) -> int:
        return sum(self.sizes)

    def summary(self) -> str:
        mib = 1 << 20
        lb = sum(self.lower_bound)
        ratio = f" ({self.total / lb:.4f}x)" if lb else ""
        return (
            f"{self.strategy}: {len(self.placements)} tensors -> {self.total / mib:.1f} MiB, "
            f"lower bound {lb / mib:.1f} MiB{ratio}"
        )

"""The numpy CPU backend: a buffer is an aligned uint8 array, a placed tensor an ndarray view.

Views are made once per plan (per graph and executor, re-made only for tensors whose
(buffer, offset) changed) and every kernel writes into its node's view, so a planned run
allocates only O(block) scratch. Weights enter graphs as PARAM leafs in buffers of their
own (`param`), shared by every executor; an executor binds template buffers (base.py) to
buffers of its own, so several run the same plans at once on different threads.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorplan import dtype as dt
from tensorplan.backends.base import RunsItsOwn, TemplateBuffer
from tensorplan.backends.kernels import KERNELS, executes
from tensorplan.dtype import DType
from tensorplan.graph import Graph
from tensorplan.tensor import Buffer, Flag, Tensor


def aligned_bytes(size: int, alignment: int) -> np.ndarray:
    """A zeroed 1-D uint8 array of `size` bytes whose address is a multiple of `alignment`."""
    raw = np.zeros(size + alignment, np.uint8)  # calloc: pages are zeroed lazily
    shift = -raw.ctypes.data % alignment
    return raw[shift : shift + size]


class NumpyBuffer:
    """One CPU allocation: a 1-D uint8 array (owned, or wrapping someone else's bytes)."""

    __slots__ = ("data",)

    def __init__(self, data: np.ndarray) -> None:
        if data.ndim != 1 or data.dtype != np.uint8 or not data.flags.c_contiguous:
            raise ValueError(
                f"a NumpyBuffer holds a contiguous 1-D uint8 array, not {data.dtype} {data.shape}"
            )
        self.data = data

    @classmethod
    def from_array(cls, arr: np.ndarray) -> NumpyBuffer:
        """Wrap a C-contiguous array's bytes without copying (weights, memmaps, a cache).
        The buffer aliases `arr`: writes through either are seen by the other."""
        if not arr.flags.c_contiguous:
            raise ValueError("from_array needs a C-contiguous array (np.ascontiguousarray copies)")
        return cls(arr.reshape(-1).view(np.uint8))

    @property
    def size(self) -> int:
        return int(self.data.size)

    @property
    def address(self) -> int:
        return int(self.data.ctypes.data)

    def __repr__(self) -> str:
        return f"NumpyBuffer({self.size} B at {self.address:#x})"


@dataclass(frozen=True, slots=True)
class NumpyBufferType:
    alignment: int = 64  # a cache line, and enough for every SIMD width numpy uses
    max_size: int = 1 << 62  # no practical limit on the CPU
    name: str = "cpu"

    def __post_init__(self) -> None:
        if self.alignment <= 0 or self.alignment & (self.alignment - 1):
            raise ValueError(f"alignment must be a power of two, got {self.alignment}")

    def alloc_buffer(self, size: int) -> NumpyBuffer:
        if not 0 <= size <= self.max_size:
            raise ValueError(f"{self.name}: cannot allocate {size} B (max {self.max_size} B)")
        return NumpyBuffer(aligned_bytes(size, self.alignment))


# ---- views of placed tensors --------------------------------------------------------------
Bindings = Mapping[TemplateBuffer, Buffer]


def placement(t: Tensor, bindings: Bindings | None = None) -> tuple[NumpyBuffer, int]:
    """(buffer, absolute byte offset) of t; a view the allocator left unbound is found
    through its root, and a template buffer through `bindings`."""
    if t.buffer is not None:
        buf, off = t.buffer, t.offset
    elif t.view_src is not None and t.view_src.buffer is not None:
        buf, off = t.view_src.buffer, t.view_src.offset + t.view_offset
    else:
        raise ValueError(
            f"{t!r} has no placement: plan its graph (GraphAllocator.alloc_graph) "
            "or place it yourself"
        )
    if isinstance(buf, TemplateBuffer):
        real = bindings.get(buf) if bindings is not None else None
        if real is None:
            raise ValueError(f"{t!r} lives in {buf!r}, which this executor was not given")
        buf = real
    if not isinstance(buf, NumpyBuffer):
        raise TypeError(f"{t!r} lives in a {type(buf).__name__}, which numpy cannot read")
    return buf, off


def make_view(t: Tensor, buf: NumpyBuffer, offset: int) -> np.ndarray:
    try:
        return np.ndarray(
            t.shape, np.dtype(t.dtype.name), buffer=buf.data, offset=offset, strides=t.strides
        )
    except (TypeError, ValueError) as e:
        raise ValueError(
            f"{t!r} at [{offset}, {offset + t.nbytes}) does not fit {buf!r}: {e}"
        ) from None


class NumpyViewCache:
    """ndarray views of placed tensors, re-made only when a tensor's placement changed.

    `limit` bounds the entries (oldest dropped first) so a cache fed tensors of graphs
    that come and go does not keep their buffers alive forever.
    """

    def __init__(self, limit: int | None = None, bindings: Bindings | None = None) -> None:
        self._views: dict[Tensor, tuple[NumpyBuffer, int, np.ndarray]] = {}
        self.limit = limit
        self.bindings = bindings
        self.made = 0

    def placement(self, t: Tensor) -> tuple[NumpyBuffer, int]:
        return placement(t, self.bindings)

    def array(self, t: Tensor) -> np.ndarray:
        buf, off = placement(t, self.bindings)
        hit = self._views.get(t)
        if hit is not None and hit[0] is buf and hit[1] == off:
            return hit[2]
        arr = make_view(t, buf, off)
        self.made += 1
        if self.limit is not None and hit is None and len(self._views) >= self.limit:
            del self._views[next(iter(self._views))]
        self._views[t] = (buf, off, arr)
        return arr


class NumpyProgram:
    """A graph's kernels bound to its tensors' views; re-bound when the plan moved them."""

    def __init__(self, graph: Graph, bindings: Bindings | None = None) -> None:
        self.nodes = [n for n in graph.nodes if executes(n)]
        missing = {n.op.name for n in self.nodes if n.op is not None} - KERNELS.keys()
        if missing:
            raise NotImplementedError(f"numpy backend has no kernel for {sorted(missing)}")
        tensors = dict.fromkeys(t for n in self.nodes for t in (n, *n.srcs))
        self.tensors = list(tensors)
        self.views = NumpyViewCache(bindings=bindings)
        self.bound_to: list[tuple[NumpyBuffer, int]] | None = None
        self.steps: list[tuple[Any, Any, list[Any], Any]] = []

    def run(self) -> None:
        where = [self.views.placement(t) for t in self.tensors]
        if where != self.bound_to:
            self.steps = [self.step(n) for n in self.nodes]
            self.bound_to = where
        for kernel, out, srcs, params in self.steps:
            kernel(out, srcs, params)

    def step(self, n: Tensor) -> tuple[Any, Any, list[Any], Any]:
        """(kernel, out, srcs, params) running node n over its current views."""
        assert n.op is not None
        return (
            KERNELS[n.op.name],
            self.views.array(n),
            [self.views.array(s) for s in n.srcs],
            n.params,
        )


# ---- executors and the backend ---------------------------------------------------------------
class NumpyExecutor:
    """Runs planned graphs over one set of buffers (see base.Executor)."""

    def __init__(self, backend: NumpyBackend, bindings: Bindings | None = None) -> None:
        self.backend = backend
        self.bindings = dict(bindings) if bindings is not None else None
        self._loose = NumpyViewCache(limit=64, bindings=self.bindings)  # set/get/array
        self._programs: weakref.WeakKeyDictionary[Graph, NumpyProgram] = weakref.WeakKeyDictionary()

    @property
    def views_made(self) -> int:
        """How many ndarray views were made so far (steady runs of one plan add none)."""
        return self._loose.made + sum(p.views.made for p in self._programs.values())

    def array(self, t: Tensor) -> np.ndarray:
        """The live ndarray view of placed tensor t (writes go to its bytes)."""
        return self._loose.array(t)

    def set(self, t: Tensor, value: Any) -> None:
        arr = self.array(t)
        v = np.asarray(value)
        if v.shape != arr.shape:
            raise ValueError(f"set {t.name or t!r}: value has shape {v.shape}, tensor {t.shape}")
        if not np.can_cast(v.dtype, arr.dtype, casting="same_kind"):
            raise TypeError(
                f"set {t.name or t!r}: cannot store {v.dtype} values in a {t.dtype} tensor"
            )
        np.copyto(arr, v, casting="same_kind")

    def get(self, t: Tensor) -> np.ndarray:
        return self.array(t).copy()

    def copy_slots(self, t: Tensor, n_slots: int, sources: Sequence[int], n_rows: int,
                   targets: Sequence[int] | None = None) -> None:
        a = self.array(t).reshape(n_slots, -1, *t.shape[1:])
        src = np.asarray(sources)
        dst = slice(0, len(src)) if targets is None else np.asarray(targets)
        a[dst, :n_rows] = a[src, :n_rows]  # fancy indexing reads before it writes

    def compute(self, graph: Graph) -> None:
        program = self._programs.get(graph)
        if program is None:
            program = self._programs[graph] = self.backend.program(graph, self.bindings)
        program.run()


class NumpyBackend(RunsItsOwn):
    _own: NumpyExecutor
    # Whether two OS threads computing at once each run on their part of the cores
    # (machine.computing). Not here: OpenBLAS has one pool per process, and a second
    # thread's products waited on it (the step engine's encoder beside its decoder steps,
    # tiny.en float32, 8 clients: 0.97-1.10 of the sequential ceiling against 1.16 without)
    shares_cores = False

    def __init__(self, buffer_type: NumpyBufferType | None = None) -> None:
        self.buffer_type = buffer_type or NumpyBufferType()
        self._own = NumpyExecutor(self)  # the backend as an executor over real buffers

    def executor(self, bindings: Bindings | None = None) -> NumpyExecutor:
        return NumpyExecutor(self, bindings)

    def program(self, graph: Graph, bindings: Bindings | None = None) -> NumpyProgram:
        """How this backend runs `graph` (subclasses bind other kernels)."""
        return NumpyProgram(graph, bindings)

    # the backend's own executor (RunsItsOwn has set, get, compute, copy_slots)
    def array(self, t: Tensor) -> np.ndarray:
        return self._own.array(t)

    def param(self, value: Any, name: str = "") -> Tensor:
        """A PARAM leaf over `value`'s bytes: no copy when value is a C-contiguous, aligned
        ndarray (it then aliases value), else one copy into an aligned buffer."""
        arr = np.asarray(value)
        t = Tensor(arr.shape, dt.dtype(arr.dtype.name), flags=Flag.PARAM, name=name)
        if arr.flags.c_contiguous and arr.flags.aligned:
            t.place(NumpyBuffer.from_array(arr), 0)
        else:
            t.place(self.buffer_type.alloc_buffer(arr.nbytes), 0)
            np.copyto(make_view(t, *placement(t)), arr)
        return t

    def persistent(self, shape: Sequence[int], dtype: DType | str, name: str = "") -> Tensor:
        t = Tensor(tuple(shape), dt.dtype(dtype), name=name)
        t.place(self.buffer_type.alloc_buffer(t.nbytes), 0)
        return t

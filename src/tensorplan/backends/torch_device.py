"""The device backend: planned graphs over PyTorch tensors on any torch device (cpu, cuda).

A buffer is one zeroed `torch.uint8` allocation on the device; a placed tensor is a view
of it (`buf[offset:offset + nbytes].view(dtype).as_strided(shape, strides)`), made once
per plan, and every node's kernel (device_kernels.py) writes into its planned view.
Weights are uploaded once, in `weights_dtype` where given (float16 matrices on a GPU).
`set` copies host values in, `get` hands a host numpy copy back, so Whisper's sessions
run unchanged on either device. On the CPU this is the same code path as on CUDA, which
is how CI exercises it without a GPU.

With a `Capturer` (capture.py), each executor runs a graph eagerly once, then captures
it and replays the capture from then on: the plan fixed every address, so the caller
only writes new inputs into the planned input tensors before each run. A failed capture
logs one warning per backend and leaves that graph eager.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from tensorplan import dtype as dt
from tensorplan.backends.base import RunsItsOwn, TemplateBuffer
from tensorplan.backends.capture import Capturer, CudaGraphCapturer, Replayable
from tensorplan.backends.device_kernels import DEVICE_KERNELS
from tensorplan.backends.kernels import executes
from tensorplan.dtype import DType
from tensorplan.errors import UserError
from tensorplan.graph import Graph
from tensorplan.tensor import Buffer, Flag, Tensor

log = logging.getLogger("tensorplan.backends")

TORCH_DTYPES = {
    "float32": torch.float32, "float16": torch.float16, "float64": torch.float64,
    "bfloat16": torch.bfloat16, "int64": torch.int64, "int32": torch.int32,
    "int16": torch.int16, "int8": torch.int8, "uint8": torch.uint8,
}  # fmt: skip
WEIGHT_DTYPES = ("float16", "bfloat16")


def torch_device(name: str) -> torch.device:
    """`name` as a torch.device, or a UserError when this machine or build has none."""
    try:
        dev = torch.device(name)
    except RuntimeError as e:
        raise UserError(f"device {name!r}: {e}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        why = "this PyTorch build has no CUDA" if torch.version.cuda is None else "no GPU found"
        raise UserError(f"--device {name}: CUDA is not available ({why})")
    if dev.type not in ("cpu", "cuda"):
        raise UserError(f"--device {name}: only cpu and cuda are supported")
    return dev


# ---- buffers ----------------------------------------------------------------------------
class DeviceBuffer:
    """One device allocation: a 1-D torch.uint8 tensor."""

    __slots__ = ("data",)

    def __init__(self, data: torch.Tensor) -> None:
        self.data = data

    @property
    def size(self) -> int:
        return int(self.data.numel())

    @property
    def address(self) -> int:
        return int(self.data.data_ptr())

    def host(self) -> np.ndarray:
        """A host copy of the bytes."""
        return np.array(self.data.cpu().numpy(), copy=True)

    def __repr__(self) -> str:
        return f"DeviceBuffer({self.size} B on {self.data.device} at {self.address:#x})"


class WeightBuffer:
    """A PARAM's storage: a typed device tensor, possibly narrower than the graph's dtype
    (float16 under a float32 tensor). `size` is the graph's view of it (its dtype's bytes),
    so placement checks hold; views index it in elements of the graph's dtype."""

    __slots__ = ("data", "size")

    def __init__(self, data: torch.Tensor, size: int) -> None:
        self.data, self.size = data, size

    @property
    def address(self) -> int:
        return int(self.data.data_ptr())


@dataclass(frozen=True, slots=True)
class DeviceBufferType:
    device: str = "cpu"
    alignment: int = 256  # cuBLAS and vectorised loads want 16 B; CUDA's allocator gives 512
    max_size: int = 1 << 62
    name: str = field(default="")

    def __post_init__(self) -> None:
        if self.alignment <= 0 or self.alignment & (self.alignment - 1):
            raise ValueError(f"alignment must be a power of two, got {self.alignment}")
        if not self.name:
            object.__setattr__(self, "name", f"torch-{self.device}")

    def alloc_buffer(self, size: int) -> DeviceBuffer:
        if not 0 <= size <= self.max_size:
            raise ValueError(f"{self.name}: cannot allocate {size} B (max {self.max_size} B)")
        raw = torch.zeros(size + self.alignment, dtype=torch.uint8, device=self.device)
        shift = -raw.data_ptr() % self.alignment
        return DeviceBuffer(raw[shift : shift + size])


# ---- views ------------------------------------------------------------------------------
Bindings = Mapping[TemplateBuffer, Buffer]
Placed = DeviceBuffer | WeightBuffer


def placement(t: Tensor, bindings: Bindings | None = None) -> tuple[Placed, int]:
    """(buffer, absolute byte offset) of t, through its root and the executor's bindings."""
    if t.buffer is not None:
        buf, off = t.buffer, t.offset
    elif t.view_src is not None and t.view_src.buffer is not None:
        buf, off = t.view_src.buffer, t.view_src.offset + t.view_offset
    else:
        raise ValueError(f"{t!r} has no placement: plan its graph or place it yourself")
    if isinstance(buf, TemplateBuffer):
        real = bindings.get(buf) if bindings is not None else None
        if real is None:
            raise ValueError(f"{t!r} lives in {buf!r}, which this executor was not given")
        buf = real
    if not isinstance(buf, DeviceBuffer | WeightBuffer):
        raise TypeError(f"{t!r} lives in a {type(buf).__name__}, not a device buffer")
    return buf, off


def make_view(t: Tensor, buf: Placed, offset: int) -> torch.Tensor:
    item = t.dtype.itemsize
    if any(s % item for s in t.strides) or offset % item:
        raise ValueError(f"{t!r}: strides and offset must be whole elements of {t.dtype}")
    strides = [s // item for s in t.strides]
    if isinstance(buf, WeightBuffer):  # typed storage, indexed in the graph's elements
        base = buf.data
        return base.as_strided(t.shape, strides, base.storage_offset() + offset // item)
    if offset + t.nbytes > buf.size:
        raise ValueError(f"{t!r} at [{offset}, {offset + t.nbytes}) does not fit {buf!r}")
    span = buf.data[offset : offset + -(-t.nbytes // item) * item]
    return span.view(TORCH_DTYPES[t.dtype.name]).as_strided(t.shape, strides)


class DeviceViewCache:
    """Views of placed tensors, re-made only when a tensor's placement changed."""

    def __init__(self, bindings: Bindings | None = None, limit: int | None = None) -> None:
        self._views: dict[Tensor, tuple[Placed, int, torch.Tensor]] = {}
        self.bindings, self.limit = bindings, limit
        self.made = 0

    def view(self, t: Tensor) -> torch.Tensor:
        buf, off = placement(t, self.bindings)
        hit = self._views.get(t)
        if hit is not None and hit[0] is buf and hit[1] == off:
            return hit[2]
        v = make_view(t, buf, off)
        self.made += 1
        if self.limit is not None and hit is None and len(self._views) >= self.limit:
            del self._views[next(iter(self._views))]
        self._views[t] = (buf, off, v)
        return v


# ---- programs ---------------------------------------------------------------------------
Step = tuple[Any, torch.Tensor, list[torch.Tensor], dict[str, Any]]


class DeviceProgram:
    """A graph's kernels bound to its tensors' views: callable (one run) and, for
    capture, the addresses it touches."""

    def __init__(self, graph: Graph, backend: DeviceBackend, bindings: Bindings | None) -> None:
        self.nodes = [n for n in graph.nodes if executes(n)]
        missing = {n.op.name for n in self.nodes if n.op is not None} - DEVICE_KERNELS.keys()
        if missing:
            raise NotImplementedError(f"device backend has no kernel for {sorted(missing)}")
        self.tensors = list(dict.fromkeys(t for n in self.nodes for t in (n, *n.srcs)))
        self.backend = backend
        self.views = DeviceViewCache(bindings)
        self.bound_to: list[tuple[Placed, int]] | None = None
        self.steps: list[Step] = []
        self.runs = 0
        self.replay: Replayable | None = None
        self.eager_only = False

    def moved(self) -> bool:
        return [placement(t, self.views.bindings) for t in self.tensors] != self.bound_to

    def bind(self) -> None:
        self.bound_to = [placement(t, self.views.bindings) for t in self.tensors]
        self.steps = [self.step(n) for n in self.nodes]
        self.replay, self.runs = None, 0  # a capture of the old views is stale

    def __call__(self) -> None:
        for kernel, out, srcs, params in self.steps:
            kernel(out, srcs, params)

    def addresses(self) -> list[int]:
        return [int(self.views.view(t).data_ptr()) for t in self.tensors]

    def step(self, n: Tensor) -> Step:
        assert n.op is not None
        out = self.views.view(n)
        srcs = [self.views.view(s) for s in n.srcs]
        params = dict(n.params)
        # a src held narrower than its graph dtype (weights_dtype): kernels compute in it
        params["_narrowed"] = any(v.dtype != TORCH_DTYPES[s.dtype.name]
                                  for s, v in zip(n.srcs, srcs, strict=True))
        if n.op.name == "layer_norm":  # mean and 1/std per row: scratch kept with the step
            rows = (*out.shape[:-1], 1)
            params["_stats"] = tuple(torch.empty(rows, device=out.device) for _ in range(2))
        if n.op.name == "qmatmul":
            params["_wide"] = self.backend.widened(n.srcs[1], srcs[1], out.dtype)
        return DEVICE_KERNELS[n.op.name], out, srcs, params


# ---- executors and the backend ----------------------------------------------------------
class DeviceExecutor:
    """Runs planned graphs over one set of device buffers (see base.Executor)."""

    def __init__(self, backend: DeviceBackend, bindings: Bindings | None = None) -> None:
        self.backend = backend
        self.bindings = dict(bindings) if bindings is not None else None
        self._loose = DeviceViewCache(self.bindings, limit=64)  # set/get/copy_slots
        self._programs: weakref.WeakKeyDictionary[Graph, DeviceProgram] = (
            weakref.WeakKeyDictionary())

    @property
    def views_made(self) -> int:
        return self._loose.made + sum(p.views.made for p in self._programs.values())

    def view(self, t: Tensor) -> torch.Tensor:
        """The live device view of placed tensor t (writes go to its bytes)."""
        return self._loose.view(t)

    def set(self, t: Tensor, value: Any) -> None:
        v = self.view(t)
        arr = np.asarray(value)
        if arr.shape != tuple(v.shape):
            raise ValueError(f"set {t.name or t!r}: value has shape {arr.shape}, tensor {t.shape}")
        if not np.can_cast(arr.dtype, np.dtype(t.dtype.name), casting="same_kind"):
            raise TypeError(f"set {t.name or t!r}: cannot store {arr.dtype} values in a "
                            f"{t.dtype} tensor")
        host = np.asarray(arr, dtype=np.dtype(t.dtype.name), order="C")  # keeps 0-d
        v.copy_(torch.from_numpy(host))

    def get(self, t: Tensor) -> np.ndarray:
        v = self.view(t).to("cpu", TORCH_DTYPES[t.dtype.name], copy=True)
        return np.asarray(v.numpy())  # typed as an ndarray also where PyTorch is absent (Any)

    def copy_slots(self, t: Tensor, n_slots: int, sources: Sequence[int], n_rows: int,
                   targets: Sequence[int] | None = None) -> None:
        a = self.view(t).view(n_slots, -1, *t.shape[1:])
        idx = torch.as_tensor(list(sources), dtype=torch.long, device=a.device)
        dst = (torch.as_tensor(list(targets), dtype=torch.long, device=a.device)
               if targets is not None else torch.arange(len(idx), device=a.device))
        a[dst, :n_rows] = a[idx, :n_rows]  # the gather is a copy: read before write

    def compute(self, graph: Graph) -> None:
        p = self._programs.get(graph)
        if p is None:
            p = self._programs[graph] = DeviceProgram(graph, self.backend, self.bindings)
        if p.bound_to is None or p.moved():
            p.bind()
        capturer = self.backend.capturer
        if p.replay is not None:
            p.replay.replay()
            return
        p.runs += 1
        if capturer is None or p.eager_only or p.runs == 1:
            p()  # the first run is eager: it warms kernels up and makes their scratch
            return
        try:
            p.replay = capturer.capture(p)
        except Exception as e:  # noqa: BLE001 - any capture failure means: stay eager
            p.eager_only = True
            self.backend.capture_failed(e)
            p()
            return
        p.replay.replay()


class DeviceBackend(RunsItsOwn):
    """Planned graphs on one torch device.

    weights_dtype: float16 or bfloat16 stores weight matrices (PARAMs of 2 or more axes
    holding float32) in that dtype; None keeps every weight as given. cuda_graphs: capture
    each graph after its first run (CUDA only); capturer: an explicit Capturer (tests).
    """

    _own: DeviceExecutor

    def __init__(self, device: str = "cpu", weights_dtype: str | None = None,
                 cuda_graphs: bool | None = None, capturer: Capturer | None = None) -> None:
        self.device = torch_device(device)
        if weights_dtype is not None and weights_dtype not in WEIGHT_DTYPES:
            raise ValueError(f"weights_dtype must be one of {', '.join(WEIGHT_DTYPES)} or None")
        self.weights_dtype = weights_dtype
        self.buffer_type = DeviceBufferType(str(self.device))
        on_cuda = self.device.type == "cuda"
        if capturer is None and (on_cuda if cuda_graphs is None else cuda_graphs):
            if not on_cuda:
                raise ValueError("cuda_graphs needs a cuda device")
            capturer = CudaGraphCapturer(self.device)
        self.capturer = capturer
        self._warned = False
        self._own = DeviceExecutor(self)
        self._wide: dict[int, tuple[Tensor, torch.Tensor]] = {}
        self._widening = threading.Lock()

    def executor(self, bindings: Bindings | None = None) -> DeviceExecutor:
        return DeviceExecutor(self, bindings)

    def capture_failed(self, e: Exception) -> None:
        if not self._warned:
            self._warned = True
            log.warning("graph capture failed on %s, running eagerly: %s", self.device, e)

    def widened(self, weight: Tensor, q: torch.Tensor, like: torch.dtype) -> torch.Tensor:
        """int8 weight `weight` (values q) as `like`, once per weight tensor."""
        with self._widening:
            hit = self._wide.get(id(weight))
            if hit is None:
                hit = self._wide[id(weight)] = (weight, q.to(like))
        return hit[1]

    # the backend's own executor (RunsItsOwn has set, get, compute, copy_slots)
    def view(self, t: Tensor) -> torch.Tensor:
        return self._own.view(t)

    def param(self, value: Any, name: str = "") -> Tensor:
        """A PARAM leaf: `value` copied to the device once (narrowed to weights_dtype when
        it is a float32 matrix and one is set)."""
        arr = np.asarray(value, order="C")
        t = Tensor(arr.shape, dt.dtype(arr.dtype.name), flags=Flag.PARAM, name=name)
        store = TORCH_DTYPES[arr.dtype.name]
        if self.weights_dtype is not None and arr.dtype == np.float32 and arr.ndim >= 2:
            store = TORCH_DTYPES[self.weights_dtype]
        host = torch.from_numpy(np.array(arr, copy=True))  # a copy: the caller may reuse arr
        data = host.to(self.device, store).reshape(-1)
        t.place(WeightBuffer(data, t.nbytes), 0)
        return t

    def persistent(self, shape: Sequence[int], dtype: DType | str, name: str = "") -> Tensor:
        t = Tensor(tuple(shape), dt.dtype(dtype), name=name)
        t.place(self.buffer_type.alloc_buffer(t.nbytes), 0)
        return t

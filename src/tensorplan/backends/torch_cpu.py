"""The PyTorch CPU backend: NumpyBackend's buffers, views and plans, PyTorch's kernels.

Buffers are the same aligned uint8 arrays, so plans, weights and persistent tensors are
interchangeable with NumpyBackend; each planned numpy view is wrapped once per plan as a
torch tensor sharing its bytes (torch.from_numpy), and a node runs its torch kernel into
that tensor. Nodes PyTorch has no kernel for, or whose dtypes its kernel does not take,
run their numpy kernel over the plain views. numpy stays the reference: tests compare
the two backends node by node and end to end.

Needs the optional dependency PyTorch, its CPU build: `TORCH_INSTALL` in backends/__init__.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any

import numpy as np

from tensorplan import backends
from tensorplan.backends import TORCH_INSTALL
from tensorplan.backends import threads as pools
from tensorplan.backends.numpy_cpu import Bindings, NumpyBackend, NumpyBufferType, NumpyProgram
from tensorplan.graph import Graph
from tensorplan.tensor import Tensor, contiguous_strides

# PyTorch and its kernels, imported by load_torch() when the first program is made, not
# when the backend is: `import torch` costs ~1.2 s and 240 MB, and load_model builds and
# plans every graph (numpy's work) before anything runs.
torch: Any = None
TORCH_KERNELS: dict[str, Any] = {}
ANY_DTYPE: frozenset[str] = frozenset()
kernels: Any = None  # the torch_kernels module
_importing = threading.Lock()


def load_torch() -> Any:
    """PyTorch, imported once (with this backend's kernels; its thread pool sized as ours:
    threads.configure ran before torch was imported, so it could not size it then)."""
    global torch, TORCH_KERNELS, ANY_DTYPE, kernels
    with _importing:
        if torch is None:
            import torch as module

            from tensorplan.backends import torch_kernels

            TORCH_KERNELS, ANY_DTYPE = torch_kernels.TORCH_KERNELS, torch_kernels.ANY_DTYPE
            kernels = torch_kernels
            module.set_num_threads(pools.count())
            torch = module
    return torch


def _as_torch(arr: np.ndarray) -> Any:
    with warnings.catch_warnings():  # weights may be read-only; kernels never write srcs
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(arr)


class TorchProgram(NumpyProgram):
    def __init__(self, graph: Graph, backend: TorchBackend, bindings: Bindings | None) -> None:
        super().__init__(graph, bindings)
        self.backend = backend

    def step(self, n: Tensor) -> tuple[Any, Any, list[Any], Any]:
        assert n.op is not None
        name = n.op.name
        kernel = TORCH_KERNELS.get(name)
        few_rows = (name == "matmul" and _rows(n) < self.backend.min_matmul_rows
                    and not _attends_contiguously(n))
        if kernel is None or not _takes(n) or few_rows:
            return super().step(n)
        out = self.views.array(n)
        srcs = [self.views.array(s) for s in n.srcs]
        params = dict(n.params)
        if name == "layer_norm":  # mean and 1/std per row: scratch kept with the step
            rows = out.shape[:-1] + (1,)
            params["_stats"] = (torch.empty(rows), torch.empty(rows))
        if name == "qmatmul" and self._bf16(n):
            kernel = kernels.qmatmul_bf16
            params["_bf16"] = self.backend.bf16_weight(n.srcs[1], srcs[1], srcs[2])
        elif name == "qmatmul":
            params["_packed"] = self.backend.packed(n.srcs[1], srcs[1], srcs[2])
        elif name == "matmul" and self._bf16(n):
            kernel = kernels.matmul_bf16
        elif name == "attention" and self._bf16(n):
            kernel = kernels.attention_bf16
        # a product's work is its operands' size, not its result's (attention over 1,500
        # cross keys yields 64 values per head from a 1,500 x 64 block of each)
        work = max(n.size, *(t.size for t in n.srcs)) if name in PRODUCTS else n.size
        threads = pools.count() if work >= PARALLEL_MIN else 1
        return _on_threads(kernel, threads), _as_torch(out), [_as_torch(s) for s in srcs], params

    def _bf16(self, n: Tensor) -> bool:
        """Whether product n runs in bfloat16: its precision allows it (graphs mark the
        products that may) and the backend's bf16_products."""
        return n.params.get("precision") == "bfloat16" and self.backend.bf16_products


PRODUCTS = ("matmul", "attention")  # ops whose work is their operands' size

# Nodes smaller than this run PyTorch on one thread. PyTorch splits even a 1536-element
# gelu across its OpenMP threads, and waking them costs more than the work: 100 us per
# tiny op with passive waiting (which __init__.py sets so idle threads leave the cores to
# OpenBLAS), 12 us on one thread (measured; an add of 384 floats took 1.8 us either way).
PARALLEL_MIN = 1 << 15

# PyTorch's OpenMP thread count is per OS thread, so is what this thread set last.
_threads_now = threading.local()


def _on_threads(kernel: Any, n: int) -> Any:
    """kernel, run with PyTorch's intra-op thread count set to n (0.2 us per change)."""

    def run(out: Any, srcs: Any, params: Any) -> None:
        want = pools.share(n)  # fewer while this thread shares the cores
        now = getattr(_threads_now, "n", None)
        if now != want:
            if now is None:  # PyTorch sets a new OS thread's count at its first parallel
                torch.get_num_threads()  # op, over ours: let it do so before we set it
            torch.set_num_threads(want)
            _threads_now.n = want
        kernel(out, srcs, params)

    return run


# Products of fewer rows run numpy's: a few rows times a weight is a matrix-vector
# product that reads the weight once, and OpenBLAS's is more than twice as fast as
# PyTorch's (1 x 384 times the 51864 x 384 embedding: 2.8 ms against 7.0). Batched
# products count the rows of one product: PyTorch copied strided batches (a KV cache
# split into heads) whole before multiplying, 4-6 ms per beam-search attention product
# against numpy's 0.2.
MIN_MATMUL_ROWS = 32


def _attends_contiguously(n: Tensor) -> bool:
    """A batched product (attention: queries against keys or values, per head) whose
    second operand is one contiguous block, as the cross K/V are (head-major): PyTorch
    multiplies it in place, 1.7x numpy's speed for one query row per head and 3.8x for
    five (8 windows x 6 heads x 1,500 keys, measured on this project's 2-core Sapphire
    Rapids: 0.51 against 0.85 ms, 1.06 against 3.99). A strided one (the self-attention
    cache split into heads) PyTorch copies whole first, so it stays on numpy. (Other dtypes
    than float32 go to numpy before this is asked: _takes.)"""
    b = n.srcs[1]
    return b.ndim >= 3 and b.strides == contiguous_strides(b.shape, b.dtype.itemsize)


def _rows(n: Tensor) -> int:
    """Rows of one product of a (batched) matmul: a 2-D one's, or a batch slice's."""
    return n.shape[-2] if n.ndim >= 2 else 1


def _takes(n: Tensor) -> bool:
    """Whether n's torch kernel handles its dtypes: float32 throughout, or data movement."""
    assert n.op is not None
    if n.op.name in ANY_DTYPE:
        return True
    if n.op.name == "qmatmul":  # float32 activations, an int8 weight, float32 scales
        a, q, scale = n.srcs
        return a.dtype.name == scale.dtype.name == n.dtype.name == "float32"
    return all(t.dtype.name == "float32" for t in (n, *n.srcs))


class TorchBackend(NumpyBackend):
    """NumpyBackend with PyTorch's CPU kernels for the ops in torch_kernels.TORCH_KERNELS.

    min_matmul_rows: products with fewer output rows run numpy's kernel (0: none do).
    """

    shares_cores = True  # PyTorch's thread count is per OS thread (_on_threads)

    def __init__(
        self, buffer_type: NumpyBufferType | None = None, min_matmul_rows: int = MIN_MATMUL_ROWS,
        bf16: bool | None = None,
    ) -> None:
        if torch is None and not backends.torch_available():  # looked up there: tests patch it
            raise ImportError(f"the torch backend needs PyTorch's CPU build: {TORCH_INSTALL}")
        super().__init__(buffer_type)
        self.min_matmul_rows = min_matmul_rows
        self._bf16_choice = bf16  # None: where the CPU has AMX, decided once torch is loaded
        # bfloat16 copies of int8 weights whose products allow bfloat16: id(weight) -> (the
        # tensor, its copy), as _packed
        self._bf16_weights: dict[int, tuple[Tensor, Any]] = {}
        # FBGEMM-packed int8 weights, shared by every graph: id(weight tensor) -> (the
        # tensor, kept so its id is not reused, and its packed form)
        self._packed: dict[int, tuple[Tensor, Any]] = {}
        self._packing = threading.Lock()  # executors on several threads share the cache

    def program(self, graph: Graph, bindings: Bindings | None = None) -> NumpyProgram:
        load_torch()  # the first program pays the import: the work now needs its kernels
        return TorchProgram(graph, self, bindings)

    @property
    def bf16_products(self) -> bool:
        """Whether products whose precision allows it (the int8 encoder's and cross
        K/V's, whisper/planned/graphs.py) run in bfloat16. Default: where the CPU has AMX.
        Products without that hint always keep their float32 or int8 kernels."""
        if self._bf16_choice is None:
            load_torch()  # the kernels module, and PyTorch's probe of the CPU
            self._bf16_choice = kernels.bf16_products()
        return self._bf16_choice

    @property
    def bf16_nbytes(self) -> int:
        """Bytes of the bfloat16 weight copies made so far (shared by every session)."""
        with self._packing:
            return sum(int(w.nbytes) for _, w in self._bf16_weights.values())

    def bf16_weight(self, weight: Tensor, q: np.ndarray, scale: np.ndarray) -> Any:
        """The bfloat16 form of int8 weight `weight`, made once per weight tensor (a
        constant, as for `packed`)."""
        return self._once(self._bf16_weights, weight, kernels.dequantize_bf16, q, scale)

    def packed(self, weight: Tensor, q: np.ndarray, scale: np.ndarray) -> Any:
        """The packed form of int8 weight `weight` (values q, per-row scales), made once
        per weight tensor: packing copies it into FBGEMM's blocked layout, so the weight
        must be a constant (a PARAM, as Whisper's are)."""
        return self._once(self._packed, weight, kernels.pack_int8, q, scale)

    def _once(self, cache: dict[int, tuple[Tensor, Any]], weight: Tensor, make: Any,
              q: np.ndarray, scale: np.ndarray) -> Any:
        """cache's form of `weight`, made by make(q, scale) the first time (the tensor is
        kept beside it so its id is not reused)."""
        with self._packing:
            hit = cache.get(id(weight))
            if hit is None:
                hit = (weight, make(_as_torch(q), _as_torch(scale)))
                cache[id(weight)] = hit
        return hit[1]

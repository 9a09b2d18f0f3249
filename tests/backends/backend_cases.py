"""The op table every backend must pass, and helpers to place and run small graphs.

Each case builds one op (sometimes over strided views) from INPUT leafs and states the
expected result as a plain float64 numpy/scipy formula. A backend is anything with the
base.Backend interface; BACKENDS lists the ones tests run on (a CUDA backend adds itself).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import scipy.special

from tensorplan import dtype as dt
from tensorplan import ops
from tensorplan.backends import NumpyBackend, torch_available, torch_cpu
from tensorplan.backends.base import Backend
from tensorplan.graph import Graph
from tensorplan.tensor import Tensor

BACKENDS: dict[str, Callable[[], Backend]] = {"numpy": NumpyBackend}
if torch_available():  # every op through PyTorch, the smallest products included
    BACKENDS["torch"] = lambda: torch_cpu.TorchBackend(min_matmul_rows=0)

    def _device() -> Backend:
        from tensorplan.backends.torch_device import DeviceBackend

        return DeviceBackend("cpu")  # the CUDA code path, on the CPU

    BACKENDS["device"] = _device


# ---- placing and running --------------------------------------------------------------------
def place_all(graph: Graph, backend: Backend, same: Mapping[Tensor, Tensor] | None = None) -> None:
    """The simplest plan: every unplaced root gets a buffer of its own, except a node in
    `same`, which takes its src's exact bytes (in place); views follow their roots."""
    same = same or {}
    for t in graph.tensors():
        if t.is_view or t.is_placed:
            continue
        if t in same:
            src = same[t]
            assert src.buffer is not None and t.same_layout(src)
            t.place(src.buffer, src.offset)
        else:
            t.place(backend.buffer_type.alloc_buffer(max(t.nbytes, 1)), 0)
    for t in graph.tensors():
        if t.view_src is not None and t.view_src.buffer is not None:
            t.place(t.view_src.buffer, t.view_src.offset + t.view_offset)


STRATEGIES = ("naive", "offline", "ggml")  # place_all, then GraphAllocator's two strategies


def plan(graph: Graph, backend: Backend, strategy: str) -> None:
    """Place graph with `strategy`: "naive" (place_all) or a GraphAllocator strategy over
    two buffer types (the backend's, and one aligned to 16 B) picked by buffer_id."""
    if strategy == "naive":
        place_all(graph, backend)
        return
    from tensorplan.alloc import GraphAllocator

    alignment = 16 if backend.buffer_type.alignment > 16 else 64
    other = dataclasses.replace(backend.buffer_type, alignment=alignment, name="cpu2")  # type: ignore[type-var]
    types = [backend.buffer_type, other]
    assert GraphAllocator(types, strategy=strategy).alloc_graph(graph)


def rel_rms(got: np.ndarray, want: np.ndarray) -> float:
    """Root of the normalised mean squared error, over the entries both have finite."""
    finite = np.isfinite(want)
    g, w = got[finite].astype(np.float64), want[finite]
    return float(np.sqrt(np.sum((g - w) ** 2) / max(np.sum(w**2), 1e-300)))


def assert_close(got: np.ndarray, want: np.ndarray, tol: float) -> None:
    assert got.shape == want.shape, (got.shape, want.shape)
    if got.dtype.kind in "iu":
        np.testing.assert_array_equal(got, want)
        return
    # non-finite entries (masked softmax, overflow) must match exactly
    np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))
    ninf = ~np.isfinite(want)
    np.testing.assert_array_equal(got[ninf], want[ninf])
    err = rel_rms(got, want)
    assert err <= tol, f"relative RMS error {err:.3g} > {tol:.3g}"


# ---- the op table ---------------------------------------------------------------------------
Fill = Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]


@dataclass(frozen=True)
class Arg:
    shape: tuple[int, ...]
    dtype: str = "float32"
    low: float = -2.0
    high: float = 2.0
    fill: Fill | None = None  # custom values (integer ids, masks)

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        if self.fill is not None:
            return self.fill(rng, self.shape).astype(self.dtype)
        return rng.uniform(self.low, self.high, self.shape).astype(self.dtype)


@dataclass(frozen=True)
class Case:
    id: str
    args: tuple[Arg, ...]
    build: Callable[..., Tensor]  # INPUT leafs -> the node under test
    expect: Callable[..., np.ndarray]  # the inputs in float64 (ids stay integers) -> result
    tol: float = 1e-6  # relative RMS bound on the backend's result
    tol64: float | None = 1e-12  # bound on reference.evaluate(float64=True); None: skip

    def leafs(self) -> list[Tensor]:
        return [ops.input(a.shape, dt.dtype(a.dtype), f"in{i}") for i, a in enumerate(self.args)]

    def inplace_srcs(self) -> list[int]:
        """Args the node may overwrite: same-layout roots it reads, if its op is in place."""
        leafs = self.leafs()
        node = self.build(*leafs)
        if node.op is None or not node.op.inplace:
            return []
        return sorted(
            {
                leafs.index(s)
                for s in node.srcs
                if any(s is x for x in leafs) and s.same_layout(node)
            }
        )

    def sample(self, rng: np.random.Generator) -> list[np.ndarray]:
        return [a.sample(rng) for a in self.args]

    def want(self, values: list[np.ndarray]) -> np.ndarray:
        wide = [v.astype(np.float64) if v.dtype.kind == "f" else v for v in values]
        return np.asarray(self.expect(*wide))


def run_case(backend: Backend, case: Case, inplace: int | None = None, seed: int = 0
             ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Build, place (the node over arg `inplace`'s bytes if given), run; (got, want)."""
    leafs = case.leafs()
    node = case.build(*leafs)
    graph = Graph.build(node)
    place_all(graph, backend, {node: leafs[inplace]} if inplace is not None else None)
    values = case.sample(np.random.default_rng(seed))
    for t, v in zip(leafs, values, strict=True):
        backend.set(t, v)
    backend.compute(graph)
    return np.asarray(backend.get(node)), case.want(values)


# ---- formulas (float64) ---------------------------------------------------------------------
def _gelu(x: np.ndarray) -> np.ndarray:
    return np.asarray(x * (1 + scipy.special.erf(x / np.sqrt(2))) / 2)


def _attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float = 1.0
               ) -> np.ndarray:
    return np.asarray(_softmax(q @ np.swapaxes(k, -1, -2), scale=scale) @ v)


def _heads(x: Tensor, start: int, n_head: int, dh: int) -> Tensor:
    """Columns [start, start + n_head * dh) of a 2-D x as (n_head, rows, dh) views."""
    rows, item = x.shape[0], x.dtype.itemsize
    return ops.view(x, (n_head, rows, dh), (dh * item, x.strides[0], item), start * item)


def _np_heads(x: np.ndarray, start: int, n_head: int, dh: int) -> np.ndarray:
    return x[:, start:start + n_head * dh].reshape(x.shape[0], n_head, dh).transpose(1, 0, 2)


def _softmax(a: np.ndarray, mask: np.ndarray | float = 0.0, scale: float = 1.0) -> np.ndarray:
    z = a * scale + mask
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return np.asarray(e / e.sum(axis=-1, keepdims=True))


def _layer_norm(a: np.ndarray, w: np.ndarray | float = 1.0, b: np.ndarray | float = 0.0,
                eps: float = 1e-5) -> np.ndarray:  # fmt: skip
    mu = a.mean(axis=-1, keepdims=True)
    var = ((a - mu) ** 2).mean(axis=-1, keepdims=True)
    return np.asarray((a - mu) / np.sqrt(var + eps) * w + b)


def _rms_norm(a: np.ndarray, w: np.ndarray | float = 1.0, eps: float = 1e-6) -> np.ndarray:
    return np.asarray(a / np.sqrt((a**2).mean(axis=-1, keepdims=True) + eps) * w)


def _im2col(x: np.ndarray, k: int, stride: int, pad: int) -> np.ndarray:
    c, length = x.shape
    xp = np.pad(x, ((0, 0), (pad, pad)))
    l_out = (length + 2 * pad - k) // stride + 1
    out = np.zeros((l_out, c * k))
    for l in range(l_out):
        for ci in range(c):
            for ki in range(k):
                out[l, ci * k + ki] = xp[ci, l * stride + ki]
    return out


def _conv1d(x: np.ndarray, w: np.ndarray, stride: int, pad: int) -> np.ndarray:
    c_out, c_in, k = w.shape
    xp = np.pad(x, ((0, 0), (pad, pad)))
    l_out = (x.shape[1] + 2 * pad - k) // stride + 1
    out = np.zeros((c_out, l_out))
    for l in range(l_out):
        out[:, l] = np.einsum("oik,ik->o", w, xp[:, l * stride : l * stride + k])
    return out


def _conv2d(x: np.ndarray, w: np.ndarray, stride: tuple[int, int], pad: tuple[int, int],
            groups: int = 1) -> np.ndarray:  # fmt: skip
    c_out, cpg, kh, kw = w.shape
    opg = c_out // groups
    xp = np.pad(x, ((0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
    h_out = (xp.shape[1] - kh) // stride[0] + 1
    w_out = (xp.shape[2] - kw) // stride[1] + 1
    out = np.zeros((c_out, h_out, w_out))
    for o in range(c_out):
        g = o // opg
        for i in range(h_out):
            for j in range(w_out):
                win = xp[g * cpg : (g + 1) * cpg, i * stride[0] : i * stride[0] + kh,
                         j * stride[1] : j * stride[1] + kw]  # fmt: skip
                out[o, i, j] = np.sum(win * w[o])
    return out


def _pool2d(x: np.ndarray, k: tuple[int, int], stride: tuple[int, int], pad: tuple[int, int],
            mode: str) -> np.ndarray:  # fmt: skip
    fill = -np.inf if mode == "max" else 0.0
    xp = np.pad(x, ((0, 0), (pad[0], pad[0]), (pad[1], pad[1])), constant_values=fill)
    h_out = (xp.shape[1] - k[0]) // stride[0] + 1
    w_out = (xp.shape[2] - k[1]) // stride[1] + 1
    out = np.zeros((x.shape[0], h_out, w_out))
    for i in range(h_out):
        for j in range(w_out):
            win = xp[:, i * stride[0] : i * stride[0] + k[0], j * stride[1] : j * stride[1] + k[1]]
            out[:, i, j] = win.max(axis=(1, 2)) if mode == "max" else win.mean(axis=(1, 2))
    return out


def _set_rows(dst: np.ndarray, ids: np.ndarray, src: np.ndarray) -> np.ndarray:
    out = dst.copy()
    out[ids] = src
    return out


def _distinct_ids(high: int) -> Fill:
    return lambda rng, shape: rng.permutation(high)[: shape[0]]


def _causal(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """An additive mask: -inf above the diagonal, small noise elsewhere (no row all -inf)."""
    q, k = shape
    return np.where(np.arange(k)[None, :] > np.arange(q)[:, None], -np.inf,
                    rng.uniform(-1, 1, shape))  # fmt: skip


def _ids(high: int) -> Fill:
    return lambda rng, shape: rng.integers(0, high, shape)


T = ops.transpose
F16 = "float16"


def _int8(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.integers(-127, 128, shape)


def _unary_cases(name: str, f: Callable[..., Tensor], want: Callable[..., np.ndarray],
                 low: float = -2.0) -> list[Case]:  # fmt: skip
    return [
        Case(f"{name}", (Arg((7, 33), low=low),), f, want),
        # a strided (transposed) source
        Case(f"{name}-strided", (Arg((5, 9), low=low),), lambda x: f(T(x)), lambda x: want(x.T)),
        # more than one block (kernels.BLOCK elements), split inside the last axis
        Case(f"{name}-big", (Arg((70_001,), low=low),), f, want),
    ]


CASES: list[Case] = [
    # ---- binary, with broadcasting and views
    Case("add", (Arg((3, 4, 5)), Arg((3, 4, 5))), ops.add, np.add),
    Case("add-bcast-row", (Arg((3, 4, 5)), Arg((5,))), ops.add, np.add),
    Case("add-bcast-both", (Arg((3, 1, 5)), Arg((4, 1))), ops.add, np.add),
    Case("add-bcast-first", (Arg((4, 1)), Arg((2, 4, 6))), ops.add, np.add),
    Case(
        "add-views",
        (Arg((5, 4, 3)), Arg((3, 5, 4))),
        lambda x, y: ops.add(ops.permute(x, (2, 0, 1)), y),
        lambda x, y: x.transpose(2, 0, 1) + y,
    ),  # fmt: skip
    Case("add-same", (Arg((6, 7)),), lambda x: ops.add(x, x), lambda x: x + x),
    Case("sub", (Arg((3, 4, 5)), Arg((3, 4, 5))), ops.sub, np.subtract),
    Case("sub-bcast", (Arg((3, 4, 5)), Arg((4, 1))), ops.sub, np.subtract),
    Case("mul", (Arg((3, 4, 5)), Arg((3, 4, 5))), ops.mul, np.multiply),
    Case("mul-bcast", (Arg((1, 5)), Arg((6, 5))), ops.mul, np.multiply),
    Case("div", (Arg((3, 4, 5)), Arg((3, 4, 5), low=0.5, high=2)), ops.div, np.divide),
    Case("div-bcast", (Arg((3, 4, 5)), Arg((5,), low=0.5, high=2)), ops.div, np.divide),
    # ---- unary
    Case("scale", (Arg((4, 6)),), lambda x: ops.scale(x, -0.37), lambda x: x * -0.37),
    *_unary_cases("neg", ops.neg, np.negative),
    *_unary_cases("exp", ops.exp, np.exp),
    *_unary_cases("sqrt", ops.sqrt, np.sqrt, low=0.01),
    *_unary_cases("tanh", ops.tanh, np.tanh),
    *_unary_cases("gelu", ops.gelu, _gelu),
    *_unary_cases("silu", ops.silu, lambda x: x / (1 + np.exp(-x))),
    *_unary_cases("relu", ops.relu, lambda x: np.maximum(x, 0)),
    Case("gelu-f16", (Arg((8, 40), F16),), ops.gelu, _gelu, tol=1e-3, tol64=None),
    # ---- softmax
    Case("softmax", (Arg((3, 4, 9)),), ops.softmax, _softmax),
    Case(
        "softmax-scale",
        (Arg((4, 9), low=-8, high=8),),
        lambda a: ops.softmax(a, scale=0.125),
        lambda a: _softmax(a, scale=0.125),
    ),  # fmt: skip
    Case(
        "softmax-mask",
        (Arg((2, 5, 5)), Arg((5, 5), fill=_causal)),
        lambda a, m: ops.softmax(a, m, scale=0.5),
        lambda a, m: _softmax(a, m, 0.5),
    ),
    Case("softmax-mask-full", (Arg((4, 6)), Arg((4, 6))), ops.softmax, _softmax),
    Case("softmax-strided", (Arg((6, 4)),), lambda a: ops.softmax(T(a)), lambda a: _softmax(a.T)),
    # rows longer than a block: one row per block. Scores up to 30 in 40k-long rows
    # sum ~1e13-sized terms: a vectorised exp and a pairwise sum (PyTorch's) land
    # ~1.5e-6 from float64, numpy's ~5e-7; both are float32 rounding, not a bug.
    Case("softmax-long", (Arg((3, 40_000), low=-30, high=30),), ops.softmax, _softmax,
         tol=4e-6),
    # many short rows: many rows per block, several blocks
    Case("softmax-many", (Arg((9, 1000, 8)),), ops.softmax, _softmax),
    Case("softmax-f16", (Arg((3, 50), F16),), ops.softmax, _softmax, tol=1e-3, tol64=None),
    # ---- norms
    Case("layer_norm", (Arg((3, 4, 16)),), ops.layer_norm, _layer_norm),
    Case(
        "layer_norm-wb",
        (Arg((5, 16), low=1, high=3), Arg((16,)), Arg((16,))),
        lambda a, w, b: ops.layer_norm(a, w, b, eps=1e-3),
        lambda a, w, b: _layer_norm(a, w, b, eps=1e-3),
    ),  # fmt: skip
    Case(
        "layer_norm-w",
        (Arg((5, 16)), Arg((16,))),
        lambda a, w: ops.layer_norm(a, w),
        lambda a, w: _layer_norm(a, w),
    ),  # fmt: skip
    Case(
        "layer_norm-b",
        (Arg((5, 16)), Arg((16,))),
        lambda a, b: ops.layer_norm(a, None, b),
        lambda a, b: _layer_norm(a, b=b),
    ),  # fmt: skip
    Case(
        "layer_norm-strided",
        (Arg((16, 5)),),
        lambda a: ops.layer_norm(T(a)),
        lambda a: _layer_norm(a.T),
    ),  # fmt: skip
    Case("layer_norm-long", (Arg((2, 50_000)),), ops.layer_norm, _layer_norm),
    Case(
        "layer_norm-f16",
        (Arg((6, 64), F16), Arg((64,), F16), Arg((64,), F16)),
        ops.layer_norm,
        _layer_norm,
        tol=2e-3,
        tol64=None,
    ),  # fmt: skip
    Case("rms_norm", (Arg((3, 4, 16)),), ops.rms_norm, _rms_norm),
    Case(
        "rms_norm-w",
        (Arg((5, 16)), Arg((16,))),
        lambda a, w: ops.rms_norm(a, w, eps=1e-4),
        lambda a, w: _rms_norm(a, w, eps=1e-4),
    ),  # fmt: skip
    Case(
        "rms_norm-strided", (Arg((16, 5)),), lambda a: ops.rms_norm(T(a)), lambda a: _rms_norm(a.T)
    ),  # fmt: skip
    # ---- matmul
    Case("matmul", (Arg((7, 12)), Arg((12, 5))), ops.matmul, np.matmul),
    Case(
        "matmul-tb",
        (Arg((7, 12)), Arg((5, 12))),
        lambda a, b: ops.matmul(a, b, True),
        lambda a, b: a @ b.T,
    ),  # fmt: skip
    Case("matmul-batched", (Arg((2, 3, 4, 6)), Arg((6, 5))), ops.matmul, np.matmul),
    Case(
        "matmul-batched-tb",
        (Arg((3, 4, 6)), Arg((1, 5, 6))),
        lambda a, b: ops.matmul(a, b, True),
        lambda a, b: a @ np.swapaxes(b, -1, -2),
    ),
    Case("matmul-bcast", (Arg((2, 1, 4, 6)), Arg((3, 6, 5))), ops.matmul, np.matmul),
    Case(
        "matmul-a-view",
        (Arg((12, 7)), Arg((12, 5))),
        lambda a, b: ops.matmul(T(a), b),
        lambda a, b: a.T @ b,
    ),  # fmt: skip
    Case("matmul-f16-b", (Arg((7, 12)), Arg((12, 5), F16)), ops.matmul, np.matmul),
    # int8 weights: numpy's kernel is exact for the dequantized weight (tol64); the torch
    # one also quantizes the activations to 8 bits per call, hence the loose tol
    *(
        Case(
            f"qmatmul-{'x'.join(map(str, shape))}",
            (Arg(shape), Arg((n, shape[-1]), "int8", fill=_int8), Arg((n,), low=1e-3, high=2e-2)),
            ops.qmatmul,
            lambda a, q, s: a @ (q * s[:, None]).T,
            tol=2e-2,
        )
        for shape, n in (((7, 64), 5), ((2, 3, 96), 40), ((1, 384), 1000))
    ),
    Case(
        "matmul-f16-b-tb",
        (Arg((3, 7, 12)), Arg((9, 12), F16)),
        lambda a, b: ops.matmul(a, b, True),
        lambda a, b: a @ b.T,
    ),  # fmt: skip
    # a weight wider than one widening block (kernels.WIDEN_BLOCK elements)
    Case(
        "matmul-f16-b-big",
        (Arg((4, 64)), Arg((5000, 64), F16)),
        lambda a, b: ops.matmul(a, b, True),
        lambda a, b: a @ b.T,
    ),  # fmt: skip
    Case(
        "linear", (Arg((5, 8)), Arg((3, 8)), Arg((3,))), ops.linear, lambda x, w, b: x @ w.T + b
    ),  # fmt: skip
    # ---- attention: softmax(q k^T * scale) v in one node
    Case(
        "attention",
        (Arg((2, 3, 5, 8)), Arg((2, 3, 7, 8)), Arg((2, 3, 7, 6))),
        lambda q, k, v: ops.attention(q, k, v, scale=0.35),
        lambda q, k, v: _attention(q, k, v, 0.35),
    ),
    Case("attention-2d", (Arg((4, 8)), Arg((9, 8)), Arg((9, 3))),
         lambda q, k, v: ops.attention(q, k, v, scale=1.0), _attention),
    # heads as strided column views of one (A, 3d) projection, as Whisper's encoder reads
    Case("attention-heads", (Arg((10, 3 * 12)),), lambda x: ops.attention(
        *(_heads(x, i * 12, 3, 4) for i in range(3)), scale=0.5),
        lambda x: _attention(*(_np_heads(x, i * 12, 3, 4) for i in range(3)), 0.5)),
    # more query rows than one block of scores (kernels.ATTENTION_BLOCK elements) holds
    Case("attention-blocks", (Arg((1, 300, 8)), Arg((1, 16_000, 8)), Arg((1, 16_000, 4))),
         lambda q, k, v: ops.attention(q, k, v, scale=0.7),
         lambda q, k, v: _attention(q, k, v, 0.7)),
    # empty axes: no queries, no key width (every key scores 0: the mean of v), no values
    *(Case(f"attention-empty-{axis}", tuple(Arg(a) for a in shapes),
           lambda q, k, v: ops.attention(q, k, v, scale=0.5),
           lambda q, k, v: _attention(q, k, v, 0.5))
      for axis, shapes in (("m", ((2, 0, 4), (2, 5, 4), (2, 5, 3))),
                           ("d", ((2, 3, 0), (2, 5, 0), (2, 5, 3))),
                           ("e", ((2, 3, 4), (2, 5, 4), (2, 5, 0))))),
    # the bfloat16 hint (taken by the torch backend on CPUs with AMX)
    Case("attention-bf16", (Arg((2, 6, 8)), Arg((2, 9, 8)), Arg((2, 9, 5))),
         lambda q, k, v: ops.attention(q, k, v, scale=0.35, precision="bfloat16"),
         lambda q, k, v: _attention(q, k, v, 0.35), tol=1e-2),
    # ---- im2col and conv1d
    Case(
        "im2col", (Arg((3, 10)),), lambda x: ops.im2col(x, 3, 1, 1), lambda x: _im2col(x, 3, 1, 1)
    ),  # fmt: skip
    Case(
        "im2col-stride",
        (Arg((2, 11)),),
        lambda x: ops.im2col(x, 3, 2, 1),
        lambda x: _im2col(x, 3, 2, 1),
    ),  # fmt: skip
    Case("im2col-nopad", (Arg((4, 9)),), lambda x: ops.im2col(x, 5), lambda x: _im2col(x, 5, 1, 0)),
    Case(
        "im2col-widepad",
        (Arg((2, 4)),),
        lambda x: ops.im2col(x, 3, 2, 3),
        lambda x: _im2col(x, 3, 2, 3),
    ),  # fmt: skip
    Case(
        "im2col-strided",
        (Arg((10, 3)),),
        lambda x: ops.im2col(T(x), 3, 1, 1),
        lambda x: _im2col(x.T, 3, 1, 1),
    ),  # fmt: skip
    Case(
        "conv1d",
        (Arg((4, 12)), Arg((6, 4, 3))),
        lambda x, w: ops.conv1d(x, w, 2, 1),
        lambda x, w: _conv1d(x, w, 2, 1),
    ),  # fmt: skip
    Case(
        "conv2d",
        (Arg((3, 7, 6)), Arg((4, 3, 3, 3))),
        ops.conv2d,
        lambda x, w: _conv2d(x, w, (1, 1), (0, 0)),
    ),  # fmt: skip
    Case(
        "conv2d-pad-stride",
        (Arg((3, 9, 8)), Arg((5, 3, 3, 2))),
        lambda x, w: ops.conv2d(x, w, stride=(2, 1), padding=(1, 2)),
        lambda x, w: _conv2d(x, w, (2, 1), (1, 2)),
    ),  # fmt: skip
    Case(
        "conv2d-groups",
        (Arg((4, 6, 6)), Arg((6, 2, 3, 3))),
        lambda x, w: ops.conv2d(x, w, padding=1, groups=2),
        lambda x, w: _conv2d(x, w, (1, 1), (1, 1), 2),
    ),  # fmt: skip
    Case(
        "conv2d-depthwise",
        (Arg((3, 5, 5)), Arg((3, 1, 3, 3))),
        lambda x, w: ops.conv2d(x, w, stride=2, padding=1, groups=3),
        lambda x, w: _conv2d(x, w, (2, 2), (1, 1), 3),
    ),  # fmt: skip
    # output rows split over several im2col blocks (kernels.CONV_BLOCK elements)
    Case(
        "conv2d-big",
        (Arg((16, 40, 64)), Arg((8, 16, 3, 3))),
        lambda x, w: ops.conv2d(x, w, padding=1),
        lambda x, w: _conv2d(x, w, (1, 1), (1, 1)),
    ),  # fmt: skip
    Case(
        "conv2d-strided-x",
        (Arg((6, 5, 3)), Arg((2, 3, 2, 2))),
        lambda x, w: ops.conv2d(ops.permute(x, (2, 0, 1)), w),
        lambda x, w: _conv2d(x.transpose(2, 0, 1), w, (1, 1), (0, 0)),
    ),  # fmt: skip
    Case(
        "pool2d-max",
        (Arg((3, 7, 8)),),
        lambda x: ops.pool2d(x, 2),
        lambda x: _pool2d(x, (2, 2), (2, 2), (0, 0), "max"),
    ),  # fmt: skip
    Case(
        "pool2d-max-pad",
        (Arg((2, 7, 7)),),
        lambda x: ops.pool2d(x, 3, 2, 1),
        lambda x: _pool2d(x, (3, 3), (2, 2), (1, 1), "max"),
    ),  # fmt: skip
    Case(
        "pool2d-avg-pad",
        (Arg((2, 6, 5)),),
        lambda x: ops.pool2d(x, (3, 2), (1, 2), (1, 1), "avg"),
        lambda x: _pool2d(x, (3, 2), (1, 2), (1, 1), "avg"),
    ),  # fmt: skip
    # ---- data movement
    Case(
        "concat-0",
        (Arg((2, 5)), Arg((3, 5)), Arg((1, 5))),
        lambda *ts: ops.concat(ts, 0),
        lambda *xs: np.concatenate(xs, 0),
    ),  # fmt: skip
    Case(
        "concat-last",
        (Arg((2, 3, 4)), Arg((2, 3, 1))),
        lambda *ts: ops.concat(ts, -1),
        lambda *xs: np.concatenate(xs, -1),
    ),  # fmt: skip
    Case(
        "concat-view",
        (Arg((4, 2)), Arg((2, 3))),
        lambda a, b: ops.concat([T(a), b], 1),
        lambda a, b: np.concatenate([a.T, b], 1),
    ),  # fmt: skip
    Case(
        "get_rows",
        (Arg((10, 4)), Arg((6,), "int32", fill=_ids(10))),
        ops.get_rows,
        lambda t, i: t[i],
    ),  # fmt: skip
    # a transposed table (Whisper's embedding is held that way), rows in several blocks
    Case(
        "get_rows-strided-table",
        (Arg((3000, 100)), Arg((40,), "int32", fill=_ids(100))),
        lambda t, i: ops.get_rows(T(t), i),
        lambda t, i: t.T[i],
    ),  # fmt: skip
    Case(
        "get_rows-i64-3d",
        (Arg((5, 2, 3), F16), Arg((7,), "int64", fill=_ids(5))),
        ops.get_rows,
        lambda t, i: t[i],
    ),  # fmt: skip
    Case(
        "cont",
        (Arg((3, 4, 5)),),
        lambda x: ops.cont(ops.permute(x, (2, 0, 1))),
        lambda x: x.transpose(2, 0, 1),
    ),  # fmt: skip
    Case(
        "cast-f16",
        (Arg((4, 5)),),
        lambda x: ops.cast(x, dt.float16),
        lambda x: x.astype(np.float16),
        tol=0,
        tol64=1e-3,
    ),  # fmt: skip
    Case(
        "cast-from-f16",
        (Arg((4, 5), F16),),
        lambda x: ops.cast(T(x), dt.float32),
        lambda x: x.T,
        tol=0,
    ),  # fmt: skip
    Case(
        "cast-int",
        (Arg((4, 5), low=-5, high=5),),
        lambda x: ops.cast(x, dt.int32),
        lambda x: x.astype(np.int32),
    ),  # fmt: skip
    Case("mean-last", (Arg((3, 4, 5)),), ops.mean, lambda x: x.mean(-1, keepdims=True)),
    Case("mean-0", (Arg((3, 4, 5)),), lambda x: ops.mean(x, 0), lambda x: x.mean(0, keepdims=True)),
    Case(
        "mean-strided",
        (Arg((5, 6)),),
        lambda x: ops.mean(T(x)),
        lambda x: x.T.mean(-1, keepdims=True),
    ),  # fmt: skip
    Case("argmax", (Arg((4, 9)),), ops.argmax, lambda x: x.argmax(-1)),
    Case("argmax-0", (Arg((4, 3, 9)),), lambda x: ops.argmax(x, 0), lambda x: x.argmax(0)),
    Case("argmax-strided", (Arg((9, 4)),), lambda x: ops.argmax(T(x)), lambda x: x.T.argmax(-1)),
    Case("copy_into", (Arg((3, 4)), Arg((3, 4))), ops.copy_into, lambda s, d: s),
    Case(
        "copy_into-slot",
        (Arg((2, 4)), Arg((5, 4))),
        lambda s, d: ops.copy_into(s, ops.view(d, (2, 4), offset=2 * 16)),
        lambda s, d: s,
    ),
    Case(
        "copy_into-cast",
        (Arg((3, 4)), Arg((4, 3), F16)),
        lambda s, d: ops.copy_into(s, T(d)),
        lambda s, d: s.astype(np.float16),
        tol=0,
        tol64=None,
    ),  # fmt: skip
    Case(
        "set_rows",
        (Arg((6, 4)), Arg((3,), "int32", fill=_distinct_ids(6)), Arg((3, 4))),
        ops.set_rows,
        _set_rows,
    ),  # fmt: skip
    Case(
        "set_rows-i64-view",
        (Arg((2, 5, 3)), Arg((2,), "int64", fill=_distinct_ids(4)), Arg((2, 3))),
        lambda d, i, s: ops.set_rows(ops.view(d, (4, 3), offset=12), i, s),
        lambda d, i, s: _set_rows(d.reshape(10, 3)[1:5], i, s),
    ),  # fmt: skip
    # ---- view ops: nothing runs, the result is the root's bytes seen another way
    Case(
        "view",
        (Arg((4, 6)),),
        lambda x: ops.view(x, (2, 3), (48, 8), offset=4),
        lambda x: x[::2, 1::2],
    ),  # fmt: skip
    Case("reshape", (Arg((4, 6)),), lambda x: ops.reshape(x, (3, -1)), lambda x: x.reshape(3, 8)),
    Case(
        "permute",
        (Arg((2, 3, 4)),),
        lambda x: ops.permute(x, (1, 2, 0)),
        lambda x: x.transpose(1, 2, 0),
    ),  # fmt: skip
]

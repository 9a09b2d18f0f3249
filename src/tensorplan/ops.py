"""Op builders: each records (op, srcs, params) and returns a new Tensor. Nothing computes.

Shapes follow numpy's broadcasting and axis order. Every op says whether it may run in
place (its backend kernel tolerates dst being one of its same-layout srcs); view ops
alias their source's bytes and get no memory of their own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from tensorplan import dtype as dt
from tensorplan.dtype import DType
from tensorplan.tensor import Flag, Op, Tensor, contiguous_strides, extent

# ---- the op table -------------------------------------------------------------------
ADD = Op("add", inplace=True)
SUB = Op("sub", inplace=True)
MUL = Op("mul", inplace=True)
DIV = Op("div", inplace=True)
SCALE = Op("scale", inplace=True)
NEG = Op("neg", inplace=True)
EXP = Op("exp", inplace=True)
SQRT = Op("sqrt", inplace=True)
TANH = Op("tanh", inplace=True)
GELU = Op("gelu", inplace=True)
SILU = Op("silu", inplace=True)
RELU = Op("relu", inplace=True)
SOFTMAX = Op("softmax", inplace=True)
LAYER_NORM = Op("layer_norm", inplace=True)
RMS_NORM = Op("rms_norm", inplace=True)
MATMUL = Op("matmul")
QMATMUL = Op("qmatmul")  # float activations times an int8 weight with per-row scales
ATTENTION = Op("attention")  # softmax(q k^T * scale) v: the scores are never a tensor
IM2COL = Op("im2col")
CONCAT = Op("concat")
GET_ROWS = Op("get_rows")
CONT = Op("cont")
CAST = Op("cast")
MEAN = Op("mean")
ARGMAX = Op("argmax")
COPY_INTO = Op("copy_into", is_view=True)  # writes src into dst's bytes; result is a view of dst
SET_ROWS = Op(
    "set_rows", is_view=True
)  # writes src rows into dst at row ids; result is a view of dst
VIEW = Op("view", is_view=True)
RESHAPE = Op("reshape", is_view=True)
PERMUTE = Op("permute", is_view=True)
CONV2D = Op("conv2d")  # direct 2-D convolution, one node (CNN benchmark graphs)
POOL2D = Op("pool2d")

ALL_OPS: tuple[Op, ...] = (
    ADD, SUB, MUL, DIV, SCALE, NEG, EXP, SQRT, TANH, GELU, SILU, RELU, SOFTMAX, LAYER_NORM,
    RMS_NORM, MATMUL, QMATMUL, ATTENTION, IM2COL, CONCAT, GET_ROWS, CONT, CAST, MEAN, ARGMAX,
    COPY_INTO, SET_ROWS, VIEW, RESHAPE, PERMUTE, CONV2D, POOL2D,
)  # fmt: skip


def _node(
    op: Op,
    shape: Sequence[int],
    dtype: DType,
    srcs: Sequence[Tensor],
    name: str = "",
    **params: Any,
) -> Tensor:
    return Tensor(tuple(shape), dtype, op=op, srcs=tuple(srcs), params=params, name=name)


# ---- leafs ----------------------------------------------------------------------------
def new_tensor(
    shape: Sequence[int], dtype: DType = dt.float32, name: str = "", flags: Flag = Flag.NONE
) -> Tensor:
    return Tensor(tuple(shape), dtype, name=name, flags=flags)


def input(shape: Sequence[int], dtype: DType = dt.float32, name: str = "") -> Tensor:  # noqa: A001
    return new_tensor(shape, dtype, name, Flag.INPUT)


def param(shape: Sequence[int], dtype: DType = dt.float32, name: str = "") -> Tensor:
    return new_tensor(shape, dtype, name, Flag.PARAM)


def ref(t: Tensor, name: str = "") -> Tensor:
    """A leaf that views `t` (ggml_view_tensor): how a later graph reads an earlier
    graph's result or a persistent tensor without making it one of its own nodes."""
    return Tensor(
        t.shape,
        t.dtype,
        strides=t.strides,
        view_src=t.root,
        view_offset=t.view_offset,
        name=name or f"{t.name}(ref)",
    )


# ---- elementwise ------------------------------------------------------------------------
def broadcast_shape(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    n = max(len(a), len(b))
    pa = (1,) * (n - len(a)) + tuple(a)
    pb = (1,) * (n - len(b)) + tuple(b)
    out = []
    for x, y in zip(pa, pb, strict=True):
        if x != y and 1 not in (x, y):
            raise ValueError(f"shapes {tuple(a)} and {tuple(b)} do not broadcast")
        out.append(max(x, y) if 0 not in (x, y) else 0)
    return tuple(out)


def _binary(op: Op, a: Tensor, b: Tensor, name: str) -> Tensor:
    if a.dtype != b.dtype:
        raise TypeError(f"{op.name}: dtypes differ ({a.dtype} vs {b.dtype})")
    return _node(op, broadcast_shape(a.shape, b.shape), a.dtype, (a, b), name)


def add(a: Tensor, b: Tensor, name: str = "") -> Tensor:
    return _binary(ADD, a, b, name)


def sub(a: Tensor, b: Tensor, name: str = "") -> Tensor:
    return _binary(SUB, a, b, name)


def mul(a: Tensor, b: Tensor, name: str = "") -> Tensor:
    return _binary(MUL, a, b, name)


def div(a: Tensor, b: Tensor, name: str = "") -> Tensor:
    return _binary(DIV, a, b, name)


def _unary(op: Op, a: Tensor, name: str, **params: Any) -> Tensor:
    return _node(op, a.shape, a.dtype, (a,), name, **params)


def scale(a: Tensor, s: float, name: str = "") -> Tensor:
    return _unary(SCALE, a, name, s=float(s))


def neg(a: Tensor, name: str = "") -> Tensor:
    return _unary(NEG, a, name)


def exp(a: Tensor, name: str = "") -> Tensor:
    return _unary(EXP, a, name)


def sqrt(a: Tensor, name: str = "") -> Tensor:
    return _unary(SQRT, a, name)


def tanh(a: Tensor, name: str = "") -> Tensor:
    return _unary(TANH, a, name)


def gelu(a: Tensor, name: str = "") -> Tensor:
    """Exact GELU: x * (1 + erf(x / sqrt(2))) / 2."""
    return _unary(GELU, a, name)


def silu(a: Tensor, name: str = "") -> Tensor:
    return _unary(SILU, a, name)


def relu(a: Tensor, name: str = "") -> Tensor:
    return _unary(RELU, a, name)


# ---- normalisation ------------------------------------------------------------------------
def softmax(a: Tensor, mask: Tensor | None = None, scale: float = 1.0, name: str = "") -> Tensor:
    """softmax(a * scale + mask) over the last axis; mask broadcasts to a."""
    srcs: tuple[Tensor, ...] = (a,)
    if mask is not None:
        broadcast_shape(a.shape, mask.shape)
        if broadcast_shape(a.shape, mask.shape) != a.shape:
            raise ValueError(f"softmax mask {mask.shape} must broadcast to {a.shape}")
        srcs = (a, mask)
    return _node(SOFTMAX, a.shape, a.dtype, srcs, name, scale=float(scale))


def _check_vector(v: Tensor | None, n: int, what: str) -> None:
    if v is not None and v.shape != (n,):
        raise ValueError(f"{what} must have shape ({n},), got {v.shape}")


def layer_norm(
    a: Tensor,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
    name: str = "",
) -> Tensor:
    """(a - mean) / sqrt(var + eps) * weight + bias over the last axis."""
    _check_vector(weight, a.shape[-1], "layer_norm weight")
    _check_vector(bias, a.shape[-1], "layer_norm bias")
    srcs = tuple(t for t in (a, weight, bias) if t is not None)
    return _node(
        LAYER_NORM,
        a.shape,
        a.dtype,
        srcs,
        name,
        eps=float(eps),
        has_weight=weight is not None,
        has_bias=bias is not None,
    )


def rms_norm(a: Tensor, weight: Tensor | None = None, eps: float = 1e-6, name: str = "") -> Tensor:
    _check_vector(weight, a.shape[-1], "rms_norm weight")
    srcs = (a,) if weight is None else (a, weight)
    return _node(RMS_NORM, a.shape, a.dtype, srcs, name, eps=float(eps))


# ---- linear algebra ------------------------------------------------------------------------
MATMUL_PRECISIONS = ("float32", "bfloat16")


def _precision_hint(precision: str) -> dict[str, str]:
    """A product's node params for `precision` (none for the float32 default)."""
    if precision not in MATMUL_PRECISIONS:
        raise ValueError(f"product precision must be one of {', '.join(MATMUL_PRECISIONS)}, "
                         f"got {precision!r}")
    return {} if precision == "float32" else {"precision": precision}


def matmul(a: Tensor, b: Tensor, transpose_b: bool = False, name: str = "",
           precision: str = "float32") -> Tensor:
    """a (..., M, K) @ b (..., K, N), or b (..., N, K) transposed; batch axes broadcast.
    The result takes a's dtype (a float16 weight as b is widened by the backend).

    precision "bfloat16" allows a backend to round both operands and the result to
    bfloat16, summing in float32 (a relative error near 3e-3), where its hardware
    multiplies those faster (the torch backend on CPUs with AMX); the reference kernels
    ignore it."""
    hint = _precision_hint(precision)
    if a.ndim < 2 or b.ndim < 2:
        raise ValueError(f"matmul needs 2-D or more operands, got {a.shape} and {b.shape}")
    m, k = a.shape[-2:]
    kb, n = (b.shape[-1], b.shape[-2]) if transpose_b else b.shape[-2:]
    if k != kb:
        raise ValueError(
            f"matmul: inner dims differ: {a.shape} @ {b.shape} (transpose_b={transpose_b})"
        )
    batch = broadcast_shape(a.shape[:-2], b.shape[:-2])
    return _node(MATMUL, (*batch, m, n), a.dtype, (a, b), name, transpose_b=transpose_b, **hint)


def attention(q: Tensor, k: Tensor, v: Tensor, scale: float, name: str = "",
              precision: str = "float32") -> Tensor:
    """softmax(q @ k^T * scale) @ v over the last two axes: q (..., M, D), k (..., N, D)
    and v (..., N, E) with the same batch axes -> (..., M, E) in q's dtype.

    One node where matmul, softmax and matmul are three: its (M, N) scores are never a
    planned tensor, so a backend may compute it without holding them (PyTorch's fused
    attention reads K and V in blocks; the reference kernel holds a few rows of scores
    at a time). precision "bfloat16" as matmul's (the softmax stays float32)."""
    hint = _precision_hint(precision)
    for t, what in ((q, "q"), (k, "k"), (v, "v")):
        if t.ndim < 2:
            raise ValueError(f"attention: {what} needs 2-D or more, got {t.shape}")
    if not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]):
        raise ValueError(f"attention: batch axes differ: q {q.shape}, k {k.shape}, v {v.shape}")
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ValueError(f"attention: q {q.shape}, k {k.shape} and v {v.shape} do not fit "
                         "(q and k share their last axis, k and v their keys)")
    return _node(ATTENTION, (*q.shape[:-1], v.shape[-1]), q.dtype, (q, k, v), name,
                 scale=float(scale), **hint)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, name: str = "") -> Tensor:
    """x @ weight.T + bias, with weight in PyTorch's (out_features, in_features) layout."""
    y = matmul(x, weight, transpose_b=True, name=f"{name}.mm" if name else "")
    return add(y, bias, name=name) if bias is not None else y


def qmatmul(a: Tensor, q: Tensor, scale: Tensor, name: str = "",
            precision: str = "float32") -> Tensor:
    """a (..., M, K) @ (q * scale[:, None]).T: q (N, K) an int8 weight in PyTorch's
    (out, in) layout, scale (N,) its per-row float32 scales. The float32 result is that
    of the dequantized weight; a backend may also quantize `a` per call (the torch one
    does, as CTranslate2's int8 does), which adds its own rounding. precision "bfloat16"
    allows a backend to multiply `a` and the dequantized weight in bfloat16 instead (as
    for matmul)."""
    hint = _precision_hint(precision)
    if a.ndim < 2 or q.ndim != 2 or q.dtype != dt.int8:
        raise ValueError(f"qmatmul needs a (..., M, K) and an int8 (N, K), got {a.shape}, "
                         f"{q.dtype} {q.shape}")
    if a.shape[-1] != q.shape[1]:
        raise ValueError(f"qmatmul: inner dims differ: {a.shape} @ {q.shape}^T")
    _check_vector(scale, q.shape[0], "qmatmul scale")
    return _node(QMATMUL, (*a.shape[:-1], q.shape[0]), a.dtype, (a, q, scale), name, **hint)


def im2col(x: Tensor, kernel: int, stride: int = 1, padding: int = 0, name: str = "") -> Tensor:
    """x (C, L) -> columns (L_out, C * kernel), column index c * kernel + k."""
    if x.ndim != 2:
        raise ValueError(f"im2col expects (channels, length), got {x.shape}")
    c, length = x.shape
    l_out = (length + 2 * padding - kernel) // stride + 1
    if l_out <= 0:
        raise ValueError(f"im2col: input length {length} too short for kernel {kernel}")
    return _node(
        IM2COL,
        (l_out, c * kernel),
        x.dtype,
        (x,),
        name,
        kernel=kernel,
        stride=stride,
        padding=padding,
    )


def conv1d(x: Tensor, weight: Tensor, stride: int = 1, padding: int = 0, name: str = "") -> Tensor:
    """x (C_in, L), weight (C_out, C_in, K) -> (C_out, L_out), as im2col + matmul."""
    c_out, c_in, k = weight.shape
    if x.shape[0] != c_in:
        raise ValueError(f"conv1d: input has {x.shape[0]} channels, weight expects {c_in}")
    cols = im2col(x, k, stride, padding, name=f"{name}.im2col" if name else "")
    w2d = reshape(weight, (c_out, c_in * k))
    return matmul(w2d, cols, transpose_b=True, name=name)


# ---- data movement ------------------------------------------------------------------------
def concat(ts: Sequence[Tensor], axis: int = 0, name: str = "") -> Tensor:
    if not ts:
        raise ValueError("concat of nothing")
    first = ts[0]
    axis = axis % first.ndim
    for t in ts[1:]:
        if (
            t.dtype != first.dtype
            or t.ndim != first.ndim
            or any(t.shape[i] != first.shape[i] for i in range(first.ndim) if i != axis)
        ):
            raise ValueError(f"concat: {t.shape} does not match {first.shape} off axis {axis}")
    shape = list(first.shape)
    shape[axis] = sum(t.shape[axis] for t in ts)
    return _node(CONCAT, shape, first.dtype, ts, name, axis=axis)


def get_rows(table: Tensor, ids: Tensor, name: str = "") -> Tensor:
    """table (V, ...), integer ids (n,) -> (n, ...): an embedding lookup."""
    _check_ids(ids, "get_rows")
    return _node(GET_ROWS, (ids.shape[0], *table.shape[1:]), table.dtype, (table, ids), name)


def cont(a: Tensor, name: str = "") -> Tensor:
    """A contiguous copy (of a strided view, typically)."""
    return _unary(CONT, a, name)


def cast(a: Tensor, dtype: DType, name: str = "") -> Tensor:
    return _node(CAST, a.shape, dtype, (a,), name)


def copy_into(src: Tensor, dst: Tensor, name: str = "") -> Tensor:
    """Write src into dst's bytes (e.g. a KV-cache slot); returns a view of dst that
    orders later readers after the write. dst usually lives outside the graph."""
    if src.shape != dst.shape:
        raise ValueError(f"copy_into: shapes differ ({src.shape} vs {dst.shape})")
    return _write_into(COPY_INTO, dst, (src, dst), name)


def set_rows(dst: Tensor, ids: Tensor, src: Tensor, name: str = "") -> Tensor:
    """dst[ids[i]] = src[i] for every i: dst (R, ...), ids (n,) integer, src (n, ...).
    Writes into dst's bytes (a KV cache, say) at rows chosen at run time, so one planned
    graph serves every position; returns a view of dst ordering later readers after it."""
    _check_ids(ids, "set_rows")
    if src.shape != (ids.shape[0], *dst.shape[1:]) or src.dtype != dst.dtype:
        raise ValueError(
            f"set_rows: src {src.dtype} {src.shape} does not fit rows of "
            f"{dst.dtype} {dst.shape} at {ids.shape[0]} ids"
        )
    return _write_into(SET_ROWS, dst, (dst, ids, src), name)


def _check_ids(ids: Tensor, what: str) -> None:
    if ids.ndim != 1 or ids.dtype not in (dt.int32, dt.int64):
        raise ValueError(f"{what} ids must be a 1-D integer tensor, got {ids.dtype} {ids.shape}")


def _write_into(op: Op, dst: Tensor, srcs: tuple[Tensor, ...], name: str) -> Tensor:
    """The node of an op that writes into dst's bytes: a view of dst (same shape, strides and
    place), so that readers of the result are ordered after the write."""
    return Tensor(
        dst.shape,
        dst.dtype,
        strides=dst.strides,
        op=op,
        srcs=srcs,
        view_src=dst.root,
        view_offset=dst.view_offset,
        name=name,
    )


def mean(a: Tensor, axis: int = -1, name: str = "") -> Tensor:
    """Mean over one axis, kept as size 1."""
    axis = axis % a.ndim
    shape = list(a.shape)
    shape[axis] = 1
    return _node(MEAN, shape, a.dtype, (a,), name, axis=axis)


def argmax(a: Tensor, axis: int = -1, name: str = "") -> Tensor:
    """Index of the maximum over one axis (removed), as int32."""
    axis = axis % a.ndim
    shape = a.shape[:axis] + a.shape[axis + 1 :]
    return _node(ARGMAX, shape, dt.int32, (a,), name, axis=axis)


# ---- views ----------------------------------------------------------------------------------
def _view_node(
    op: Op,
    a: Tensor,
    shape: Sequence[int],
    strides: Sequence[int],
    offset: int,
    name: str,
    **params: Any,
) -> Tensor:
    t = Tensor(
        tuple(shape),
        a.dtype,
        strides=tuple(strides),
        op=op,
        srcs=(a,),
        params=params,
        view_src=a.root,
        view_offset=a.view_offset + offset,
        name=name,
    )
    root = a.root
    if t.nbytes and t.view_offset + t.nbytes > root.nbytes:
        raise ValueError(
            f"view [{t.view_offset}, {t.view_offset + t.nbytes}) exceeds its root "
            f"of {root.nbytes} B"
        )
    return t


def view(
    a: Tensor,
    shape: Sequence[int],
    strides: Sequence[int] | None = None,
    offset: int = 0,
    name: str = "",
) -> Tensor:
    """A window into a's bytes: byte offset from a's start, byte strides (default contiguous)."""
    st = (
        tuple(strides)
        if strides is not None
        else contiguous_strides(tuple(shape), a.dtype.itemsize)
    )
    if offset < 0 or any(s < 0 for s in st):
        raise ValueError("views take non-negative offsets and strides")
    if offset + extent(tuple(shape), st, a.dtype.itemsize) > a.nbytes:
        raise ValueError(f"view of {tuple(shape)} at +{offset} exceeds its source {a.shape}")
    return _view_node(VIEW, a, shape, st, offset, name)


def reshape(a: Tensor, shape: Sequence[int], name: str = "") -> Tensor:
    shape = list(shape)
    if shape.count(-1) == 1:
        known = math.prod(n for n in shape if n != -1)
        shape[shape.index(-1)] = a.size // known if known else 0
    if math.prod(shape) != a.size:
        raise ValueError(f"cannot reshape {a.shape} to {tuple(shape)}")
    if not a.is_contiguous:
        raise ValueError(
            f"reshape needs a contiguous tensor; {a.shape} has strides {a.strides} (use cont first)"
        )
    return _view_node(
        RESHAPE, a, shape, contiguous_strides(tuple(shape), a.dtype.itemsize), 0, name
    )


def permute(a: Tensor, axes: Sequence[int], name: str = "") -> Tensor:
    axes = [x % a.ndim for x in axes]
    if sorted(axes) != list(range(a.ndim)):
        raise ValueError(f"permute axes {axes} are not a permutation of {a.ndim} axes")
    return _view_node(
        PERMUTE,
        a,
        [a.shape[i] for i in axes],
        [a.strides[i] for i in axes],
        0,
        name,
        axes=tuple(axes),
    )


def transpose(a: Tensor, name: str = "") -> Tensor:
    """Swap the last two axes (a view)."""
    axes = list(range(a.ndim))
    axes[-2], axes[-1] = axes[-1], axes[-2]
    return permute(a, axes, name)


# ---- 2-D convolution and pooling (CNN graphs; x is (C, H, W), batch 1) ---------------------
def _pair(v: int | Sequence[int], what: str) -> tuple[int, int]:
    h, w = (v, v) if isinstance(v, int) else tuple(v)
    if h < 0 or w < 0:
        raise ValueError(f"{what} must be non-negative, got {v}")
    return int(h), int(w)


def _window_out(
    hw: tuple[int, int],
    kernel: tuple[int, int],
    stride: tuple[int, int],
    padding: tuple[int, int],
    what: str,
) -> tuple[int, int]:
    out = tuple(
        (n + 2 * p - k) // s + 1 for n, k, s, p in zip(hw, kernel, stride, padding, strict=True)
    )
    if min(stride) < 1 or min(out) <= 0:
        raise ValueError(
            f"{what}: input {hw} too small for kernel {kernel} (stride {stride}, padding {padding})"
        )
    return out[0], out[1]


def conv2d(
    x: Tensor,
    weight: Tensor,
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] = 0,
    groups: int = 1,
    name: str = "",
) -> Tensor:
    """PyTorch's Conv2d without bias (a cross-correlation), as one node.

    x (C_in, H, W), weight (C_out, C_in // groups, KH, KW) -> (C_out, H_out, W_out), with
    H_out = (H + 2 * pad_h - KH) // stride_h + 1 (W likewise); padding is zeros. stride and
    padding are an int or an (h, w) pair, stored as pairs in params. With cpg = C_in // groups
    and opg = C_out // groups, output channel o belongs to group g = o // opg and
        out[o, i, j] = sum over c < cpg, p < KH, q < KW of
                       x_pad[g * cpg + c, i * stride_h + p, j * stride_w + q] * weight[o, c, p, q]
    groups == C_in == C_out is a depthwise convolution. Add a bias (C_out, 1, 1) separately.
    """
    if x.ndim != 3 or weight.ndim != 4:
        raise ValueError(
            f"conv2d expects x (C, H, W) and weight (O, C/g, KH, KW), got {x.shape} "
            f"and {weight.shape}"
        )
    c_out, cpg, kh, kw = weight.shape
    if groups < 1 or x.shape[0] % groups or c_out % groups or x.shape[0] // groups != cpg:
        raise ValueError(
            f"conv2d: {x.shape[0]} input channels, weight {weight.shape} and "
            f"groups={groups} do not agree"
        )
    st, pad = _pair(stride, "conv2d stride"), _pair(padding, "conv2d padding")
    h_out, w_out = _window_out((x.shape[1], x.shape[2]), (kh, kw), st, pad, "conv2d")
    return _node(
        CONV2D,
        (c_out, h_out, w_out),
        x.dtype,
        (x, weight),
        name,
        stride=st,
        padding=pad,
        groups=groups,
    )


def pool2d(
    x: Tensor,
    kernel: int | Sequence[int],
    stride: int | Sequence[int] | None = None,
    padding: int | Sequence[int] = 0,
    mode: str = "max",
    name: str = "",
) -> Tensor:
    """Max or average pooling over (KH, KW) windows of each channel, as one node.

    x (C, H, W) -> (C, H_out, W_out), H_out = (H + 2 * pad_h - KH) // stride_h + 1; stride
    defaults to the kernel. mode "max": padded cells count as -inf (PyTorch MaxPool2d).
    mode "avg": the window sum divided by KH * KW, padded cells counting as zeros
    (AvgPool2d with count_include_pad=True). kernel, stride, padding are stored as pairs.
    """
    if x.ndim != 3:
        raise ValueError(f"pool2d expects (C, H, W), got {x.shape}")
    if mode not in ("max", "avg"):
        raise ValueError(f"pool2d mode must be 'max' or 'avg', got {mode!r}")
    k = _pair(kernel, "pool2d kernel")
    st = k if stride is None else _pair(stride, "pool2d stride")
    pad = _pair(padding, "pool2d padding")
    h_out, w_out = _window_out((x.shape[1], x.shape[2]), k, st, pad, "pool2d")
    return _node(
        POOL2D,
        (x.shape[0], h_out, w_out),
        x.dtype,
        (x,),
        name,
        kernel=k,
        stride=st,
        padding=pad,
        mode=mode,
    )

"""Numpy kernels, one per computing op: `kernel(out, srcs, params)` writes into `out`.

Every kernel keeps three rules:
- It writes only through `out` (out= everywhere) and allocates nothing of tensor size.
  Multi-step kernels walk row blocks of at most BLOCK elements through block-sized scratch.
- It is correct in place: when `out` is one of its same-layout srcs, each block of `out`
  is written only after that block of every src has been read.
- Its result depends on the operands' layouts (shape, strides, dtype) only, never on
  where they live, so a planned run and reference.py's unplanned run agree bit for bit.

Params follow ops.py's builders. Pure view ops (view, reshape, permute) have no kernel:
their result is their source's bytes. Writing view ops (copy_into, set_rows) do.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from tensorplan.backends import threads
from tensorplan.tensor import Tensor

Kernel = Callable[[np.ndarray, Sequence[np.ndarray], Mapping[str, Any]], None]
Index = tuple[int | slice, ...]

BLOCK = 1 << 15  # elements per block: 128 KiB of float32 scratch stays in L2
WIDEN_BLOCK = 1 << 18  # elements of a float16 weight widened to float32 at a time (1 MiB)
CONV_BLOCK = 1 << 18  # elements of conv2d's per-block im2col columns (1 MiB of float32)
# elements of attention scores in hand (16 MiB of float32): a whole head of Whisper's
# encoder (1500 x 1500, 9 MB, what its planned score tensor held before the op was fused).
# Blocks of 1 MiB made an encoder window 15-25% slower (the softmax's scratch per block)
ATTENTION_BLOCK = 1 << 22


# ---- blocks and scratch -------------------------------------------------------------------
def blocks(shape: tuple[int, ...], whole_rows: bool = False) -> Iterator[Index]:
    """Index tuples cutting `shape` into blocks of at most BLOCK elements, in order.

    With whole_rows, a block always spans the full last axis (for row reductions), even
    when one row alone exceeds BLOCK.
    """
    n = len(shape)
    inner, split = 1, n  # axes split.. are taken whole
    while split > 0 and inner * shape[split - 1] <= BLOCK:
        inner *= shape[split - 1]
        split -= 1
    if whole_rows and split == n and n > 0:
        inner, split = shape[-1], n - 1
    if split == 0:
        yield ()
        return
    cut = split - 1  # the axis stepped through; axes before it are walked one index at a time
    step = max(1, BLOCK // max(inner, 1))
    for outer in np.ndindex(*shape[:cut]):
        for i in range(0, shape[cut], step):
            yield (*outer, slice(i, i + step))


def _block_cap(shape: tuple[int, ...], whole_rows: bool) -> int:
    """The most elements one block of `blocks(shape, whole_rows)` holds."""
    size = math.prod(shape)
    if whole_rows and shape:
        return min(size, max(BLOCK, shape[-1]))
    return min(size, BLOCK)


class _Scratch:
    """One flat allocation per kernel call, handed out block by block as shaped views."""

    def __init__(self, n: int, dtype: np.dtype[Any] | type) -> None:
        self.flat = np.empty(n, dtype)

    def take(self, shape: tuple[int, ...]) -> np.ndarray:
        return self.flat[: math.prod(shape)].reshape(shape)


def _work_dtype(dtype: np.dtype[Any]) -> np.dtype[Any]:
    # float16 rows are normalised in float32 (as ggml does); wider types in themselves
    return np.promote_types(dtype, np.float32)


# ---- elementwise --------------------------------------------------------------------------
def elementwise(
    f: Callable[..., Any], arity: int
) -> Callable[[Any, Sequence[Any], Mapping[str, Any]], None]:
    """The kernel of an elementwise function that takes its inputs and out=: a numpy
    ufunc, or a PyTorch function (torch_kernels.py uses this too)."""

    def kernel(out: Any, srcs: Sequence[Any], params: Mapping[str, Any]) -> None:
        f(*srcs[:arity], out=out)

    kernel.__name__ = f.__name__
    return kernel


def scale(out: np.ndarray, srcs: Sequence[np.ndarray], params: Mapping[str, Any]) -> None:
    np.multiply(srcs[0], params["s"], out=out)


def relu(out: np.ndarray, srcs: Sequence[np.ndarray], params: Mapping[str, Any]) -> None:
    np.maximum(srcs[0], 0, out=out)


def gelu(out: np.ndarray, srcs: Sequence[np.ndarray], params: Mapping[str, Any]) -> None:
    """x * (1 + erf(x / sqrt(2))) / 2, exact GELU (not the tanh form), in float32 passes.

    erf through Abramowitz & Stegun 7.1.26, as PyTorch's vectorized CPU gelu (the one
    openai-whisper runs) evaluates it: erfc(a) = t * poly(t) * exp(-a^2), t = 1 / (1 + p a),
    |error| <= 1.5e-7. 1 + erf(u) is then (1 + sign u) - sign(u) * erfc(|u|), which keeps
    the small values of negative inputs accurate (no 1 - (1 - w) cancellation). Max error
    against float64 GELU: 4.2e-7 over [-8, 8] (PyTorch's: 9.7e-7); 18 passes over a block,
    6x faster than the float64 erf polynomials this replaced (tests pin both bounds)."""
    x = srcs[0]
    work = _work_dtype(out.dtype)
    if work != np.float32:  # float64: reference.py's golden mode needs its full precision
        _gelu_exact(out, srcs)
        return
    cap = _block_cap(out.shape, False)
    t_scr, r_scr, s_scr = (_Scratch(cap, work) for _ in range(3))
    with np.errstate(all="ignore"):  # inf - inf in the last steps of x = -inf gives nan
        for idx in blocks(out.shape):
            xb = x[idx]
            t, r, s = t_scr.take(xb.shape), r_scr.take(xb.shape), s_scr.take(xb.shape)
            np.abs(xb, out=t)
            t *= _AS_P / math.sqrt(2)
            t += 1
            np.divide(1, t, out=t)  # faster than np.reciprocal here
            np.multiply(t, _AS_COEF[0], out=r)
            for c in _AS_COEF[1:]:
                r += c
                r *= t
            np.multiply(xb, xb, out=t)
            t *= -0.5  # -u^2
            np.exp(t, out=t)
            r *= t  # erfc(|u|)
            np.sign(xb, out=s)
            r *= s
            s += 1
            s -= r  # 1 + erf(u)
            s *= 0.5  # before x: 2 * x overflows near float32's largest values
            np.multiply(s, xb, out=out[idx])


def _gelu_exact(out: np.ndarray, srcs: Sequence[np.ndarray]) -> None:
    """gelu through the float64 erf polynomials: float64 precision."""
    x = srcs[0]
    cap = _block_cap(out.shape, False)
    scratch = _Scratch(cap, _work_dtype(out.dtype))
    wide = [_Scratch(cap, np.float64) for _ in range(5)]
    with np.errstate(all="ignore"):  # erf's unused branch may overflow; inf and nan pass
        for idx in blocks(out.shape):
            xb = x[idx]
            s = scratch.take(xb.shape)
            np.multiply(xb, 1 / math.sqrt(2), out=s)
            erf(s, s, [w.take(s.shape) for w in wide])
            s += 1
            s *= xb
            np.multiply(s, 0.5, out=out[idx])


# erf(u) = u * P(2u^2 - 1) for |u| < 1 and sign(u) * (1 - exp(-u^2) * Q((|u| - 2.5) / 1.5))
# for 1 <= |u| <= 4 (Q ~ erfcx, the scaled complementary error function; erf is 1 in float32
# beyond 4): Chebyshev fits of math.erf at 400 nodes, in the power basis, highest first.
# Absolute error ~1e-15: float64 gelu (reference.py's float64 mode, the golden forward
# pass) uses these; float32 rounded from them is the correctly rounded erf (tests check it
# against scipy.special.erf bit for bit), but 5x slower than gelu's float32 passes.
_ERF_SMALL = (
    -3.094966254557458e-13, 9.224607213258915e-12, -2.0371020156686454e-10,
    4.115719285663235e-09, -7.511551131917184e-08, 1.2233827920114852e-06,
    -1.7537169520176798e-05, 0.00021751715602492532, -0.0022854855611293633,
    0.0198524966889857, -0.14053608902271797, 0.9654687386698676,
)  # fmt: skip
_ERFCX_LARGE = (
    2.472423037157623e-08, -7.43301244111683e-08, 1.0833258166255659e-07,
    -3.210988747605776e-07, 1.143256718826069e-06, -3.2222522198774923e-06,
    8.689962321596686e-06, -2.3559434938525902e-05, 6.258891378684257e-05,
    -0.00016203181187794674, 0.0004090822596734883, -0.001005826749054815,
    0.002403648085968128, -0.005570706772364841, 0.012489373848078602,
    -0.02700529663062456, 0.05611049344593109, -0.11152102018526125, 0.21080636406113887,
)  # fmt: skip


def _horner(coef: Sequence[float], t: np.ndarray, acc: np.ndarray) -> np.ndarray:
    acc.fill(coef[0])
    for c in coef[1:]:
        acc *= t
        acc += c
    return acc


def erf(u: np.ndarray, out: np.ndarray, wide: Sequence[np.ndarray]) -> None:
    """out = erf(u) for contiguous float32 or float64 u and out (may be the same array),
    through five float64 scratch arrays of u's size in `wide`; the |u| >= 1 branch runs on
    those elements only. Call it under np.errstate(all="ignore"): the small branch's polynomial is
    evaluated (and discarded) everywhere."""
    w, t, acc, a, q = (x.reshape(-1) for x in wide)
    np.copyto(w, u.reshape(-1))
    np.multiply(w, w, out=t)
    np.minimum(t, 1.0, out=t)  # beyond 1 the small branch is not used: no overflow
    t *= 2
    t -= 1
    _horner(_ERF_SMALL, t, acc)
    acc *= w
    np.abs(w, out=t)
    large = np.flatnonzero(t >= 1)
    if large.size:
        n = large.size
        a, q, big = a[:n], q[:n], t[:n]
        np.take(t, large, out=a)  # |u|; t is free from here on
        np.minimum(a, 4.0, out=a)
        np.subtract(a, 2.5, out=q)
        q *= 2 / 3
        _horner(_ERFCX_LARGE, q, big)
        np.multiply(a, a, out=a)
        np.negative(a, out=a)
        np.exp(a, out=a)
        big *= a  # erfc(|u|)
        np.subtract(1.0, big, out=big)
        np.take(w, large, out=q)
        np.copysign(big, q, out=big)
        np.put(acc, large, big)
    np.copyto(out.reshape(-1), acc, casting="same_kind")


_AS_P = 0.3275911  # Abramowitz & Stegun 7.1.26: p, then a5, a4, a3, a2, a1 (Horner order)
_AS_COEF = (1.061405429, -1.453152027, 1.421413741, -0.284496736, 0.254829592)


def silu(out: np.ndarray, srcs: Sequence[np.ndarray], params: Mapping[str, Any]) -> None:
    """x / (1 + exp(-x))."""
    x = srcs[0]
    scratch = _Scratch(_block_cap(out.shape, False), _work_dtype(out.dtype))
    for idx in blocks(out.shape):
        xb = x[idx]
        s = scratch.take(xb.shape)
        np.negative(xb, out=s)
        np.exp(s, out=s)
        s += 1
        np.divide(xb, s, out=out[idx])


# ---- row-wise (last axis) ------------------------------------------------------------------
def _row_scratch(shape: tuple[int, ...], dtype: np.dtype[Any]) -> tuple[_Scratch, _Scratch]:
    """Scratch for a whole block and for one value per row of it."""
    cap = _block_cap(shape, True)
    return _Scratch(cap, dtype), _Scratch(cap // max(shape[-1], 1) + 1, dtype)


def _rows(block: tuple[int, ...]) -> tuple[int, ...]:
    return (*block[:-1], 1)


def softmax(out: np.ndarray, srcs: Sequence[np.ndarray], params: Mapping[str, Any]) -> None:
    """softmax(a * scale + mask) over the last axis, shifted by the row max for stability."""
    a = srcs[0]
    mask = np.broadcast_to(srcs[1], a.shape) if len(srcs) > 1 else None
    scr, row_scr = _row_scratch(out.shape, _work_dtype(out.dtype))
    for idx in blocks(out.shape, whole_rows=True):
        s = scr.take(out[idx].shape)
        m = row_scr.take(_rows(s.shape))
        np.multiply(a[idx], params["scale"], out=s)
        if mask is not None:
            np.add(s, mask[idx], out=s)
        np.max(s, axis=-1, keepdims=True, out=m)
        np.subtract(s, m, out=s)
        np.exp(s, out=s)
        np.sum(s, axis=-1, keepdims=True, out=m)
        np.divide(s, m, out=out[idx])


def layer_norm(out: np.ndarray, srcs: Sequence[np.ndarray], params: Mapping[str, Any]) -> None:
    """(a - mean) / sqrt(var + eps) * weight + bias over the last axis (biased variance)."""
    a, rest = srcs[0], list(srcs[1:])
    weight = rest.pop(0) if params.get("has_weight") else None
    bias = rest.pop(0) if params.get("has_bias") else None
    work = _work_dtype(out.dtype)
    scr, row_scr = _row_scratch(out.shape, work)
    sq_scr = _Scratch(scr.flat.size, work)
    for idx in blocks(out.shape, whole_rows=True):
        s = scr.take(out[idx].shape)
        sq = sq_scr.take(s.shape)
        m = row_scr.take(_rows(s.shape))
        np.copyto(s, a[idx])
        np.mean(s, axis=-1, keepdims=True, out=m)
        s -= m
        np.multiply(s, s, out=sq)
        np.mean(sq, axis=-1, keepdims=True, out=m)
        m += params["eps"]
        np.sqrt(m, out=m)
        s /= m
        if weight is not None:
            s *= weight
        if bias is not None:
            s += bias
        np.copyto(out[idx], s, casting="same_kind")


def rms_norm(out: np.ndarray, srcs: Sequence[np.ndarray], params: Mapping[str, Any]) -> None:
    """a / sqrt(mean(a**2) + eps) * weight over the last axis."""
    weight = srcs[1] if len(srcs) > 1 else None
    work = _work_dtype(out.dtype)
    scr, row_scr = _row_scratch(out.shape, work)
    sq_scr = _Scratch(scr.flat.size, work)
    for idx in blocks(out.shape, whole_rows=True):
        s = scr.take(out[idx].shape)
        sq = sq_scr.take(s.shape)
        m = row_scr.take(_rows(s.shape))
        np.copyto(s, srcs[0][idx])
        np.multiply(s, s, out=sq)
        np.mean(sq, axis=-1, keepdims=True, out=m)
        m += params["eps"]
        np.sqrt(m, out=m)
        s /= m
        if weight is not None:
            s *= weight
        np.copyto(out[idx], s, casting="same_kind")


# ---- linear algebra ------------------------------------------------------------------------
def matmul(out: np.ndarray, srcs: Sequence[np.ndarray], params: Mapping[str, Any]) -> None:
    """a (..., M, K) @ b (..., K, N), or b (..., N, K) with transpose_b; batch axes broadcast.

    Cost of a b narrower than a (a float16 weight with float32 activations): numpy would
    widen all of b into a temporary as big as the float32 weight on every call. Instead b
    is widened WIDEN_BLOCK elements at a time and multiplied block by block into columns
    of `out`: 1 MiB of scratch, but still one float16 -> float32 conversion of all of b
    per call. That conversion dominates a one-row product (measured on this project's CPU:
    1 x 384 times a 51865 x 384 float16 weight, 42 ms against 8 ms with a float32 weight;
    numpy's own mixed matmul took 155 ms) and vanishes in a 1500-row one (38 vs 34 ms).
    Keep decode-time weights float32 when speed matters more than their memory.
    """
    a, b = srcs
    transpose_b = bool(params.get("transpose_b"))
    with threads.for_product(out.size * a.shape[-1]):
        if b.dtype == out.dtype:
            np.matmul(a, np.swapaxes(b, -1, -2) if transpose_b else b, out=out)
            return
        _widened_product(out, a, b, transpose_b, lambda cols, part, wide: np.copyto(wide, part))


def qmatmul(out: np.ndarray, srcs: Sequence[np.ndarray], params: Mapping[str, Any]) -> None:
    """a @ (q * scale[:, None]).T, the int8 weight dequantized WIDEN_BLOCK elements at a
    time into scratch (the reference: exact for the dequantized weight)."""
    a, q, scale = srcs
    with threads.for_product(out.size * a.shape[-1]):
        _widened_product(
            out, a, q, True, lambda cols, part, wide: np.multiply(part, scale[cols, None],
                                                                   out=wide)
        )


def attention(out: np.ndarray, srcs: Sequence[np.ndarray], params: Mapping[str, Any]) -> None:
    """softmax(q @ k^T * scale) @ v per batch index, as matmul, softmax and matmul would
    compute it (the reference ignores precision), a block of q's rows at a time: the
    scores in hand are at most ATTENTION_BLOCK elements (or one row), the kernel's one
    scratch allocation."""
    q, k, v = srcs
    m, n = q.shape[-2], k.shape[-2]
    step = max(1, ATTENTION_BLOCK // max(n, 1))
    scores = _Scratch(min(step, m) * n, _work_dtype(out.dtype))
    with threads.for_product(out.size * q.shape[-1] + q.size * n):
        for b in np.ndindex(*q.shape[:-2]):
            kt = np.swapaxes(k[b], -1, -2)
            for i in range(0, m, step):
                rows = slice(i, min(i + step, m))
                s = scores.take((rows.stop - i, n))
                np.matmul(q[b][rows], kt, out=s)
                softmax(s, (s,), params)
                np.matmul(s, v[b], out=out[b][rows])


Widen = Callable[[slice, np.ndarray, np.ndarray], Any]


def _widened_product(
    out: np.ndarray, a: np.ndarray, b: np.ndarray, transpose_b: bool, widen: Widen
) -> None:
    """a @ b (b transposed with transpose_b) into out, b made out's dtype WIDEN_BLOCK
    elements at a time: widen(cols, part, scratch) writes `part`, b's slice for out's
    columns `cols`, into the scratch block, which is multiplied into those columns."""
    n_axis = -2 if transpose_b else -1  # b's axis that becomes out's last axis
    n = b.shape[n_axis]
    per_col = math.prod(b.shape) // max(n, 1)
    step = max(1, WIDEN_BLOCK // max(per_col, 1))
    scratch = _Scratch(per_col * min(step, n), out.dtype)
    for j in range(0, n, step):
        cols = slice(j, min(j + step, n))
        part = b[..., cols, :] if transpose_b else b[..., cols]
        wide = scratch.take(part.shape)
        widen(cols, part, wide)
        np.matmul(a, np.swapaxes(wide, -1, -2) if transpose_b else wide, out=out[..., cols])


def _valid(n_out: int, n_in: int, k: int, stride: int, pad: int) -> tuple[int, int]:
    """[lo, hi): the outputs i whose input index i * stride + k - pad lies in [0, n_in)."""
    lo = min(n_out, max(0, -((k - pad) // stride)))
    hi = max(lo, min(n_out, (n_in - 1 - k + pad) // stride + 1))
    return lo, hi


def _taps(lo: int, hi: int, k: int, stride: int, pad: int) -> slice:
    """The slice of x's axis feeding outputs [lo, hi) at kernel tap k (see _valid)."""
    start = lo * stride + k - pad
    return slice(start, start + (hi - lo - 1) * stride + 1, stride)


def _view_as(arr: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """`arr` reshaped without copying (a copy would silently drop the writes)."""
    view = arr.reshape(shape)
    if view.size and not np.shares_memory(view, arr):
        raise ValueError(f"cannot view an array of strides {arr.strides} as {shape}")
    return view


def im2col(out: np.ndarray, srcs: Sequence[np.ndarray], params: Mapping[str, Any]) -> None:
    """x (C, L) -> out (L_out, C * K): out[l, c*K + k] = x[c, l*stride + k - padding],
    zero where that index falls in the padding."""
    x = srcs[0]
    kernel, stride, pad = params["kernel"], params["stride"], params["padding"]
    cols = _view_as(out, (out.shape[0], x.shape[0], kernel))
    for k in range(kernel):
        col = cols[:, :, k]  # (L_out, C)
        lo, hi = _valid(out.shape[0], x.shape[1], k, stride, pad)
        col[:lo] = 0
        col[hi:] = 0
        if hi > lo:
            np.copyto(col[lo:hi], x[:, _taps(lo, hi, k, stride, pad)].T)


def _fill_columns(cols: np.ndarray, x: np.ndarray, rows: tuple[int, int],
                  params: Mapping[str, Any]) -> None:  # fmt: skip
    """cols (n, W_out, C, KH, KW) = the input windows of output rows [rows[0], rows[1])."""
    (sh, sw), (ph, pw) = params["stride"], params["padding"]
    n, w_out, _, kh, kw = cols.shape
    i0, i1 = rows
    for p in range(kh):
        ilo, ihi = _valid(i1, x.shape[1], p, sh, ph)
        ilo, ihi = max(ilo, i0), max(ihi, i0)
        for q in range(kw):
            jlo, jhi = _valid(w_out, x.shape[2], q, sw, pw)
            tap = cols[:, :, :, p, q]  # (n, W_out, C)
            if ilo > i0 or ihi < i1 or jlo > 0 or jhi < w_out:
                tap[...] = 0  # some of these outputs read padding
            if ihi > ilo and jhi > jlo:
                window = x[:, _taps(ilo, ihi, p, sh, ph), _taps(jlo, jhi, q, sw, pw)]
                np.copyto(tap[ilo - i0 : ihi - i0, jlo:jhi], window.transpose(1, 2, 0))


def conv2d(out: np.ndarray, srcs: Sequence[np.ndarray], params: Mapping[str, Any]) -> None:
    """x (C_in, H, W) * weight (C_out, C_in/groups, KH, KW) -> out (C_out, H_out, W_out),
    zero padding, as ops.conv2d states: per group, blocks of output rows are unfolded
    into CONV_BLOCK-sized im2col columns and multiplied with the group's weights."""
    x, w = srcs
    groups = params["groups"]
    c_out, cpg, kh, kw = w.shape
    opg = c_out // groups
    _, h_out, w_out = out.shape
    per_row = w_out * cpg * kh * kw
    step = max(1, CONV_BLOCK // max(per_row, 1))
    scratch = _Scratch(min(step, h_out) * per_row, out.dtype)
    for g in range(groups):
        # a weight of another dtype (float16) is widened here: one weight-sized temporary
        wg = np.asarray(w[g * opg : (g + 1) * opg], out.dtype).reshape(opg, cpg * kh * kw)
        xg = x[g * cpg : (g + 1) * cpg]
        for i0 in range(0, h_out, step):
            i1 = min(i0 + step, h_out)
            cols = scratch.take((i1 - i0, w_out, cpg, kh, kw))
            _fill_columns(cols, xg, (i0, i1), params)
            dst = _view_as(out[g * opg : (g + 1) * opg, i0:i1], (opg, (i1 - i0) * w_out))
            with threads.for_product(dst.size * cpg * kh * kw):
                np.matmul(wg, cols.reshape((i1 - i0) * w_out, cpg * kh * kw).T, out=dst)


def pool2d(out: np.ndarray, srcs: Sequence[np.ndarray], params: Mapping[str, Any]) -> None:
    """Max (padding counts as -inf) or average (padding counts as 0, divisor KH * KW)
    over each (KH, KW) window of each channel, accumulated tap by tap into out."""
    x = srcs[0]
    (kh, kw), (sh, sw), (ph, pw) = params["kernel"], params["stride"], params["padding"]
    is_max = params["mode"] == "max"
    out[...] = -np.inf if is_max else 0
    for p in range(kh):
        ilo, ihi = _valid(out.shape[1], x.shape[1], p, sh, ph)
        for q in range(kw):
            jlo, jhi = _valid(out.shape[2], x.shape[2], q, sw, pw)
            if ihi > ilo and jhi > jlo:
                acc = out[:, ilo:ihi, jlo:jhi]
                window = x[:, _taps(ilo, ihi, p, sh, ph), _taps(jlo, jhi, q, sw, pw)]
                (np.maximum if is_max else np.add)(acc, window, out=acc)
    if not is_max:
        out /= kh * kw


# ---- data movement ------------------------------------------------------------------------
def concat(out: np.ndarray, srcs: Sequence[np.ndarray], params: Mapping[str, Any]) -> None:
    axis = params["axis"]
    pos = 0
    for s in srcs:
        n = s.shape[axis]
        np.copyto(out[(slice(None),) * axis + (slice(pos, pos + n),)], s)
        pos += n


def get_rows(out: np.ndarray, srcs: Sequence[np.ndarray], params: Mapping[str, Any]) -> None:
    table, ids = srcs
    if ids.size and (ids.min() < 0 or ids.max() >= table.shape[0]):
        raise IndexError(f"get_rows: ids {ids.min()}..{ids.max()} outside 0..{table.shape[0] - 1}")
    if table.flags.c_contiguous:
        # checked above, so mode="clip" changes nothing; mode="raise" would buffer out
        np.take(table, ids, axis=0, out=out, mode="clip")
        return
    # np.take copies a strided table whole first (25 ms for a transposed 51864 x 384
    # embedding, measured); fancy indexing gathers just the rows, a block at a time
    per_row = max(1, math.prod(table.shape[1:]))
    step = max(1, BLOCK // per_row)
    for i in range(0, ids.shape[0], step):
        np.copyto(out[i : i + step], table[ids[i : i + step]])


def set_rows(out: np.ndarray, srcs: Sequence[np.ndarray], params: Mapping[str, Any]) -> None:
    """out (dst's bytes)[ids[i]] = src[i]; rows not named keep their values."""
    _, ids, src = srcs
    if ids.size and (ids.min() < 0 or ids.max() >= out.shape[0]):
        raise IndexError(f"set_rows: ids {ids.min()}..{ids.max()} outside 0..{out.shape[0] - 1}")
    out[ids] = src


def copy(out: np.ndarray, srcs: Sequence[np.ndarray], params: Mapping[str, Any]) -> None:
    """cont, cast and copy_into: convert (unsafe casting, like astype) into out's layout."""
    np.copyto(out, srcs[0], casting="unsafe")


def mean(out: np.ndarray, srcs: Sequence[np.ndarray], params: Mapping[str, Any]) -> None:
    np.mean(srcs[0], axis=params["axis"], keepdims=True, out=out)


def argmax(out: np.ndarray, srcs: Sequence[np.ndarray], params: Mapping[str, Any]) -> None:
    np.argmax(srcs[0], axis=params["axis"], out=out)


def executes(node: Tensor) -> bool:
    """Whether a node runs a kernel: view ops only alias bytes, except the writing ones."""
    return node.op is not None and (not node.op.is_view or node.op.name in KERNELS)


KERNELS: dict[str, Kernel] = {
    "add": elementwise(np.add, 2),
    "sub": elementwise(np.subtract, 2),
    "mul": elementwise(np.multiply, 2),
    "div": elementwise(np.divide, 2),
    "scale": scale,
    "neg": elementwise(np.negative, 1),
    "exp": elementwise(np.exp, 1),
    "sqrt": elementwise(np.sqrt, 1),
    "tanh": elementwise(np.tanh, 1),
    "gelu": gelu,
    "silu": silu,
    "relu": relu,
    "softmax": softmax,
    "layer_norm": layer_norm,
    "rms_norm": rms_norm,
    "matmul": matmul,
    "qmatmul": qmatmul,
    "attention": attention,
    "im2col": im2col,
    "concat": concat,
    "get_rows": get_rows,
    "cont": copy,
    "cast": copy,
    "mean": mean,
    "argmax": argmax,
    "copy_into": copy,
    "set_rows": set_rows,
    "conv2d": conv2d,
    "pool2d": pool2d,
}

"""PyTorch kernels for every op, on any device: `kernel(out, srcs, params)` over torch views.

torch_kernels.py covers the float32 ops where PyTorch beats numpy on the CPU and leaves
the rest to numpy; a GPU has no numpy to fall back on, so this table covers every op and
dtype. Kernels write into `out` (out= or copy_); the ones PyTorch has no out= form for
compute into a temporary and copy it, and each says how big that temporary is (docs/
device.md lists them). No kernel reads a device value back to the host: a sync would
break CUDA graph capture, so index bounds are checked on the CPU only (a GPU's own
indexing kernels assert on a bad id).

Weights may be held narrower than their graph dtype (float16 matrices under float32
activations on a GPU): products cast the activations to the weight's dtype, multiply
there (tensor cores), and widen into `out`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from tensorplan.backends import torch_kernels as tk
from tensorplan.backends.kernels import elementwise

Kernel = Callable[[torch.Tensor, Sequence[torch.Tensor], Mapping[str, Any]], None]


def _check_ids(ids: torch.Tensor, n: int, op: str) -> None:
    """IndexError for ids outside [0, n) -- on the CPU only (no device sync)."""
    if ids.device.type == "cpu" and ids.numel():
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= n:
            raise IndexError(f"{op}: ids {lo}..{hi} outside 0..{n - 1}")


def _into(out: torch.Tensor, value: torch.Tensor) -> None:
    out.copy_(value)


def _work(t: torch.Tensor) -> torch.Tensor:
    """float16 rows normalised in float32, as the numpy kernels do."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


# ---- elementwise and rows -------------------------------------------------------------------
def gelu(out: torch.Tensor, srcs: Sequence[torch.Tensor], params: Mapping[str, Any]) -> None:
    if out.dtype == srcs[0].dtype:
        tk.gelu(out, srcs, params)
    else:
        _into(out, F.gelu(srcs[0]))


def softmax(out: torch.Tensor, srcs: Sequence[torch.Tensor], params: Mapping[str, Any]) -> None:
    """float32 as torch_kernels' (one pass into out); narrower rows through a float32
    temporary of out's size, as the numpy kernel widens them."""
    if out.dtype == torch.float32:
        tk.softmax(out, srcs, params)
        return
    z = _work(srcs[0]) * params["scale"]
    if len(srcs) > 1:
        z += srcs[1]
    _into(out, torch.softmax(z, -1))


def layer_norm(out: torch.Tensor, srcs: Sequence[torch.Tensor], params: Mapping[str, Any]) -> None:
    a, rest = srcs[0], list(srcs[1:])
    weight = rest.pop(0) if params.get("has_weight") else None
    bias = rest.pop(0) if params.get("has_bias") else None
    same = all(t is None or t.dtype == a.dtype for t in (weight, bias)) and out.dtype == a.dtype
    if a.dtype == torch.float32 and same:
        tk.layer_norm(out, srcs, params)  # fused, into out; _stats made once per step
        return
    y = F.layer_norm(_work(a), [a.shape[-1]], _work(weight) if weight is not None else None,
                     _work(bias) if bias is not None else None, params["eps"])
    _into(out, y)  # one float32 temporary of out's size


def rms_norm(out: torch.Tensor, srcs: Sequence[torch.Tensor], params: Mapping[str, Any]) -> None:
    a = _work(srcs[0])
    y = a * torch.rsqrt(a.square().mean(-1, keepdim=True) + params["eps"])  # two of a's size
    if len(srcs) > 1:
        y *= srcs[1]
    _into(out, y)


# ---- products -------------------------------------------------------------------------------
def matmul(out: torch.Tensor, srcs: Sequence[torch.Tensor], params: Mapping[str, Any]) -> None:
    a, b = srcs
    bt = b.mT if params.get("transpose_b") else b
    if a.dtype == b.dtype == out.dtype:
        torch.matmul(a, bt, out=out)
    elif params.get("_narrowed"):
        # a weight the backend stores narrower than the graph says (weights_dtype): the
        # product in the weight's dtype, widened into out (temporaries: a and out in it)
        _into(out, torch.matmul(a.to(b.dtype), bt))
    else:  # the graph's own float16 b: widened to a's dtype, as numpy's (b-sized temporary)
        torch.matmul(a, bt.to(a.dtype), out=out)


def qmatmul(out: torch.Tensor, srcs: Sequence[torch.Tensor], params: Mapping[str, Any]) -> None:
    """a @ (q * scale).T as (a @ wide.T) * scale, `wide` q widened to a's dtype once per
    weight (params["_wide"], made by the program): int8 saves no device memory here."""
    a, _, scale = srcs
    torch.matmul(a, params["_wide"].mT, out=out)
    out.mul_(scale)


def im2col(out: torch.Tensor, srcs: Sequence[torch.Tensor], params: Mapping[str, Any]) -> None:
    """x (C, L) -> out (L_out, C * K): the padded input (a temporary of x's size plus the
    padding) unfolded as a view and copied into out once."""
    x = srcs[0]
    k, stride, pad = params["kernel"], params["stride"], params["padding"]
    cols = F.pad(x, (pad, pad)).unfold(1, k, stride)  # (C, L_out, K), a view
    out.view(out.shape[0], x.shape[0], k).copy_(cols.permute(1, 0, 2))


def conv2d(out: torch.Tensor, srcs: Sequence[torch.Tensor], params: Mapping[str, Any]) -> None:
    x, w = srcs
    y = F.conv2d(x[None].to(w.dtype), w, stride=params["stride"], padding=params["padding"],
                 groups=params["groups"])
    _into(out, y[0])  # a temporary of out's size


def pool2d(out: torch.Tensor, srcs: Sequence[torch.Tensor], params: Mapping[str, Any]) -> None:
    x = srcs[0][None]
    k, st, pad = params["kernel"], params["stride"], params["padding"]
    if params["mode"] == "max":  # PyTorch pads with -inf, as ops.pool2d states
        y = F.max_pool2d(x, k, st, pad)
    else:
        y = F.avg_pool2d(x, k, st, pad, count_include_pad=True)
    _into(out, y[0])


# ---- data movement --------------------------------------------------------------------------
def get_rows(out: torch.Tensor, srcs: Sequence[torch.Tensor], params: Mapping[str, Any]) -> None:
    table, ids = srcs
    _check_ids(ids, table.shape[0], "get_rows")
    if table.dtype == out.dtype:
        torch.index_select(table, 0, ids, out=out)
    else:  # a narrower embedding: the rows gathered, then widened (a temporary of out's size)
        _into(out, torch.index_select(table, 0, ids))


def set_rows(out: torch.Tensor, srcs: Sequence[torch.Tensor], params: Mapping[str, Any]) -> None:
    _, ids, src = srcs
    _check_ids(ids, out.shape[0], "set_rows")
    out.index_copy_(0, ids.long(), src)  # int32 ids widened: a temporary of ids' size


def concat(out: torch.Tensor, srcs: Sequence[torch.Tensor], params: Mapping[str, Any]) -> None:
    pos, axis = 0, params["axis"]
    for s in srcs:  # narrow + copy_: cat's out= refuses strided outputs on some devices
        out.narrow(axis, pos, s.shape[axis]).copy_(s)
        pos += s.shape[axis]


def mean(out: torch.Tensor, srcs: Sequence[torch.Tensor], params: Mapping[str, Any]) -> None:
    if out.dtype == torch.float32:
        tk.mean(out, srcs, params)
    else:
        _into(out, _work(srcs[0]).mean(params["axis"], keepdim=True))


def argmax(out: torch.Tensor, srcs: Sequence[torch.Tensor], params: Mapping[str, Any]) -> None:
    _into(out, torch.argmax(srcs[0], params["axis"]))  # int64 indices, narrowed into out


DEVICE_KERNELS: dict[str, Kernel] = {
    **{k: v for k, v in tk.TORCH_KERNELS.items() if k not in ("qmatmul", "concat", "get_rows")},
    "exp": elementwise(torch.exp, 1),
    "gelu": gelu,
    "softmax": softmax,
    "layer_norm": layer_norm,
    "rms_norm": rms_norm,
    "matmul": matmul,
    "qmatmul": qmatmul,
    "im2col": im2col,
    "conv2d": conv2d,
    "pool2d": pool2d,
    "get_rows": get_rows,
    "set_rows": set_rows,
    "concat": concat,
    "mean": mean,
    "argmax": argmax,
}

"""PyTorch CPU kernels, one per op where PyTorch does better than numpy: `kernel(out, srcs,
params)` over torch tensors that alias the planned numpy views (torch.from_numpy).

Same contract as kernels.py: write only through `out` (every call passes out=), correct
when `out` is its same-layout first src, nothing tensor-sized allocated. What PyTorch
adds is fused, vectorised row kernels: softmax and layer_norm in one pass over a row
instead of numpy's five or six, and gelu's erf vectorised (measured on this project's
2-core CPU: softmax of 1500 x 1500 1.7 ms against numpy's 6.9, gelu of 1500 x 1536
1.4 ms against 34).

Only float32 (and, for data movement, any dtype); a node with another dtype, or an op
missing here, runs its numpy kernel (torch_cpu.py chooses).
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from tensorplan.backends.kernels import elementwise

TorchKernel = Callable[[torch.Tensor, Sequence[torch.Tensor], Mapping[str, Any]], None]


def scale(out: torch.Tensor, srcs: Sequence[torch.Tensor], params: Mapping[str, Any]) -> None:
    torch.mul(srcs[0], params["s"], out=out)


def relu(out: torch.Tensor, srcs: Sequence[torch.Tensor], params: Mapping[str, Any]) -> None:
    torch.clamp_min(srcs[0], 0, out=out)


def gelu(out: torch.Tensor, srcs: Sequence[torch.Tensor], params: Mapping[str, Any]) -> None:
    torch._C._nn.gelu(srcs[0], out=out)  # type: ignore[call-arg]  # stubs lack out=; erf gelu


def silu(out: torch.Tensor, srcs: Sequence[torch.Tensor], params: Mapping[str, Any]) -> None:
    torch._C._nn.silu(srcs[0], out=out)  # type: ignore[call-arg]  # the stubs lack out=


def softmax(out: torch.Tensor, srcs: Sequence[torch.Tensor], params: Mapping[str, Any]) -> None:
    """softmax(a * scale + mask) over the last axis: the scaled, masked scores are written
    into `out` in one pass (mask + scale * a), then normalised in place row by row."""
    a, s = srcs[0], params["scale"]
    if len(srcs) > 1:
        torch.add(srcs[1], a, alpha=s, out=out)
    elif s != 1:
        torch.mul(a, s, out=out)
    elif out.data_ptr() != a.data_ptr():
        out.copy_(a)
    torch._softmax(out, -1, False, out=out)


def layer_norm(out: torch.Tensor, srcs: Sequence[torch.Tensor], params: Mapping[str, Any]) -> None:
    a, rest = srcs[0], list(srcs[1:])
    weight = rest.pop(0) if params.get("has_weight") else None
    bias = rest.pop(0) if params.get("has_bias") else None
    mean, rstd = params["_stats"]  # (rows, 1) scratch made once per bound program
    torch.ops.aten.native_layer_norm.out(
        a, [a.shape[-1]], weight, bias, params["eps"], out0=out, out1=mean, out2=rstd
    )


def matmul(out: torch.Tensor, srcs: Sequence[torch.Tensor], params: Mapping[str, Any]) -> None:
    a, b = srcs
    torch.matmul(a, b.mT if params.get("transpose_b") else b, out=out)


def qmatmul(out: torch.Tensor, srcs: Sequence[torch.Tensor], params: Mapping[str, Any]) -> None:
    """FBGEMM's int8 product: the weight prepacked once per backend (params["_packed"]),
    `a` quantized per call, int32 accumulation.

    FBGEMM quantizes `a` with one scale for the whole tensor; rows of different magnitude
    then lose bits (Whisper's encoder: next-token KL up to 0.044). Each row is divided by
    its own peak first and the result multiplied back, which makes that scale a per-row
    one (as CTranslate2's int8): KL <= 0.005, for 2 passes over `a` and one over `out`.
    reduce_range quantizes to 7 bits: x86's u8 x s8 pair sums saturate at 16 bits, and
    with full 8 bits a weight row reaching +-127 came out 12% wrong (measured). FBGEMM
    has no out= form: its result is a new tensor, written into `out` by the last pass."""
    a, packed = srcs[0], params["_packed"]
    if a.numel() == a.shape[-1]:  # one row: one scale is its own
        out.copy_(torch.ops.quantized.linear_dynamic(a, packed, True))
        return
    peak = a.abs().amax(dim=-1, keepdim=True).clamp_min_(1e-30)
    torch.mul(torch.ops.quantized.linear_dynamic(a / peak, packed, True), peak, out=out)


def matmul_bf16(out: torch.Tensor, srcs: Sequence[torch.Tensor],
                params: Mapping[str, Any]) -> None:
    """matmul with both operands rounded to bfloat16 (a node whose precision allows it,
    on a CPU with AMX: see bf16_products); the products are summed in float32, the result
    rounded to bfloat16 (PyTorch's CPU product has no float32 result for bfloat16
    operands: relative error 2.8e-3 against 2.3e-3) and widened into `out`. The bfloat16
    copies of the operands and the result are the call's own, as qmatmul's are."""
    a, b = srcs
    b = b.mT if params.get("transpose_b") else b
    out.copy_(torch.matmul(a.bfloat16(), b.bfloat16()))


def attention(out: torch.Tensor, srcs: Sequence[torch.Tensor], params: Mapping[str, Any],
              dtype: torch.dtype | None = None) -> None:
    """PyTorch's fused attention (scaled_dot_product_attention), which reads K and V in
    blocks and never holds the scores: Whisper's encoder self-attention (6 heads x 1500
    x 1500, tiny.en) in 17-50 ms against 42-90 ms for matmul, softmax and matmul (float32,
    1-2 threads, this project's 2-core Sapphire Rapids). Its CPU kernel takes the fast
    path for 4-D operands only (3-D ones ran 3-5x slower), so the batch axes are folded
    into one. `dtype`: the operands rounded to it first (bfloat16: see attention_bf16)."""
    n = math.prod(srcs[0].shape[:-2])  # not -1: ambiguous where an axis is empty
    q, k, v = (t.reshape(1, n, *t.shape[-2:]) for t in srcs)
    if dtype is not None:
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    o = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=params["scale"])
    out.copy_(o.reshape(out.shape))


def attention_bf16(out: torch.Tensor, srcs: Sequence[torch.Tensor],
                   params: Mapping[str, Any]) -> None:
    """attention with q, k and v rounded to bfloat16 (a node whose precision allows it, on
    a CPU with AMX): the scores and the softmax are kept in float32 inside the kernel, the
    result rounded to bfloat16 (on random heads of outputs up to 0.33, 1.2e-3 at most from
    float32, where matmul_bf16's products around a float32 softmax were 3.3e-3 off), 8-24
    ms a tiny.en layer against 28-48 ms for those."""
    attention(out, srcs, params, torch.bfloat16)


def qmatmul_bf16(out: torch.Tensor, srcs: Sequence[torch.Tensor],
                 params: Mapping[str, Any]) -> None:
    """qmatmul as a bfloat16 product (as matmul_bf16): the int8 weight dequantized once
    into bfloat16 (params["_bf16"], exact int8 values times their scales rounded to 8
    bits of mantissa) and `a` rounded to bfloat16. Nearer the dequantized product than
    qmatmul's 7-bit activations (relative error 2.9e-3 against 1.5e-2 on the encoder's
    fc1), and faster where AMX multiplies bfloat16 tiles."""
    out.copy_(torch.matmul(srcs[0].bfloat16(), params["_bf16"].mT))


def bf16_products() -> bool:
    """Whether this CPU multiplies bfloat16 matrices in AMX tiles. Measured on this
    project's 2-core Sapphire Rapids: the encoder's fc1 (1500 x 384 by 384 x 1536) in
    1.6-1.9 ms as bfloat16 against 5.8-8.8 ms in float32 and 4-5 ms through FBGEMM's int8
    with per-row activation scales; without AMX, bfloat16 products are emulated or run on
    AVX512-BF16 at about float32's speed, so they buy nothing.

    TENSORPLAN_BF16=0 turns them off (int8 then gives the same text on every x86 CPU,
    as FBGEMM's integer products do), =1 forces them (tests of the path elsewhere)."""
    forced = os.environ.get(BF16_ENV, "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    return bool(torch.cpu._is_amx_tile_supported())


BF16_ENV = "TENSORPLAN_BF16"


def dequantize_bf16(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """An int8 (N, K) weight with per-row scales (N,) as a bfloat16 (N, K) matrix."""
    return (q.float() * scale[:, None]).bfloat16()


def pack_int8(q: torch.Tensor, scale: torch.Tensor) -> Any:
    """FBGEMM's packed form of an int8 (N, K) weight with per-row scales (N,)."""
    zero = torch.zeros(q.shape[0], dtype=torch.long)
    with warnings.catch_warnings():  # "quantized tensor creation is deprecated": FBGEMM's
        warnings.simplefilter("ignore")  # packing still takes one, and nothing else does
        qt = torch._make_per_channel_quantized_tensor(q, scale.double(), zero, 0)
    return torch.ops.quantized.linear_prepack(qt, None)


def concat(out: torch.Tensor, srcs: Sequence[torch.Tensor], params: Mapping[str, Any]) -> None:
    torch.cat(list(srcs), dim=params["axis"], out=out)


def get_rows(out: torch.Tensor, srcs: Sequence[torch.Tensor], params: Mapping[str, Any]) -> None:
    table, ids = srcs
    if ids.numel():
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= table.shape[0]:
            raise IndexError(f"get_rows: ids {lo}..{hi} outside 0..{table.shape[0] - 1}")
    torch.index_select(table, 0, ids, out=out)


def copy(out: torch.Tensor, srcs: Sequence[torch.Tensor], params: Mapping[str, Any]) -> None:
    out.copy_(srcs[0])


def mean(out: torch.Tensor, srcs: Sequence[torch.Tensor], params: Mapping[str, Any]) -> None:
    torch.mean(srcs[0], dim=params["axis"], keepdim=True, out=out)


TORCH_KERNELS: dict[str, TorchKernel] = {
    "add": elementwise(torch.add, 2),
    "sub": elementwise(torch.sub, 2),
    "mul": elementwise(torch.mul, 2),
    "div": elementwise(torch.div, 2),
    "scale": scale,
    "neg": elementwise(torch.neg, 1),
    "exp": elementwise(torch.exp, 1),
    "sqrt": elementwise(torch.sqrt, 1),
    "tanh": elementwise(torch.tanh, 1),
    "gelu": gelu,
    "silu": silu,
    "relu": relu,
    "softmax": softmax,
    "layer_norm": layer_norm,
    "matmul": matmul,
    "qmatmul": qmatmul,
    "attention": attention,
    "concat": concat,
    "get_rows": get_rows,
    "cont": copy,
    "cast": copy,
    "copy_into": copy,
    "mean": mean,
}

# Ops whose kernel reads or writes other dtypes than float32 correctly (data movement).
ANY_DTYPE = frozenset({"concat", "get_rows", "cont", "cast", "copy_into"})

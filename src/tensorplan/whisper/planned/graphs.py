"""Whisper's compute graphs, built from tensorplan ops (no data, no numpy).

Shapes in comments use: d = model width, H = heads, dh = d / H, F = 3000 mel frames,
A = 1500 audio positions, T = 448 text positions, B = batch (beams), N = new tokens,
R = logit rows, V = vocabulary. Weights are PARAM leafs in PyTorch's (out, in) layout.

Four graphs, as in whisper.cpp: conv (mel -> audio embedding), encoder (-> encoder
output), cross (-> per-layer cross-attention K/V, once per 30 s window) and decoder
(N new tokens of B sequences against a fixed-size self-attention KV cache, written and
read through run-time row ids so one planned graph serves every position).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tensorplan import dtype as dt
from tensorplan import ops
from tensorplan.tensor import Tensor
from tensorplan.whisper.model_files.ct2_weights import ModelDims as Dims

Params = Callable[[str], Tensor]  # name (CT2 variable name) -> PARAM leaf


def _columns(t: Tensor, start: int, width: int) -> Tensor:
    """Columns [start, start+width) of a 2-D tensor, as a strided view."""
    rows, _ = t.shape
    item = t.dtype.itemsize
    return ops.view(t, (rows, width), (t.strides[0], item), offset=start * item)


def _split_heads(t: Tensor, start: int, n_batch: int, n_tok: int, n_head: int, d: int) -> Tensor:
    """(B*N, >= start+d) rows -> (B, H, N, dh) view of columns [start, start+d)."""
    item = t.dtype.itemsize
    dh = d // n_head
    row = t.strides[0]
    return ops.view(
        t, (n_batch, n_head, n_tok, dh), (n_tok * row, dh * item, row, item), offset=start * item
    )


def _merge_heads(t: Tensor, name: str) -> Tensor:
    """(B, H, N, dh) -> (B*N, H*dh) contiguous."""
    b, h, n, dh = t.shape
    return ops.reshape(ops.cont(ops.permute(t, (0, 2, 1, 3)), name=name), (b * n, h * dh))


# The products that may run in bfloat16 under compute type int8: the encoder's and the
# cross K/V's (1,500 rows a window, where a backend with AMX multiplies bfloat16 tiles
# faster than int8: docs/usage.md). Never the decoder's: a step's few rows are faster on
# FBGEMM's int8 (the logits product, R x 384 by 384 x 51864, took 1.1 / 3.9 / 8.4 ms at
# R = 8 / 40 / 64 rows against bfloat16's 2.2 / 6.8 / 7.6), its weights would need
# bfloat16 copies (the logits' alone 40 MB for tiny.en), and a step's kernel must not
# depend on how many windows share its batch. float32 weights ignore the hint.
WINDOW_PRECISION = "bfloat16"


def _linear(
    x: Tensor, p: Params, prefix: str, name: str, rows: tuple[int, int] | None = None,
    precision: str = "float32",
) -> Tensor:
    """x @ W.T + b for the weights under `prefix`, or for output rows [start, start + n)
    of them (a fused weight); an int8 W (compute type int8) comes with its per-row
    scales as f"{prefix}/weight_scale", and its product takes `precision` as a hint."""
    w, b = p(f"{prefix}/weight"), p(f"{prefix}/bias")
    scale = p(f"{prefix}/weight_scale") if w.dtype == dt.int8 else None
    if rows is not None:
        w, b = _rows_of(w, *rows), _rows_of(b, *rows)
        scale = _rows_of(scale, *rows) if scale is not None else None
    if scale is not None:
        y = ops.qmatmul(x, w, scale, name=f"{name}.mm", precision=precision)
    else:
        y = ops.matmul(x, w, transpose_b=True, name=f"{name}.mm")
    return ops.add(y, b, name=name)


def _rows_of(t: Tensor, start: int, n: int) -> Tensor:
    """Rows [start, start + n) of a contiguous weight, matrix or vector, as a view."""
    row = t.dtype.itemsize * (t.shape[1] if t.ndim == 2 else 1)
    return ops.view(t, (n, *t.shape[1:]), offset=start * row)


def _embed(p: Params, name: str, ids: Tensor) -> Tensor:
    """Rows `ids` of embedding table `name` as float32 (an int8 table: times its scales)."""
    table = p(name)
    if table.dtype != dt.int8:
        return ops.get_rows(table, ids, name="tok_emb")
    scale = p(f"{name}_scale")
    rows = ops.cast(ops.get_rows(table, ids), dt.float32)
    scales = ops.get_rows(ops.reshape(scale, (scale.shape[0], 1)), ids)  # (n, 1)
    return ops.mul(rows, scales, name="tok_emb")


def _layer_norm(x: Tensor, p: Params, prefix: str) -> Tensor:
    return ops.layer_norm(x, p(f"{prefix}/gamma"), p(f"{prefix}/beta"), eps=1e-5, name=prefix)


def _mlp(x: Tensor, p: Params, prefix: str, precision: str = "float32") -> Tensor:
    h = _layer_norm(x, p, f"{prefix}/layer_norm")
    h = ops.gelu(_linear(h, p, f"{prefix}/linear_0", f"{prefix}/fc1", precision=precision))
    h = _linear(h, p, f"{prefix}/linear_1", f"{prefix}/fc2", precision=precision)
    return ops.add(x, h, name=f"{prefix}/residual")


# ---- conv -----------------------------------------------------------------------------------
def build_conv(p: Params, dims: Dims) -> tuple[Tensor, Tensor]:
    """mel (n_mels, F) INPUT -> audio embedding (A, d) with positions added."""
    mel = ops.input((dims.n_mels, 2 * dims.n_audio_ctx), dt.float32, name="mel")

    def conv_gelu(x: Tensor, i: int, stride: int) -> Tensor:  # x (C, L) -> (L_out, d)
        w = p(f"encoder/conv{i}/weight")  # (d, C, 3)
        cols = ops.im2col(x, kernel=3, stride=stride, padding=1, name=f"conv{i}.cols")
        w2d = ops.reshape(w, (w.shape[0], w.shape[1] * w.shape[2]))
        y = ops.matmul(cols, w2d, transpose_b=True, name=f"conv{i}.mm")  # channels last
        return ops.gelu(ops.add(y, p(f"encoder/conv{i}/bias"), name=f"conv{i}.bias"))

    x = conv_gelu(mel, 1, 1)  # (F, d)
    x = conv_gelu(ops.transpose(x), 2, 2)  # (A, d)
    pos = p("encoder/position_encodings/encodings")  # (1500, d)
    if pos.shape[0] != dims.n_audio_ctx:  # a narrowed window: its first positions
        pos = ops.view(pos, (dims.n_audio_ctx, pos.shape[1]))
    x = ops.add(x, pos, name="embd_conv")
    return mel, x


# ---- encoder --------------------------------------------------------------------------------
def _encoder_attention(h: Tensor, p: Params, prefix: str, n_head: int) -> Tensor:
    """Self-attention of every head in one fused node (ops.attention): its (H, A, A)
    scores are never planned (a session's arena holds none of them), and PyTorch's fused
    kernel computes it in a third to a half of the time of matmul, softmax and matmul.

    Under compute type int8 (int8 projections) the attention may run in bfloat16: the
    projections' int8 activations already round to 7-8 bits per row, coarser than
    bfloat16's 8-bit mantissa. In float32, matmul, softmax and matmul per head were a third
    of the int8 encoder's time (99 of 298 ms a window, tiny.en, 2 cores; docs/usage.md)."""
    n_ctx, d = h.shape
    dh = d // n_head
    # the projections' hint applies to int8 weights only (_linear); the attention has no
    # weight, so it asks the projection's dtype
    int8 = p(f"{prefix}/linear_0/weight").dtype == dt.int8
    precision = WINDOW_PRECISION if int8 else "float32"
    qkv = _linear(h, p, f"{prefix}/linear_0", f"{prefix}/qkv", precision=WINDOW_PRECISION)
    q, k, v = (_by_head(_columns(qkv, i * d, d), n_head) for i in range(3))  # (H, A, dh)
    heads = ops.attention(q, k, v, scale=dh**-0.5, name=f"{prefix}/attention",
                          precision=precision)
    o = ops.reshape(ops.cont(ops.permute(heads, (1, 0, 2)), name=f"{prefix}/heads"),
                    (n_ctx, d))  # (A, d), head i in columns [i*dh, (i+1)*dh)
    return _linear(o, p, f"{prefix}/linear_1", f"{prefix}/out", precision=WINDOW_PRECISION)


def build_encoder(p: Params, dims: Dims, x: Tensor) -> Tensor:
    """audio embedding (A, d) -> encoder output (A, d)."""
    for i in range(dims.n_audio_layer):
        prefix = f"encoder/layer_{i}"
        h = _layer_norm(x, p, f"{prefix}/self_attention/layer_norm")
        h = _encoder_attention(h, p, f"{prefix}/self_attention", dims.n_audio_head)
        x = ops.add(x, h, name=f"{prefix}/attn_residual")
        x = _mlp(x, p, f"{prefix}/ffn", WINDOW_PRECISION)
    return _layer_norm(x, p, "encoder/layer_norm")


# ---- cross K/V ------------------------------------------------------------------------------
def build_cross(
    p: Params, dims: Dims, enc: Tensor, kv_dtype: dt.DType = dt.float32
) -> list[tuple[Tensor, Tensor]]:
    """encoder output (A, d) -> per decoder layer (K, V), each (H, A, dh) in kv_dtype.

    Head-major: every decoder step reads each head's K and V whole, and a head's (A, dh)
    block read contiguously is about twice as fast as the same block strided across the
    rows of an (A, d) matrix (8 windows' cross-attention scores on 2 cores: 0.55 against
    1.18 ms); the reordering costs one copy per window."""
    d, n_head = dims.n_text_state, dims.n_text_head
    kv = []
    for i in range(dims.n_text_layer):
        prefix = f"decoder/layer_{i}/attention/linear_1"  # K and V fused: (2d, d), (2d,)
        pair = []
        for part, rows in (("k", (0, d)), ("v", (d, d))):
            name = f"cross_{part}{i}"
            heads = _by_head(_linear(enc, p, prefix, f"{name}.rows", rows=rows,
                                     precision=WINDOW_PRECISION), n_head)
            pair.append(ops.cont(heads, name=name) if kv_dtype == heads.dtype
                        else ops.cast(heads, kv_dtype, name))
        kv.append((pair[0], pair[1]))
    return kv


# ---- decoder --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class DecoderInputs:
    tokens: Tensor  # (B*N,) int32
    positions: Tensor  # (B*N,) int32, absolute positions
    kv_rows: Tensor  # (B*N,) int32, row b*T + position in the flattened KV cache
    mask: Tensor  # (B, 1, N, K) float32, 0 where a key may be read, -inf elsewhere; the
    # first K <= T rows of each sequence's cache are read (a short context reads less)
    logit_rows: Tensor  # (R,) int32, which of the B*N rows get logits


def decoder_inputs(n_batch: int, n_tok: int, n_rows: int, n_kv: int) -> DecoderInputs:
    """Inputs of a decoder graph that reads the first n_kv cache rows of each sequence."""
    n = n_batch * n_tok
    return DecoderInputs(
        ops.input((n,), dt.int32, "tokens"),
        ops.input((n,), dt.int32, "positions"),
        ops.input((n,), dt.int32, "kv_rows"),
        ops.input((n_batch, 1, n_tok, n_kv), dt.float32, "kq_mask"),
        ops.input((n_rows,), dt.int32, "logit_rows"),
    )


def _self_attention(
    h: Tensor,
    p: Params,
    prefix: str,
    kv_cache: tuple[Tensor, Tensor],
    inp: DecoderInputs,
    n_batch: int,
    n_tok: int,
    n_head: int,
    n_ctx: int,
) -> Tensor:
    d = h.shape[1]
    qkv = _linear(h, p, f"{prefix}/linear_0", f"{prefix}/qkv")  # (B*N, 3d)
    n_kv = inp.mask.shape[-1]  # rows read per sequence: the scores cost K, not T
    caches = []
    for j, cache in enumerate(kv_cache):  # cache (B_max*T, d) flattened rows
        rows = ops.view(cache, (n_batch * n_ctx, d))  # this batch's slots
        new = _columns(qkv, (j + 1) * d, d)
        if cache.dtype != new.dtype:
            new = ops.cast(new, cache.dtype)
        written = ops.set_rows(rows, inp.kv_rows, new)
        item, row = written.dtype.itemsize, written.strides[0]
        dh = d // n_head
        caches.append(ops.view(written, (n_batch, n_head, n_kv, dh),
                               (n_ctx * row, dh * item, row, item)))  # (B, H, K, dh)
    q = _split_heads(qkv, 0, n_batch, n_tok, n_head, d)  # (B, H, N, dh)
    scores = ops.matmul(q, caches[0], transpose_b=True, name=f"{prefix}/scores")  # (B,H,N,T)
    probs = ops.softmax(scores, inp.mask, scale=(d // n_head) ** -0.5)
    o = ops.matmul(probs, caches[1], name=f"{prefix}/attn")  # (B, H, N, dh)
    o = _merge_heads(o, f"{prefix}/merge")
    return _linear(o, p, f"{prefix}/linear_1", f"{prefix}/out")


def _cross_attention(
    h: Tensor,
    p: Params,
    prefix: str,
    kv: tuple[Tensor, Tensor],
    n_batch: int,
    n_tok: int,
    n_head: int,
    n_windows: int = 0,
) -> tuple[Tensor, Tensor]:
    """Returns (output (B*N, d), pre-softmax scores (H, B*N, A)).

    n_windows > 0: kv holds that many windows' K/V, (W, H, A, dh), and the B*N rows
    come grouped by window (rows of window w are the w-th equal run): each run attends to
    its own window (batched transcription: one chunk of audio per window).

    Every sequence reads the same K/V, so each head is one product of all B*N query rows
    with its K: (H, B*N, dh) x (H, dh, A) reads each head's K once per step, where
    (B, H, N, dh) x (1, H, dh, A) made B matrix-vector products that read it B times
    (beam search and best-of sampling: 5x the bytes)."""
    d = h.shape[1]
    if n_windows:
        return _windows_cross_attention(h, p, prefix, kv, n_windows, n_head)
    q = _by_head(_linear(h, p, f"{prefix}/linear_0", f"{prefix}/q"), n_head)  # (H, B*N, dh)
    k, v = kv  # (H, A, dh)
    scores = ops.matmul(q, k, transpose_b=True, name=f"{prefix}/scores")  # (H, B*N, A)
    probs = ops.softmax(scores, scale=(d // n_head) ** -0.5)
    o = ops.matmul(probs, v, name=f"{prefix}/attn")  # (H, B*N, dh)
    o = ops.reshape(ops.cont(ops.permute(o, (1, 0, 2)), name=f"{prefix}/merge"), (-1, d))
    return _linear(o, p, f"{prefix}/linear_2", f"{prefix}/out"), scores


def _windows_cross_attention(
    h: Tensor, p: Params, prefix: str, kv: tuple[Tensor, Tensor], n_windows: int, n_head: int
) -> tuple[Tensor, Tensor]:
    """Cross-attention of W windows at once: (W, H, R, dh) x (W, H, A, dh)^T, R rows per
    window; each window's K is still read once per step for all of its rows (beams)."""
    d = h.shape[1]
    q = _linear(h, p, f"{prefix}/linear_0", f"{prefix}/q")  # (W*R, d)
    n_rows = q.shape[0] // n_windows
    qh = _split_heads(q, 0, n_windows, n_rows, n_head, d)  # (W, H, R, dh)
    k, v = kv  # (W, H, A, dh)
    scores = ops.matmul(qh, k, transpose_b=True, name=f"{prefix}/scores")  # (W, H, R, A)
    probs = ops.softmax(scores, scale=(d // n_head) ** -0.5)
    o = ops.matmul(probs, v, name=f"{prefix}/attn")  # (W, H, R, dh)
    return _linear(_merge_heads(o, f"{prefix}/merge"), p, f"{prefix}/linear_2",
                   f"{prefix}/out"), scores


def _by_head(t: Tensor, n_head: int) -> Tensor:
    """(rows, d) -> (H, rows, dh): head i is columns [i*dh, (i+1)*dh), as a strided view."""
    rows, d = t.shape
    dh, item = d // n_head, t.dtype.itemsize
    return ops.view(t, (n_head, rows, dh), (dh * item, t.strides[0], item))


def build_decoder_trunk(
    p: Params,
    dims: Dims,
    inp: DecoderInputs,
    n_batch: int,
    n_tok: int,
    kv_self: list[tuple[Tensor, Tensor]],
    kv_cross: list[tuple[Tensor, Tensor]],
    n_windows: int = 0,
) -> tuple[Tensor, list[Tensor]]:
    """tokens of B sequences, N new each -> (hidden (B*N, d) before the final norm,
    per layer the cross-attention scores QK^T (H, B*N, A), unscaled and pre-softmax;
    (W, H, R, A) with n_windows, see _cross_attention)."""
    x = ops.add(
        _embed(p, "decoder/embeddings/weight", inp.tokens),
        ops.get_rows(p("decoder/position_encodings/encodings"), inp.positions, name="pos_emb"),
        name="embd",
    )  # (B*N, d)
    scores = []
    for i in range(dims.n_text_layer):
        prefix = f"decoder/layer_{i}"
        h = _layer_norm(x, p, f"{prefix}/self_attention/layer_norm")
        h = _self_attention(
            h, p, f"{prefix}/self_attention", kv_self[i], inp, n_batch, n_tok, dims.n_text_head,
            dims.n_text_ctx,
        )
        x = ops.add(x, h, name=f"{prefix}/self_residual")
        h = _layer_norm(x, p, f"{prefix}/attention/layer_norm")
        h, qk = _cross_attention(
            h, p, f"{prefix}/attention", kv_cross[i], n_batch, n_tok, dims.n_text_head, n_windows
        )
        scores.append(qk)
        x = ops.add(x, h, name=f"{prefix}/cross_residual")
        x = _mlp(x, p, f"{prefix}/ffn")
    return x, scores


def build_head(p: Params, x: Tensor, logit_rows: Tensor) -> Tensor:
    """hidden (B*N, d) -> logits (R, V) of the requested rows only (tied embeddings)."""
    x = ops.get_rows(x, logit_rows, name="logit_rows")  # (R, d)
    x = _layer_norm(x, p, "decoder/layer_norm")
    table = p("decoder/embeddings/weight")
    if table.dtype == dt.int8:
        scale = p("decoder/embeddings/weight_scale")
        return ops.qmatmul(x, table, scale, name="logits").set_output()  # (R, V)
    return ops.matmul(x, table, transpose_b=True, name="logits").set_output()  # (R, V)


def build_decoder(
    p: Params,
    dims: Dims,
    inp: DecoderInputs,
    n_batch: int,
    n_tok: int,
    kv_self: list[tuple[Tensor, Tensor]],
    kv_cross: list[tuple[Tensor, Tensor]],
    n_windows: int = 0,
) -> Tensor:
    """tokens of B sequences, N new each -> logits (R, V) for the requested rows."""
    x, _ = build_decoder_trunk(p, dims, inp, n_batch, n_tok, kv_self, kv_cross, n_windows)
    return build_head(p, x, inp.logit_rows)

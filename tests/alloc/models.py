"""Shape-only model graphs (no weights, no numpy) for ratio and planning-time checks."""

from __future__ import annotations

from tensorplan import dtype as dt
from tensorplan import ops
from tensorplan.graph import Graph
from tensorplan.ops import IM2COL
from tensorplan.tensor import Tensor


def _w(*shape: int, dtype: dt.DType = dt.float32) -> Tensor:
    return ops.param(shape, dtype)


def _linear(x: Tensor, n_in: int, n_out: int, bias: bool = True) -> Tensor:
    return ops.linear(x, _w(n_out, n_in), _w(n_out) if bias else None)


def attention(x: Tensor, n_head: int, mask: Tensor | None = None) -> Tensor:
    """Unfused multi-head self attention, whisper.cpp style: x (n, d) -> (n, d)."""
    n, d = x.shape
    dh = d // n_head

    def heads(t: Tensor) -> Tensor:  # (n, d) -> (h, n, dh), a view
        return ops.permute(ops.reshape(t, (n, n_head, dh)), (1, 0, 2))

    q = heads(ops.scale(_linear(x, d, d), dh**-0.25))
    k = heads(ops.scale(_linear(x, d, d, bias=False), dh**-0.25))
    v = heads(_linear(x, d, d))
    kq = ops.softmax(ops.matmul(q, k, transpose_b=True), mask)
    o = ops.cont(ops.permute(ops.matmul(kq, v), (1, 0, 2)))  # (n, h, dh)
    return _linear(ops.reshape(o, (n, d)), d, d)


def encoder_layer(x: Tensor, n_head: int) -> Tensor:
    d = x.shape[-1]
    h = ops.layer_norm(x, _w(d), _w(d))
    x = ops.add(x, attention(h, n_head))
    h = ops.layer_norm(x, _w(d), _w(d))
    h = _linear(ops.gelu(_linear(h, d, 4 * d)), 4 * d, d)
    return ops.add(x, h)


def conv_stem(mel: Tensor, d: int) -> Tensor:
    """Whisper's two conv1d + GELU, im2col in float16 as in whisper.cpp: (M, 2n) -> (n, d)."""

    def conv(x: Tensor, c_in: int, stride: int) -> Tensor:
        l_out = (x.shape[1] + 2 - 3) // stride + 1
        cols = Tensor(
            (l_out, c_in * 3),
            dt.float16,
            op=IM2COL,
            srcs=(x,),
            params={"kernel": 3, "stride": stride, "padding": 1},
        )
        mm = ops.matmul(
            ops.reshape(_w(d, c_in, 3), (d, c_in * 3)),
            ops.reshape(cols, cols.shape),
            transpose_b=True,
        )
        return ops.gelu(ops.add(ops.reshape(mm, mm.shape), _w(d, 1)))

    h = conv(conv(mel, mel.shape[0], 1), d, 2)
    return ops.transpose(h)


def whisper_encoder(
    n_layer: int = 4, d: int = 384, n_head: int = 6, n_ctx: int = 1500, n_mels: int = 80
) -> Graph:
    mel = ops.input((n_mels, 2 * n_ctx), name="mel")
    x = ops.add(ops.cont(conv_stem(mel, d)), _w(n_ctx, d))
    for _ in range(n_layer):
        x = encoder_layer(x, n_head)
    out = ops.layer_norm(x, _w(d), _w(d), name="out").set_output()
    return Graph.build(out)


def decoder(
    n_layer: int = 4, d: int = 384, n_head: int = 6, n_tokens: int = 32, n_vocab: int = 51864
) -> Graph:
    """Token embedding, causal self attention + MLP layers, logits."""
    ids = ops.input((n_tokens,), dt.int32, name="ids")
    mask = ops.input((n_tokens, n_tokens), name="mask")
    x = ops.add(ops.get_rows(_w(n_vocab, d), ids), _w(n_tokens, d))
    for _ in range(n_layer):
        h = ops.layer_norm(x, _w(d), _w(d))
        x = ops.add(x, attention(h, n_head, mask))
        h = ops.layer_norm(x, _w(d), _w(d))
        x = ops.add(x, _linear(ops.gelu(_linear(h, d, 4 * d)), 4 * d, d))
    logits = ops.matmul(ops.layer_norm(x, _w(d), _w(d)), _w(n_vocab, d), transpose_b=True)
    return Graph.build(logits.set_output())


def resnet(n_blocks: int = 16, c: int = 64, hw: int = 56) -> Graph:
    """A residual CNN as matmul-over-im2col blocks with projection shortcuts every 4th."""
    x = ops.input((c, hw * hw), name="image")
    for i in range(n_blocks):
        cols = ops.im2col(x, 3, 1, 1)  # (hw*hw, c*3)
        h = ops.relu(ops.matmul(_w(c, c * 3), cols, transpose_b=True))
        h = ops.matmul(_w(c, c * 3), ops.im2col(h, 3, 1, 1), transpose_b=True)
        short = (
            ops.matmul(_w(c, c), ops.transpose(ops.cont(ops.transpose(x))), transpose_b=False)
            if i % 4 == 0
            else x
        )
        x = ops.relu(ops.add(h, short))
    return Graph.build(ops.mean(x, axis=-1).set_output())

"""Shape-level graphs of standard models, for the planner benchmarks (fp32, batch 1, no weights).

Each builder returns a `Graph` built only with `tensorplan.ops`. Weights are PARAM leafs,
and they are also placed in a fake external buffer (`ExternalBuffer`, no bytes behind it),
so that either definition of "external" (docs/allocator.md rule 2) keeps them out of the plan.
State that outlives a graph (Whisper's KV caches) is external too and is read through
`ops.ref`. The model input is flagged INPUT and the final result OUTPUT.

CNN layout is (C, H, W); batchnorm is folded into mul + add by per-channel vectors (C, 1, 1);
ReLU6 is modelled as ReLU. Transformers follow the reference implementations (HF BERT post-LN,
GPT-2 pre-LN with a tied LM head, OpenAI Whisper), with unfused attention:
scores (H, T, S) -> softmax(scale, mask) -> @ V, heads merged by permute + cont.

`MODELS` maps a benchmark name to a zero-argument builder; `synthetic_chain` makes
transformer-like chains of any length for planning-time scaling.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from tensorplan import dtype as dt
from tensorplan import ops
from tensorplan.graph import Graph
from tensorplan.tensor import Flag, Tensor

F32 = dt.float32.itemsize


# ---- external storage ------------------------------------------------------------------------
@dataclass(eq=False)
class ExternalBuffer:
    """A stand-in for memory the planner does not own (weights, caches): a size, no bytes."""

    name: str
    size: int = 0

    def place(self, t: Tensor, alignment: int = 64) -> Tensor:
        offset = -(-self.size // alignment) * alignment
        self.size = offset + t.nbytes
        t.place(self, offset)
        return t


class Builder:
    """Creates a model's weights (PARAM, externally placed) and its external state tensors."""

    def __init__(self, name: str) -> None:
        self.weights = ExternalBuffer(f"{name}.weights")
        self.state = ExternalBuffer(f"{name}.state")

    def param(self, shape: tuple[int, ...], name: str) -> Tensor:
        return self.weights.place(ops.param(shape, name=name))

    def external(self, shape: tuple[int, ...], name: str) -> Tensor:
        return self.state.place(ops.new_tensor(shape, name=name))

    def linear(self, x: Tensor, n_out: int, name: str, bias: bool = True) -> Tensor:
        w = self.param((n_out, x.shape[-1]), f"{name}.weight")
        b = self.param((n_out,), f"{name}.bias") if bias else None
        return ops.linear(x, w, b, name=name)

    def layer_norm(self, x: Tensor, name: str) -> Tensor:
        n = x.shape[-1]
        return ops.layer_norm(x, self.param((n,), f"{name}.weight"),
                              self.param((n,), f"{name}.bias"), name=name)


def param_count(graph: Graph) -> int:
    """Elements of the PARAM leafs the graph reads (a tied weight counts once)."""
    return sum(t.size for t in graph.leafs if t.has(Flag.PARAM))


# ---- CNNs ---------------------------------------------------------------------------------------
def _conv_bn(b: Builder, x: Tensor, c_out: int, k: int, stride: int, name: str,
             groups: int = 1, relu: bool = True) -> Tensor:
    """conv (no bias) -> batchnorm folded to mul + add -> optional ReLU."""
    w = b.param((c_out, x.shape[0] // groups, k, k), f"{name}.weight")
    y = ops.conv2d(x, w, stride, k // 2, groups, name=f"{name}.conv")
    y = ops.mul(y, b.param((c_out, 1, 1), f"{name}.bn.scale"), name=f"{name}.bn.mul")
    y = ops.add(y, b.param((c_out, 1, 1), f"{name}.bn.shift"), name=f"{name}.bn.add")
    return ops.relu(y, name=f"{name}.relu") if relu else y


def _classifier(b: Builder, x: Tensor, n_classes: int) -> Tensor:
    """Global average pool (C, H, W) -> (1, C), then a linear layer -> (1, n_classes)."""
    c, h, w = x.shape
    pooled = ops.mean(ops.reshape(x, (c, h * w)), -1, name="avgpool")
    return b.linear(ops.reshape(pooled, (1, c)), n_classes, "fc")


# (expansion t, channels c, repeats n, first stride s), from the MobileNetV2 paper, table 2
_MOBILENET_V2 = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                 (6, 160, 3, 2), (6, 320, 1, 1))


def mobilenet_v2(resolution: int = 224, n_classes: int = 1000) -> Graph:
    """MobileNet v2 (torchvision layout, 3.5M params): 52 convs, 10 residual adds, softmax."""
    b = Builder("mobilenet_v2")
    x = ops.input((3, resolution, resolution), name="image")
    h = _conv_bn(b, x, 32, 3, 2, "features.0")
    i = 1
    for t, c, n, s in _MOBILENET_V2:
        for r in range(n):
            c_in, stride, name = h.shape[0], s if r == 0 else 1, f"features.{i}"
            y = _conv_bn(b, h, c_in * t, 1, 1, f"{name}.expand") if t != 1 else h
            y = _conv_bn(b, y, c_in * t, 3, stride, f"{name}.dw", groups=c_in * t)
            y = _conv_bn(b, y, c, 1, 1, f"{name}.project", relu=False)
            h = ops.add(h, y, name=f"{name}.residual") if stride == 1 and c_in == c else y
            i += 1
    h = _conv_bn(b, h, 1280, 1, 1, f"features.{i}")
    probs = ops.softmax(_classifier(b, h, n_classes), name="probs").set_output()
    return Graph.build(probs)


def _bottleneck(b: Builder, x: Tensor, width: int, stride: int, name: str) -> Tensor:
    """ResNet v1.5 bottleneck: 1x1 -> 3x3 (stride here) -> 1x1 (x4), projection when needed."""
    c_out = 4 * width
    y = _conv_bn(b, x, width, 1, 1, f"{name}.conv1")
    y = _conv_bn(b, y, width, 3, stride, f"{name}.conv2")
    y = _conv_bn(b, y, c_out, 1, 1, f"{name}.conv3", relu=False)
    if stride != 1 or x.shape[0] != c_out:
        x = _conv_bn(b, x, c_out, 1, stride, f"{name}.downsample", relu=False)
    return ops.relu(ops.add(y, x, name=f"{name}.residual"), name=f"{name}.relu")


def resnet50(resolution: int = 224, n_classes: int = 1000) -> Graph:
    """ResNet-50 v1.5 (torchvision layout, 25.6M params): 53 convs, 16 residual adds."""
    b = Builder("resnet50")
    x = ops.input((3, resolution, resolution), name="image")
    w = b.param((64, 3, 7, 7), "conv1.weight")
    h = ops.conv2d(x, w, 2, 3, name="conv1")
    h = ops.mul(h, b.param((64, 1, 1), "bn1.scale"), name="bn1.mul")
    h = ops.relu(ops.add(h, b.param((64, 1, 1), "bn1.shift"), name="bn1.add"), name="relu")
    h = ops.pool2d(h, 3, 2, 1, "max", name="maxpool")
    for li, (width, n, stride) in enumerate(((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2))):
        for r in range(n):
            h = _bottleneck(b, h, width, stride if r == 0 else 1, f"layer{li + 1}.{r}")
    return Graph.build(_classifier(b, h, n_classes).set_output())


# ---- attention blocks ---------------------------------------------------------------------------
def _heads(x: Tensor, n_head: int) -> Tensor:
    """(T, d) contiguous -> (H, T, d/H), a view."""
    t, d = x.shape
    return ops.permute(ops.reshape(x, (t, n_head, d // n_head)), (1, 0, 2))


def _attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, name: str) -> Tensor:
    """q (H, T, dh), k and v (H, S, dh) -> (T, H * dh) contiguous: softmax(q k^T / sqrt(dh)) v."""
    n_head, t, dh = q.shape
    scores = ops.matmul(q, k, transpose_b=True, name=f"{name}.scores")
    probs = ops.softmax(scores, mask, scale=1 / math.sqrt(dh), name=f"{name}.softmax")
    ctx = ops.matmul(probs, v, name=f"{name}.ctx")
    merged = ops.cont(ops.permute(ctx, (1, 0, 2)), name=f"{name}.merge")
    return ops.reshape(merged, (t, n_head * dh))


def _mlp(b: Builder, x: Tensor, n_ff: int, name: str) -> Tensor:
    h = ops.gelu(b.linear(x, n_ff, f"{name}.fc1"), name=f"{name}.gelu")
    return b.linear(h, x.shape[-1], f"{name}.fc2")


def _split_qkv(qkv: Tensor, n_head: int) -> tuple[Tensor, Tensor, Tensor]:
    """A fused (T, 3d) projection -> three (H, T, dh) strided views (GPT-2's c_attn)."""
    t, d3 = qkv.shape
    d = d3 // 3
    dh = d // n_head
    strides = (dh * F32, d3 * F32, F32)
    return tuple(ops.view(qkv, (n_head, t, dh), strides, i * d * F32) for i in range(3))  # type: ignore[return-value]


# ---- BERT and GPT-2 -----------------------------------------------------------------------------
def bert_base(seq: int = 128) -> Graph:
    """BERT-base uncased (110M params): 12 post-LN layers, d 768, 12 heads, with the pooler.
    Outputs: last hidden state (seq, 768) and pooled (1, 768)."""
    b, d, n_head = Builder("bert_base"), 768, 12
    ids = ops.input((seq,), dt.int32, name="input_ids")
    types = ops.input((seq,), dt.int32, name="token_type_ids")
    mask = ops.input((1, seq), name="attention_mask")  # additive: 0 or -inf per key
    pos = ops.view(b.param((512, d), "embeddings.position"), (seq, d))
    h = ops.add(ops.get_rows(b.param((30522, d), "embeddings.word"), ids), pos)
    h = ops.add(h, ops.get_rows(b.param((2, d), "embeddings.token_type"), types))
    h = b.layer_norm(h, "embeddings.ln")
    for i in range(12):
        name = f"layer.{i}"
        q, k, v = (_heads(b.linear(h, d, f"{name}.{p}"), n_head) for p in "qkv")
        a = b.linear(_attend(q, k, v, mask, f"{name}.attn"), d, f"{name}.attn.out")
        h = b.layer_norm(ops.add(h, a, name=f"{name}.res1"), f"{name}.ln1")
        h = b.layer_norm(ops.add(h, _mlp(b, h, 4 * d, f"{name}.mlp"), name=f"{name}.res2"),
                         f"{name}.ln2")
    pooled = ops.tanh(b.linear(ops.view(h, (1, d)), d, "pooler"), name="pooled")
    return Graph.build([h.set_output(), pooled.set_output()])


def gpt2_small(seq: int = 1024) -> Graph:
    """GPT-2 small (124M params): 12 pre-LN layers, d 768, 12 heads, causal mask, tied LM head.
    Output: logits (seq, 50257)."""
    b, d, n_head = Builder("gpt2"), 768, 12
    ids = ops.input((seq,), dt.int32, name="input_ids")
    mask = ops.input((seq, seq), name="causal_mask")
    wte = b.param((50257, d), "wte")
    h = ops.add(ops.get_rows(wte, ids), ops.view(b.param((1024, d), "wpe"), (seq, d)), name="emb")
    for i in range(12):
        name = f"h.{i}"
        qkv = b.linear(b.layer_norm(h, f"{name}.ln_1"), 3 * d, f"{name}.c_attn")
        a = b.linear(_attend(*_split_qkv(qkv, n_head), mask, f"{name}.attn"), d, f"{name}.c_proj")
        h = ops.add(h, a, name=f"{name}.res1")
        h = ops.add(h, _mlp(b, b.layer_norm(h, f"{name}.ln_2"), 4 * d, f"{name}.mlp"),
                    name=f"{name}.res2")
    logits = ops.matmul(b.layer_norm(h, "ln_f"), wte, transpose_b=True, name="logits")
    return Graph.build(logits.set_output())


# ---- Whisper ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class WhisperDims:
    n_state: int
    n_head: int
    n_layer: int
    n_mels: int = 80
    n_audio_ctx: int = 1500
    n_text_ctx: int = 448
    n_vocab: int = 51865


WHISPER = {"tiny": WhisperDims(384, 6, 4), "base": WhisperDims(512, 8, 6)}


def whisper_conv(size: str = "tiny") -> Graph:
    """The conv stem (whisper.cpp's conv graph): mel (80, 3000) -> (d, 1500)."""
    m, b = WHISPER[size], Builder(f"whisper_{size}_conv")
    d = m.n_state
    x = ops.input((m.n_mels, 2 * m.n_audio_ctx), name="mel")
    for i, (c_in, stride) in enumerate(((m.n_mels, 1), (d, 2))):
        name = f"conv{i + 1}"
        x = ops.conv1d(x, b.param((d, c_in, 3), f"{name}.weight"), stride, 1, name=name)
        x = ops.gelu(ops.add(x, b.param((d, 1), f"{name}.bias")), name=f"{name}.gelu")
    return Graph.build(x.set_output())


def _self_attention(b: Builder, x: Tensor, n_head: int, name: str) -> Tensor:
    q, k, v = (b.linear(x, x.shape[-1], f"{name}.{p}", bias=p != "k") for p in "qkv")
    ctx = _attend(_heads(q, n_head), _heads(k, n_head), _heads(v, n_head), None, name)
    return b.linear(ctx, x.shape[-1], f"{name}.out")


def whisper_encoder(size: str = "tiny") -> Graph:
    """Encoder after the conv stem: (d, 1500) conv output -> (1500, d), pre-LN blocks, ln_post."""
    m, b = WHISPER[size], Builder(f"whisper_{size}_encoder")
    d = m.n_state
    x = ops.input((d, m.n_audio_ctx), name="embd_conv")
    h = ops.add(ops.cont(ops.transpose(x)), b.param((m.n_audio_ctx, d), "positional_embedding"))
    for i in range(m.n_layer):
        name = f"blocks.{i}"
        h = ops.add(h, _self_attention(b, b.layer_norm(h, f"{name}.attn_ln"), m.n_head,
                                       f"{name}.attn"), name=f"{name}.res1")
        h = ops.add(h, _mlp(b, b.layer_norm(h, f"{name}.mlp_ln"), 4 * d, f"{name}.mlp"),
                    name=f"{name}.res2")
    return Graph.build(b.layer_norm(h, "ln_post").set_output())


def _cache_heads(cache: Tensor, layer: int, n_rows: int, n_head: int) -> Tensor:
    """Rows [0, n_rows) of one layer of an external (n_layer, n_ctx, d) cache as (H, n_rows, dh)."""
    _, n_ctx, d = cache.shape
    dh = d // n_head
    return ops.view(ops.ref(cache), (n_head, n_rows, dh), (dh * F32, d * F32, F32),
                    layer * n_ctx * d * F32)


def whisper_cross(size: str = "tiny") -> Graph:
    """Cross-attention K/V of every decoder layer from the encoder output, written into
    external caches (whisper.cpp's cross graph). The results are the cache writes."""
    m, b = WHISPER[size], Builder(f"whisper_{size}_cross")
    d, n_ctx = m.n_state, m.n_audio_ctx
    enc = ops.input((n_ctx, d), name="encoder_out")
    writes = []
    for kind in "kv":
        cache = b.external((m.n_layer, n_ctx, d), f"cross_{kind}")
        for i in range(m.n_layer):
            y = b.linear(enc, d, f"decoder.blocks.{i}.cross_attn.{kind}", bias=kind == "v")
            slot = ops.view(ops.ref(cache), (n_ctx, d), offset=i * n_ctx * d * F32)
            writes.append(ops.copy_into(y, slot, name=f"cross_{kind}.{i}"))
    return Graph.build(writes)


def whisper_decoder(size: str = "tiny", n_tokens: int = 448, n_past: int = 0) -> Graph:
    """Decoder on n_tokens new tokens after n_past cached ones. Self-attention K/V are written
    into external caches at rows [n_past, n_past + n_tokens) and read back for rows
    [0, n_past + n_tokens); cross-attention K/V are external. Output: logits (n_tokens, V).
    The cache writes are listed as extra graph outputs, layer by layer, so that each write
    is ordered before the attention that reads it (ggml_build_forward_expand's idiom)."""
    m, b = WHISPER[size], Builder(f"whisper_{size}_decoder")
    d, n_kv, n_head = m.n_state, n_past + n_tokens, m.n_head
    caches = {k: b.external((m.n_layer, m.n_text_ctx, d), k) for k in ("k", "v")}
    cross = {k: b.external((m.n_layer, m.n_audio_ctx, d), f"cross_{k}") for k in ("k", "v")}
    tokens = ops.input((n_tokens,), dt.int32, name="tokens")
    mask = ops.input((n_tokens, n_kv), name="causal_mask") if n_tokens > 1 else None
    emb = b.param((m.n_vocab, d), "token_embedding")
    pos = ops.view(b.param((m.n_text_ctx, d), "positional_embedding"), (n_tokens, d),
                   offset=n_past * d * F32)
    h = ops.add(ops.get_rows(emb, tokens), pos, name="emb")
    writes: list[Tensor] = []
    for i in range(m.n_layer):
        name = f"blocks.{i}"
        x = b.layer_norm(h, f"{name}.attn_ln")
        q = b.linear(x, d, f"{name}.attn.q")
        for kind in "kv":
            y = b.linear(x, d, f"{name}.attn.{kind}", bias=kind == "v")
            row = (i * m.n_text_ctx + n_past) * d * F32
            slot = ops.view(ops.ref(caches[kind]), (n_tokens, d), offset=row)
            writes.append(ops.copy_into(y, slot, name=f"{name}.{kind}_cache"))
        k, v = (_cache_heads(caches[c], i, n_kv, n_head) for c in "kv")
        a = _attend(_heads(q, n_head), k, v, mask, f"{name}.attn")
        h = ops.add(h, b.linear(a, d, f"{name}.attn.out"), name=f"{name}.res1")
        q = b.linear(b.layer_norm(h, f"{name}.cross_ln"), d, f"{name}.cross.q")
        k, v = (_cache_heads(cross[c], i, m.n_audio_ctx, n_head) for c in "kv")
        a = _attend(_heads(q, n_head), k, v, None, f"{name}.cross")
        h = ops.add(h, b.linear(a, d, f"{name}.cross.out"), name=f"{name}.res2")
        h = ops.add(h, _mlp(b, b.layer_norm(h, f"{name}.mlp_ln"), 4 * d, f"{name}.mlp"),
                    name=f"{name}.res3")
    logits = ops.matmul(b.layer_norm(h, "ln"), emb, transpose_b=True, name="logits")
    return Graph.build([*writes, logits.set_output()])


# ---- synthetic chains (planning-time scaling) -----------------------------------------------
def synthetic_chain(n_blocks: int, seed: int = 0, d: int = 256, seq: int = 128) -> Graph:
    """n_blocks pre-LN transformer-like blocks with random head counts, MLP widths and
    occasional extra branches: about 17 planned tensors per block, sizes varying."""
    rng, b = random.Random(seed), Builder("synthetic")
    h = ops.input((seq, d), name="x")
    carry: Tensor | None = None  # a side branch, read by the next block
    for i in range(n_blocks):
        name = f"b{i}"
        n_head = rng.choice((1, 2, 4, 8))
        qkv = b.linear(b.layer_norm(h, f"{name}.ln1"), 3 * d, f"{name}.qkv")
        a = _attend(*_split_qkv(qkv, n_head), None, f"{name}.attn")
        h = ops.add(h, b.linear(a, d, f"{name}.proj"), name=f"{name}.res1")
        y = _mlp(b, b.layer_norm(h, f"{name}.ln2"), d * rng.choice((1, 2, 3, 4, 6)), name)
        if carry is not None:
            y = ops.add(y, carry, name=f"{name}.join")
        carry = ops.tanh(h, name=f"{name}.side") if rng.random() < 0.25 else None
        h = ops.add(h, y, name=f"{name}.res2")
    return Graph.build(ops.layer_norm(h, name="out").set_output())



def random_dag(n_nodes: int, seed: int = 0, seq: int = 64,
               widths: tuple[int, ...] = (64, 128, 256, 512, 1024)) -> Graph:
    """n_nodes random ops, each reading tensors picked mostly among the last few dozen
    (an exponential look-back, so some reads reach far back): widening and narrowing
    matmuls, in-place-able adds of two same-width tensors, and unary ops. Only what the
    final output reaches is kept, about 0.9 planned tensors per node, sizes varying 16x."""
    rng, b = random.Random(seed), Builder("random_dag")
    weights: dict[tuple[int, int], Tensor] = {}
    pool = [ops.input((seq, widths[0]), name="x")]
    by_width: dict[int, list[Tensor]] = {widths[0]: [pool[0]]}

    def pick() -> Tensor:
        return pool[-1 - min(int(rng.expovariate(0.1)), len(pool) - 1)]

    for i in range(n_nodes):
        a, r, name = pick(), rng.random(), f"n{i}"
        if r < 0.3:
            key = (rng.choice(widths), a.shape[1])
            if key not in weights:
                weights[key] = b.param(key, f"w{key[0]}x{key[1]}")
            y = ops.linear(a, weights[key], name=name)
        elif r < 0.7 and len(by_width[a.shape[1]]) > 1:
            same = by_width[a.shape[1]]
            other = same[-1 - min(int(rng.expovariate(0.2)), len(same) - 1)]
            y = ops.add(a, other, name=name)
        else:
            y = (ops.tanh if rng.random() < 0.5 else ops.gelu)(a, name=name)
        pool.append(y)
        by_width.setdefault(y.shape[1], []).append(y)
    return Graph.build(ops.tanh(pool[-1], name="out").set_output())

MODELS: dict[str, Callable[[], Graph]] = {
    "mobilenet_v2": mobilenet_v2,
    "resnet50": resnet50,
    "bert_base_s128": partial(bert_base, 128),
    "bert_base_s512": partial(bert_base, 512),
    "gpt2_small_s1024": partial(gpt2_small, 1024),
}
for _size in WHISPER:
    MODELS |= {
        f"whisper_{_size}_conv": partial(whisper_conv, _size),
        f"whisper_{_size}_encoder": partial(whisper_encoder, _size),
        f"whisper_{_size}_cross": partial(whisper_cross, _size),
        f"whisper_{_size}_decoder_448": partial(whisper_decoder, _size, 448, 0),
        f"whisper_{_size}_decoder_step": partial(whisper_decoder, _size, 1, 447),
    }

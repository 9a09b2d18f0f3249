"""Whisper on the planned runtime: weights in, graphs planned once, windows and tokens run.

`WhisperModel.encode(mel)` runs the conv, encoder and cross graphs for one 30 s window;
`WhisperModel.inference(n_batch)` starts a decoding session whose `logits` feeds only the
tokens not yet in the self-attention KV cache. Every graph is planned once per shape and
reused: decoding a token re-plans nothing and allocates no tensor-sized arrays.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorplan import dtype as dt
from tensorplan import ops
from tensorplan.alloc import GraphAllocator
from tensorplan.backends.numpy_cpu import NumpyBackend
from tensorplan.graph import Graph
from tensorplan.pipeline import Pipeline
from tensorplan.tensor import Tensor
from tensorplan.whisper import graphs
from tensorplan.whisper.graphs import Dims

log = logging.getLogger("tensorplan.whisper")

# Decoder graphs that feed several tokens at once. Longer prompts go in chunks of the
# largest: the KV cache makes chunked feeding exact, and the worst-case graph (its
# (H, N, 1500) cross-attention scores above all) stays small.
PROMPT_BUCKETS = (4, 16, 64)


@dataclass
class DecoderGraph:
    n_batch: int
    n_tok: int
    n_rows: int
    inputs: graphs.DecoderInputs
    logits: Tensor


@dataclass
class AlignGraph:
    """A teacher-forced decoder pass that keeps the alignment heads' cross-attention."""

    n_tok: int
    inputs: graphs.DecoderInputs
    hidden: Tensor  # (N, d) before the final norm, OUTPUT
    heads: list[Tensor]  # per alignment head (N, A) pre-softmax QK^T * scale, OUTPUT
    graph: Graph
    head_rows: Tensor  # (HEAD_ROWS,) INPUT of the logits head graph
    logits: Tensor  # (HEAD_ROWS, V)
    head_graph: Graph


@dataclass(frozen=True, slots=True)
class Alignment:
    scores: np.ndarray  # (n_alignment_heads, N, A): QK^T * scale before the softmax
    logits: np.ndarray  # (len(rows), V) for the requested rows


HEAD_ROWS = 32  # logits rows per run of the alignment head graph

# "int8": every projection matrix and the token embedding (tied to the logits) as int8
# with one scale per row, as faster-whisper's int8; the convolutions stay float32. The
# decoder reads its matrices whole for every token, so a token reads a quarter of the
# bytes; the encoder's 1500-row products ran 1.4-1.6x faster on FBGEMM (measured).
COMPUTE_TYPES = ("float32", "int8")
EMBEDDING = "decoder/embeddings/weight"  # the token embedding, tied to the logits
_QUANTIZED = re.compile(
    r"decoder/embeddings/weight"
    r"|(en|de)coder/layer_\d+/(self_attention|attention|ffn)/linear_[012]/weight"
)


def _quantized(name: str) -> bool:
    return _QUANTIZED.fullmatch(name) is not None


_TINY = np.finfo(np.float32).tiny


def quantize_rows(w: np.ndarray, block: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """w (N, K) -> (q int8 (N, K), scale float32 (N,)) with w ~ q * scale[:, None],
    symmetric per row: scale = max |w_row| / 127 (1 for an all-zero row), at least the
    smallest normal float32, since a subnormal scale has too few bits to undo the
    division (a row peaking at 1e-43 came back 1.8x too large). Works `block` rows at a
    time, so a float16 table is never widened whole (the 51864-row embedding would take
    80 MB of float32 at load)."""
    q = np.empty(w.shape, np.int8)
    scale = np.empty(w.shape[0], np.float32)
    for i in range(0, w.shape[0], block):
        rows = np.array(w[i : i + block], np.float32)  # a copy: w is not ours to scale
        peak = np.abs(rows).max(axis=1)
        s = np.where(peak > 0, np.maximum(peak / 127, _TINY), 1).astype(np.float32)
        rows /= s[:, None]
        np.rint(rows, out=rows)
        np.clip(rows, -127, 127, out=rows)
        q[i : i + block] = rows
        scale[i : i + block] = s
    return q, scale


class WhisperModel:
    """One model, one backend, one plan per graph shape."""

    def __init__(
        self,
        weights: Any,
        tokenizer: Any,
        config: Any,
        *,
        plan: str = "joint",
        strategy: str = "offline",
        max_batch: int = 5,
        kv_dtype: str = "float32",
        weights_dtype: str = "float32",
        compute_type: str = "float32",
        backend: NumpyBackend | None = None,
    ) -> None:
        self.weights, self.tokenizer, self.config = weights, tokenizer, config
        self.dims: Dims = weights.dims
        self.is_multilingual = bool(getattr(tokenizer, "is_multilingual", False))
        self.backend = backend or NumpyBackend()
        self.plan_mode, self.strategy = plan, strategy
        self.max_batch = max_batch
        if kv_dtype not in ("float32", "float16") or weights_dtype not in ("float32", "float16"):
            raise ValueError("kv_dtype and weights_dtype must be float32 or float16")
        self.kv_dtype, self.weights_dtype = kv_dtype, weights_dtype
        if compute_type not in COMPUTE_TYPES:
            raise ValueError(f"compute_type must be one of {', '.join(COMPUTE_TYPES)}")
        self.compute_type = compute_type
        self._params: dict[str, Tensor] = {}
        self.kv_self = self._make_kv_self(max_batch)
        self._build()

    # ---- weights and persistent tensors ------------------------------------------------
    def param(self, name: str) -> Tensor:
        """A weight as a PARAM leaf: float32, or as stored (float16) for the encoder's
        weights when `weights="float16"` (its 1500-row products hide the widening), or
        int8 with per-row scales (f"{name}_scale") for every projection matrix and the
        token embedding when compute_type="int8"."""
        t = self._params.get(name)
        if t is None and self.compute_type == "int8":
            base = name.removesuffix("_scale")
            if _quantized(base):
                q, scale = quantize_rows(self.weights.get(base))
                self.weights.model.release(base)
                self._params[base] = self.backend.param(q, base)
                self._params[f"{base}_scale"] = self.backend.param(scale, f"{base}_scale")
                return self._params[name]
        if t is None and name == EMBEDDING:
            # Held transposed, (d, V) contiguous, and handed out as its (V, d) view: the
            # logits product x @ E^T then reads a plain row-major matrix, which OpenBLAS
            # runs without repacking the 80 MB table (tiny.en: 1 row 3.2 -> 2.2 ms, 5
            # rows 11.7 -> 6.9 ms, measured); token lookups gather one strided column.
            arr = np.ascontiguousarray(np.asarray(self.weights.get(name)).T, np.float32)
            self.weights.model.release(name)
            root = self.backend.param(arr, f"{name}^T")
            t = self._params[name] = ops.transpose(root, name)
            return t
        if t is None:
            arr = self.weights.get(name)
            keep = (
                self.weights_dtype == "float16"
                and name.startswith("encoder/")
                and name.endswith("/weight")
                and arr.ndim >= 2
            )  # matrices only
            arr = np.array(arr, dtype=arr.dtype if keep else np.float32, order="C")
            self.weights.model.release(name)
            t = self._params[name] = self.backend.param(arr, name)
        return t

    def _make_kv_self(self, n_batch: int) -> list[tuple[Tensor, Tensor]]:
        rows, d = n_batch * self.dims.n_text_ctx, self.dims.n_text_state
        kv = dt.dtype(self.kv_dtype)
        return [
            (
                self.backend.persistent((rows, d), kv, f"kv_self.k{i}"),
                self.backend.persistent((rows, d), kv, f"kv_self.v{i}"),
            )
            for i in range(self.dims.n_text_layer)
        ]

    # ---- graphs -------------------------------------------------------------------------
    def _build(self) -> None:
        p, dims = self.param, self.dims
        self.pipeline = Pipeline(self.backend.buffer_type, self.plan_mode, self.strategy)
        persist = self.backend.persistent

        self.mel, embd = graphs.build_conv(p, dims)
        embd_read, copy = self.pipeline.handoff(embd, persist)
        self.pipeline.add("conv", [copy or embd])

        enc = graphs.build_encoder(p, dims, ops.ref(embd_read, "embd_conv"))
        enc_read, copy = self.pipeline.handoff(enc, persist)
        self.pipeline.add("encoder", [copy or enc])

        kv = graphs.build_cross(p, dims, ops.ref(enc_read, "embd_enc"), dt.dtype(self.kv_dtype))
        self.kv_cross: list[tuple[Tensor, Tensor]] = []
        outs = []
        for k, v in kv:
            k_read, k_copy = self.pipeline.handoff(k, persist, read_repeatedly=True)
            v_read, v_copy = self.pipeline.handoff(v, persist, read_repeatedly=True)
            self.kv_cross.append((k_read, v_read))
            outs += [k_copy or k, v_copy or v]
        self.pipeline.add("cross", outs)

        self.decoders: dict[tuple[int, int, int], DecoderGraph] = {}
        for n_batch in sorted({1, self.max_batch}):
            self._add_decoder(n_batch, 1, 1)
            self._add_decoder(n_batch, 1, 2 if n_batch == 1 else n_batch)
        for n_tok in PROMPT_BUCKETS:
            self._add_decoder(1, n_tok, 2)
        self.pipeline.allocate()
        log.debug("planned compute bytes: %s", self.pipeline.compute_bytes())

    def _add_decoder(self, n_batch: int, n_tok: int, n_rows: int) -> None:
        key = (n_batch, n_tok, n_rows)
        if key in self.decoders:
            return
        inp = graphs.decoder_inputs(n_batch, n_tok, n_rows, self.dims.n_text_ctx)
        cross = [(ops.ref(k), ops.ref(v)) for k, v in self.kv_cross]
        logits = graphs.build_decoder(
            self.param, self.dims, inp, n_batch, n_tok, self.kv_self, cross
        )
        self.decoders[key] = DecoderGraph(n_batch, n_tok, n_rows, inp, logits)
        self.pipeline.add(f"decoder[b{n_batch},n{n_tok},r{n_rows}]", [logits], group="decoder")

    def decoder(self, n_batch: int, n_tok: int, n_rows: int) -> DecoderGraph:
        """The smallest planned decoder graph that fits (n_batch, n_tok, n_rows)."""
        fits = [
            g
            for (b, n, r), g in self.decoders.items()
            if b >= n_batch and n >= n_tok and r >= n_rows
        ]
        if not fits:
            raise ValueError(
                f"no decoder graph for batch {n_batch}, {n_tok} tokens, "
                f"{n_rows} rows (max batch {self.max_batch})"
            )
        return min(fits, key=lambda g: (g.n_batch, g.n_tok, g.n_rows))

    # ---- running ------------------------------------------------------------------------
    def encode(self, mel: np.ndarray) -> None:
        """mel (n_mels, 3000) float32: run conv, encoder and cross for this window."""
        self.backend.set(self.mel, mel)
        for name in ("conv", "encoder", "cross"):
            self.backend.compute(self.pipeline.stages[name].graph)

    def encoder_output(self) -> np.ndarray:
        stage = self.pipeline.stages["encoder"].graph
        return self.backend.get(stage.outputs[0])

    def run_decoder(
        self,
        g: DecoderGraph,
        tokens: np.ndarray,
        positions: np.ndarray,
        batch_rows: np.ndarray,
        rows: np.ndarray,
    ) -> np.ndarray:
        """Feed tokens (B, N) at positions (B, N); batch_rows (B,) selects KV slots (the
        mask follows the positions); rows: flat row ids for logits."""
        self._feed_inputs(g.inputs, g.n_tok, g.n_batch, tokens, positions, batch_rows)
        be = self.backend
        inp = g.inputs
        flat = np.asarray(rows, dtype=np.int32)
        be.set(
            inp.logit_rows,
            np.concatenate([flat, np.repeat(flat[-1:], g.n_rows - len(flat))]).astype(np.int32),
        )
        be.compute(self.pipeline.stages[_stage_name(g)].graph)
        return be.get(g.logits)[: len(flat)]

    def align(self, tokens: Sequence[int], rows: Sequence[int]) -> Alignment:
        """Teacher-force `tokens` through the decoder over the encoded window; return the
        alignment heads' cross-attention scores and the logits of `rows` (positions).
        Overwrites batch slot 0 of the KV cache: call between decoding sessions."""
        n = len(tokens)
        if not 0 < n <= self.dims.n_text_ctx:
            raise ValueError(f"cannot align {n} tokens (1 to {self.dims.n_text_ctx})")
        chunk = PROMPT_BUCKETS[-1]
        scale = (self.dims.n_text_state // self.dims.n_text_head) ** -0.5
        scores, logits = [], []
        want = sorted(set(rows))
        for start in range(0, n, chunk):  # the KV cache makes chunked passes exact
            part = list(tokens[start : start + chunk])
            bucket = next(b for b in PROMPT_BUCKETS if b >= len(part))
            g = self._align_graph(bucket)
            pos = np.arange(start, start + len(part))[None, :]
            self.run_decoder_graph(
                g.inputs, g.n_tok, 1, g.graph, np.asarray(part)[None, :], pos, [0]
            )
            scores.append(np.stack([self.backend.get(h)[: len(part)] for h in g.heads]))
            local = [r - start for r in want if start <= r < start + len(part)]
            for s in range(0, len(local), HEAD_ROWS):
                ids = local[s : s + HEAD_ROWS]
                self.backend.set(
                    g.head_rows, np.array(ids + [ids[-1]] * (HEAD_ROWS - len(ids)), dtype=np.int32)
                )
                self.backend.compute(g.head_graph)
                logits.append(self.backend.get(g.logits)[: len(ids)])
        by_row = dict(zip(want, np.concatenate(logits) if logits else [], strict=True))
        out = (
            np.stack([by_row[r] for r in rows])
            if len(rows)
            else np.zeros((0, self.dims.n_vocab), np.float32)
        )
        return Alignment(np.concatenate(scores, axis=1) * np.float32(scale), out)

    def _align_graph(self, n_tok: int) -> AlignGraph:
        cache = self.__dict__.setdefault("_align_graphs", {})
        if n_tok in cache:
            return cache[n_tok]
        inp = graphs.decoder_inputs(1, n_tok, 1, self.dims.n_text_ctx)
        cross = [(ops.ref(k), ops.ref(v)) for k, v in self.kv_cross]
        hidden, scores = graphs.build_decoder_trunk(
            self.param, self.dims, inp, 1, n_tok, self.kv_self, cross
        )
        hidden.set_output()
        heads = []
        n_audio = self.dims.n_audio_ctx
        for layer, head in self.config.alignment_heads:
            qk = scores[layer]  # (H, N, A): one sequence
            view = ops.view(qk, (n_tok, n_audio), offset=head * n_tok * n_audio * 4)
            heads.append(ops.cont(view, name=f"align.l{layer}h{head}").set_output())
        graph = Graph.build([hidden, *heads])
        GraphAllocator([self.backend.buffer_type], strategy=self.strategy).alloc_graph(graph)
        rows = ops.input((HEAD_ROWS,), dt.int32, "head_rows")
        logits = graphs.build_head(self.param, ops.ref(hidden, "hidden"), rows)
        head_graph = Graph.build(logits)
        GraphAllocator([self.backend.buffer_type], strategy=self.strategy).alloc_graph(head_graph)
        cache[n_tok] = AlignGraph(n_tok, inp, hidden, heads, graph, rows, logits, head_graph)
        return cache[n_tok]

    def run_decoder_graph(
        self,
        inp: graphs.DecoderInputs,
        gn: int,
        gb: int,
        graph: Graph,
        tokens: np.ndarray,
        positions: np.ndarray,
        batch_rows: Sequence[int],
    ) -> None:
        """Run a decoder trunk graph over tokens (B, n) padded to its (gb, gn)."""
        self._feed_inputs(inp, gn, gb, tokens, positions, np.asarray(batch_rows))
        self.backend.compute(graph)

    def _feed_inputs(
        self,
        inp: graphs.DecoderInputs,
        gn: int,
        gb: int,
        tokens: np.ndarray,
        positions: np.ndarray,
        batch_rows: np.ndarray,
    ) -> None:
        """Set a decoder graph's inputs for tokens (B, n) at positions (B, n), padded to the
        graph's (gb, gn): padding repeats the last token at its own position (same K/V
        bytes), spare batch rows compute into KV slots nobody reads."""
        b, n = tokens.shape
        tok = np.concatenate([tokens, np.repeat(tokens[:, -1:], gn - n, axis=1)], axis=1)
        pos = np.concatenate([positions, np.repeat(positions[:, -1:], gn - n, axis=1)], axis=1)
        if b < gb:
            tok = np.concatenate([tok, np.repeat(tok[:1], gb - b, axis=0)])
            pos = np.concatenate([pos, np.repeat(pos[:1], gb - b, axis=0)])
            batch_rows = np.concatenate([batch_rows, np.arange(b, gb)])
        t_ctx = self.dims.n_text_ctx
        kv_rows = batch_rows[:, None] * t_ctx + pos
        mask = np.where(np.arange(t_ctx)[None, None, :] <= pos[:, :, None], 0.0, -np.inf)
        self._set_inputs(inp, tok, pos, kv_rows, mask[:, None].astype(np.float32))

    def _set_inputs(
        self,
        inp: graphs.DecoderInputs,
        tok: np.ndarray,
        pos: np.ndarray,
        kv_rows: np.ndarray,
        mask: np.ndarray,
    ) -> None:
        be = self.backend
        be.set(inp.tokens, tok.reshape(-1).astype(np.int32))
        be.set(inp.positions, pos.reshape(-1).astype(np.int32))
        be.set(inp.kv_rows, kv_rows.reshape(-1).astype(np.int32))
        be.set(inp.mask, mask)

    def inference(self, n_batch: int) -> Inference:
        return Inference(self, n_batch)

    def reorder_kv(self, source_rows: Sequence[int], n_ctx: int) -> None:
        """Batch slot i takes slot source_rows[i]'s first n_ctx cache rows."""
        t_ctx = self.dims.n_text_ctx
        src = np.asarray(source_rows)
        for k, v in self.kv_self:
            for cache in (k, v):
                a = self.backend.array(cache).reshape(self.max_batch, t_ctx, -1)
                a[: len(src), :n_ctx] = a[src, :n_ctx]


def _stage_name(g: DecoderGraph) -> str:
    return f"decoder[b{g.n_batch},n{g.n_tok},r{g.n_rows}]"


class Inference:
    """A decoding session: B sequences sharing the current window's cross K/V."""

    def __init__(self, model: WhisperModel, n_batch: int) -> None:
        if n_batch > model.max_batch:
            raise ValueError(f"batch {n_batch} exceeds the planned maximum {model.max_batch}")
        self.model, self.n_batch = model, n_batch
        self.n_cached = 0

    def logits(self, tokens: np.ndarray, positions: Sequence[int] | None = None) -> np.ndarray:
        """tokens (B, n_ctx): whole sequences so far -> logits (B, len(positions), V)."""
        tokens = np.asarray(tokens)
        b, n_ctx = tokens.shape
        if positions is None:
            positions = [n_ctx - 1]
        if b != self.n_batch:
            self.n_batch = b
        new = tokens[:, self.n_cached :]
        if new.shape[1] == 0:
            raise ValueError("no new tokens to feed")
        if any(p < self.n_cached for p in positions):
            raise ValueError("logits requested for a position already in the KV cache")
        first = self.n_cached
        m = self.model
        n_new = new.shape[1]
        if b > 1 and first == 0 and (new == new[:1]).all():
            # identical prompts (beams, best-of samples): feed one, then copy its cache
            out = self._feed(new[:1], first, positions)
            m.reorder_kv([0] * b, first + n_new)
            self.n_cached = first + n_new
            return np.repeat(out, b, axis=0)
        out = self._feed(new, first, positions)
        self.n_cached = first + n_new
        return out

    def _feed(self, new: np.ndarray, first: int, positions: Sequence[int]) -> np.ndarray:
        m = self.model
        b, n_new = new.shape
        n_pos = len(positions)
        if b == 1:
            chunk = min(n_new, PROMPT_BUCKETS[-1])
        else:
            chunk = 1  # batched prompts that differ are fed one token at a time
        outs = []
        rel = [p - first for p in positions]
        for s in range(0, n_new, chunk):
            part = new[:, s : s + chunk]
            g = m.decoder(b, part.shape[1], b * n_pos)
            pos = np.broadcast_to(np.arange(first + s, first + s + part.shape[1]), part.shape)
            want = [r - s for r in rel if s <= r < s + part.shape[1]]
            flat = [bi * g.n_tok + r for bi in range(b) for r in want] or [0]
            logits = m.run_decoder(g, part, pos, np.arange(b), np.asarray(flat))
            if want:
                outs.append(logits.reshape(b, len(want), -1))
        return outs[0] if len(outs) == 1 else np.concatenate(outs, axis=1)

    def rearrange_kv_cache(self, source_indices: Sequence[int]) -> None:
        if list(source_indices) != list(range(len(source_indices))):
            self.model.reorder_kv(source_indices, self.n_cached)
        self.n_batch = len(source_indices)

    def cleanup_caching(self) -> None:
        self.n_cached = 0

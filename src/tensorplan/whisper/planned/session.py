"""One stream's state over a shared model: its arenas, KV caches and decoding position.

A `WhisperSession` binds every template buffer of a `WhisperModel` (model.py) to zeroed
memory of its own and runs the model's planned graphs through its own executor, so
sessions on different threads never share a byte they write. It is what decoding/window.py and
decoding/seek_loop.py call a `DecodingSession`: `encode(mel)` holds one window, `inference(n)`
decodes against it, `align(tokens, rows)` aligns words. A session is used by one thread at
a time; `reset()` zeroes its memory after a failed or non-finite run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tensorplan.backends.base import Buffer, Executor, TemplateBuffer, bind_templates
from tensorplan.tensor import Tensor
from tensorplan.whisper.planned import graphs
from tensorplan.whisper.planned.model import HEAD_ROWS, PROMPT_BUCKETS, DecoderGraph, WhisperModel
from tensorplan.whisper.planned.window_batch import BatchDecoder, BatchGraphs, WindowBatch


@dataclass(frozen=True, slots=True)
class Alignment:
    scores: np.ndarray  # (n_alignment_heads, N, A): QK^T * scale before the softmax
    logits: np.ndarray  # (len(rows), V) for the requested rows


class NonFiniteError(FloatingPointError):
    """The model produced NaN or infinite values (bad weights or input); the session that
    saw them must be reset before it is used again."""


class WhisperSession:
    def __init__(self, model: WhisperModel,
                 shared: Mapping[TemplateBuffer, Buffer] | None = None) -> None:
        """shared: buffers bound already, by the session of the model this one narrows
        (its self-attention caches): used as they are, not allocated again."""
        self.model = model
        self.dims, self.tokenizer, self.config = model.dims, model.tokenizer, model.config
        self.is_multilingual = model.is_multilingual
        self._shared = dict(shared or {})
        self.buffers = self._bind()
        self.executor = model.backend.executor(self.buffers)
        self._aligning: Executor | None = None  # made by the first word alignment
        self._batches: dict[WindowBatch, Executor] = {}  # bound on first use of each
        self._narrowed: dict[int, WhisperSession] = {}  # made on first use of each

    def _bind(self) -> dict[TemplateBuffer, Buffer]:
        own = [t for t in self.model.session_buffers if t not in self._shared]
        return {**bind_templates(self.model.backend.buffer_type, own),
                **{t: b for t, b in self._shared.items() if t in self.model.session_buffers}}

    @property
    def nbytes(self) -> int:
        """The bytes this session holds, its narrowed sessions' own included."""
        mine = {id(b): b.size for b in self.buffers.values()}
        for narrow in self._narrowed.values():
            mine.update({id(b): b.size for b in narrow.buffers.values()})
        return sum(mine.values())

    def narrowed(self, n_audio_ctx: int) -> WhisperSession:
        """This session over the model's narrowed windows (WhisperModel.narrowed): a
        session of that model bound on first use, sharing this one's self-attention
        caches; one thread uses the two, one run at a time."""
        model = self.model.narrowed(n_audio_ctx)
        if model is self.model:
            return self
        narrow = self._narrowed.get(n_audio_ctx)
        if narrow is None:
            narrow = self._narrowed[n_audio_ctx] = WhisperSession(model, self.buffers)
        return narrow

    def reset(self) -> None:
        """Fresh zeroed memory for this session: nothing of an earlier run can leak into the
        next (a NaN left in a KV row beyond the mask still poisons 0 * NaN)."""
        self.buffers = self._bind()
        self.executor = self.model.backend.executor(self.buffers)
        self._aligning = None
        self._batches = {}
        self._narrowed = {}  # they shared the old caches: made again on use

    def close(self) -> None:
        """Let go of this session's memory: its executors held the buffers too, so only
        dropping them frees it. Any later run fails with "not given" (no bindings)."""
        self.buffers = {}
        self.executor = self.model.backend.executor({})
        self._aligning = None
        for narrow in self._narrowed.values():
            narrow.close()
        self._narrowed = {}

    def release_batches(self) -> None:
        """Drop the window batches' buffers this session bound (their KV caches and
        arena): a batched request's memory goes back when it ends, not when the session
        does. The executors that saw them are made again."""
        if not self._batches:
            return
        for batch in self._batches:
            for template in batch.buffers:
                self.buffers.pop(template, None)
        self._batches = {}
        self.executor = self.model.backend.executor(self.buffers)
        if self._aligning is not None:  # it held the batch buffers too; its own stay bound
            self._aligning = self.model.backend.executor(self.buffers)

    def _align_executor(self) -> Executor:
        """The executor of the alignment graphs: this session's buffers plus their own."""
        if self._aligning is None:
            own = bind_templates(self.model.backend.buffer_type, self.model.align_buffers)
            self.buffers.update(own)
            self._aligning = self.model.backend.executor(self.buffers)
        return self._aligning

    def batch_executor(self, batch: WindowBatch) -> Executor:
        """The executor of a window batch's graphs: this session's buffers plus the
        batch's own (bound on first use: a session pays only for the batches it runs)."""
        ex = self._batches.get(batch)
        if ex is None:
            own = bind_templates(self.model.backend.buffer_type, batch.buffers)
            self.buffers.update(own)
            ex = self._batches[batch] = self.model.backend.executor(self.buffers)
        return ex

    def encode_into(self, batch: WindowBatch, slot: int, mel: np.ndarray,
                    encoder: WhisperSession | None = None) -> None:
        """Encode one window (on `encoder`'s graphs if given: another session of the
        model, e.g. on another thread) and copy its cross K/V into window `slot` of this
        session's batch."""
        encoder = encoder or self
        encoder.encode(mel)
        ex = self.batch_executor(batch)
        for (k, v), (k_slot, v_slot) in zip(self.model.kv_cross, batch.slots[slot],
                                            strict=True):
            ex.set(k_slot, encoder.executor.get(k))
            ex.set(v_slot, encoder.executor.get(v))

    def hold_window(self, batch: WindowBatch, slot: int) -> None:
        """Make window `slot` of the batch the encoded window (for `align`)."""
        ex = self.batch_executor(batch)
        for (k, v), (k_slot, v_slot) in zip(self.model.kv_cross, batch.slots[slot],
                                            strict=True):
            ex.set(k, ex.get(k_slot))
            ex.set(v, ex.get(v_slot))

    def run_batch(self, batch: WindowBatch, graphs: BatchGraphs, g: BatchDecoder,
                  tokens: np.ndarray, positions: np.ndarray, rows: np.ndarray, *,
                  check: bool = True) -> np.ndarray:
        """Feed tokens (S, N) at positions (S, N) of the first S sequences of the batch
        through one of its graphs; rows: flat row ids for logits. check=False: the caller
        checks each sequence's rows (one bad sequence need not fail the others)."""
        ex = self.batch_executor(batch)
        self._feed(ex, g.inputs, g.n_tok, graphs.n_seq, tokens, positions,
                   np.arange(len(tokens)))
        ex.set(g.inputs.logit_rows, np.asarray(rows, np.int32))
        ex.compute(batch.graph(g))
        logits = np.asarray(ex.get(g.logits))
        if check and not np.isfinite(logits).all():
            raise NonFiniteError("the decoder produced non-finite logits")
        return logits

    def reorder_batch_kv(self, batch: WindowBatch, source_rows: Sequence[int],
                         n_ctx: int) -> None:
        """Sequence i of the batch takes sequence source_rows[i]'s first n_ctx cache rows.
        Only the sequences that change are copied: with 8 windows of 5 beams, copying all
        40 moved ~50 MB a step, and most beams keep their own history."""
        moved = [i for i, s in enumerate(source_rows) if s != i]
        if not moved:
            return
        ex = self.batch_executor(batch)
        sources = [source_rows[i] for i in moved]
        for k, v in batch.kv_self:
            for cache in (k, v):
                ex.copy_slots(cache, batch.n_seq, sources, n_ctx, targets=moved)

    def move_windows(self, batch: WindowBatch, source_slots: Sequence[int], n_ctx: int) -> None:
        """Window slot i takes slot source_slots[i]: its cross K/V and its sequences' first
        n_ctx cache rows (packs the windows still decoding into a smaller prefix)."""
        ex = self.batch_executor(batch)
        for k, v in batch.kv_cross:
            for cross in (k, v):
                ex.copy_slots(cross, batch.n_windows, source_slots, cross.shape[0]
                              // batch.n_windows)
        g = batch.n_group
        self.reorder_batch_kv(batch, [s * g + i for s in source_slots for i in range(g)], n_ctx)

    # ---- one window ---------------------------------------------------------------------
    def encode(self, mel: np.ndarray) -> None:
        """mel (n_mels, 3000) float32: run conv, encoder and cross for this window."""
        ex, stages = self.executor, self.model.pipeline.stages
        ex.set(self.model.mel, mel)
        for name in ("conv", "encoder", "cross"):
            ex.compute(stages[name].graph)

    def cross_kv(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """The encoded window as decoder `layer` reads it: its cross-attention K and V,
        float32 (A, d) with heads side by side, as a reference model computes them.
        (The encoder's own output is not kept: once the cross stage has read it, the
        planner lends its bytes to that stage's other tensors.)"""
        def rows(t: Tensor) -> np.ndarray:
            heads = np.asarray(self.executor.get(t), np.float32)  # (H, A, dh)
            return heads.transpose(1, 0, 2).reshape(heads.shape[1], -1)
        k, v = self.model.kv_cross[layer]
        return rows(k), rows(v)

    def inference(self, n_batch: int) -> KVInference:
        return KVInference(self, n_batch)

    # ---- decoder passes -----------------------------------------------------------------
    def run_decoder(self, g: DecoderGraph, tokens: np.ndarray, positions: np.ndarray,
                    batch_rows: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Feed tokens (B, N) at positions (B, N); batch_rows (B,) selects KV slots (the
        mask follows the positions); rows: flat row ids for logits."""
        self._feed(self.executor, g.inputs, g.n_tok, g.n_batch, tokens, positions, batch_rows)
        flat = np.asarray(rows, dtype=np.int32)
        pad = np.repeat(flat[-1:], g.n_rows - len(flat))
        self.executor.set(g.inputs.logit_rows, np.concatenate([flat, pad]).astype(np.int32))
        self.executor.compute(g.graph)
        logits = np.asarray(self.executor.get(g.logits))[: len(flat)]
        if not np.isfinite(logits).all():
            raise NonFiniteError("the decoder produced non-finite logits")
        return logits

    def reorder_kv(self, source_rows: Sequence[int], n_ctx: int) -> None:
        """Batch slot i takes slot source_rows[i]'s first n_ctx cache rows."""
        for k, v in self.model.kv_self:
            for cache in (k, v):
                self.executor.copy_slots(cache, self.model.max_batch, source_rows, n_ctx)

    def align(self, tokens: Sequence[int], rows: Sequence[int]) -> Alignment:
        """Teacher-force `tokens` through the decoder over the encoded window; return the
        alignment heads' cross-attention scores and the logits of `rows` (positions).
        Overwrites batch slot 0 of the KV cache: call between decodings."""
        n = len(tokens)
        if not 0 < n <= self.dims.n_text_ctx:
            raise ValueError(f"cannot align {n} tokens (1 to {self.dims.n_text_ctx})")
        chunk, ex = PROMPT_BUCKETS[-1], self._align_executor()
        scale = (self.dims.n_text_state // self.dims.n_text_head) ** -0.5
        scores, logits = [], []
        want = sorted(set(rows))
        for start in range(0, n, chunk):  # the KV cache makes chunked passes exact
            part = list(tokens[start : start + chunk])
            g = self.model.aligners[next(b for b in PROMPT_BUCKETS if b >= len(part))]
            pos = np.arange(start, start + len(part))[None, :]
            self._feed(ex, g.inputs, g.n_tok, 1, np.asarray(part)[None, :], pos, np.array([0]))
            ex.compute(g.graph)
            scores.append(np.stack([np.asarray(ex.get(h))[: len(part)] for h in g.heads]))
            local = [r - start for r in want if start <= r < start + len(part)]
            for s in range(0, len(local), HEAD_ROWS):
                ids = local[s : s + HEAD_ROWS]
                ex.set(g.head_rows, np.array(ids + [ids[-1]] * (HEAD_ROWS - len(ids)), np.int32))
                ex.compute(g.head_graph)
                logits.append(np.asarray(ex.get(g.logits))[: len(ids)])
        by_row = dict(zip(want, np.concatenate(logits) if logits else [], strict=True))
        out = (np.stack([by_row[r] for r in rows]) if len(rows)
               else np.zeros((0, self.dims.n_vocab), np.float32))
        return Alignment(np.concatenate(scores, axis=1) * np.float32(scale), out)

    def _feed(self, ex: Executor, inp: graphs.DecoderInputs, gn: int, gb: int,
              tokens: np.ndarray, positions: np.ndarray, batch_rows: np.ndarray) -> None:
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
        t_ctx, n_kv = self.dims.n_text_ctx, inp.mask.shape[-1]
        kv_rows = batch_rows[:, None] * t_ctx + pos
        mask = np.where(np.arange(n_kv)[None, None, :] <= pos[:, :, None], 0.0, -np.inf)
        ex.set(inp.tokens, tok.reshape(-1).astype(np.int32))
        ex.set(inp.positions, pos.reshape(-1).astype(np.int32))
        ex.set(inp.kv_rows, kv_rows.reshape(-1).astype(np.int32))
        ex.set(inp.mask, mask[:, None].astype(np.float32))


class KVInference:
    """decoding.Inference over a session: B sequences sharing the window's cross K/V."""

    def __init__(self, session: WhisperSession, n_batch: int) -> None:
        if n_batch > session.model.max_batch:
            raise ValueError(f"batch {n_batch} exceeds the planned maximum "
                             f"{session.model.max_batch}")
        self.session, self.n_batch = session, n_batch
        self.n_cached = 0

    def logits(self, tokens: np.ndarray, positions: Sequence[int] | None = None) -> np.ndarray:
        """tokens (B, n_ctx): whole sequences so far -> logits (B, len(positions), V)."""
        tokens = np.asarray(tokens)
        b, n_ctx = tokens.shape
        if positions is None:
            positions = [n_ctx - 1]
        self.n_batch = b
        new = tokens[:, self.n_cached :]
        if new.shape[1] == 0:
            raise ValueError("no new tokens to feed")
        if any(p < self.n_cached for p in positions):
            raise ValueError("logits requested for a position already in the KV cache")
        first, n_new = self.n_cached, new.shape[1]
        if b > 1 and first == 0 and (new == new[:1]).all():
            # identical prompts (beams, best-of samples): feed one, then copy its cache
            out = self._feed(new[:1], first, positions)
            self.session.reorder_kv([0] * b, first + n_new)
            self.n_cached = first + n_new
            return np.repeat(out, b, axis=0)
        out = self._feed(new, first, positions)
        self.n_cached = first + n_new
        return out

    def _feed(self, new: np.ndarray, first: int, positions: Sequence[int]) -> np.ndarray:
        s = self.session
        b, n_new = new.shape
        # batched prompts that differ are fed one token at a time
        chunk = min(n_new, PROMPT_BUCKETS[-1]) if b == 1 else 1
        outs = []
        rel = [p - first for p in positions]
        for i in range(0, n_new, chunk):
            part = new[:, i : i + chunk]
            g = s.model.decoder(b, part.shape[1], b * len(positions))
            pos = np.broadcast_to(np.arange(first + i, first + i + part.shape[1]), part.shape)
            want = [r - i for r in rel if i <= r < i + part.shape[1]]
            flat = [bi * g.n_tok + r for bi in range(b) for r in want] or [0]
            logits = s.run_decoder(g, part, pos, np.arange(b), np.asarray(flat))
            if want:
                outs.append(logits.reshape(b, len(want), -1))
        return outs[0] if len(outs) == 1 else np.concatenate(outs, axis=1)

    def rearrange_kv_cache(self, source_indices: Sequence[int]) -> None:
        if list(source_indices) != list(range(len(source_indices))):
            self.session.reorder_kv(source_indices, self.n_cached)
        self.n_batch = len(source_indices)

    def cleanup_caching(self) -> None:
        self.n_cached = 0

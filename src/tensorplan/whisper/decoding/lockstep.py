"""Decode the windows of a `WindowBatch` (planned/window_batch.py) together, in lockstep.

Each window gets its own `DecodingTask` (window.py), so its logit filters, greedy or
beam-search decoder and ranking are exactly those of a window decoded alone; only the
decoder passes are shared: every step feeds the last token of all W*G sequences through
one planned graph. A window that finished keeps its rows in the graph (re-feeding its last
token, which rewrites the same cache row) but is no longer updated, so its result is the
one it would have had alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from tensorplan.whisper.decoding.window import DecodingResult, DecodingTask, log_softmax
from tensorplan.whisper.options import DecodingOptions
from tensorplan.whisper.planned.window_batch import PROMPT_TOKENS, BatchGraphs, WindowBatch

if TYPE_CHECKING:
    from tensorplan.whisper.planned.session import WhisperSession


class _Rows:
    """The `Inference` one window's DecodingTask holds: decoding passes are the batch's,
    so it only records the beam reorder, which the batch applies for all windows at once."""

    def __init__(self) -> None:
        self.sources: list[int] | None = None

    def logits(self, tokens: np.ndarray, positions: Sequence[int] | None = None) -> np.ndarray:
        raise NotImplementedError("a batched window is fed by its batch")

    def rearrange_kv_cache(self, source_indices: Sequence[int]) -> None:
        self.sources = list(source_indices)

    def cleanup_caching(self) -> None:
        pass


class _WindowView:
    """What a DecodingTask needs of a session, for one window of a batch."""

    def __init__(self, session: WhisperSession) -> None:
        self.dims, self.tokenizer, self.config = session.dims, session.tokenizer, session.config
        self.is_multilingual = session.is_multilingual
        self.rows = _Rows()

    def encode(self, mel: np.ndarray) -> None:
        raise NotImplementedError("batched windows are encoded into the batch")

    def inference(self, n_batch: int) -> _Rows:
        return self.rows


def decode_batch(session: WhisperSession, batch: WindowBatch, n_windows: int,
                 options: DecodingOptions) -> list[DecodingResult]:
    """Decode windows 0..n_windows-1 of `batch` (already encoded into its slots, see
    WhisperSession.encode_into) with the same options. Runs the smallest prefix of the
    batch's graphs that holds them; once windows finish, those still decoding are packed
    into a smaller prefix when one fits (their cross K/V read per step is most of a
    step's bytes, so finished windows must not stay in the graph)."""
    views = [_WindowView(session) for _ in range(n_windows)]
    tasks = [DecodingTask(v, options) for v in views]
    g = batch.n_group
    if tasks[0].n_group != g:
        raise ValueError(f"the options decode {tasks[0].n_group} sequences per window, "
                         f"the batch was planned for {g}")
    sizes = batch.for_windows(n_windows)
    initial = tasks[0].initial
    at_sot, last = _prompt(session, batch, sizes, initial.tokens, initial.sot_index)
    no_speech = [float(np.exp(log_softmax(at_sot[w])[session.tokenizer.no_speech]))
                 for w in range(n_windows)]
    tokens = [np.tile(np.array(initial.tokens, np.int32), (g, 1)) for _ in range(n_windows)]
    sum_logprobs = [np.zeros(g, np.float64) for _ in range(n_windows)]
    done = [False] * n_windows
    slots = list(range(n_windows))  # the window in each slot
    n_ctx = tasks[0].n_ctx
    logits = np.repeat(last[:n_windows], g, axis=0)  # (slots*G, V): beams share the prompt
    for _ in range(tasks[0].sample_len):
        identity = list(range(len(slots) * g))
        sources = list(identity)
        for slot, w in enumerate(slots):
            if done[w]:
                continue
            rows = np.array(logits[slot * g : (slot + 1) * g], np.float32)  # filters edit it
            for logit_filter in tasks[w].logit_filters:
                logit_filter.apply(rows, tokens[w])
            views[w].rows.sources = None
            tokens[w], completed = tasks[w].decoder.update(tokens[w], rows, sum_logprobs[w])
            moved = views[w].rows.sources
            if moved is not None:
                sources[slot * g : (slot + 1) * g] = [slot * g + s for s in moved]
            done[w] = completed or tokens[w].shape[1] >= n_ctx
        if all(done):
            break
        n_fed = max(tokens[w].shape[1] for w in slots) - 1  # cache rows written so far
        if sources != identity:
            session.reorder_batch_kv(batch, sources, n_fed)
        live = [slot for slot, w in enumerate(slots) if not done[w]]
        smaller = batch.for_windows(len(live))
        if smaller.n_windows < sizes.n_windows:
            session.move_windows(batch, live, n_fed)
            slots, sizes = [slots[s] for s in live], smaller
        logits = _step(session, batch, sizes, [tokens[w] for w in slots])
    return [task.finish(tokens[w], sum_logprobs[w], no_speech[w])
            for w, task in enumerate(tasks)]


def _prompt(session: WhisperSession, batch: WindowBatch, sizes: BatchGraphs,
            initial: Sequence[int], sot_index: int) -> tuple[np.ndarray, np.ndarray]:
    """Feed the initial tokens to every sequence, PROMPT_TOKENS at a time (the cache makes
    pieces exact); returns the logits of one sequence per window at the sot and at the
    last position, each (W, V)."""
    n_win, n_seq = sizes.n_windows, sizes.n_seq
    n = len(initial)
    want = {sot_index: np.empty(0), n - 1: np.empty(0)}
    for start in range(0, n, PROMPT_TOKENS):
        piece = np.array(initial[start : start + PROMPT_TOKENS], np.int32)
        tok = np.tile(piece, (n_seq, 1))
        pos = np.tile(np.arange(start, start + len(piece)), (n_seq, 1))
        here = [p for p in want if start <= p < start + len(piece)]
        # logits rows: sequence w*G of each window, at each wanted position in this piece
        rows = [w * batch.n_group * PROMPT_TOKENS + (p - start) for p in here
                for w in range(n_win)]
        rows += [rows[-1] if rows else 0] * (2 * n_win - len(rows))
        out = session.run_batch(batch, sizes, sizes.prompt, tok, pos, np.array(rows))
        for i, p in enumerate(here):
            want[p] = out[i * n_win : (i + 1) * n_win]
    return want[sot_index], want[n - 1]


def _step(session: WhisperSession, batch: WindowBatch, sizes: BatchGraphs,
          tokens: list[np.ndarray]) -> np.ndarray:
    """Feed each sequence's last token at its position; padding re-feeds the first
    sequence's; returns logits (sizes.n_seq, V)."""
    last = np.concatenate([t[:, -1] for t in tokens])
    pos = np.concatenate([np.full(len(t), t.shape[1] - 1) for t in tokens])
    pad = sizes.n_seq - len(last)
    if pad:
        last = np.concatenate([last, np.repeat(last[:1], pad)])
        pos = np.concatenate([pos, np.repeat(pos[:1], pad)])
    g = sizes.step(int(pos.max()) + 1)
    return session.run_batch(batch, sizes, g, last[:, None], pos[:, None],
                             np.arange(sizes.n_seq))

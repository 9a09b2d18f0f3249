"""The limits on what one request may ask for, defined once (docs/robustness.md).

Each bounds a size that a user's number turns into memory or work: sequences decoded
together size the KV cache, temperatures scale logits. `check_kv_budget` runs before a model
is planned, so a request too large is refused before any arena is allocated.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import numpy as np

from tensorplan.errors import AudioTooLongError, UserError

MAX_SEQUENCES = 64  # beams or best-of samples decoded together (openai's CLI uses 5)
MAX_PATIENCE = 16.0  # beam search candidates collected: round(beam_size * patience)
MAX_TEMPERATURE = 100.0  # far beyond 1.0, where sampling is already near uniform
MIN_TEMPERATURE = 1e-3  # a positive temperature below this is greedy decoding in all but name
MAX_SEED = 2**64 - 1  # numpy's generators take any non-negative int; 64 bits is plenty
# The self-attention KV cache a model may plan: 2 (K, V) x layers x sequences x n_text_ctx x
# n_text_state x itemsize. 4 GiB holds large-v3 at 29 sequences in float32 (58 in float16),
# tiny at all 64 (352 MB). TENSORPLAN_MAX_KV_BYTES raises it.
DEFAULT_MAX_KV_BYTES = 4 << 30
MAX_KV_ENV = "TENSORPLAN_MAX_KV_BYTES"
# clip_timestamps spans: each is decoded as at least one 30 s window whatever its length, so
# a list of 10,000 tiny spans kept a server's session busy for minutes on seconds of audio
MAX_CLIP_SPANS = 100
# and their times: past any audio a file can hold (1e308 s overflowed the frame count)
MAX_CLIP_SECONDS = 1e9
# decoded audio one server request may hold (--max-audio-seconds): checked against the
# container's declared duration before decoding, and counted while decoding
DEFAULT_MAX_AUDIO_SECONDS = 4 * 3600.0


def kv_cache_bytes(dims: Any, max_batch: int, kv_dtype: str) -> int:
    """Bytes of the self-attention K and V caches for `max_batch` sequences."""
    itemsize = np.dtype(kv_dtype).itemsize
    return 2 * int(dims.n_text_layer) * max_batch * int(dims.n_text_ctx) * int(dims.n_text_state) \
        * itemsize


def max_kv_bytes() -> int:
    text = os.environ.get(MAX_KV_ENV, "")
    if not text:
        return DEFAULT_MAX_KV_BYTES
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise UserError(f"{MAX_KV_ENV}={text!r}: expected a positive number of bytes")
    return value


def check_kv_budget(dims: Any, max_batch: int, kv_dtype: str) -> None:
    """UserError, before anything is allocated, if the KV cache would pass the limit."""
    if not 1 <= max_batch <= MAX_SEQUENCES:
        raise UserError(f"max_batch {max_batch}: sequences decoded together (--beam-size, "
                        f"--best-of) must be between 1 and {MAX_SEQUENCES}")
    need, limit = kv_cache_bytes(dims, max_batch, kv_dtype), max_kv_bytes()
    if need > limit:
        raise UserError(f"{max_batch} sequences need a {need / 2**30:.2f} GiB {kv_dtype} KV "
                        f"cache, more than the {limit / 2**30:.2f} GiB limit: lower "
                        f"--beam-size/--best-of, use --kv-dtype float16, or raise {MAX_KV_ENV}")


def batch_kv_bytes(dims: Any, n_windows: int, n_group: int, kv_dtype: str) -> int:
    """Bytes of a window batch's caches: self-attention K/V for n_windows x n_group
    sequences, and cross-attention K/V for n_windows encoded windows."""
    itemsize = np.dtype(kv_dtype).itemsize
    cross = 2 * int(dims.n_text_layer) * n_windows * int(dims.n_audio_ctx) \
        * int(dims.n_text_state) * itemsize
    return kv_cache_bytes(dims, n_windows * n_group, kv_dtype) + cross


def check_batch_budget(dims: Any, n_windows: int, n_group: int, kv_dtype: str) -> None:
    """check_kv_budget's limit for batched decoding (batch_size windows of beam_size or
    best_of sequences each), before its graphs are planned or its caches allocated."""
    need, limit = batch_kv_bytes(dims, n_windows, n_group, kv_dtype), max_kv_bytes()
    if need > limit:
        raise UserError(f"batch_size {n_windows} x {n_group} sequences per window need "
                        f"{need / 2**30:.2f} GiB of {kv_dtype} KV caches, more than the "
                        f"{limit / 2**30:.2f} GiB limit: lower batch_size or beam_size/"
                        f"best_of, use --kv-dtype float16, or raise {MAX_KV_ENV}")


def check_audio_seconds(name: str, seconds: float, limit: float | None, declared: bool) -> None:
    """AudioTooLongError when `seconds` of audio pass `limit` (None: no limit)."""
    if limit is not None and seconds > limit:
        how = "declares" if declared else "decodes to more than"
        raise AudioTooLongError(f"{name}: {how} {seconds:.0f} s of audio, more than the "
                                f"{limit:.0f} s limit")


def check_token_ids(ids: Iterable[int], n_vocab: int, what: str) -> None:
    """UserError for an id outside the vocabulary (it would index past the logits)."""
    bad = [t for t in ids if not 0 <= t < n_vocab]
    if bad:
        raise UserError(f"{what}: token id {bad[0]} is outside the vocabulary "
                        f"(0 to {n_vocab - 1})")

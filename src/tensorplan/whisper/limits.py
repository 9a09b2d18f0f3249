"""The limits on what one request may ask for, defined once (docs/robustness.md).

Each bounds a size that a user's number turns into memory or work: sequences decoded
together size the KV cache, temperatures scale logits. `check_kv_budget` runs before a model
is planned, so a request too large is refused before any arena is allocated.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from tensorplan.errors import UserError

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

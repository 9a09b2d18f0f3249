"""CPU threads per session, so concurrent sessions never fight over the same cores.

The cores are divided once, at start-up: each of N sessions computes with cores // N
threads (at least one), passed to the model as its `threads` option, which sizes every
pool (OpenBLAS's is process-wide; PyTorch's OpenMP count is per OS thread, and the torch
backend sets it per kernel in the thread that runs it). Dividing them again as sessions
become busy or idle would need a per-session count in the kernels, which they do not read.
"""

from __future__ import annotations

from tensorplan.machine import cores


def per_session(n_sessions: int, n_cores: int | None = None) -> int:
    return max(1, (n_cores or cores()) // max(1, n_sessions))


def default_sessions(n_cores: int) -> int:
    """Sessions of two threads each. Measured on 2 cores (docs/serve.md): one session of two
    threads served 4 concurrent clients as fast as or faster than two of one thread (the
    decoders of two sessions in one process take turns holding the interpreter lock), while
    a lone session on many cores leaves most of them idle in the decoder's small kernels."""
    return max(1, n_cores // 2)

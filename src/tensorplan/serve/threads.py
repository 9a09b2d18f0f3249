"""CPU threads and sessions of a server, so concurrent work never fights over the same cores.

Without the step engine, requests run on sessions: the cores are divided once, at start-up,
and each of N sessions computes with cores // N threads (at least one), passed to the
model as its `threads` option, which sizes every pool (OpenBLAS's is process-wide;
PyTorch's OpenMP count is per OS thread, and the torch backend sets it per kernel in the
thread that runs it).

With the step engine, requests decode on its one thread, which computes on every core,
and the sessions serve only live updates (/v1/realtime). The threads computing at once
(the engine's, its encoder's, live updates, batched long files) split the cores
(machine.computing: k of them, cores // k PyTorch threads each; a lone one takes them
all), so there is one session per core, up to MAX_LIVE_SESSIONS.
"""

from __future__ import annotations

from tensorplan.machine import cores

# Sessions for live updates by default, at most: each holds an arena (49 MiB for
# tiny.en), and past a few updates at once the cores are the limit.
MAX_LIVE_SESSIONS = 8


def per_session(n_sessions: int, n_cores: int | None = None) -> int:
    return max(1, (n_cores or cores()) // max(1, n_sessions))


def default_sessions(n_cores: int, engine: bool = False) -> int:
    """Without the engine, sessions of two threads each. Measured on 2 cores (docs/serve.md):
    one session of two threads served 4 concurrent clients as fast as or faster than two of
    one thread (the decoders of two sessions in one process take turns holding the
    interpreter lock), while a lone session on many cores leaves most of them idle in the
    decoder's small kernels. With it, a session per core for live updates: on 2 cores
    (AMX), 8 live streams' p95 latency 12.4-14.7 s with one session of two threads (and
    Silero on two), 7.3-7.4 s with two sharing the cores (docs/realtime.md)."""
    if engine:
        return max(1, min(n_cores, MAX_LIVE_SESSIONS))
    return max(1, n_cores // 2)


def threads_for(n_sessions: int, engine: bool, n_cores: int | None = None) -> int:
    """Threads of the process's pools: every core for the engine (live updates then share
    them), else each session's part."""
    return max(1, n_cores or cores()) if engine else per_session(n_sessions, n_cores)

"""The worker-process scaffolding of the benches that time implementations side by side
(batched.py, peers.py): each implementation is a child process that speaks JSON lines on
stdin/stdout, reports its own peak RSS, and starts in an environment of pinned threads.

A helper module for bench scripts, not a bench: the scripts import it from this folder.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

Reply = Callable[..., None]


# ---- the child -------------------------------------------------------------------------------
def protocol() -> Reply:
    """Keep the real stdout for the protocol and send fd 1 to stderr (library chatter, C printf
    included, must not reach it); returns reply(**fields), which writes one JSON line."""
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)

    def reply(**kw: object) -> None:
        out.write(json.dumps(kw) + "\n")
        out.flush()

    return reply


def serve(transcribe: Callable[[np.ndarray], str], reply: Reply) -> None:
    """Answer requests "AUDIO.npy" with {"seconds", "text"} (the samples are loaded before the
    clock starts); an empty line (or EOF) ends, answered with {"rss_mb"}."""
    for line in sys.stdin:
        if not line.strip():
            break
        audio = np.load(line.strip())
        start = time.perf_counter()
        text = transcribe(audio)
        reply(seconds=time.perf_counter() - start, text=text)
    reply(rss_mb=maxrss_mb())


def maxrss_mb() -> float:
    """Peak RSS of this process's own address space: VmHWM. (ru_maxrss would do on macOS,
    but on Linux it keeps the forking parent's peak across exec.)"""
    try:
        status = Path("/proc/self/status").read_text()
        kib = next(int(line.split()[1]) for line in status.splitlines()
                   if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kib * 1024 / 1e6


# ---- the parent ------------------------------------------------------------------------------
def child_env(threads: int, **extra: str) -> dict[str, str]:
    """A child's environment: `threads` OpenMP and OpenBLAS threads, and OMP_WAIT_POLICY
    PASSIVE unless it is set already (spinning threads lose most of their time on a shared,
    oversubscribed machine)."""
    return {"OMP_WAIT_POLICY": "PASSIVE", **os.environ, "OMP_NUM_THREADS": str(threads),
            "OPENBLAS_NUM_THREADS": str(threads), **extra}

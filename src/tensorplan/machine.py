"""What this process may run on: a leaf beside errors and files, usable by every layer."""

from __future__ import annotations

import os
from typing import Any


def cores() -> int:
    """The CPUs this process may run on (its affinity mask, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def return_free_memory() -> None:
    """Hand freed heap memory back to the OS (glibc's malloc_trim; elsewhere nothing).

    glibc raises its mmap threshold to the size of each large block freed (up to 32 MiB),
    so after one big request the next ones' arrays come from the heap and arenas, and
    their freed pages stay with the process: a server that ran a 4-window, 16-beam batch
    kept 230-310 MB of it. Called when a server goes idle, where the trim costs nobody."""
    global _trim
    if _trim is None:
        try:
            import ctypes

            _trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):  # not glibc
            _trim = False
    if _trim:
        _trim(0)


_trim: Any = None

"""What this process may run on: a leaf beside errors and files, usable by every layer."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable


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
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    import ctypes  # here: only a server going idle needs it, not every start-up

    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None

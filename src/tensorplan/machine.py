"""What this process may run on: a leaf beside errors and files, usable by every layer."""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


def cores() -> int:
    """The CPUs this process may run on (its affinity mask, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


_here = threading.local()  # this OS thread's share: a function giving how many run at once


@contextmanager
def shared_by(running: Callable[[], int]) -> Iterator[None]:
    """Inside this, this OS thread's work shares the cores with running() threads (itself
    included), read as it goes: the backends that can (PyTorch's CPU kernels) compute on
    cores // running() threads, so a share follows as others start and finish. For work
    whose numerics may depend on its thread count, or do not (backends/threads.py)."""
    before = getattr(_here, "running", None)
    _here.running = running
    try:
        yield
    finally:
        _here.running = before


def running_beside() -> int:
    """How many threads share the cores with this one, itself included (1 outside
    shared_by)."""
    running = getattr(_here, "running", None)
    return 1 if running is None else max(1, int(running()))


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

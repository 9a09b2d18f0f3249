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


_here = threading.local()  # whether this OS thread is inside computing()
_computing = [0]  # threads inside computing() now, in the whole process
_counting = threading.Lock()


@contextmanager
def computing() -> Iterator[None]:
    """This OS thread computes now, and shares the cores with every other thread inside
    computing() at the moment: the backends that can (PyTorch's CPU kernels, whose count
    is per OS thread) run k such threads on cores // k each, read at each kernel, so a
    share follows as others start and finish. A thread outside keeps the whole count.
    (A share changes a product's rounding in the last bits: docs/engine.md.)"""
    depth = getattr(_here, "depth", 0)
    if depth == 0:
        with _counting:
            _computing[0] += 1
    _here.depth = depth + 1
    try:
        yield
    finally:
        _here.depth = depth
        if depth == 0:
            with _counting:
                _computing[0] -= 1


def sharing() -> bool:
    """Whether this OS thread is inside computing(), sharing the cores with other work."""
    return bool(getattr(_here, "depth", 0))


def running_beside() -> int:
    """How many threads share the cores with this one, itself included: those inside
    computing() if this one is, else 1."""
    return max(1, _computing[0]) if sharing() else 1


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

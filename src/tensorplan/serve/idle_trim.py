"""Freed memory handed back to the OS once the server has been quiet for a while.

A big request's arrays (or a flood of live connections' buffers) stay with the process
after they are freed: glibc raises its mmap threshold to the size of each large block
freed, so they are reused from the heap and never returned (machine.return_free_memory).
The trim runs on a thread of its own once no request and no live update has run for
IDLE_TRIM_S, where it costs nobody; trimming whenever the last job ended cost a client
sending one request after another 3-4% of its speed (its next request faulted the pages
in again: one jfk.wav at a time, interleaved with a lone session in process, 0.94
against 0.97-0.98 of its speed without the trim).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from tensorplan.machine import return_free_memory

IDLE_TRIM_S = 1.0


class IdleTrimmer:
    def __init__(self, idle_s: float = IDLE_TRIM_S,
                 trim: Callable[[], None] = return_free_memory) -> None:
        self.idle_s = idle_s
        self._trim = trim
        self.trims = 0  # times memory was handed back
        self._cond = threading.Condition()
        self._active = 0  # jobs and live updates running now
        self._started = 0  # ever: a trim waits for a spell in which none starts
        self._ran = False  # one ended since the last trim
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="tensorplan-trim",
                                        daemon=True)
        self._thread.start()

    @contextmanager
    def active(self) -> Iterator[None]:
        """Around a request's job or a live update: the server is not idle meanwhile."""
        with self._cond:
            self._active += 1
            self._started += 1
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self._active -= 1
                self._ran = True
                self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closed or (self._ran and not self._active))
                if self._closed:
                    return
                if self._cond.wait_for(self._work_came(self._started), self.idle_s):
                    continue  # work came back first (or the server is closing)
                self._ran = False
            self._trim()
            with self._cond:
                self.trims += 1

    def _work_came(self, started: int) -> Callable[[], bool]:
        """Whether work started since `started` had (or the server closes)."""
        return lambda: self._closed or self._started != started

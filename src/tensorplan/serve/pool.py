"""N transcription sessions over one shared model, and a bounded queue in front of them.

`FixedSessionPool` is the one place that knows how a session is made; `Scheduler` runs jobs on
dedicated worker threads (one per session, so blocking work never runs on the event loop),
refuses work when the queue is full, and counts busy sessions and queued jobs for /health.
A job is cancelled cooperatively: its callbacks raise `Cancelled` at the next segment or
window, which frees its session for the next job.

With a step engine (whisper/planned/step_engine.py) the jobs run on the engine's streams
instead: one worker thread per engine window, every stream's decoding steps batched
together; a job is then also stopped between two decoding steps (its stream checks the flag).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from tensorplan.machine import return_free_memory
from tensorplan.serve.errors import ApiError


class Cancelled(Exception):
    """Raised inside a job's callbacks once nobody waits for its result."""


class FixedSessionPool:
    """N sessions of one model; `session()` lends one, to one thread, for a job's length."""

    def __init__(self, model: Any, n_sessions: int) -> None:
        self.model = model
        self.size = n_sessions
        self._stack = ExitStack()
        self._free: queue.SimpleQueue[Any] = queue.SimpleQueue()
        for _ in range(n_sessions):  # each: its own arena, KV cache and decoding state
            self._free.put(self._stack.enter_context(model.session()))

    @property
    def session_bytes(self) -> int:
        return int(self.model.session_bytes)

    def close(self) -> None:
        self._stack.close()

    @contextmanager
    def session(self) -> Iterator[Any]:
        s = self._free.get()
        try:
            yield s
        finally:
            self._free.put(s)


class Job:
    """One transcription: a function of a session, and a flag its callbacks check."""

    def __init__(self, run: Callable[[Any, Job], Any],
                 cleanup: Callable[[], None] | None = None) -> None:
        self.run = run
        self.cleanup = cleanup  # called once the job is over, run or not (e.g. its upload)
        self.cancelled = threading.Event()

    def check(self) -> None:
        if self.cancelled.is_set():
            raise Cancelled


# the server hands freed memory back once it has been idle this long: trimming whenever the
# last job ended cost a client sending one request after another 3-4% of its speed (the
# next request faulted the returned pages in again; one jfk.wav at a time, interleaved
# with a lone session in process: 0.94 against 0.97-0.98 of its speed without the trim)
IDLE_TRIM_S = 1.0


class Scheduler:
    def __init__(self, pool: FixedSessionPool, max_queue: int, engine: Any = None) -> None:
        self.pool = pool
        self.engine = engine
        self.max_queue = max_queue
        self.workers = engine.windows if engine is not None else pool.size
        self._lock = threading.Lock()
        self.queued = 0  # admitted, waiting for a session
        self.busy = 0  # running on a session
        self.done = 0
        self.trims = 0  # freed memory handed back to the OS (after IDLE_TRIM_S idle)
        self._started = 0  # jobs started, ever: a trim waits for a spell without one
        self._ran = False  # a job ended since the last trim
        self._closed = False
        self._changed = threading.Condition(self._lock)
        self._jobs: set[Job] = set()
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.workers, thread_name_prefix="tensorplan-session")
        # every worker started now: the process's threads do not grow under load
        started = threading.Barrier(self.workers + 1)
        for _ in range(self.workers):
            self._executor.submit(started.wait)
        started.wait()
        self._trimmer = threading.Thread(target=self._trim_when_idle, daemon=True,
                                         name="tensorplan-trim")
        self._trimmer.start()

    def stats(self) -> dict[str, int]:
        with self._lock:
            stats = {"sessions": self.pool.size, "busy_sessions": self.busy,
                     "queued": self.queued, "max_queue": self.max_queue,
                     "completed": self.done, "memory_trims": self.trims}
        if self.engine is not None:
            stats.update(self.engine.stats(), streams=self.workers,
                         engine_bytes=self.engine.nbytes)
        return stats

    def submit(self, job: Job) -> asyncio.Future[Any]:
        """Queue `job`; ApiError 429 (with Retry-After) when the queue is full."""
        with self._lock:
            if self.busy + self.queued >= self.workers + self.max_queue:
                raise ApiError(429, f"the server is busy: {self.queued} requests queued; "
                               "retry later", code="queue_full", headers={"Retry-After": "1"})
            self.queued += 1
            self._jobs.add(job)
        future = self._executor.submit(self._work, job)
        future.add_done_callback(lambda f: self._forget(job, f))
        return asyncio.wrap_future(future)

    async def run(self, job: Job) -> Any:
        """Submit and await `job`; if the caller goes away, the job is cancelled."""
        future = self.submit(job)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            job.cancelled.set()
            raise

    def cancel_all(self) -> None:
        with self._lock:
            jobs = list(self._jobs)
        for job in jobs:
            job.cancelled.set()

    def close(self) -> None:
        """Cancel what is queued or running and wait for the workers to stop."""
        self.cancel_all()
        self._executor.shutdown(wait=True, cancel_futures=True)
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        self._trimmer.join()

    def _trim_when_idle(self) -> None:
        """Hand freed memory back once the server has been idle IDLE_TRIM_S (the
        trimmer's thread): a big request's arrays stay with the process otherwise
        (machine.return_free_memory), and a quiet server is where the trim costs nobody."""
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._closed or (
                    self._ran and self.busy == 0 and self.queued == 0))
                if self._closed:
                    return
                if self._changed.wait_for(self._work_came(self._started), IDLE_TRIM_S):
                    continue  # work came back first (or the server is closing)
                self._ran = False
            return_free_memory()
            with self._lock:
                self.trims += 1

    def _work_came(self, started: int) -> Callable[[], bool]:
        """Whether a job started since `started` jobs had (or the server closes)."""
        return lambda: self._closed or self._started != started

    def _work(self, job: Job) -> Any:
        with self._changed:
            self.queued -= 1
            self.busy += 1
            self._started += 1
            self._changed.notify_all()
        try:
            job.check()  # cancelled while it waited
            with self._lend(job) as session:
                return job.run(session, job)
        finally:
            with self._changed:
                self.busy -= 1
                self.done += 1
                self._ran = True
                self._changed.notify_all()

    def _lend(self, job: Job) -> Any:
        if self.engine is not None:
            return self.engine.borrow(job.check)
        return self.pool.session()

    def _forget(self, job: Job, future: concurrent.futures.Future[Any]) -> None:
        with self._changed:
            self._jobs.discard(job)
            if future.cancelled():  # never started: it still counted as queued
                self.queued -= 1
                self._changed.notify_all()
        if job.cleanup is not None:
            job.cleanup()

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

from tensorplan.serve.errors import ApiError
from tensorplan.serve.idle_trim import IdleTrimmer


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


class Scheduler:
    def __init__(self, pool: FixedSessionPool, max_queue: int, trimmer: IdleTrimmer,
                 engine: Any = None) -> None:
        self.pool = pool
        self.trimmer = trimmer  # told when jobs run (idle_trim.py)
        self.engine = engine
        self.max_queue = max_queue
        self.workers = engine.windows if engine is not None else pool.size
        self._lock = threading.Lock()
        self.queued = 0  # admitted, waiting for a session
        self.busy = 0  # running on a session
        self.done = 0
        self._jobs: set[Job] = set()
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.workers, thread_name_prefix="tensorplan-session")
        # every worker started now: the process's threads do not grow under load
        started = threading.Barrier(self.workers + 1)
        for _ in range(self.workers):
            self._executor.submit(started.wait)
        started.wait()

    def stats(self) -> dict[str, int]:
        with self._lock:
            stats = {"sessions": self.pool.size, "busy_sessions": self.busy,
                     "queued": self.queued, "max_queue": self.max_queue,
                     "completed": self.done, "memory_trims": self.trimmer.trims}
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

    def _work(self, job: Job) -> Any:
        with self._lock:
            self.queued -= 1
            self.busy += 1
        try:
            job.check()  # cancelled while it waited
            with self._lend(job) as session, self.trimmer.active():
                return job.run(session, job)
        finally:
            with self._lock:
                self.busy -= 1
                self.done += 1

    def _lend(self, job: Job) -> Any:
        if self.engine is not None:
            return self.engine.borrow(job.check)
        return self.pool.session()

    def _forget(self, job: Job, future: concurrent.futures.Future[Any]) -> None:
        with self._lock:
            self._jobs.discard(job)
            if future.cancelled():  # never started: it still counted as queued
                self.queued -= 1
        if job.cleanup is not None:
            job.cleanup()

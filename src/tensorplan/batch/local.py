"""`--workers N`: N spawned processes on this machine, each with one model and one arena.

Each worker talks to the driver over its own pipe, so when one dies (killed, out of memory,
a crash in native code) the driver knows exactly which file it held: that file alone is
failed as crashed (and retried by the driver), and only that worker is replaced; the others
keep their loaded models. (concurrent.futures' pool breaks as a whole on one death and
cannot say whose file killed it.) BLAS threads per worker are set in the worker's
environment before it starts, so workers x threads <= cores.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from tensorplan.batch.jobs import (
    Failed,
    ModelSpec,
    Outcome,
    Task,
    Worker,
    blas_env,
    describe,
    limit_blas_threads,
)
from tensorplan.errors import UserError
from tensorplan.machine import cores
from tensorplan.whisper.options import TranscribeOptions

MAX_LOAD_DEATHS = 3  # workers that die while loading the model before the run gives up
STOP_TIMEOUT = 5.0  # seconds an idle worker gets to exit before it is terminated


@dataclass(slots=True)
class _Proc:
    process: Any  # multiprocessing's SpawnProcess
    conn: Connection
    ready: bool = False
    task: Task | None = None


class LocalPool:
    def __init__(self, spec: ModelSpec, options: TranscribeOptions, n_workers: int,
                 threads: int | None = None) -> None:
        if n_workers < 1:
            raise UserError("--workers must be at least 1")
        self.spec, self.options = spec, options
        self.threads = threads or max(1, cores() // n_workers)
        self.ctx = mp.get_context("spawn")  # never fork a process that may hold BLAS threads
        self.load_deaths = 0
        self.procs: list[_Proc] = []
        try:
            for _ in range(n_workers):
                self.procs.append(self._start())
            while not all(p.ready for p in self.procs):  # a model that fails to load fails here
                self._poll()
        except BaseException:
            self.close()
            raise

    @property
    def n_idle(self) -> int:
        return sum(p.task is None for p in self.procs)

    @property
    def n_busy(self) -> int:
        return sum(p.task is not None for p in self.procs)

    def submit(self, task: Task) -> None:
        i, proc = next((i, p) for i, p in enumerate(self.procs) if p.task is None)
        if not proc.process.is_alive():  # died while idle: replace it, charge no file
            self._replace(i, proc)
            proc = self.procs[i]
        proc.task = task
        try:
            proc.conn.send(task)
        except OSError:
            pass  # it died just now: wait() sees its sentinel and fails the task as crashed

    def wait(self) -> list[tuple[Task, Outcome]]:
        outcomes: list[tuple[Task, Outcome]] = []
        while not outcomes:
            outcomes = self._poll()
        return outcomes

    def close(self) -> None:
        for proc in self.procs:
            if proc.task is None:
                try:
                    proc.conn.send(None)  # the worker exits when it reads this
                except OSError:
                    pass
            else:
                proc.process.terminate()  # interrupted mid-file: the file stays pending
        for proc in self.procs:
            proc.process.join(STOP_TIMEOUT)
            if proc.process.is_alive():
                proc.process.kill()
                proc.process.join()
            proc.conn.close()
        self.procs = []

    def _start(self) -> _Proc:
        parent, child = self.ctx.Pipe()
        process = self.ctx.Process(target=_serve, daemon=True, name="tensorplan-worker",
                                   args=(child, self.spec, self.options, self.threads))
        with _environment(blas_env(self.threads)):  # read by BLAS when the worker loads it
            process.start()
        child.close()
        return _Proc(process, parent)

    def _poll(self) -> list[tuple[Task, Outcome]]:
        """Wait for any worker to send something or die; return the outcomes that arrived."""
        handles = [p.conn for p in self.procs] + [p.process.sentinel for p in self.procs]
        ready = set(wait(handles))
        outcomes = []
        for i, proc in enumerate(list(self.procs)):
            if proc.conn in ready and proc.conn.poll():
                message = self._receive(proc)
                if message is not None:
                    outcomes.append(message)
                    continue
            if proc.process.sentinel in ready or not proc.process.is_alive():
                outcomes.extend(self._replace(i, proc))
        return outcomes

    def _receive(self, proc: _Proc) -> tuple[Task, Outcome] | None:
        try:
            kind, payload = proc.conn.recv()
        except (EOFError, OSError):
            return None  # it died: its sentinel says so
        if kind == "ready":
            proc.ready = True
        elif kind == "init-error":
            raise UserError(f"a worker could not load the model: {payload}")
        elif kind == "outcome":
            assert proc.task is not None
            task, proc.task = proc.task, None
            return task, payload
        return None

    def _replace(self, i: int, dead: _Proc) -> list[tuple[Task, Outcome]]:
        """Start a worker in dead's place; its file (if any) comes back as crashed."""
        dead.process.join()
        dead.conn.close()
        if not dead.ready:
            self.load_deaths += 1
            if self.load_deaths >= MAX_LOAD_DEATHS:
                raise UserError(f"{self.load_deaths} worker processes died while loading the "
                                f"model (last exit code {dead.process.exitcode})")
        self.procs[i] = self._start()
        if dead.task is None:
            return []
        error = f"worker process died (exit code {dead.process.exitcode})"
        return [(dead.task, Failed(dead.task.key, error, crashed=True))]


def _serve(conn: Connection, spec: ModelSpec, options: TranscribeOptions, threads: int) -> None:
    """A worker process: load the model once, then transcribe tasks until told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the driver, which stops us
    limit_blas_threads(threads)
    try:
        worker = Worker(spec, options)
    except Exception as e:
        conn.send(("init-error", describe(e)))
        return
    conn.send(("ready", os.getpid()))
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return  # the driver is gone
        if task is None:
            return
        outcome = worker.run(task)
        try:
            conn.send(("outcome", outcome))
        except OSError:  # BrokenPipeError: the driver stopped (SIGTERM, Ctrl-C) meanwhile
            return


@contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """os.environ with `values` set, restored after: spawn copies the environment at start."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

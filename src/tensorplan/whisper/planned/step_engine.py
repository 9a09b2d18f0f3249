"""One engine per model: every active decoding's next step in one batched decoder pass.

Each request keeps its own sequential seek loop (decoding/seek_loop.py: fallback, conditioning,
no-speech, word timestamps) on its own thread, over an `EngineStream` (whisper/engine.py)
instead of a session of its own. The stream hands the model's work to this engine, whose
one thread owns the only `WhisperSession` and runs, in turn:

- one batched decoder step over every decoding task that asked for its next logits (a
  task: one DecodingTask, G rows: 1 greedy, beam_size or best_of), per group size G, on
  the `WindowBatch` planned for (windows, G) with its prefix and context-bucket graphs;
- then one "solo" job from a FIFO: encode a window, feed a task's prompt (on the model's
  one-window decoder graphs, exactly as a lone session would), or align words.

Where the backend lets two threads split the cores (PyTorch's CPU kernels: `encodes_aside`),
windows encode on a second session, on a thread of its own, beside the decoder steps (a
window asked for while the engine is idle is encoded on the engine's thread, where it is
decoded next); while that thread is busy and windows wait, the engine's thread encodes
them too when it has nothing else to do. Each thread computes on its part of the cores
while both work (machine.computing), on all of them alone. PyTorch's products may round
differently on another thread count (float32 here; int8 on 4 cores or more), so on
PyTorch an engine's window can differ from a lone session's in the last bits, as its
batched steps already may; on numpy's kernels the engine encodes on its own thread only,
and stays exact.

A task takes a window slot of its group's batch at its first step (its prompt's KV rows
and its window's cross K/V are copied in) and frees it when it finishes; the last task
moves into the freed slot, so the smallest prefix graph keeps covering what is active.
A stream has at most one job waiting at a time, so a long file's windows queue behind
a short request's one encoder window, never ahead of all of them (fairness).

Numerics: a task's prompt is computed alone, as a lone session computes it. Its steps
share linear layers with the other tasks' rows: OpenBLAS picks its kernel by the
product's row count (gemv for one row, small-matrix and gemm paths above), so a row's
logits can differ in the last bits with the batch around it (docs/engine.md gives the
measured size); tokens, and so transcripts, have been equal on every clip tested.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tensorplan import ops
from tensorplan.backends import threads
from tensorplan.machine import computing
from tensorplan.tensor import Tensor
from tensorplan.whisper.planned.session import NonFiniteError, WhisperSession
from tensorplan.whisper.planned.window_batch import WindowBatch

DEFAULT_WINDOWS = 8  # window slots per group size: tasks decoding at once
GATHER_SECONDS = 0.01  # how long a step waits for active tasks still choosing their token


class EngineClosed(RuntimeError):
    """The engine stopped (the server is shutting down) before the work was done."""


@dataclass(eq=False)
class Task:
    """One decoding (a DecodingTask's rows) as the engine sees it."""

    stream: Any  # the EngineStream whose window it decodes
    n_group: int
    n_cached: int = 0  # KV rows written per sequence
    prompt_kv: list[np.ndarray] | None = None  # (n, d) per cache tensor, until it joins
    slot: int | None = None  # its window slot in the group's batch, once joined
    solo: Any = None  # its KVInference while it decodes alone on the session's own graphs
    sources: list[int] | None = None  # a beam reorder to apply before its next step
    pending: np.ndarray | None = None  # the last token of each row, for the next step
    result: Any = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)


@dataclass(eq=False)
class _Job:
    run: Callable[[], Any]
    stream: Any  # whose window the job puts in the session's own graphs (None: no one's)
    result: Any = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)


@dataclass(eq=False)
class _Encode:
    """A window waiting for the encoder (either session's: whichever thread is free)."""

    stream: Any
    mel: np.ndarray
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)


class _Group:
    """The tasks of one group size over their WindowBatch."""

    def __init__(self, batch: WindowBatch) -> None:
        self.batch = batch
        self.slots: list[Task | None] = [None] * batch.n_windows
        self.cross_views: dict[int, list[Tensor]] = {}

    @property
    def active(self) -> list[Task]:
        return [t for t in self.slots if t is not None]

    def free_slot(self) -> int | None:
        return next((i for i, t in enumerate(self.slots) if t is None), None)

    def width(self) -> int:
        """Slots up to the last taken one: what a step's prefix graph must cover."""
        return max((i + 1 for i, t in enumerate(self.slots) if t is not None), default=0)


class StepEngine:
    """The batching thread over one model (see the module docstring)."""

    def __init__(self, model: Any, windows: int = DEFAULT_WINDOWS,
                 gather_seconds: float = GATHER_SECONDS) -> None:
        if windows < 1:
            raise ValueError(f"windows must be at least 1, got {windows}")
        self.model, self.windows, self.gather_seconds = model, windows, gather_seconds
        self.session = WhisperSession(model)
        # windows encode on a session and thread of their own, beside the decoder steps
        # (engine_bytes counts that session by the same rule)
        self._encoder = WhisperSession(model) if encodes_aside(model) else None
        self._encodes: deque[_Encode] = deque()
        self._encoder_busy = False
        self._working = False  # the engine's thread runs steps, a job or a window now
        self.encoded_aside = 0  # windows the encoder's thread encoded
        self._groups: dict[int, _Group] = {}
        self._cond = threading.Condition()
        self._jobs: deque[_Job] = deque()
        self._joining: deque[Task] = deque()  # asked for a step, waiting for a slot
        self._held: Any = None  # the stream whose window the session's own graphs hold
        self._solo: Task | None = None  # the one task decoding alone (none other active)
        # each admitted stream's window (cross K/V) between its decodings: allocated and
        # touched once, so the engine's memory is known at start and never grows
        shapes = [(t.shape, np.dtype(t.dtype.name)) for pair in model.kv_cross for t in pair]
        self._parking: list[list[np.ndarray]] = [[np.ones(shape, dtype) for shape, dtype
                                                  in shapes] for _ in range(windows)]
        self._closed = False
        self.steps = 0  # batched decoder passes run
        self.rows_stepped = 0  # task steps they carried (rows / G)
        self.solo_jobs = 0
        self.decodings = 0  # prompts fed: decodings started (a fallback starts another)
        self._thread = threading.Thread(target=self._loop, name="tensorplan-engine",
                                        daemon=True)
        self._thread.start()
        self._encoder_thread: threading.Thread | None = None
        if self._encoder is not None:
            self._encoder_thread = threading.Thread(target=self._encode_loop,
                                                    name="tensorplan-encoder", daemon=True)
            self._encoder_thread.start()

    # ---- called from request threads ----------------------------------------------------
    def call(self, fn: Callable[[], Any], stream: Any = None) -> Any:
        """Run fn on the engine thread between steps (FIFO); its result or its error.
        `stream`: the stream whose window fn loads into the session's own graphs (a task
        decoding alone there for another stream moves into the batch first)."""
        job = _Job(fn, stream)
        self._hand_over(lambda: (self._jobs, job))
        return job.result

    def encode_window(self, stream: Any, mel: np.ndarray) -> None:
        """Encode a window into the stream's store (stream.cross): on the encoder's own
        thread when there is one and the engine is not idle, else as a job between
        steps."""
        # chosen and queued at once: two windows asked for together go one to each thread
        self._hand_over(lambda: (self._jobs, _Job(lambda: self.encode(stream, mel), stream))
                        if self._encoder is None or self._idle()
                        else (self._encodes, _Encode(stream, mel)))

    def _idle(self) -> bool:
        """Nothing decodes, waits or encodes (the caller holds the lock): a window is then
        encoded on the engine's own thread and session, which its decoding reads next (no
        copy in, no second thread waking up). One jfk request in process: 0.935 ->
        0.97-0.98 of a lone session's speed; the encoder's thread earns its keep only
        beside decoder steps."""
        return not (self._working or self._active() or self._joining or self._jobs
                    or self._encodes or self._encoder_busy)

    def _hand_over(self, choose: Callable[[], tuple[deque[Any], _Job | _Encode]]) -> None:
        """Queue a job for the engine's threads (`choose`, under the lock, says which
        queue and job) and wait for it; its error is raised here."""
        with self._cond:
            if self._closed:
                raise EngineClosed("the engine is closed")
            queue, job = choose()
            queue.append(job)
            self._cond.notify_all()
        job.done.wait()
        if job.error is not None:
            raise job.error

    def step(self, task: Task, last_tokens: np.ndarray) -> np.ndarray:
        """Feed one token per row of a task at its next position; its logits (G, V)."""
        with self._cond:
            if self._closed:
                raise EngineClosed("the engine is closed")
            task.pending, task.result, task.error = last_tokens, None, None
            task.done.clear()
            if task.slot is None and task.solo is None and task not in self._joining:
                self._joining.append(task)
            self._cond.notify_all()
        task.done.wait()
        if task.error is not None:
            raise task.error
        return np.asarray(task.result)

    def park(self) -> list[np.ndarray]:
        """A free window store for a stream (waits while every one is taken)."""
        with self._cond:
            self._cond.wait_for(lambda: self._parking or self._closed)
            if self._closed:
                raise EngineClosed("the engine is closed")
            return self._parking.pop()

    def unpark(self, store: list[np.ndarray]) -> None:
        with self._cond:
            self._parking.append(store)
            self._cond.notify_all()

    def prepare(self, n_group: int) -> None:
        """Plan and bind the batch of a group size now, every byte of it touched, so the
        engine's memory is reached at start, not under load."""
        self.call(lambda: self._prepare(n_group))

    def finish(self, task: Task) -> None:
        """The task is over (finished, failed or cancelled): free its slot."""
        self.call(lambda: self._leave(task), None)

    def stats(self) -> dict[str, int]:
        with self._cond:
            return {"engine_tasks": len(self._active()),
                    "engine_waiting": len(self._joining), "engine_jobs": len(self._jobs),
                    "engine_steps": self.steps, "engine_task_steps": self.rows_stepped,
                    "engine_decodings": self.decodings,
                    "engine_encoded_aside": self.encoded_aside}

    @property
    def nbytes(self) -> int:
        """Bytes the engine holds: its session (whose buffers include the batches it has
        bound: counting those again reported 907 MiB for tiny.en's 548), the encoder's
        session where it has one, and its streams' window stores."""
        encoder = self._encoder.nbytes if self._encoder is not None else 0
        return int(self.session.nbytes + encoder + self.model.window_store_bytes * self.windows)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()
        if self._encoder_thread is not None:
            self._encoder_thread.join()
        self.session.close()
        if self._encoder is not None:
            self._encoder.close()

    # ---- the engine thread --------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cond:
                while not (self._closed or self._jobs or self._ready_tasks()
                           or self._admittable() or (self._encodes and self._encoder_busy)):
                    self._cond.wait()
                if self._closed:
                    self._fail_all(EngineClosed("the engine is closed"))
                    return
                self._admit()
                self._gather()
                ready = self._ready_tasks()
                job = self._jobs.popleft() if self._jobs else None
                # nothing else to do while the encoder's thread is busy: encode a waiting
                # window here too (alone, that thread left this one idle while windows
                # queued)
                window = self._encodes.popleft() if not (ready or job) and \
                    self._encodes and self._encoder_busy else None
                self._working = bool(ready or job or window)
            try:
                with computing():  # the cores are shared with the encoder's thread, if busy
                    if ready:
                        self._run_steps(ready)
                    if job is not None:
                        self._run_job(job)
                    if window is not None:
                        self._encode_here(window)
            finally:
                with self._cond:
                    self._working = False

    def _encode_loop(self) -> None:
        """The encoder's thread: windows in arrival order (one per stream at a time)."""
        # a first pass over silence, alone and on every core: PyTorch's compute pool is
        # per OS thread and grows at the first kernel that asks for more threads, so this
        # thread's is made at start, not under load (a 16-client test saw the server's
        # threads grow by one once the engine encoded lone windows on its own thread)
        assert self._encoder is not None
        self._encoder.encode(np.zeros(self.model.mel.shape, np.float32))
        while True:
            with self._cond:
                while not (self._closed or self._encodes):
                    self._cond.wait()
                if self._closed:
                    for job in self._encodes:
                        job.error = EngineClosed("the engine is closed")
                        job.done.set()
                    self._encodes.clear()
                    return
                job = self._encodes.popleft()
                self._encoder_busy = True
                self._cond.notify_all()  # the engine's thread may take the next one
            try:
                with computing():
                    self._encode_aside(job.stream, job.mel)
                self.encoded_aside += 1
            except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
                job.error = e
            finally:
                with self._cond:
                    self._encoder_busy = False
            job.done.set()

    def _encode_here(self, window: _Encode) -> None:
        """A waiting window, encoded on the engine's own session (its thread)."""
        job = _Job(lambda: self.encode(window.stream, window.mel), window.stream)
        self._run_job(job)
        window.error = job.error
        window.done.set()

    def _gather(self) -> None:
        """Wait (briefly) until every task holding a slot asked for its next step, so one
        pass carries them all; a task busy elsewhere is not waited for past the limit."""
        deadline = time.monotonic() + self.gather_seconds
        while not self._closed:
            active = self._active()
            if not active or all(t.pending is not None for t in active):
                return
            if not any(t.pending is not None for t in active):
                return  # nothing to step yet: the jobs go first
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._cond.wait(left)

    def _active(self) -> list[Task]:
        solo = [self._solo] if self._solo is not None else []
        return solo + [t for g in self._groups.values() for t in g.active]

    def _ready_tasks(self) -> list[Task]:
        return [t for t in self._active() if t.pending is not None]

    def _admittable(self) -> bool:
        for task in self._joining:
            group = self._groups.get(task.n_group)
            if group is None or group.free_slot() is not None:
                return True
        return False

    def _admit(self) -> None:
        """Tasks waiting for a slot take free ones, in arrival order."""
        waiting: deque[Task] = deque()
        while self._joining:
            task = self._joining.popleft()
            group = self._group(task.n_group)
            slot = group.free_slot()
            if slot is None:
                waiting.append(task)
                continue
            group.slots[slot] = task
            task.slot = slot
            self._join(group, task)
        self._joining = waiting

    def _group(self, n_group: int) -> _Group:
        group = self._groups.get(n_group)
        if group is None:
            group = _Group(self.model.window_batch(self.windows, n_group))
            with self._cond:  # request threads read the groups (_idle, stats)
                self._groups[n_group] = group
        return group

    def _join(self, group: _Group, task: Task) -> None:
        """Copy the task's window (cross K/V) and prompt (KV rows) into its slot."""
        assert task.slot is not None and task.prompt_kv is not None
        batch, ex = group.batch, self.session.batch_executor(group.batch)
        for view, value in zip(self._cross_views(group, task.slot), task.stream.cross,
                               strict=True):
            ex.set(view, value)
        g, n = batch.n_group, task.n_cached
        first = task.slot * g
        caches = [c for pair in batch.kv_self for c in pair]
        for cache, rows in zip(caches, task.prompt_kv, strict=True):
            ex.set(_rows(cache, batch.n_seq, first, n), rows)
            if g > 1:  # beams and samples share the prompt
                ex.copy_slots(cache, batch.n_seq, [first] * (g - 1), n,
                              targets=list(range(first + 1, first + g)))
        task.prompt_kv = None

    def _cross_views(self, group: _Group, slot: int) -> list[Tensor]:
        views = group.cross_views.get(slot)
        if views is None:
            views = group.cross_views[slot] = [t for pair in group.batch.slots[slot]
                                               for t in pair]
        return views

    def _run_steps(self, ready: list[Task]) -> None:
        by_group: dict[int, list[Task]] = {}
        for t in ready:
            if t.solo is not None:
                try:
                    self._solo_step(t)
                except BaseException as e:  # noqa: BLE001 - handed to the task's thread
                    self._fail(t, e)
                continue
            by_group.setdefault(t.n_group, []).append(t)
        for n_group, tasks in by_group.items():
            group = self._groups[n_group]
            try:
                self._step(group, tasks)
            except BaseException as e:  # noqa: BLE001 - handed to the tasks' threads
                for t in tasks:
                    self._fail(t, e)

    def _step(self, group: _Group, tasks: list[Task]) -> None:
        batch, g = group.batch, group.batch.n_group
        self._reorder(group, tasks)
        sizes = batch.for_windows(group.width())
        n_seq = sizes.n_seq
        tok = np.zeros(n_seq, np.int32)
        pos = np.zeros(n_seq, np.int64)
        stepping = set(tasks)
        for slot in range(sizes.n_windows):
            t = group.slots[slot]
            if t is None:
                continue  # a free slot computes into its own rows, rewritten on join
            rows = slice(slot * g, (slot + 1) * g)
            pos[rows] = t.n_cached  # a task not stepping now rewrites its next row only
            if t in stepping and t.pending is not None:
                tok[rows] = t.pending
        graph = sizes.step(int(pos.max()) + 1)
        logits = self.session.run_batch(batch, sizes, graph, tok[:, None], pos[:, None],
                                        np.arange(n_seq), check=False)
        self.steps += 1
        self.rows_stepped += len(tasks)
        with self._cond:
            for t in tasks:
                assert t.slot is not None
                mine = logits[t.slot * g : (t.slot + 1) * g]
                t.pending = None
                if not np.isfinite(mine).all():
                    t.error = NonFiniteError("the decoder produced non-finite logits")
                else:
                    t.n_cached += 1
                    t.result = mine
                t.done.set()

    def _reorder(self, group: _Group, tasks: list[Task]) -> None:
        """Apply the beam reorders the tasks asked for since their last step."""
        batch, g = group.batch, group.batch.n_group
        sources = list(range(batch.n_seq))
        n_ctx = 0
        for t in tasks:
            if t.sources is None:
                continue
            assert t.slot is not None
            first = t.slot * g
            sources[first : first + g] = [first + s for s in t.sources]
            n_ctx = max(n_ctx, t.n_cached)
            t.sources = None
        if n_ctx:
            self.session.reorder_batch_kv(batch, sources, n_ctx)

    def _leave(self, task: Task) -> None:
        """Free the task's slot; the task in the last slot moves in (keeps prefixes small)."""
        with self._cond:
            if task in self._joining:
                self._joining.remove(task)
        if task.solo is not None:
            task.solo.cleanup_caching()
            task.solo = None
            if self._solo is task:
                self._solo = None
        if task.slot is None:
            return
        group = self._groups[task.n_group]
        freed, task.slot = task.slot, None
        group.slots[freed] = None
        if task.error is not None and isinstance(task.error, NonFiniteError):
            self._zero_slot(group, freed)  # a NaN row must not reach the next task
        last = group.width() - 1
        if last > freed:
            mover = group.slots[last]
            assert mover is not None
            self._move(group, last, freed, mover.n_cached + 1)
            group.slots[freed], group.slots[last] = mover, None
            mover.slot = freed

    def _move(self, group: _Group, source: int, target: int, n_ctx: int) -> None:
        batch, g = group.batch, group.batch.n_group
        ex = self.session.batch_executor(batch)
        for k, v in batch.kv_cross:
            for cross in (k, v):
                ex.copy_slots(cross, batch.n_windows, [source],
                              cross.shape[0] // batch.n_windows, targets=[target])
        for k, v in batch.kv_self:
            for cache in (k, v):
                ex.copy_slots(cache, batch.n_seq, [source * g + i for i in range(g)], n_ctx,
                              targets=[target * g + i for i in range(g)])

    def _zero_slot(self, group: _Group, slot: int) -> None:
        batch, g = group.batch, group.batch.n_group
        ex = self.session.batch_executor(batch)
        t_ctx = self.model.dims.n_text_ctx
        for cache in (c for pair in batch.kv_self for c in pair):
            ex.set(_rows(cache, batch.n_seq, slot * g, g * t_ctx),
                   np.zeros((g * t_ctx, cache.shape[1]), np.float32))

    def _run_job(self, job: _Job) -> None:
        try:
            solo = self._solo
            if solo is not None and job.stream is not None and job.stream is not solo.stream:
                self._evict(solo)
            job.result = job.run()
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            job.error = e
        self.solo_jobs += 1
        job.done.set()

    def _fail(self, task: Task, error: BaseException) -> None:
        with self._cond:
            task.pending, task.error = None, error
            task.done.set()

    def _fail_all(self, error: BaseException) -> None:
        for job in self._jobs:
            job.error = error
            job.done.set()
        self._jobs.clear()
        for t in [*self._joining, *(t for g in self._groups.values() for t in g.active)]:
            if t.pending is not None or not t.done.is_set():
                t.error = error
                t.done.set()
        self._joining.clear()

    # ---- solo work, on the session's own one-window graphs (engine thread) --------------
    def hold(self, stream: Any) -> None:
        """Make the stream's window the one the session's own graphs attend to."""
        if self._held is stream:
            return
        ex = self.session.executor
        for t, value in zip((c for pair in self.model.kv_cross for c in pair), stream.cross,
                            strict=True):
            ex.set(t, value)
        self._held = stream

    def encode(self, stream: Any, mel: np.ndarray) -> None:
        """Encode a window; keep its cross K/V in the stream's store (stream.cross)."""
        self._encode_on(self.session, stream, mel)
        self._held = stream

    def _encode_aside(self, stream: Any, mel: np.ndarray) -> None:
        """encode() on the encoder's session (its thread). The engine's session no longer
        holds the stream's current window, if it held its last one."""
        assert self._encoder is not None
        self._encode_on(self._encoder, stream, mel)
        with self._cond:
            if self._held is stream:
                self._held = None

    def _encode_on(self, session: WhisperSession, stream: Any, mel: np.ndarray) -> None:
        """Encode a window on `session`'s graphs, its cross K/V copied to stream.cross."""
        session.encode(mel)
        ex = session.executor
        for t, store in zip((t for pair in self.model.kv_cross for t in pair), stream.cross,
                            strict=True):
            np.copyto(store, ex.get(t))

    def prompt(self, task: Task, tokens: np.ndarray, positions: Sequence[int]) -> np.ndarray:
        """Feed a task's first tokens (one sequence: its rows share them) alone; keep the
        KV rows they wrote for its join. Logits (1, len(positions), V)."""
        self.hold(task.stream)
        self.decodings += 1
        n = tokens.shape[1]
        with self._cond:
            alone = not self._active() and not self._joining
        if alone and task.n_group <= self.model.max_batch:
            # nobody to batch with: decode as a lone session does, on its own graphs
            task.solo = self.session.inference(task.n_group)
            out = task.solo.logits(np.repeat(tokens, task.n_group, axis=0), positions)
            task.n_cached = n
            with self._cond:
                self._solo = task
            return np.asarray(out)[:1]
        inference = self.session.inference(1)
        out = inference.logits(tokens, positions)
        ex = self.session.executor
        caches = [c for pair in self.model.kv_self for c in pair]
        task.prompt_kv = [np.asarray(ex.get(c))[:n].copy() for c in caches]
        task.n_cached = n
        return np.asarray(out)

    def _prepare(self, n_group: int) -> None:
        group = self._group(n_group)
        batch = group.batch
        ex = self.session.batch_executor(batch)
        for t in (t for pair in (*batch.kv_cross, *batch.kv_self) for t in pair):
            ex.set(t, np.zeros(t.shape, np.dtype(t.dtype.name)))
        sizes = batch.sizes[-1]  # the full batch at its longest context
        zeros = np.zeros((sizes.n_seq, 1), np.int32)
        self.session.run_batch(batch, sizes, sizes.steps[-1], zeros, zeros,
                               np.arange(sizes.n_seq), check=False)

    def _solo_step(self, task: Task) -> None:
        """One step of the task decoding alone, exactly as a lone session steps."""
        inference = task.solo
        if task.sources is not None:
            inference.rearrange_kv_cache(task.sources)
            task.sources = None
        tokens = np.zeros((task.n_group, task.n_cached + 1), np.int32)
        assert task.pending is not None
        tokens[:, -1] = task.pending
        logits = inference.logits(tokens)[:, -1]
        self.steps += 1
        self.rows_stepped += 1
        with self._cond:
            task.pending, task.result = None, logits
            task.n_cached += 1
            task.done.set()

    def _evict(self, task: Task) -> None:
        """Another stream needs the session's own graphs: the task decoding alone there
        moves into a slot of its group's batch (its KV rows and window copied in)."""
        group = self._group(task.n_group)
        slot = group.free_slot()
        assert slot is not None, "a task decodes alone only while no other is active"
        batch, g, n = group.batch, group.batch.n_group, task.n_cached
        ex = self.session.batch_executor(batch)
        for view, value in zip(self._cross_views(group, slot), task.stream.cross,
                               strict=True):
            ex.set(view, value)
        own = [c for pair in self.model.kv_self for c in pair]
        batched = [c for pair in batch.kv_self for c in pair]
        for mine, theirs in zip(own, batched, strict=True):
            for i in range(g):
                rows = ex.get(_rows(mine, self.model.max_batch, i, n))
                ex.set(_rows(theirs, batch.n_seq, slot * g + i, n), rows)
        task.solo = None
        with self._cond:
            group.slots[slot] = task
            task.slot = slot
            self._solo = None


def encodes_aside(model: Any) -> bool:
    """Whether an engine over `model` encodes on a session and thread of its own: where
    its backend lets two threads split the cores (PyTorch's CPU kernels) and there are
    two to split. On 2 cores (tiny.en int8, AMX, 8 clients of jfk in process) it went
    from 1.12-1.28 to 1.36-1.61 times the sequential throughput (docs/engine.md): the
    decoder's steps ran beside encoder passes, and the engine's thread encodes too when
    idle."""
    return bool(getattr(model.backend, "shares_cores", False)) and threads.count() >= 2


def _rows(cache: Tensor, n_seq: int, first_seq: int, n_rows: int) -> Tensor:
    """A view of n_rows rows of a KV cache from sequence first_seq's first row."""
    per_seq = cache.shape[0] // n_seq
    row = cache.shape[1] * cache.dtype.itemsize
    return ops.view(cache, (n_rows, cache.shape[1]), offset=first_seq * per_seq * row)

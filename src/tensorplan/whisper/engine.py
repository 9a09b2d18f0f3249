"""A request's view of the step engine (planned/step_engine.py): the sessions the seek loop
runs over.

`EngineStream` is a `DecodingSession` (decoding/window.py) and what the word aligner asks of a
session, but holds no arena of its own: encoding, prompts and alignment run as jobs on
the engine's thread, and each decoding step joins the engine's next batched pass. The
seek loop, temperature fallback, conditioning and word timestamps run unchanged on the
request's own thread. `Engine` is the public face (`Whisper.engine()`); its sessions
are `api.Session`s whose work goes through the engine.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np

from tensorplan.machine import computing
from tensorplan.whisper.api import Audio, Session
from tensorplan.whisper.options import TranscribeOptions
from tensorplan.whisper.planned.session import Alignment
from tensorplan.whisper.planned.step_engine import DEFAULT_WINDOWS, GATHER_SECONDS, StepEngine, Task
from tensorplan.whisper.result import TranscriptionResult

if TYPE_CHECKING:
    from tensorplan.whisper.api import Whisper


class EngineStream:
    """One request's window and decodings, over the shared engine."""

    def __init__(self, engine: StepEngine, check: Callable[[], None] | None = None) -> None:
        model = engine.model
        self.engine, self.model = engine, model
        self.dims, self.tokenizer, self.config = model.dims, model.tokenizer, model.config
        self.is_multilingual = model.is_multilingual
        self.cross: list[np.ndarray] = []  # the encoded window's cross K/V (its store)
        self.check = check or (lambda: None)  # raises to stop the request (cancellation)

    def encode(self, mel: np.ndarray) -> None:
        self.check()
        if not self.cross:
            self.cross = self.engine.park()  # held until close(): one window at a time
        self.engine.encode_window(self, mel)

    def inference(self, n_batch: int) -> EngineInference:
        return EngineInference(self, n_batch)

    def align(self, tokens: Sequence[int], rows: Sequence[int]) -> Alignment:
        self.check()
        engine = self.engine

        def run() -> Alignment:
            engine.hold(self)
            return engine.session.align(tokens, rows)

        return engine.call(run, self)  # type: ignore[no-any-return]

    def reset(self) -> None:
        """Nothing to zero: a failed task's rows are cleared by the engine."""

    def close(self) -> None:
        """Give the window store back (the stream is done with its audio)."""
        if self.cross:
            store, self.cross = self.cross, []
            self.engine.unpark(store)


class EngineInference:
    """decoding.Inference through the engine: the first call feeds the prompt alone,
    each later call one token per row in the engine's next batched step."""

    def __init__(self, stream: EngineStream, n_batch: int) -> None:
        self.stream = stream
        self.task = Task(stream, n_batch)

    def logits(self, tokens: np.ndarray, positions: Sequence[int] | None = None) -> np.ndarray:
        self.stream.check()
        tokens = np.asarray(tokens, np.int32)
        b, n_ctx = tokens.shape
        positions = [n_ctx - 1] if positions is None else list(positions)
        task, engine = self.task, self.stream.engine
        if b != task.n_group:
            raise ValueError(f"{b} rows fed to a decoding of {task.n_group}")
        if task.n_cached == 0:
            if not (tokens == tokens[:1]).all():
                raise ValueError("the rows of a decoding start from the same tokens")
            first = tokens[:1]
            out = engine.call(lambda: engine.prompt(task, first, positions), self.stream)
            return np.repeat(out, b, axis=0)
        if n_ctx != task.n_cached + 1 or positions != [n_ctx - 1]:
            raise ValueError("after its prompt, a decoding feeds one token per row and "
                             "asks for its logits")
        return engine.step(task, tokens[:, -1].copy())[:, None, :]

    def rearrange_kv_cache(self, source_indices: Sequence[int]) -> None:
        sources = list(source_indices)
        if len(sources) != self.task.n_group:
            raise ValueError("a beam reorder keeps the decoding's number of rows")
        if sources == list(range(len(sources))):
            return
        before = self.task.sources  # not yet applied: compose
        self.task.sources = sources if before is None else [before[s] for s in sources]

    def cleanup_caching(self) -> None:
        task = self.task
        self.stream.engine.finish(task)
        self.task = Task(self.stream, task.n_group)


class EngineSession(Session):
    """An api.Session whose model work runs on the engine (it holds no arena)."""

    def __init__(self, whisper: Whisper, engine: StepEngine,
                 check: Callable[[], None] | None = None) -> None:
        self.whisper = whisper
        self.state = EngineStream(engine, check)  # type: ignore[assignment]
        self.dirty = False
        self.closed = False
        self._busy = threading.Lock()

    def transcribe(self, *args: Any, **kwargs: Any) -> TranscriptionResult:
        """As Session.transcribe; the stream's window store is given back after."""
        try:
            return super().transcribe(*args, **kwargs)
        finally:
            self.state.close()

    def _run_batched(self, samples: np.ndarray, opts: TranscribeOptions,
                     on_segment: Any, progress: Any, vad_options: Any) -> TranscriptionResult:
        """The batched long-file pipeline keeps a session of its own (not yet on the
        engine: its batch would decode in lockstep with the engine's), and shares the
        cores with the engine's threads while it computes."""
        with self.whisper.pool.borrow() as session, computing():
            return session._run_batched(samples, opts, on_segment, progress, vad_options)


class Engine:
    """Continuous batching over one model: `session()` gives a stream whose decoding
    steps share the engine's batched passes with every other stream's."""

    def __init__(self, whisper: Whisper, windows: int = DEFAULT_WINDOWS,
                 gather_seconds: float = GATHER_SECONDS,
                 prepare: Sequence[int] = ()) -> None:
        self.whisper = whisper
        self.core = StepEngine(whisper.model, windows, gather_seconds)
        for n_group in prepare:  # group sizes whose batches are made (and touched) now
            self.core.prepare(n_group)

    @property
    def windows(self) -> int:
        return self.core.windows

    @property
    def nbytes(self) -> int:
        return self.core.nbytes

    def session(self, check: Callable[[], None] | None = None) -> EngineSession:
        """A stream over the engine (one transcription at a time); `check` is called
        before each model call and may raise to stop the transcription."""
        return EngineSession(self.whisper, self.core, check)

    @contextmanager
    def borrow(self, check: Callable[[], None] | None = None) -> Iterator[EngineSession]:
        yield self.session(check)

    def transcribe(self, audio: Audio, options: TranscribeOptions | None = None,
                   **kwargs: Any) -> TranscriptionResult:
        """Like Whisper.transcribe, on the engine: safe from many threads at once."""
        return self.session().transcribe(audio, options, **kwargs)

    def stats(self) -> dict[str, int]:
        return self.core.stats()

    def close(self) -> None:
        self.core.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""A transcription that runs on callbacks, read as a lazy generator (faster-whisper's
`segments, info = model.transcribe(...)`: nothing is decoded until the loop asks).

The decode runs in a thread of its own from the first `next()`, handing each segment over
a queue of `AHEAD` places: it decodes at most that far ahead of the reader, so a reader
that stops (break, `close()`, the generator collected) stops the decode at its next
segment or window, and the thread is joined before the generator finishes.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from tensorplan.whisper.result import Segment

T = TypeVar("T")
AHEAD = 1  # segments decoded ahead of the reader
POLL_SECONDS = 0.1  # how often a decode blocked on a full queue checks for a gone reader

OnSegment = Callable[[Segment], None]
OnProgress = Callable[[int, int], None]
Run = Callable[[OnSegment, OnProgress], Any]


class _ReaderGone(Exception):
    """Raised inside the decode once nobody reads its segments: it ends the run."""


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


_DONE = object()


def segments_as_decoded(run: Run, convert: Callable[[Segment], T],
                        progress: OnProgress | None = None) -> Iterator[T]:
    """Call `run(on_segment, on_progress)` in a thread; yield `convert(segment)` for each
    segment as it arrives. An error in the run is raised from the generator."""
    handover: queue.Queue[object] = queue.Queue(maxsize=AHEAD)
    gone = threading.Event()

    def put(item: object) -> None:
        while not gone.is_set():
            try:
                handover.put(item, timeout=POLL_SECONDS)
                return
            except queue.Full:
                continue
        raise _ReaderGone

    def on_progress(done: int, total: int) -> None:
        if gone.is_set():  # between windows: end a run whose windows hold no segments
            raise _ReaderGone
        if progress is not None:
            progress(done, total)

    def work() -> None:
        try:
            run(put, on_progress)
            put(_DONE)
        except _ReaderGone:
            pass
        except BaseException as e:  # handed to the reader, raised there
            try:
                put(_Failed(e))
            except _ReaderGone:
                pass

    thread = threading.Thread(target=work, name="tensorplan-segments", daemon=True)
    thread.start()
    try:
        while True:
            item = handover.get()
            if item is _DONE:
                return
            if isinstance(item, _Failed):
                raise item.error
            assert isinstance(item, Segment)
            yield convert(item)
    finally:
        gone.set()
        thread.join()

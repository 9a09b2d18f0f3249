"""Decoding updates of many live streams on a few worker threads, round robin.

A stream's state lives in its `LiveStream`; an update borrows a whisper `Session` from the
lender only for its decode, so 32 open streams need no more sessions than workers. Streams
wait in a ring: a worker takes the first one with work (and not being updated by another)
and puts it at the back, so every stream with work gets its turn before any gets two.
In a server with the step engine, updates running at once share the cores with each
other and with the engine (a lone one takes them all): on 2 cores, two encoder passes of
one thread each finish more windows a second than one pass on both.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from tensorplan.live.events import Event
from tensorplan.live.options import LiveOptions, TurnDetection
from tensorplan.live.stream import LiveStream
from tensorplan.machine import computing

log = logging.getLogger("tensorplan.live")

# lends a whisper Session for one decode: the server's pool, or a command's one session
SessionLender = Callable[[], AbstractContextManager[Any]]


class LiveEngine:
    def __init__(self, lend: SessionLender, workers: int = 1, share_cores: bool = False
                 ) -> None:
        """share_cores: updates share the process's cores with the other work computing
        at the time (machine.computing), for a process whose pools have every core (a
        server with the step engine); else each update computes on the process's count,
        sized for its session."""
        self._lend = lend
        self._sharing = computing if share_cores else nullcontext
        self._cond = threading.Condition()
        self._ring: deque[LiveStream] = deque()
        self._stopping = False
        self.opened = 0
        self.decodes = 0
        self.max_span_s = 0.0
        self.updating = 0
        self._threads = [threading.Thread(target=self._work, name=f"tensorplan-live-{i}",
                                          daemon=True) for i in range(workers)]
        for t in self._threads:
            t.start()

    def open(self, options: LiveOptions, detection: TurnDetection | None,
             emit: Callable[[list[Event]], None]) -> LiveStream:
        stream = LiveStream(options, detection, emit, wake=self.wake)
        with self._cond:
            self._ring.append(stream)
            self.opened += 1
        return stream

    def close(self, stream: LiveStream) -> None:
        """Forget `stream` (an update in progress finishes; its events go nowhere)."""
        with self._cond:
            stream.closed = True
            if stream in self._ring:
                self._ring.remove(stream)
        stream.detach()

    @property
    def streams(self) -> int:
        """Streams open now."""
        with self._cond:
            return len(self._ring)

    def wake(self) -> None:
        with self._cond:
            self._cond.notify()

    def stats(self) -> dict[str, Any]:
        with self._cond:
            return {"live_streams": len(self._ring), "live_streams_opened": self.opened,
                    "live_updating": self.updating, "live_decodes": self.decodes,
                    "live_max_decode_s": round(self.max_span_s, 3)}

    def shutdown(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        for t in self._threads:
            t.join(timeout=60)

    def _next(self) -> LiveStream | None:
        for _ in range(len(self._ring)):
            stream = self._ring[0]
            self._ring.rotate(-1)
            if not stream.busy and stream.has_work():
                stream.busy = True
                return stream
        return None

    def _work(self) -> None:
        while True:
            with self._cond:
                stream = None
                while not self._stopping and (stream := self._next()) is None:
                    self._cond.wait(timeout=0.5)  # also a stream whose work is time-based
                if self._stopping or stream is None:
                    if stream is not None:
                        stream.busy = False
                    return
                self.updating += 1
            span = 0.0
            try:
                with self._lend() as session, self._sharing():
                    span = stream.step(session)
            except Exception as e:  # noqa: BLE001 - the stream's turn fails, not the worker
                stream.fail(e)
            finally:
                with self._cond:
                    stream.busy = False
                    self.updating -= 1
                    if span:
                        self.decodes += 1
                        self.max_span_s = max(self.max_span_s, span)
                    self._cond.notify()

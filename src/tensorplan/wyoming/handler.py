"""One Wyoming connection: events in, transcripts out.

transcribe (optional: language, model name) → audio-start → audio-chunk* → audio-stop, then
the server answers transcript-start, one transcript-chunk per segment as it is decoded,
transcript-stop and the whole transcript (clients that do not stream read only the last;
Home Assistant waits for `transcript`). A bad event or audio format gets an `error` event
and the connection carries on; a stream that no longer holds well-formed events
(framing.py) gets one and is closed; a client gone mid-decode is a quiet disconnect. The
decode runs in a thread, at most `sessions` at once.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from wyoming.asr import Transcribe, Transcript, TranscriptChunk, TranscriptStart, TranscriptStop
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe
from wyoming.ping import Ping, Pong
from wyoming.server import AsyncEventHandler

from tensorplan.errors import UserError
from tensorplan.whisper.api import Whisper
from tensorplan.whisper.options import TranscribeOptions
from tensorplan.whisper.result import Segment, TranscriptionResult
from tensorplan.wyoming.audio import BadAudio, Utterance, check_format
from tensorplan.wyoming.framing import BadFrame, read_event
from tensorplan.wyoming.info import describe, languages

log = logging.getLogger("tensorplan.wyoming")

# a client that reads nothing for this long is dropped: its writes must not wait forever
WRITE_TIMEOUT_S = 30.0
# and one that sends nothing for this long in the middle of an utterance: its audio is held
STALL_TIMEOUT_S = 60.0


@dataclass
class Shared:
    """What every connection shares: the model, the decoding defaults, the session bound."""

    whisper: Whisper
    model_name: str
    options: TranscribeOptions
    sessions: asyncio.Semaphore
    max_seconds: float
    max_connections: int  # open at once (--max-connections); one more is refused
    connections: int = 0  # open now (the event loop's thread only)


class Handler(AsyncEventHandler):
    def __init__(self, shared: Shared, *args: Any) -> None:
        super().__init__(*args)
        self.shared = shared
        self.language: str | None = None
        self.utterance: Utterance | None = None

    async def run(self) -> None:
        """The package's loop over events, reading them with bounded lengths (framing.py).
        Past `max_connections` open ones a new connection gets a busy error and is closed;
        one stalled mid-utterance for STALL_TIMEOUT_S is closed."""
        self._is_running = True
        shared = self.shared
        shared.connections += 1
        try:
            if shared.connections > shared.max_connections:
                log.warning("wyoming: %d connections open, refusing one more",
                            shared.max_connections)
                await self.error(f"server busy: {shared.max_connections} connections are "
                                 "open (--max-connections)", "busy")
                return
            while self._is_running:
                try:
                    event = await self._next_event()
                except BadFrame as e:
                    log.warning("wyoming: a client sent a malformed event: %s", e)
                    await self.error(str(e), "bad-request")
                    break
                if event is None or not await self.handle_event(event):
                    break
        except ConnectionError:
            pass  # gone while we wrote to it
        finally:
            shared.connections -= 1
            await self.disconnect()
            self.writer.close()

    async def _next_event(self) -> Event | None:
        """The next event; None where the client left or stalled mid-utterance."""
        if self.utterance is None:
            return await read_event(self.reader)
        try:
            return await asyncio.wait_for(read_event(self.reader), STALL_TIMEOUT_S)
        except asyncio.TimeoutError:
            log.info("wyoming: a client sent nothing for %g s mid-utterance", STALL_TIMEOUT_S)
            self.utterance = None
            await self.error(f"no audio for {STALL_TIMEOUT_S:g} s after audio-start: "
                             "closing", "timeout")
            return None

    async def write_event(self, event: Event) -> None:
        """Write and drain, as the package does, but give up on a client that reads
        nothing for WRITE_TIMEOUT_S (ConnectionError: it is gone)."""
        try:
            await asyncio.wait_for(super().write_event(event), WRITE_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise ConnectionError(f"the client read nothing for {WRITE_TIMEOUT_S:g} s") \
                from None

    async def handle_event(self, event: Event) -> bool:
        """False ends the connection: the client is gone."""
        try:
            await self._handle(event)
        except ConnectionError:
            log.info("wyoming: a client left during %s", event.type)
            self.utterance = None
            return False
        except (BadAudio, UserError, ValueError) as e:
            self.utterance = None
            await self.error(str(e), "bad-request")
        except Exception as e:  # an engine failure: reported, the connection lives on
            log.exception("wyoming: %s failed", event.type)
            self.utterance = None
            await self.error(f"transcription failed: {e}", "internal")
        return True

    async def _handle(self, event: Event) -> None:
        if Describe.is_type(event.type):
            await self.write_event(describe(self.shared.whisper, self.shared.model_name).event())
        elif Ping.is_type(event.type):
            await self.write_event(Pong(text=_parse(Ping, event).text).event())
        elif Transcribe.is_type(event.type):
            self.transcribe_request(_parse(Transcribe, event))
        elif AudioStart.is_type(event.type):
            start = _parse(AudioStart, event)
            self.utterance = None
            check_format(start.rate, start.width, start.channels)
            self.utterance = Utterance(self.shared.max_seconds)
        elif AudioChunk.is_type(event.type):
            if self.utterance is None:
                raise BadAudio("audio-chunk before audio-start")
            self.utterance.add(_parse(AudioChunk, event))
        elif AudioStop.is_type(event.type):
            if self.utterance is None:
                raise BadAudio("audio-stop before audio-start")
            utterance, self.utterance = self.utterance, None
            await self.transcribe(utterance)
        else:
            await self.error(f"unexpected event {event.type!r}: this server speaks asr "
                             "(describe, transcribe, audio-start/chunk/stop)", "bad-event")

    def transcribe_request(self, request: Transcribe) -> None:
        if request.name is not None and request.name not in (self.shared.model_name,
                                                             "tensorplan"):
            raise ValueError(f"transcribe: model {request.name!r} is not served here "
                             f"(this server has {self.shared.model_name})")
        if request.language is not None and request.language not in \
                languages(self.shared.whisper):
            raise ValueError(f"transcribe: language {request.language!r} is not supported "
                             f"by {self.shared.model_name}")
        self.language = request.language

    async def transcribe(self, utterance: Utterance) -> None:
        loop = asyncio.get_running_loop()
        texts: asyncio.Queue[str | None] = asyncio.Queue()
        samples = utterance.samples()
        options = self.shared.options
        if self.language is not None:
            options = TranscribeOptions(**{**_fields(options), "language": self.language})

        def segment_done(segment: Segment) -> None:  # in the decoding thread
            loop.call_soon_threadsafe(texts.put_nowait, segment.text)

        def run() -> TranscriptionResult:
            try:
                return self.shared.whisper.transcribe(samples, options, on_segment=segment_done)
            finally:
                loop.call_soon_threadsafe(texts.put_nowait, None)

        async def forward() -> None:  # the chunks, as the client takes them
            await self.write_event(TranscriptStart(language=self.language).event())
            while (text := await texts.get()) is not None:
                await self.write_event(TranscriptChunk(text=text).event())

        async with self.shared.sessions:
            # the slot is held for the decode only, never for a write: a client that
            # stops reading would otherwise hold it, and every other client wait
            writing = asyncio.ensure_future(forward())
            decoding = loop.run_in_executor(None, run)
            try:
                result = await decoding
            except BaseException as failure:
                writing.cancel()
                # its outcome is taken (asyncio would log an unread one as "never
                # retrieved"); a client already gone makes a failed decode a quiet
                # disconnect, but never hides a cancellation (a server shutting down)
                gone = (await asyncio.gather(writing, return_exceptions=True))[0]
                if isinstance(gone, ConnectionError) and isinstance(failure, Exception):
                    raise gone from None
                raise
        await writing  # each write bounded by WRITE_TIMEOUT_S (ConnectionError: gone)
        await self.write_event(TranscriptStop().event())
        await self.write_event(Transcript(text=result.text.strip(),
                                          language=result.language).event())
        self.language = None

    async def error(self, text: str, code: str) -> None:
        await self.write_event(Error(text=text, code=code).event())


def _parse(kind: Any, event: Event) -> Any:
    """`kind.from_event(event)`, a missing or mistyped field a client's mistake (the
    package indexes `data` as it finds it)."""
    try:
        return kind.from_event(event)
    except (KeyError, TypeError, AttributeError) as e:
        field = f" {e}" if isinstance(e, KeyError) else ""
        raise ValueError(f"{event.type}: a field is missing or of the wrong type{field}") \
            from None


def _fields(options: TranscribeOptions) -> dict[str, Any]:
    import dataclasses

    return {f.name: getattr(options, f.name) for f in dataclasses.fields(options)}

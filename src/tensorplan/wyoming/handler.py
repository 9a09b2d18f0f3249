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
import contextlib
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


@dataclass
class Shared:
    """What every connection shares: the model, the decoding defaults, the session bound."""

    whisper: Whisper
    model_name: str
    options: TranscribeOptions
    sessions: asyncio.Semaphore
    max_seconds: float


class Handler(AsyncEventHandler):
    def __init__(self, shared: Shared, *args: Any) -> None:
        super().__init__(*args)
        self.shared = shared
        self.language: str | None = None
        self.utterance: Utterance | None = None

    async def run(self) -> None:
        """The package's loop over events, reading them with bounded lengths (framing.py)."""
        self._is_running = True
        try:
            while self._is_running:
                try:
                    event = await read_event(self.reader)
                except BadFrame as e:
                    log.warning("wyoming: a client sent a malformed event: %s", e)
                    await self.error(str(e), "bad-request")
                    break
                if event is None or not await self.handle_event(event):
                    break
        except ConnectionError:
            pass  # gone while we wrote to it
        finally:
            await self.disconnect()
            self.writer.close()

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

        async with self.shared.sessions:
            await self.write_event(TranscriptStart(language=self.language).event())
            decoding = loop.run_in_executor(None, run)
            try:
                while (text := await texts.get()) is not None:
                    await self.write_event(TranscriptChunk(text=text).event())
            except ConnectionError:
                # the client left: its decode still holds a session, so its slot is held
                # until the decode ends (else clients that leave could start any number)
                with contextlib.suppress(Exception):
                    await decoding
                raise
            result = await decoding
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

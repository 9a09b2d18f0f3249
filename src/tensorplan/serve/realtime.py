"""`GET /v1/realtime`: OpenAI's Realtime transcription events over a WebSocket.

A connection holds a live stream (tensorplan.live): appended audio is decoded to 16 kHz and
fed to it on a worker thread; the stream's events come back from the live engine's threads
and leave through a bounded send queue, so a client that stops reading fills only its own
queue and is dropped (close 1008), never stalling the others. docs/realtime.md has the
protocol subset, the extension event `tensorplan.transcription.tail` and the limits.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import hmac
import json
import logging
import math
import secrets
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from tensorplan.live import (
    Committed,
    Completed,
    Delta,
    Event,
    Failed,
    LiveOptions,
    LiveStream,
    SpeechStarted,
    SpeechStopped,
    Tail,
)
from tensorplan.live.agreement import TimedWord
from tensorplan.live.pcm import PcmDecoder
from tensorplan.serve.client_secrets import PREFIX as SECRET_PREFIX
from tensorplan.serve.realtime_session import RealtimeSession, SessionError

log = logging.getLogger("tensorplan.serve")

MAX_FRAME_BYTES = 4 << 20  # a bigger frame closes the connection (1009): uvicorn's ws_max_size
# frames read ahead of the handler per connection (uvicorn's ws_max_queue; its default 32
# let a flooding client park 32 x 4 MiB, all decoded after it had gone)
MAX_QUEUED_FRAMES = 4
MAX_APPEND_BYTES = 2 << 20  # of base64 in one append (≈ 32 s of 24 kHz PCM16); more: an error
MAX_SEND_QUEUE = 1024  # events waiting for a client that does not read; more: dropped
# and their bytes: 1,024 session.updated events echoing a 3.9 MB prompt each held 3.6 GB
MAX_SEND_QUEUE_BYTES = 4 << 20
MAX_BACKLOG_S = 60.0  # audio not yet decoded; past it, reading the socket waits (TCP pushes back)
KEY_PROTOCOL = "openai-insecure-api-key."  # a browser's way to send the key
BETA_PROTOCOL = "openai-beta.realtime-v1"
POLICY_VIOLATION = 1008  # close code: no key, a wrong key, or a client that does not read
INTERNAL_ERROR = 1011  # close code: a fault of this server's, logged with its traceback
TRY_AGAIN_LATER = 1013  # close code: the model is still loading
TAIL_EVENT = "tensorplan.transcription.tail"
MAX_CLIENT_ID = 256  # characters of a client's event_id echoed in an error
MIN_PROBABILITY = 1e-12  # a word's probability is floored here for its logprob (log 0)


def _unspaced(tokens: list[str], length: int) -> list[str]:
    """The words' texts less the leading spaces a turn's text drops (its first word is
    sent unspaced), so that they join to `length` characters as the text does."""
    extra = sum(map(len, tokens)) - length
    for i, token in enumerate(tokens):
        if extra <= 0:
            break
        cut = min(extra, len(token) - len(token.lstrip()))
        tokens[i], extra = token[cut:], extra - cut
        if tokens[i]:
            break
    return tokens


def _client_id(value: Any) -> str | None:
    """A client's event_id as an error echoes it: a string, at most MAX_CLIENT_ID
    characters (a 3 MB one came back whole in each error event)."""
    if not isinstance(value, str):
        return None
    return value if len(value) <= MAX_CLIENT_ID else value[:MAX_CLIENT_ID - 3] + "..."


def _event_id() -> str:
    return "event_" + secrets.token_hex(8)


async def realtime(websocket: WebSocket) -> None:
    state = websocket.app.state.server
    offered = list(websocket.scope.get("subprotocols") or [])
    chosen = "realtime" if "realtime" in offered else None
    await websocket.accept(subprotocol=chosen)
    config = state.config
    tokens = _tokens(websocket, offered)
    # a client secret (client_secrets.py) carries the session's first settings
    preset = next((p for t in tokens if (p := state.secrets.session(t)) is not None), None)
    by_key = config.api_key is not None and _authorized(tokens, config.api_key)
    if preset is None and not by_key:
        if any(t.startswith(SECRET_PREFIX) for t in tokens):  # refused even without a key
            await _refuse(websocket, POLICY_VIOLATION, "invalid_api_key",
                          "the client secret is unknown or expired: ask "
                          "POST /v1/realtime/client_secrets for a new one")
            return
        if config.api_key is not None:
            await _refuse(websocket, POLICY_VIOLATION, "invalid_api_key",
                          "missing or incorrect API key: send 'Authorization: Bearer KEY' or "
                          f"the subprotocol '{KEY_PROTOCOL}KEY' (or a client secret in their "
                          "place)")
            return
    intent = websocket.query_params.get("intent", "transcription")
    if intent != "transcription":
        await _refuse(websocket, POLICY_VIOLATION, "unsupported_intent",
                      f"intent {intent!r} is not served here: only intent=transcription")
        return
    if state.live is None:
        await _refuse(websocket, TRY_AGAIN_LATER, "not_ready",
                      "the model is still loading; connect again shortly"
                      if state.error is None else f"the model failed to load: {state.error}")
        return
    if state.live.streams >= config.max_live_streams:  # checked and opened on this loop
        log.warning("realtime: %d live streams open, refusing one more",
                    config.max_live_streams)
        await _refuse(websocket, TRY_AGAIN_LATER, "too_many_connections",
                      f"server busy: {config.max_live_streams} realtime connections are "
                      "open (--max-live-streams); connect again later")
        return
    beta = BETA_PROTOCOL in offered or "realtime=v1" in websocket.headers.get("openai-beta", "")
    session = RealtimeSession(id="sess_" + secrets.token_hex(8),
                              shape="beta" if beta else "current", model=config.model)
    if preset is not None:  # its settings, in the shape this client speaks
        session = dataclasses.replace(preset, id=session.id, shape=session.shape)
    await Connection(websocket, state, session).run()


def _tokens(websocket: WebSocket, offered: list[str]) -> list[str]:
    """The keys a client sent: a bearer header, a browser's subprotocol."""
    scheme, _, token = websocket.headers.get("authorization", "").partition(" ")
    tokens = [token.strip()] if scheme.lower() == "bearer" else []
    return tokens + [p[len(KEY_PROTOCOL):] for p in offered if p.startswith(KEY_PROTOCOL)]


def _authorized(tokens: list[str], key: str) -> bool:
    return any(hmac.compare_digest(t.encode(), key.encode()) for t in tokens)


async def _refuse(websocket: WebSocket, code: int, error_code: str, message: str) -> None:
    await websocket.send_text(json.dumps(_error(message, code=error_code)))
    await websocket.close(code, reason=error_code)


def _error(message: str, *, code: str, param: str | None = None,
           event_id: str | None = None, kind: str = "invalid_request_error") -> dict[str, Any]:
    return {"type": "error", "event_id": _event_id(),
            "error": {"type": kind, "code": code, "message": message, "param": param,
                      "event_id": event_id}}


class EventError(Exception):
    def __init__(self, message: str, code: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code, self.param = code, param


class Connection:
    def __init__(self, websocket: WebSocket, state: Any, session: RealtimeSession) -> None:
        self.websocket = websocket
        self.state = state
        self.session = session
        self.loop = asyncio.get_running_loop()
        self.outbox: asyncio.Queue[str | None] = asyncio.Queue(MAX_SEND_QUEUE)
        self.dropped = False
        self.queued_bytes = 0  # of the texts in outbox
        self.token = secrets.token_hex(5)
        self.last_item: str | None = None
        self.decoder = PcmDecoder(session.encoding, session.rate)
        self.stream: LiveStream = state.live.open(self._options(), session.turn_detection,
                                                  self._from_engine)

    def _options(self) -> LiveOptions:
        return LiveOptions(decoding=self.state.config.defaults,
                           language=self.session.language, prompt=self.session.prompt)

    async def run(self) -> None:
        sender = asyncio.create_task(self._send_loop())
        failed = False
        try:
            self.send({"type": self.session.created_event(), "event_id": _event_id(),
                       "session": self.session.render()})
            while not (self.dropped or self._gone):
                message = await self.websocket.receive()
                if message["type"] == "websocket.disconnect" or self._gone:
                    break
                await self._handle(dict(message))
        except WebSocketDisconnect:
            pass
        except Exception as e:  # a bug of ours: this connection ends cleanly, the others go on
            # Starlette's RuntimeError for a receive or send after the client left is not
            if not (isinstance(e, RuntimeError) and not self._connected()):
                log.exception("realtime: connection failed")
                failed = True
        finally:
            self.state.live.close(self.stream)
            sender.cancel()
            if failed:
                await self._close(INTERNAL_ERROR, "server_error")
            elif self.dropped:
                await self._close(POLICY_VIOLATION, "send_queue_full")

    def _connected(self) -> bool:
        return WebSocketState.CONNECTED == self.websocket.client_state == \
            self.websocket.application_state

    # --- sending

    def send(self, event: dict[str, Any]) -> None:
        """Queue one event, after the stream's events already on their way to the loop
        (a commit's `committed` before the `cleared` of a clear right after it)."""
        self.loop.call_soon(self._enqueue, event)

    def _enqueue(self, event: dict[str, Any]) -> None:
        """On the event loop: into the send queue; a full queue drops the connection."""
        if self.dropped:
            return
        text = json.dumps(event)
        self.queued_bytes += len(text)
        try:
            if self.queued_bytes > MAX_SEND_QUEUE_BYTES:
                raise asyncio.QueueFull
            self.outbox.put_nowait(text)
        except asyncio.QueueFull:
            log.warning("realtime: a client stopped reading (%d events, %d bytes queued): "
                        "dropped", self.outbox.qsize(), self.queued_bytes)
            self.dropped = True
            self.outbox = asyncio.Queue(1)  # free the queued events now

    async def _send_loop(self) -> None:
        while True:
            text = await self.outbox.get()
            if text is None or self.dropped:
                return
            self.queued_bytes -= len(text)
            try:
                await self.websocket.send_text(text)
            except Exception:  # noqa: BLE001 - the client is gone
                self._left()
                return
            # let the transport report a failed write before the next: a send does not
            # yield while the socket takes the bytes, so a backlog of events went on into
            # a lost transport (asyncio's "socket.send() raised exception." warnings)
            await asyncio.sleep(0)

    def _left(self) -> None:
        """The client is gone (a send failed): its stream is closed now, with the audio
        it had sent and not yet been decoded, instead of after the frames still queued
        before its disconnect (20 flooding clients that vanished were decoded for 57 s)."""
        self.state.live.close(self.stream)

    @property
    def _gone(self) -> bool:
        """The stream was closed while the connection ran: its client left (_left), and
        frames it sent before leaving, still waiting ahead of the disconnect, are not
        decoded."""
        return self.stream.closed

    async def _close(self, code: int, reason: str) -> None:
        try:
            await asyncio.wait_for(self.websocket.close(code, reason=reason), 2)
        except (Exception, asyncio.TimeoutError):  # noqa: BLE001 - already gone or stuck
            pass

    def _from_engine(self, events: list[Event]) -> None:
        """The stream's events, from whichever thread made them, in order, to the loop."""
        self.loop.call_soon_threadsafe(self._deliver, events)

    def _deliver(self, events: list[Event]) -> None:
        if self.stream.closed:
            return
        for event in events:
            self._enqueue(self._render(event))

    def _item(self, turn: int) -> str:
        return f"item_{self.token}{turn:04d}"

    def _render(self, e: Event) -> dict[str, Any]:
        base: dict[str, Any] = {"event_id": _event_id(), "item_id": self._item(e.turn)}
        if isinstance(e, SpeechStarted):
            return {"type": "input_audio_buffer.speech_started", **base,
                    "audio_start_ms": e.audio_start_ms}
        if isinstance(e, SpeechStopped):
            return {"type": "input_audio_buffer.speech_stopped", **base,
                    "audio_end_ms": e.audio_end_ms}
        if isinstance(e, Committed):
            previous, self.last_item = self.last_item, base["item_id"]
            return {"type": "input_audio_buffer.committed", **base,
                    "previous_item_id": previous}
        prefix = "conversation.item.input_audio_transcription"
        if isinstance(e, Delta):
            return {"type": f"{prefix}.delta", **base, "content_index": 0, "delta": e.text,
                    **self._logprobs(e.text, e.words)}
        if isinstance(e, Tail):
            return {"type": TAIL_EVENT, **base, "content_index": 0, "text": e.text}
        if isinstance(e, Completed):
            return {"type": f"{prefix}.completed", **base, "content_index": 0,
                    "transcript": e.transcript,
                    "usage": {"type": "duration", "seconds": round(e.audio_s, 3)},
                    **self._logprobs(e.transcript, e.words)}
        assert isinstance(e, Failed)
        return {"type": f"{prefix}.failed", **base, "content_index": 0,
                "error": {"type": "server_error", "code": "transcription_failed",
                          "message": e.message, "param": None}}

    def _logprobs(self, text: str, words: tuple[TimedWord, ...]) -> dict[str, Any]:
        """`logprobs` where the session's `include` asks for them: one entry per word (its
        text as decoded is the "token", joining to `text`; the log of the word's
        probability, its tokens' mean from the word-timestamp pass)."""
        if not self.session.logprobs:
            return {}
        tokens = _unspaced([w.text for w in words], len(text))
        return {"logprobs": [{"token": t, "logprob": round(math.log(max(w.probability,
                                                                        MIN_PROBABILITY)), 6),
                              "bytes": list(t.encode())} for t, w in zip(tokens, words,
                                                                        strict=True)]}

    # --- receiving

    async def _handle(self, message: dict[str, Any]) -> None:
        client_id = None
        try:
            if message.get("text") is None:
                raise EventError("binary frames are not events: send JSON text frames",
                                 "invalid_event")
            try:
                event = json.loads(message["text"])
            # ValueError: also a number past Python's 4,300 digits for int()
            except (ValueError, RecursionError):
                raise EventError("the frame is not valid JSON", "invalid_json") from None
            if not isinstance(event, dict) or not isinstance(event.get("type"), str):
                raise EventError("an event must be a JSON object with a string 'type'",
                                 "invalid_event", "type")
            client_id = _client_id(event.get("event_id"))
            await self._dispatch(event)
        except EventError as e:
            self.send(_error(str(e), code=e.code, param=e.param, event_id=client_id))

    async def _dispatch(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind in ("session.update", "transcription_session.update"):
            await self._update(event)
        elif kind == "input_audio_buffer.append":
            await self._append(event)
        elif kind == "input_audio_buffer.commit":
            await self._flush_decoder()
            if not self.stream.commit():
                raise EventError("the input audio buffer is empty: append at least 100 ms "
                                 "of audio before committing", "input_audio_buffer_commit_empty")
        elif kind == "input_audio_buffer.clear":
            self.decoder.flush()  # what the resampler held is cleared with the rest
            self.stream.clear()
            self.send({"type": "input_audio_buffer.cleared", "event_id": _event_id()})
        else:
            raise EventError(f"unknown or unsupported event type {kind[:60]!r}: this server takes "
                             "session.update, transcription_session.update and "
                             "input_audio_buffer.append/commit/clear", "unknown_event_type",
                             "type")

    async def _flush_decoder(self) -> None:
        held = self.decoder.flush()
        if len(held):
            await asyncio.to_thread(self.stream.append, held)

    async def _update(self, event: dict[str, Any]) -> None:
        try:
            new = self.session.updated(event, self.state.config.model_names,
                                       self.state.model.is_multilingual)
        except SessionError as e:
            raise EventError(str(e), "invalid_session", e.param) from None
        if (new.encoding, new.rate) != (self.session.encoding, self.session.rate):
            await self._flush_decoder()  # the old format's last samples, then the new one
            self.decoder = PcmDecoder(new.encoding, new.rate)
        self.session = new
        self.send({"type": new.updated_event(), "event_id": _event_id(),
                   "session": new.render()})
        # after session.updated: turning detection on mid-turn announces the open turn
        self.stream.configure(self._options(), new.turn_detection)

    def _decoded(self, audio: str) -> Any:
        """An append's base64 audio as 16 kHz samples (EventError if it is not)."""
        try:
            data = base64.b64decode(audio, validate=True)
        except (binascii.Error, ValueError):
            raise EventError("'audio' is not valid base64", "invalid_base64", "audio") from None
        if self.session.encoding == "s16le" and len(data) % 2:
            raise EventError(f"PCM16 audio comes in whole 2-byte samples; got {len(data)} "
                             "bytes (is the format right?)", "invalid_audio_format", "audio")
        return self.decoder.decode(data)

    async def _append(self, event: dict[str, Any]) -> None:
        audio = event.get("audio")
        if not isinstance(audio, str):
            raise EventError("'audio' must be a base64 string", "invalid_audio", "audio")
        if len(audio) > MAX_APPEND_BYTES:
            raise EventError(f"one append carries at most {MAX_APPEND_BYTES} bytes of base64 "
                             f"(got {len(audio)}): send smaller pieces",
                             "audio_too_large", "audio")
        # off the event loop: 2 MiB appends on 8 connections held /health for up to 1.3 s
        samples = await asyncio.to_thread(self._decoded, audio)
        while self.stream.backlog_s() > MAX_BACKLOG_S and not (self.dropped or self._gone):
            await asyncio.sleep(0.05)  # the engine is behind: stop reading for a while
        if not self._gone:
            await asyncio.to_thread(self.stream.append, samples)

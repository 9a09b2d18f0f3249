"""`tensorplan wyoming` as a real server process on a free localhost port, driven by the
`wyoming` package's own AsyncTcpClient, the way Home Assistant's wyoming integration does:
describe → info; transcribe, audio-start, audio-chunk*, audio-stop → transcript."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
import wave
from pathlib import Path

import pytest

pytest.importorskip("wyoming")
from wyoming.asr import Transcribe, Transcript, TranscriptChunk, TranscriptStart, TranscriptStop
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event, async_write_event
from wyoming.info import Describe, Info

ROOT = Path(__file__).resolve().parents[2]
JFK = ROOT / "samples" / "jfk.wav"
GOLDEN = ("And so my fellow Americans ask not what your country can do for you ask what you "
          "can do for your country")
WORDS = set(GOLDEN.lower().split())
MAX_CONNECTIONS = 6  # the server's --max-connections here


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tensorplan", "wyoming", "--uri", f"tcp://127.0.0.1:{port}",
         "--sessions", "2", "--beam-size", "none", "--max-seconds", "60",
         "--max-connections", str(MAX_CONNECTIONS)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None:
                pytest.fail(f"server exited: {proc.stdout.read()}")
            time.sleep(0.3)
    yield port, proc
    proc.terminate()
    log, _ = proc.communicate(timeout=30)
    # every client mistake and every vanished client of this module was answered or logged
    # in one line: no traceback
    assert "Traceback" not in log, log[-4000:]


def jfk_chunks(samples_per_chunk: int = 1024):
    with wave.open(str(JFK)) as w:
        rate, width, channels = w.getframerate(), w.getsampwidth(), w.getnchannels()
        pcm = w.readframes(w.getnframes())
    step = samples_per_chunk * width * channels
    return rate, width, channels, [pcm[i:i + step] for i in range(0, len(pcm), step)]


async def _read_until(client: AsyncTcpClient, *types: str, timeout: float = 120) -> list[Event]:
    events = []
    while True:
        event = await asyncio.wait_for(client.read_event(), timeout)
        assert event is not None, "the server closed the connection"
        events.append(event)
        if event.type in types:
            return events


async def _transcribe(port: int, rate: int, width: int, channels: int, chunks: list[bytes],
                      language: str | None = "en") -> list[Event]:
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(Transcribe(language=language).event())
        await client.write_event(AudioStart(rate=rate, width=width, channels=channels).event())
        for data in chunks:
            await client.write_event(AudioChunk(rate=rate, width=width, channels=channels,
                                                audio=data).event())
        await client.write_event(AudioStop().event())
        return await _read_until(client, "transcript", "error")


async def _encoded(events: list[Event]) -> bytes:
    """The events as the package writes them to a socket."""
    out = bytearray()

    class Sink:  # the part of a StreamWriter async_write_event uses
        def writelines(self, lines: list[bytes]) -> None:
            out.extend(b"".join(lines))

        def write(self, data: bytes) -> None:
            out.extend(data)

        async def drain(self) -> None:
            pass

    for event in events:
        await async_write_event(event, Sink())  # type: ignore[arg-type]
    return bytes(out)


def _text(events: list[Event]) -> str:
    assert Transcript.is_type(events[-1].type), events[-1]
    return Transcript.from_event(events[-1]).text


def test_describe_lists_an_asr_program_with_the_model(server) -> None:
    async def go():
        async with AsyncTcpClient("127.0.0.1", server[0]) as client:
            await client.write_event(Describe().event())
            return Info.from_event((await _read_until(client, "info"))[-1])

    info = asyncio.run(go())
    (program,) = info.asr
    assert program.installed and program.supports_transcript_streaming
    assert [(m.name, m.languages) for m in program.models] == [("tiny.en", ["en"])]


def test_transcript_streamed_then_whole(server) -> None:
    events = asyncio.run(_transcribe(server[0], *jfk_chunks()))
    types = [e.type for e in events]
    assert types[0] == "transcript-start" and types[-2:] == ["transcript-stop", "transcript"]
    chunks = [TranscriptChunk.from_event(e).text for e in events if e.type == "transcript-chunk"]
    assert len(chunks) >= 2  # jfk.wav decodes to two segments, each sent as it came
    assert TranscriptStart.is_type(types[0]) and TranscriptStop.is_type(types[-2])
    assert _text(events) == GOLDEN
    assert "".join(chunks).strip() == GOLDEN


def test_other_formats_are_converted(server) -> None:
    rate, width, channels, chunks = jfk_chunks()
    pcm = b"".join(chunks)
    # 16-bit mono 16 kHz → 16-bit stereo 16 kHz: each sample twice
    stereo = b"".join(pcm[i:i + 2] * 2 for i in range(0, len(pcm), 2))
    step = 4096
    events = asyncio.run(_transcribe(server[0], rate, 2, 2,
                                     [stereo[i:i + step] for i in range(0, len(stereo), step)]))
    said = set(_text(events).lower().split())
    assert len(said & WORDS) >= len(WORDS) - 2


def test_many_clients_at_once(server) -> None:
    async def go():
        return await asyncio.gather(*(_transcribe(server[0], *jfk_chunks()) for _ in range(4)))

    for events in asyncio.run(go()):
        assert _text(events) == GOLDEN


@pytest.mark.parametrize("start,why", [
    ({"rate": 0, "width": 2, "channels": 1}, "rate"),
    ({"rate": 16000, "width": 3, "channels": 1}, "width"),
    ({"rate": 16000, "width": 2, "channels": 99}, "channels"),
])
def test_absurd_formats_get_an_error_and_the_server_lives_on(server, start, why) -> None:
    async def go():
        async with AsyncTcpClient("127.0.0.1", server[0]) as client:
            await client.write_event(AudioStart(**start).event())
            error = (await _read_until(client, "error"))[-1]
            await client.write_event(Describe().event())  # the same connection still serves
            info = (await _read_until(client, "info"))[-1]
            return Error.from_event(error), info

    error, info = asyncio.run(go())
    assert why in error.text
    assert info.type == "info"
    assert server[1].poll() is None


def test_bad_events_get_errors(server) -> None:
    async def go():
        async with AsyncTcpClient("127.0.0.1", server[0]) as client:
            errors = []
            for event in (Event(type="no-such-event"),
                          AudioChunk(rate=16000, width=2, channels=1, audio=b"\0\0").event(),
                          AudioStop().event(),
                          Transcribe(name="large-v3").event(),
                          Transcribe(language="fr").event()):
                await client.write_event(event)
                errors.append(Error.from_event((await _read_until(client, "error"))[-1]))
            return errors

    errors = asyncio.run(go())
    assert "no-such-event" in errors[0].text
    assert "before audio-start" in errors[1].text and "before audio-start" in errors[2].text
    assert "large-v3" in errors[3].text and "'fr'" in errors[4].text


def test_garbage_bytes_close_only_that_connection(server) -> None:
    with socket.create_connection(("127.0.0.1", server[0])) as s:
        s.sendall(b"\xff\xfe not json at all\n")
        s.settimeout(30)
        try:
            s.recv(1024)
        except OSError:
            pass
    events = asyncio.run(_transcribe(server[0], *jfk_chunks()))
    assert _text(events) == GOLDEN


@pytest.mark.parametrize("header, why", [
    (b'{"data": {}}\n', "'type'"),
    (b'{"type": "audio-chunk", "data_length": "12"}\n', "data_length"),
    (b'{"type": "audio-chunk", "payload_length": 1099511627776}\n', "payload_length"),
    (b'{"type": "audio-chunk", "data": [1], "data_length": 2}\n{}', "'data'"),
    (b'{"type": "audio-chunk", "data_length": 3}\nxyz', "not valid JSON"),
])
def test_a_malformed_event_header_gets_an_error_then_the_connection_closes(
        server, header, why) -> None:
    """The stream's framing is lost, so the connection ends, but with an error event that
    says why (a terabyte payload is refused, never read), and the server serves on."""
    with socket.create_connection(("127.0.0.1", server[0])) as s:
        s.sendall(header)
        s.settimeout(30)
        received = b""
        while chunk := s.recv(65536):
            received += chunk
    assert b'"error"' in received and b"bad-request" in received, received
    assert why.encode() in received, received
    events = asyncio.run(_transcribe(server[0], *jfk_chunks()))
    assert _text(events) == GOLDEN


def test_an_event_missing_a_field_gets_an_error_and_the_connection_lives_on(server) -> None:
    async def go():
        async with AsyncTcpClient("127.0.0.1", server[0]) as client:
            errors = []
            for event in (Event(type="audio-start", data={"width": 2, "channels": 1}),
                          Event(type="audio-chunk", data={}),
                          Event(type="transcribe", data=[1])):  # type: ignore[arg-type]
                await client.write_event(event)
                errors.append(Error.from_event((await _read_until(client, "error"))[-1]))
            await client.write_event(Describe().event())
            return errors, (await _read_until(client, "info"))[-1]

    errors, info = asyncio.run(go())
    assert "audio-start" in errors[0].text and "rate" in errors[0].text
    assert "audio-chunk" in errors[1].text
    assert "transcribe" in errors[2].text
    assert all(e.code == "bad-request" for e in errors)
    assert info.type == "info"


def test_a_client_that_leaves_during_its_decode_is_a_quiet_disconnect(server) -> None:
    """The transcript has nowhere to go: the server drops it (the module's log check says
    without a traceback) and serves the next client."""
    rate, width, channels, chunks = jfk_chunks()
    fmt = {"rate": rate, "width": width, "channels": channels}
    events = [AudioStart(**fmt).event(), *(AudioChunk(**fmt, audio=c).event() for c in chunks),
              AudioStop().event()]
    with socket.create_connection(("127.0.0.1", server[0])) as s:
        s.sendall(asyncio.run(_encoded(events)))
    time.sleep(1.0)  # its decode is under way, writing to a closed socket
    events = asyncio.run(_transcribe(server[0], rate, width, channels, chunks))
    assert _text(events) == GOLDEN


def test_too_long_audio_is_refused(server) -> None:
    rate, width, channels, _ = jfk_chunks()
    second = b"\0\0" * rate
    events = asyncio.run(_transcribe(server[0], rate, width, channels, [second] * 61))
    assert events[-1].type == "error" and "longer than 60 s" in Error.from_event(
        events[-1]).text


def test_past_max_connections_a_client_is_told_busy_and_the_others_carry_on(server) -> None:
    """Each connection may hold an utterance: their number is bounded (--max-connections),
    one more gets an error event and is closed, and a slot frees when a client leaves."""
    async def go():
        held = [AsyncTcpClient("127.0.0.1", server[0]) for _ in range(MAX_CONNECTIONS)]
        for client in held:
            await client.connect()
            await client.write_event(Describe().event())  # served: the connection is open
            assert (await _read_until(client, "info"))[-1].type == "info"
        async with AsyncTcpClient("127.0.0.1", server[0]) as extra:
            refused = await asyncio.wait_for(extra.read_event(), 30)
            assert refused is not None and refused.type == "error", refused
            assert Error.from_event(refused).code == "busy"
            assert "--max-connections" in Error.from_event(refused).text
            assert await asyncio.wait_for(extra.read_event(), 30) is None  # closed
        await held.pop().disconnect()
        await asyncio.sleep(0.5)  # the server sees it leave
        events = await _transcribe(server[0], *jfk_chunks())
        for client in held:
            await client.disconnect()
        return events

    assert _text(asyncio.run(go())) == GOLDEN

"""The handler's decode path with a failing engine and a client gone, in process (the
server tests run a real process, where a failing engine cannot be arranged)."""

from __future__ import annotations

import asyncio
import gc
import threading
from typing import Any

import pytest

pytest.importorskip("wyoming")

from wyoming.audio import AudioChunk  # noqa: E402

from tensorplan.whisper.options import TranscribeOptions  # noqa: E402
from tensorplan.wyoming.audio import Utterance  # noqa: E402
from tensorplan.wyoming.handler import Handler, Shared  # noqa: E402


class _GoneWriter:
    """A StreamWriter whose client has left: every drain fails."""

    def __init__(self) -> None:
        self.failed = threading.Event()

    def writelines(self, data: Any) -> None:
        pass

    def write(self, data: bytes) -> None:
        pass

    async def drain(self) -> None:
        self.failed.set()
        raise ConnectionResetError("the client left")


class _FailingWhisper:
    """An engine that fails its decode once the client's writes have failed."""

    def __init__(self, writer: _GoneWriter) -> None:
        self.writer = writer

    def transcribe(self, samples: Any, options: Any, on_segment: Any = None) -> Any:
        assert self.writer.failed.wait(10)
        raise RuntimeError("the engine broke")


def _handler(writer: _GoneWriter) -> Handler:
    shared = Shared(whisper=_FailingWhisper(writer), model_name="tiny.en",  # type: ignore[arg-type]
                    options=TranscribeOptions(), sessions=asyncio.Semaphore(1),
                    max_seconds=60, max_connections=4)
    return Handler(shared, asyncio.StreamReader(), writer)


def test_a_failed_decode_for_a_client_already_gone_is_a_quiet_disconnect() -> None:
    unretrieved: list[dict[str, Any]] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: unretrieved.append(ctx))
        writer = _GoneWriter()
        handler = _handler(writer)
        utterance = Utterance(max_seconds=60)
        utterance.add(AudioChunk(rate=16000, width=2, channels=1, audio=bytes(3200)))
        # the client is gone, so this is a disconnect, not an "internal" error to write
        with pytest.raises(ConnectionError):
            await handler.transcribe(utterance)
        gc.collect()  # an unread task exception is reported when the task is collected
        await asyncio.sleep(0)

    asyncio.run(main())
    assert unretrieved == []


def test_a_cancelled_decode_stays_cancelled_when_the_client_has_left() -> None:
    """The server shutting down cancels a connection mid-decode: that must not turn into
    an ordinary disconnect because the client's writes had failed too."""

    class _SlowWhisper(_FailingWhisper):
        def transcribe(self, samples: Any, options: Any, on_segment: Any = None) -> Any:
            assert self.writer.failed.wait(10)
            threading.Event().wait(0.5)  # still decoding when the cancel comes
            raise RuntimeError("not reached by the caller")

    async def main() -> None:
        writer = _GoneWriter()
        handler = _handler(writer)
        handler.shared.whisper = _SlowWhisper(writer)  # type: ignore[assignment]
        utterance = Utterance(max_seconds=60)
        utterance.add(AudioChunk(rate=16000, width=2, channels=1, audio=bytes(3200)))
        task = asyncio.ensure_future(handler.transcribe(utterance))
        while not writer.failed.is_set():
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())

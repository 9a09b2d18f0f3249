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

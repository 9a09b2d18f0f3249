"""Bind a Wyoming URI (tcp://host:port, unix://path, stdio://) and serve one model."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from functools import partial

from wyoming.server import AsyncServer, AsyncStdioServer

from tensorplan.whisper.api import Whisper
from tensorplan.whisper.options import TranscribeOptions
from tensorplan.wyoming.handler import Handler, Shared

log = logging.getLogger("tensorplan.wyoming")


async def serve(uri: str, whisper: Whisper, model_name: str, options: TranscribeOptions,
                sessions: int, max_seconds: float, max_connections: int) -> None:
    """Serve until SIGTERM (a clean stop) or Ctrl-C. A socket that cannot be bound raises
    OSError before anything says the server is listening."""
    server = AsyncServer.from_uri(uri)
    shared = Shared(whisper, model_name, options, asyncio.Semaphore(sessions), max_seconds,
                    max_connections)
    factory = partial(Handler, shared)
    announce = partial(_announce, uri, model_name, sessions)
    if isinstance(server, AsyncStdioServer):
        announce()  # stdout carries the protocol: a line there would be read as an event
        await server.run(factory)
        return
    await server.start(factory)  # binds: a taken port fails here
    announce()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGTERM, stop.set)
    try:
        await stop.wait()
    finally:
        await server.stop()


def _announce(uri: str, model_name: str, sessions: int) -> None:
    log.info("wyoming: serving %s on %s (%d sessions)", model_name, uri, sessions)
    print(f"tensorplan wyoming: listening on {uri}", file=sys.stderr, flush=True)

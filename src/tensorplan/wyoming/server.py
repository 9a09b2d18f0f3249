"""Bind a Wyoming URI (tcp://host:port, unix://path, stdio://) and serve one model."""

from __future__ import annotations

import asyncio
import logging
from functools import partial

from wyoming.server import AsyncServer

from tensorplan.whisper.api import Whisper
from tensorplan.whisper.options import TranscribeOptions
from tensorplan.wyoming.handler import Handler, Shared

log = logging.getLogger("tensorplan.wyoming")


async def serve(uri: str, whisper: Whisper, model_name: str, options: TranscribeOptions,
                sessions: int, max_seconds: float) -> None:
    server = AsyncServer.from_uri(uri)
    shared = Shared(whisper, model_name, options, asyncio.Semaphore(sessions), max_seconds)
    log.info("wyoming: serving %s on %s (%d sessions)", model_name, uri, sessions)
    print(f"tensorplan wyoming: listening on {uri}", flush=True)
    await server.run(partial(Handler, shared))

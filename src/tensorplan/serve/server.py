"""Run the app under uvicorn; SIGINT or SIGTERM stops it cleanly, with exit status 0.

On a signal uvicorn stops accepting connections and lets in-flight requests finish (up
to `graceful_s`); then the app's shutdown cancels whatever is still queued or running.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import FrameType
from typing import Any

import uvicorn

from tensorplan.serve.app import create_app
from tensorplan.serve.config import ServeConfig
from tensorplan.serve.connections import header_deadline_protocol
from tensorplan.serve.realtime import MAX_FRAME_BYTES, MAX_QUEUED_FRAMES

log = logging.getLogger("tensorplan.serve")


class _Server(uvicorn.Server):
    """uvicorn re-raises a caught signal after shutting down (exit 130 or -15); a server
    stopped on purpose has done its job, so it returns instead."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit and sig == 2:  # a second Ctrl-C: stop waiting for requests
            self.force_exit = True
        self.should_exit = True


class _OneLineForClientFaults(logging.Filter):
    """uvicorn logs a client's text frame of invalid UTF-8 with its traceback (it closes
    the socket with 1007, as it should): any client could fill the log with them. The
    record stays, as one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], UnicodeDecodeError):
            record.exc_info, record.exc_text = None, None
        return True


def serve(config: ServeConfig, load: Callable[[], Any], *, host: str, port: int,
          graceful_s: int = 30) -> int:
    """Serve until a signal; 0 then, 2 when the model could not be loaded."""
    app = create_app(config, load)
    server = _Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                    timeout_graceful_shutdown=graceful_s,
                                    timeout_keep_alive=config.keep_alive_s,  # type: ignore
                                    http=header_deadline_protocol(config.header_timeout_s),
                                    lifespan="on", ws_max_size=MAX_FRAME_BYTES,
                                    ws_max_queue=MAX_QUEUED_FRAMES))
    # after uvicorn's Config, which sets up its loggers
    logging.getLogger("uvicorn.error").addFilter(_OneLineForClientFaults())
    failed: list[str] = []

    def on_failure(message: str) -> None:
        failed.append(message)
        server.should_exit = True

    app.state.server.on_failure = on_failure
    key = "on (Bearer token)" if config.api_key else "off: bind to localhost only"
    log.warning("tensorplan serve: listening on http://%s:%d (API key %s)", host, port, key)
    server.run()
    return 2 if failed else 0

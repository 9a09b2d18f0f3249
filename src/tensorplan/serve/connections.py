"""A deadline for a request's headers, which uvicorn does not have.

uvicorn (h11) times out only the idle time between requests (`timeout_keep_alive`). A client
that connects and sends nothing, or sends its headers a byte at a time, held its connection
and a descriptor for as long as it liked: 150 such clients held 150. Here each connection
has `timeout_s` from the moment it waits for a request (on connecting, and after each
response) until that request's headers are complete, else it is closed. The body's own
timeouts are read_form's (serve/uploads.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol


def header_deadline_protocol(timeout_s: float) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol with a header deadline of `timeout_s` seconds."""

    class HeaderDeadlineProtocol(_HeaderDeadline):
        header_timeout_s = timeout_s

    return HeaderDeadlineProtocol


class _HeaderDeadline(H11Protocol):
    header_timeout_s: float
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._waiting_for_headers():
            self._arm()  # a timer already running keeps its deadline
        else:
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._waiting_for_headers():  # the next request's headers are due in time too
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _waiting_for_headers(self) -> bool:
        """No request under way: the client is to send (or is sending) headers."""
        return self.conn.their_state is h11.IDLE and (
            self.cycle is None or self.cycle.response_complete)

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._expired)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _expired(self) -> None:
        self._header_timer = None
        if self._waiting_for_headers() and not self.transport.is_closing():
            self.transport.close()

"""Reading Wyoming events off a socket, with every length bounded and every header checked.

An event is a JSON header line (`type`, optional `data`, `data_length`, `payload_length`),
then `data_length` bytes of more JSON data, then `payload_length` bytes of payload (audio).
The `wyoming` package's reader trusts the header: a missing `type` or a `data_length` that
is not a number ends the connection with an exception nobody reads, and a length of a
terabyte is read until memory runs out. This reader answers those with `BadFrame`, which
the handler reports to the client before it hangs up (the stream's framing is lost).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from wyoming.event import Event

from tensorplan.wyoming.audio import whole

MAX_HEADER_BYTES = 64 << 10  # one header line (asyncio's own readline limit)
MAX_DATA_BYTES = 1 << 20  # the JSON data after a header
# one payload: an audio-chunk of 10 s at 192 kHz, 8 channels of 4 bytes is 61 MB; clients
# send 20-100 ms chunks (Home Assistant: 1,024 samples), so 16 MiB is ample
MAX_PAYLOAD_BYTES = 16 << 20


class BadFrame(ValueError):
    """The stream does not hold a well-formed event: the message says what is wrong."""


async def read_event(reader: asyncio.StreamReader) -> Event | None:
    """The next event; None at the end of the stream (also mid-event: the client left)."""
    try:
        line = await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError:
        return None
    except asyncio.LimitOverrunError:
        raise BadFrame(f"an event header is longer than {MAX_HEADER_BYTES} bytes") from None
    header = _json_object(line, "the event header")
    kind = header.get("type")
    if not isinstance(kind, str) or not kind:
        raise BadFrame("an event header needs a string 'type'")
    data = header.get("data", {})
    if data is None:
        data = {}
    try:
        more = await _read(reader, header, "data_length", MAX_DATA_BYTES, kind)
        payload = await _read(reader, header, "payload_length", MAX_PAYLOAD_BYTES, kind)
    except asyncio.IncompleteReadError:
        return None
    if more:
        extra = _json(more, f"{kind}: the data")
        if isinstance(data, dict) and isinstance(extra, dict):
            data = {**data, **extra}
        elif not data:
            data = extra
        else:
            raise BadFrame(f"{kind}: 'data' must be a JSON object")
    # data that is not an object still frames: the handler answers it as a bad event
    return Event(type=kind, data=data, payload=payload or None)


async def _read(reader: asyncio.StreamReader, header: dict[str, Any], field: str,
                limit: int, kind: str) -> bytes:
    n = header.get(field)
    if n is None:
        return b""
    if not whole(n) or not 0 <= n <= limit:
        raise BadFrame(f"{kind}: '{field}' must be a whole number of bytes from 0 to "
                       f"{limit}, got {repr(n)[:40]}")
    return await reader.readexactly(n) if n else b""


def _json(raw: bytes, what: str) -> Any:
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise BadFrame(f"{what} is not valid JSON") from None


def _json_object(raw: bytes, what: str) -> dict[str, Any]:
    value = _json(raw, what)
    if not isinstance(value, dict):
        raise BadFrame(f"{what} must be a JSON object")
    return value

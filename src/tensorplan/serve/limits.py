"""The server's own limits and their defaults, defined once (docs/robustness.md), and the
start-up checks of `tensorplan serve`'s flags: a configuration that cannot work is refused
with one line (exit 2) before anything listens or loads.

What one request may ask the decoder for lives in whisper/limits.py; this module holds what
the transport and the process allow.
"""

from __future__ import annotations

import math
import socket

from tensorplan.errors import UserError

MAX_PORT = 65535
MAX_SESSIONS = 256  # each holds a planned arena (tiny: ~50 MB, large: GBs)
DEFAULT_ENGINE_WINDOWS = 8  # requests the step engine decodes together (--engine-windows)
MAX_ENGINE_WINDOWS = 64  # window slots decoding together: 64 tiny windows hold 1.2 GB of cross K/V
MAX_ENGINE_MEMORY_MB = float(1 << 24)  # 16 TiB: a budget, not an allocation (the windows cap it)
MAX_QUEUE = 100_000  # waiting requests, each holding its spooled upload on disk
MAX_UPLOAD_MB = 1 << 20  # 1 TiB: beyond any real recording
# Realtime WebSocket connections open at once (--max-live-streams): each holds its live
# stream (up to a minute of undecoded audio) and what the transport has buffered for it,
# ~35 MB for a client flooding 4 MiB frames; past the limit a connection is refused (1013)
DEFAULT_MAX_LIVE_STREAMS = 64
MAX_LIVE_STREAMS = 4096
# Connections. uvicorn times out only the idle time between requests (its
# timeout_keep_alive); a client that sends its headers or body a byte at a time held a
# connection, and a descriptor, for as long as it liked.
KEEP_ALIVE_S = 5.0  # idle between requests on one connection (uvicorn's default)
HEADER_TIMEOUT_S = 10.0  # from the connection (or the previous response) to complete headers
BODY_IDLE_TIMEOUT_S = 30.0  # the longest wait for the next piece of an upload
BODY_TIMEOUT_S = 600.0  # the whole upload (100 MB at 170 kB/s)
MAX_TIMEOUT_S = 86400.0


def check_port(port: int) -> None:
    if not 0 <= port <= MAX_PORT:
        raise UserError(f"--port {port}: a TCP port is between 1 and {MAX_PORT} "
                        "(0 picks a free one)")


def check_count(flag: str, value: int, lo: int, hi: int) -> None:
    if not lo <= value <= hi:
        raise UserError(f"{flag} {value}: expected an integer from {lo} to {hi}")


def check_positive(flag: str, value: float, hi: float) -> float:
    """A finite, positive number up to `hi` (argparse's float() takes nan and inf)."""
    if not (math.isfinite(value) and 0 < value <= hi):
        raise UserError(f"{flag} {value}: expected a positive number up to {hi:.10g}")
    return value


def check_api_key(key: str | None) -> None:
    """A key is sent as 'Authorization: Bearer KEY', a header value: printable ASCII, and
    whitespace at either end is dropped on the way. A key no client can send would refuse
    every request."""
    if key is None:
        return
    if not key:
        raise UserError("--api-key is empty: give a key, or leave it (and "
                        "$TENSORPLAN_API_KEY) unset to serve without one")
    if key != key.strip():
        raise UserError("--api-key begins or ends with whitespace, which HTTP drops from "
                        "the header: no client could send it")
    bad = next((c for c in key if not " " <= c <= "~"), None)
    if bad is not None:
        raise UserError(f"--api-key holds {bad!r}: an HTTP header carries printable ASCII "
                        "only, so no client could send it")


def check_host(host: str) -> None:
    """The address must resolve (an address that cannot be bound ends uvicorn's start-up
    in a log line and a bare exit)."""
    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as e:
        raise UserError(f"--host {host!r}: not an address this machine can bind "
                        f"({getattr(e, 'strerror', None) or e})") from None

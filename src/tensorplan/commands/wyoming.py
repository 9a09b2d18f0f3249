"""`tensorplan wyoming`: speech to text for Home Assistant over the Wyoming protocol.

Model flags come from ModelOptions and decoding flags from TranscribeOptions, as
`tensorplan serve`'s do; --sessions bounds the transcriptions run at once (each a session
of the one model; more clients wait their turn).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import socket
import stat
from pathlib import Path
from typing import Any

from tensorplan.errors import UserError

DEFAULT_URI = "tcp://127.0.0.1:10300"
DEFAULT_MAX_SECONDS = 300.0  # a voice command is seconds long; longer audio is refused
# connections open at once: each may hold an utterance of --max-seconds (9.6 MB at 300 s)
DEFAULT_MAX_CONNECTIONS = 64
MAX_CONNECTIONS = 4096  # the most --max-connections may say
MAX_SECONDS = 4 * 3600.0  # the most --max-seconds may say: what a server request may hold


def register(sub: Any) -> None:
    from tensorplan.whisper.flags import add_arguments
    from tensorplan.whisper.options import TranscribeOptions
    from tensorplan.whisper.planned.load_options import add_model_arguments

    p = sub.add_parser(
        "wyoming", help="serve speech to text over the Wyoming protocol (Home Assistant)",
        description="Answer describe and transcribe + audio-start/chunk/stop with "
        "transcripts (streamed as transcript-start/chunk/stop, then transcript).")
    server = p.add_argument_group("server")
    server.add_argument("--uri", default=DEFAULT_URI,
                        help=f"where to listen: tcp://HOST:PORT, unix://PATH or stdio:// "
                        f"(default: {DEFAULT_URI})")
    server.add_argument("--sessions", type=int, default=None, metavar="N",
                        help="transcriptions run at once, each a session of the one model "
                        "(default: cores / 2, at least 1)")
    server.add_argument("--max-seconds", type=float, default=DEFAULT_MAX_SECONDS,
                        help=f"longest utterance accepted (default: {DEFAULT_MAX_SECONDS:g})")
    server.add_argument("--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS,
                        metavar="N", help="connections open at once; one more gets a busy "
                        f"error (default: {DEFAULT_MAX_CONNECTIONS})")
    add_model_arguments(p.add_argument_group("model"), p.add_argument_group("memory planning"))
    add_arguments(p.add_argument_group("decoding defaults"), TranscribeOptions,
                  exclude=("task",))
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        from tensorplan.wyoming.server import serve
    except ImportError as e:
        raise UserError(f"tensorplan wyoming needs the wyoming package: pip install "
                        f"'tensorplan[wyoming]' ({e})") from None
    from wyoming.server import AsyncServer

    from tensorplan.commands.transcribe import model_options as sized_model_options
    from tensorplan.machine import cores
    from tensorplan.serve.limits import MAX_SESSIONS, check_count, check_positive
    from tensorplan.serve.threads import default_sessions, per_session
    from tensorplan.whisper.api import load
    from tensorplan.whisper.flags import from_args
    from tensorplan.whisper.options import TranscribeOptions

    sessions = default_sessions(cores()) if args.sessions is None else args.sessions
    check_count("--sessions", sessions, 1, MAX_SESSIONS)
    check_count("--max-connections", args.max_connections, 1, MAX_CONNECTIONS)
    check_positive("--max-seconds", args.max_seconds, MAX_SECONDS)  # inf: every request failed
    if not args.uri.startswith(("tcp://", "unix://", "stdio://")):
        raise UserError(f"--uri {args.uri!r}: expected tcp://HOST:PORT, unix://PATH or "
                        "stdio://")
    try:  # a port that is not one, before the model loads (binding comes later)
        server = AsyncServer.from_uri(args.uri)
    except ValueError as e:
        raise UserError(f"--uri {args.uri}: {e}") from None
    _check_socket_path(args.uri, getattr(server, "socket_path", None))
    threads = args.threads or per_session(sessions)
    defaults = from_args(TranscribeOptions, args)
    model_options = sized_model_options(args, defaults, threads=threads)
    whisper = load(model_options)
    logging.getLogger("tensorplan.wyoming").setLevel(logging.INFO)
    try:
        asyncio.run(serve(args.uri, whisper, model_options.model, defaults, sessions,
                          args.max_seconds, args.max_connections))
    except KeyboardInterrupt:
        pass
    except OSError as e:  # the port is taken, the socket path unwritable
        raise UserError(f"--uri {args.uri}: {e.strerror or e}") from None
    return 0


def _check_socket_path(uri: str, path: Path | None) -> None:
    """The wyoming package unlinks whatever is at a unix:// path before it binds: only a
    stale socket may be there, never a user's file or directory."""
    if path is None:
        return
    try:
        mode = path.lstat().st_mode  # a link's own mode: never a socket, so refused
    except OSError:  # nothing there (or no way there): the bind says what is wrong
        return
    if not stat.S_ISSOCK(mode):
        raise UserError(f"--uri {uri}: {path} exists and is not a socket (it would be "
                        "deleted to make room for one)")
    with socket.socket(socket.AF_UNIX) as s, contextlib.suppress(OSError):
        s.connect(str(path))
        raise UserError(f"--uri {uri}: a server is listening on {path} already")

"""`tensorplan serve`: OpenAI's /v1/audio/transcriptions and /translations over HTTP.

Model flags come from ModelOptions, as `tensorplan transcribe`'s do (`--threads` counts
the step engine's threads here, or each session's without it). Decoding flags (those of
`tensorplan transcribe`) set the server's defaults; each request may override them with
form fields of the same names.
"""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any

DEFAULT_PORT = 8000


def register(sub: Any) -> None:
    from tensorplan.serve import limits
    from tensorplan.serve.threads import MAX_LIVE_SESSIONS
    from tensorplan.whisper.flags import add_arguments
    from tensorplan.whisper.limits import DEFAULT_MAX_AUDIO_SECONDS
    from tensorplan.whisper.options import TranscribeOptions
    from tensorplan.whisper.planned.load_options import add_model_arguments

    p = sub.add_parser(
        "serve",
        help="serve an OpenAI-compatible transcription API and a web page",
        description="Serve POST /v1/audio/transcriptions and /v1/audio/translations "
        "(OpenAI's API), /v1/models, /health, /ready and a web page at /.",
    )
    server = p.add_argument_group("server")
    server.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default: 127.0.0.1; without --api-key keep "
                        "it local)")
    server.add_argument("--port", type=int, default=DEFAULT_PORT,
                        help=f"TCP port (default: {DEFAULT_PORT})")
    server.add_argument("--sessions", type=int, default=None, metavar="N",
                        help="sessions of the one model: requests run at once on them "
                        "without the step engine (default: cores / 2, at least 1), live "
                        "updates with it (default: the cores, at most "
                        f"{MAX_LIVE_SESSIONS}); docs/serve.md says why")
    server.add_argument("--engine-windows", type=int, default=None, metavar="N",
                        help="requests decoded together by the step engine, their decoding "
                        "steps batched into one pass (default: "
                        f"{limits.DEFAULT_ENGINE_WINDOWS}; 0: each request runs alone on a "
                        "session; docs/engine.md)")
    server.add_argument("--engine-memory-mb", type=float, default=None, metavar="MB",
                        help="instead of --engine-windows: as many requests decode together "
                        "as the step engine's planned memory fits in MB (MiB, as "
                        "--max-upload-mb): its session, word alignment, caches and the "
                        "batches of the default decoding; a request asking for another "
                        "beam_size or best_of is then refused (docs/engine.md)")
    server.add_argument("--api-key", default=os.environ.get("TENSORPLAN_API_KEY"),
                        help="require 'Authorization: Bearer KEY' (default: "
                        "$TENSORPLAN_API_KEY; unset: no authentication)")
    server.add_argument("--max-upload-mb", type=float, default=100.0,
                        help="largest accepted upload in MB (default: 100)")
    server.add_argument("--max-queue", type=int, default=64,
                        help="requests waiting for a session before 429s (default: 64)")
    server.add_argument("--max-live-streams", type=int,
                        default=limits.DEFAULT_MAX_LIVE_STREAMS, metavar="N",
                        help="realtime WebSocket connections open at once; one more is "
                        "closed with 1013 and an error event (default: "
                        f"{limits.DEFAULT_MAX_LIVE_STREAMS})")
    server.add_argument("--max-audio-seconds", type=float, default=DEFAULT_MAX_AUDIO_SECONDS,
                        help="longest audio one request may decode, from the file's declared "
                        "duration and while decoding; longer is a 413 (default: "
                        f"{DEFAULT_MAX_AUDIO_SECONDS:g})")
    server.add_argument("--header-timeout", type=float, default=limits.HEADER_TIMEOUT_S,
                        metavar="S", help="seconds a client has to send a request's headers "
                        f"(default: {limits.HEADER_TIMEOUT_S:g})")
    server.add_argument("--body-timeout", type=float, default=limits.BODY_TIMEOUT_S,
                        metavar="S", help="seconds a client has to send a whole upload; 408 "
                        f"after (default: {limits.BODY_TIMEOUT_S:g})")
    server.add_argument("--body-idle-timeout", type=float, default=limits.BODY_IDLE_TIMEOUT_S,
                        metavar="S", help="longest pause within an upload; 408 after "
                        f"(default: {limits.BODY_IDLE_TIMEOUT_S:g})")
    server.add_argument("--keep-alive-timeout", type=float, default=limits.KEEP_ALIVE_S,
                        metavar="S", help="seconds an idle connection stays open between "
                        f"requests (default: {limits.KEEP_ALIVE_S:g})")
    models = p.add_argument_group("model", "--threads: the step engine's, or each session's "
                                  "without it (none: the cores, or cores / N)")
    add_model_arguments(models, p.add_argument_group("memory planning"))
    add_arguments(p.add_argument_group("decoding defaults (a request's form fields override)"),
                  TranscribeOptions, exclude=("task",))
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tensorplan.machine import cores
    from tensorplan.serve.config import ServeConfig
    from tensorplan.serve.limits import DEFAULT_ENGINE_WINDOWS
    from tensorplan.serve.server import serve
    from tensorplan.serve.threads import default_sessions, threads_for
    from tensorplan.whisper.api import load
    from tensorplan.whisper.flags import from_args
    from tensorplan.whisper.options import TranscribeOptions
    from tensorplan.whisper.planned.load_options import model_options_from_args

    engine = args.engine_windows != 0  # requests decode on the step engine, not sessions
    sessions = default_sessions(cores(), engine) if args.sessions is None else args.sessions
    check_settings(args, sessions)
    threads = args.threads or threads_for(sessions, engine)
    model_options = model_options_from_args(args, threads=threads)
    config = ServeConfig(
        model=model_options.model,
        sessions=sessions,
        engine_windows=DEFAULT_ENGINE_WINDOWS if args.engine_windows is None
        else args.engine_windows,
        engine_memory_mb=args.engine_memory_mb,
        threads=threads,
        api_key=args.api_key or None,
        max_upload_bytes=int(args.max_upload_mb * (1 << 20)),
        max_queue=args.max_queue,
        max_live_streams=args.max_live_streams,
        defaults=from_args(TranscribeOptions, args),
        max_audio_seconds=args.max_audio_seconds,
        header_timeout_s=args.header_timeout,
        body_idle_timeout_s=args.body_idle_timeout,
        body_timeout_s=args.body_timeout,
        keep_alive_s=args.keep_alive_timeout,
    )
    logging.getLogger("tensorplan.serve").setLevel(logging.INFO)
    return serve(config, lambda: load(model_options), host=args.host, port=args.port)


def check_settings(args: argparse.Namespace, sessions: int) -> None:
    """UserError (one line, exit 2) for a configuration that cannot work, before anything
    listens or loads: every number finite and in range, a port that exists, an address
    that resolves, an API key a client can send."""
    from tensorplan.errors import UserError
    from tensorplan.serve import limits

    limits.check_port(args.port)
    limits.check_count("--sessions", sessions, 1, limits.MAX_SESSIONS)
    limits.check_count("--max-queue", args.max_queue, 0, limits.MAX_QUEUE)
    limits.check_count("--max-live-streams", args.max_live_streams, 1, limits.MAX_LIVE_STREAMS)
    if args.engine_windows is not None:
        limits.check_count("--engine-windows", args.engine_windows, 0,
                           limits.MAX_ENGINE_WINDOWS)
    if args.engine_memory_mb is not None:
        if args.engine_windows is not None:
            raise UserError("--engine-memory-mb: give it or --engine-windows, not both")
        limits.check_positive("--engine-memory-mb", args.engine_memory_mb,
                              limits.MAX_ENGINE_MEMORY_MB)
    limits.check_positive("--max-upload-mb", args.max_upload_mb, limits.MAX_UPLOAD_MB)
    limits.check_positive("--max-audio-seconds", args.max_audio_seconds, 1e7)
    for flag in ("--header-timeout", "--body-timeout", "--body-idle-timeout",
                 "--keep-alive-timeout"):
        limits.check_positive(flag, getattr(args, flag[2:].replace("-", "_")),
                              limits.MAX_TIMEOUT_S)
    limits.check_api_key(args.api_key or None)
    limits.check_host(args.host)

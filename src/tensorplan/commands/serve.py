"""`tensorplan serve`: OpenAI's /v1/audio/transcriptions and /translations over HTTP.

Model flags come from ModelOptions, as `tensorplan transcribe`'s do (`--threads` counts
each session's threads here). Decoding flags (those of `tensorplan transcribe`) set the server's
defaults; each request may override them with form fields of the same names.
"""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any

from tensorplan.errors import UserError

DEFAULT_PORT = 8000


def register(sub: Any) -> None:
    from tensorplan.whisper.model_options import add_model_arguments
    from tensorplan.whisper.options import TranscribeOptions, add_arguments

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
                        help="transcriptions run at once, each a session of the one model "
                        "(default: cores / 2, at least 1; docs/serve.md says why)")
    server.add_argument("--engine-windows", type=int, default=8, metavar="N",
                        help="requests decoded together by the step engine, their decoding "
                        "steps batched into one pass (default: 8; 0: each request runs "
                        "alone on a session; docs/engine.md)")
    server.add_argument("--api-key", default=os.environ.get("TENSORPLAN_API_KEY"),
                        help="require 'Authorization: Bearer KEY' (default: "
                        "$TENSORPLAN_API_KEY; unset: no authentication)")
    server.add_argument("--max-upload-mb", type=float, default=100.0,
                        help="largest accepted upload in MB (default: 100)")
    server.add_argument("--max-queue", type=int, default=64,
                        help="requests waiting for a session before 429s (default: 64)")
    models = p.add_argument_group("model", "--threads is per session here (none: cores / N)")
    add_model_arguments(models, p.add_argument_group("memory planning"))
    add_arguments(p.add_argument_group("decoding defaults (a request's form fields override)"),
                  TranscribeOptions, exclude=("task",))
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tensorplan.machine import cores
    from tensorplan.serve.config import ServeConfig
    from tensorplan.serve.server import serve
    from tensorplan.serve.threads import default_sessions, per_session
    from tensorplan.whisper.api import load
    from tensorplan.whisper.model_options import model_options_from_args
    from tensorplan.whisper.options import TranscribeOptions, from_args

    sessions = default_sessions(cores()) if args.sessions is None else args.sessions
    if sessions < 1 or args.max_queue < 0 or args.max_upload_mb <= 0 \
            or not 0 <= args.engine_windows <= 64:
        raise UserError("--sessions must be at least 1, --max-queue 0 or more, "
                        "--max-upload-mb positive, --engine-windows 0 to 64")
    threads = args.threads or per_session(sessions)
    model_options = model_options_from_args(args, threads=threads)
    config = ServeConfig(
        model=model_options.model,
        sessions=sessions,
        engine_windows=args.engine_windows,
        threads_per_session=threads,
        api_key=args.api_key or None,
        max_upload_bytes=int(args.max_upload_mb * (1 << 20)),
        max_queue=args.max_queue,
        defaults=from_args(TranscribeOptions, args),
    )
    logging.getLogger("tensorplan.serve").setLevel(logging.INFO)
    return serve(config, lambda: load(model_options), host=args.host, port=args.port)

"""`tensorplan serve`: OpenAI's /v1/audio/transcriptions and /translations over HTTP.

Model loading flags are in `_add_model_arguments`, one place, until they are generated from
the model options. Decoding flags (those of `tensorplan transcribe`) set the server's
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
    from tensorplan.whisper.options import TranscribeOptions, add_arguments

    p = sub.add_parser(
        "serve",
        help="serve an OpenAI-compatible transcription API and a web page",
        description="Serve POST /v1/audio/transcriptions and /v1/audio/translations "
        "(OpenAI's API), /v1/models, /health, /ready and a web page at /.",
    )
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default: 127.0.0.1; without --api-key keep it local)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="TCP port (default: 8000)")
    p.add_argument("--sessions", type=int, default=None, metavar="N",
                   help="transcriptions run at once, each a session of the one model "
                   "(default: 1; see docs/serve.md for the measurements behind it)")
    p.add_argument("--threads-per-session", type=int, default=None, metavar="K",
                   help="CPU threads each session computes with (default: cores / N)")
    p.add_argument("--api-key", default=os.environ.get("TENSORPLAN_API_KEY"),
                   help="require 'Authorization: Bearer KEY' (default: $TENSORPLAN_API_KEY; "
                   "unset: no authentication)")
    p.add_argument("--max-upload-mb", type=float, default=100.0,
                   help="largest accepted upload in MB (default: 100)")
    p.add_argument("--max-queue", type=int, default=64,
                   help="requests waiting for a session before 429s (default: 64)")
    _add_model_arguments(p)
    add_arguments(p.add_argument_group("decoding defaults (a request's form fields override)"),
                  TranscribeOptions, exclude=("task",))
    p.set_defaults(func=run)


def _add_model_arguments(p: argparse.ArgumentParser) -> None:
    from tensorplan.backends import BACKENDS
    from tensorplan.whisper.model import COMPUTE_TYPES

    p.add_argument("--model", default="tiny.en",
                   help="tiny.en (bundled), base, small, or a model directory")
    p.add_argument("--compute-type", choices=COMPUTE_TYPES, default="float32",
                   help="int8 quantizes the projection matrices (faster)")
    p.add_argument("--backend", choices=BACKENDS, default="auto",
                   help="numpy, torch, or auto (torch when installed)")


def _load_options(args: argparse.Namespace) -> dict[str, Any]:
    return {"compute_type": args.compute_type, "backend": args.backend}


def run(args: argparse.Namespace) -> int:
    from tensorplan.serve.config import ServeConfig
    from tensorplan.serve.server import serve
    from tensorplan.serve.threads import ThreadBudget, cores
    from tensorplan.whisper.api import load_model
    from tensorplan.whisper.options import TranscribeOptions, from_args

    sessions = args.sessions or 1
    if sessions < 1 or (args.threads_per_session is not None and args.threads_per_session < 1):
        raise UserError("--sessions and --threads-per-session must be at least 1")
    if args.max_queue < 0 or args.max_upload_mb <= 0:
        raise UserError("--max-queue must be 0 or more, --max-upload-mb positive")
    threads = args.threads_per_session or ThreadBudget.divide(sessions, cores()).per_session
    config = ServeConfig(
        model=args.model,
        load_options=_load_options(args),
        sessions=sessions,
        threads_per_session=threads,
        api_key=args.api_key or None,
        max_upload_bytes=int(args.max_upload_mb * (1 << 20)),
        max_queue=args.max_queue,
        defaults=from_args(TranscribeOptions, args),
    )
    logging.getLogger("tensorplan.serve").setLevel(logging.INFO)

    def load() -> Any:
        return load_model(config.model, **config.load_options)

    return serve(config, load, host=args.host, port=args.port)

"""`tensorplan export --format openai|ggml --out FILE`: write a model in a peer's format."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

# whisper/model_files/export.py's EXPORT_FORMATS, kept here import-free
EXPORT_FORMATS = ("openai", "ggml")


def register(sub: Any) -> None:
    p = sub.add_parser(
        "export",
        help="write a Whisper model as an openai-whisper .pt or a whisper.cpp ggml .bin",
        description="Convert a Whisper model (a name, a CTranslate2 directory, a .pt or a ggml "
        ".bin) to openai-whisper's checkpoint (needs torch) or whisper.cpp's ggml f16 file.",
    )
    p.add_argument("--model", default="tiny.en",
                   help="tiny.en (bundled), base, small, a CT2 directory, a .pt or a ggml .bin")
    p.add_argument("--format", required=True, choices=EXPORT_FORMATS, dest="fmt",
                   help="openai: torch checkpoint for whisper.load_model; ggml: for whisper.cpp")
    p.add_argument("--out", required=True, type=Path, metavar="FILE", help="the file to write")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tensorplan.whisper.model_files.export import export_model

    path = export_model(args.out, args.fmt, args.model)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB, {args.fmt})")
    return 0

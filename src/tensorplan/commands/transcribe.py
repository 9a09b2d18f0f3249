"""`tensorplan transcribe AUDIO...`: print segments as they come, write output files."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from tensorplan.errors import UserError
from tensorplan.pipeline import PLAN_MODES


def register(sub: Any) -> None:
    from tensorplan.whisper.options import TranscribeOptions, add_arguments

    p = sub.add_parser("transcribe", help="transcribe audio files",
                       description="Transcribe audio files with Whisper on the planned runtime.")
    p.add_argument("audio", nargs="+", help="audio files (any format ffmpeg reads)")
    p.add_argument("--model", default="tiny.en",
                   help="tiny.en (bundled), base, small, or a CTranslate2 model directory")
    p.add_argument("--output-dir", "-o", type=Path, default=None,
                   help="write output files here (default: none; '.' when --output-format "
                        "is given)")
    p.add_argument("--output-format", "-f", default=None,
                   help="comma list of txt,vtt,srt,tsv,json or 'all' (default: all when "
                        "--output-dir is given)")
    p.add_argument("--plan", choices=PLAN_MODES, default="joint",
                   help="how tensors handed between graphs stay alive (default: joint, the "
                        "leanest measured)")
    p.add_argument("--strategy", choices=("offline", "ggml"), default="offline",
                   help="memory planning strategy")
    p.add_argument("--verbose", action=argparse.BooleanOptionalAction, default=True,
                   help="print each segment as it is decoded")
    add_arguments(p.add_argument_group("decoding"), TranscribeOptions)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tensorplan.whisper.api import load_model
    from tensorplan.whisper.options import TranscribeOptions, from_args
    from tensorplan.whisper.writers import parse_formats, write_outputs

    options = from_args(TranscribeOptions, args)
    formats: tuple[str, ...] = ()
    out_dir = args.output_dir
    if args.output_format is not None or out_dir is not None:
        formats = parse_formats(args.output_format or "all")
        out_dir = out_dir or Path(".")
    paths = [Path(a) for a in args.audio]
    model = load_model(args.model, plan=args.plan, strategy=args.strategy,
                       max_batch=max(options.beam_size or 1, options.best_of or 1))
    failed = 0
    for path in paths:
        try:
            result = model.transcribe(path, options, on_segment=_printer(args.verbose),
                                      progress=_progress_bar(path))
        except UserError as e:
            if len(paths) == 1:
                raise
            print(f"tensorplan: error: {e}", file=sys.stderr)
            failed += 1
            continue
        if not args.verbose:
            print(result.text.strip())
        if formats:
            write_outputs(result, path, out_dir, formats)
    return 2 if failed else 0


def _printer(verbose: bool) -> Any:
    from tensorplan.whisper.writers import format_timestamp

    def on_segment(seg: Any) -> None:
        if verbose:
            start, end = format_timestamp(seg.start), format_timestamp(seg.end)
            print(f"[{start} --> {end}] {seg.text}", flush=True)

    return on_segment


def _progress_bar(path: Path) -> Any:
    """A tqdm bar over audio seconds, only on a terminal."""
    if not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    bar: dict[str, Any] = {}

    def progress(done: int, total: int) -> None:
        if "bar" not in bar:
            bar["bar"] = tqdm(total=round(total / 100, 2), unit="s", desc=path.name, leave=False)
        b = bar["bar"]
        b.update(round(done / 100, 2) - b.n)
        if done >= total:
            b.close()

    return progress

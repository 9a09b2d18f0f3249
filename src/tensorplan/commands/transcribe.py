"""`tensorplan transcribe AUDIO...`: print segments as they come, write output files.

Batch mode (tensorplan.batch: resumable through a manifest in OUT, files retried once, longest
first) runs when --workers or --ray is given, when an argument is a directory, or when several
files go to an --output-dir; it needs --output-dir. Without --workers/--ray it uses one model
in this process. One file, or several without --output-dir, take the plain path below, which
prints segments as they are decoded.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tensorplan.errors import UserError, one_line

if TYPE_CHECKING:  # imported where used, at run time: `tensorplan --help` stays fast
    from tensorplan.whisper.options import TranscribeOptions
    from tensorplan.whisper.planned.load_options import ModelOptions
    from tensorplan.whisper.result import Segment
    from tensorplan.whisper.writers import SubtitleOptions


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The flags in the order `--help` lists them: everyday ones first, planner internals
    last. Each group is one `add_argument_group` call below; reorder groups here."""
    from tensorplan.commands import openai_flags
    from tensorplan.whisper.flags import add_arguments
    from tensorplan.whisper.options import TranscribeOptions
    from tensorplan.whisper.planned.load_options import add_model_arguments

    p = sub.add_parser(
        "transcribe",
        help="transcribe audio files",
        usage="%(prog)s [options] AUDIO [AUDIO ...]",  # the full list is 40 lines
        description="Transcribe audio files with Whisper on the planned runtime. Flags may "
        "also be spelled as openai-whisper does (--output_dir, --verbose False).",
    )
    p.add_argument(
        "audio",
        nargs="+",
        help="audio files (any format ffmpeg reads) or directories (searched "
        "recursively for .wav .flac .mp3 .m4a .mp4 .ogg .opus .webm .mkv .aac)",
    )
    everyday = p.add_argument_group("everyday")
    everyday.add_argument(
        "--output-dir",
        "-o",
        type=Path,
        default=None,
        help="write output files here (default: none; '.' when --output-format is given)",
    )
    everyday.add_argument(
        "--output-format",
        "-f",
        default=None,
        help="comma list of txt,vtt,srt,tsv,json or 'all' (default: all when "
        "--output-dir is given)",
    )
    everyday.add_argument(
        "--verbose",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="print each segment as it is decoded (--verbose False works too)",
    )
    add_arguments(everyday, TranscribeOptions, group="everyday")
    _add_subtitle_arguments(p.add_argument_group(
        "subtitles", "srt and vtt lines from word timings, as openai-whisper's (each needs "
        "--word-timestamps)"))
    openai_flags.add_arguments(p.add_argument_group(
        "openai-whisper compatibility", "accepted so that scripts for openai-whisper run"))
    _add_batch_arguments(
        p.add_argument_group(
            "many files", "resumable batches: a manifest in --output-dir records what is done"
        )
    )
    add_arguments(p.add_argument_group("decoding"), TranscribeOptions, group="decoding")
    planning = p.add_argument_group(
        "memory planning", "how the model's tensors are laid out in memory and computed")
    add_model_arguments(everyday, planning)
    p.set_defaults(func=run)


def _add_subtitle_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--highlight-words", action=argparse.BooleanOptionalAction,
                       default=False, help="underline each word while it is spoken")
    group.add_argument("--max-line-width", type=_positive_int, default=None, metavar="N",
                       help="the most characters in a line before it breaks")
    group.add_argument("--max-line-count", type=_positive_int, default=None, metavar="N",
                       help="the most lines in a subtitle (needs --max-line-width)")
    group.add_argument("--max-words-per-line", type=_positive_int, default=None, metavar="N",
                       help="the most words in a subtitle (no effect with --max-line-width)")


def subtitle_options(args: argparse.Namespace) -> SubtitleOptions:
    """The writers' SubtitleOptions, checked as openai-whisper's CLI checks them: an error
    without --word-timestamps, a warning for a flag that has no effect."""
    from tensorplan.whisper.writers import SubtitleOptions

    names = ("highlight_words", "max_line_width", "max_line_count", "max_words_per_line")
    values = {name: getattr(args, name) for name in names}
    flag = next((n for n in names if values[n]), None)
    if flag is not None and not args.word_timestamps:
        raise UserError(f"--{flag.replace('_', '-')} requires --word-timestamps")
    unused = []
    if values["max_line_count"] and not values["max_line_width"]:
        unused.append("--max-line-count has no effect without --max-line-width")
    if values["max_words_per_line"] and values["max_line_width"]:
        unused.append("--max-words-per-line has no effect with --max-line-width")
    for message in unused:
        print(f"tensorplan: warning: {message}", file=sys.stderr)
    return SubtitleOptions(**values)


def _add_batch_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--workers",
        "-j",
        type=_positive_int,
        default=None,
        metavar="N",
        help="transcribe in N worker processes, one model each (with --ray: N "
        "actors; default there: the cluster's CPUs / --cpus-per-worker)",
    )
    group.add_argument(
        "--ray",
        metavar="ADDRESS",
        default=None,
        help="run the workers as Ray actors: 'local' starts Ray here, 'auto' "
        "joins this node's cluster, HOST:6379 names a cluster's head",
    )
    group.add_argument(
        "--cpus-per-worker",
        type=_thread_count,
        default=None,
        metavar="K",
        help="BLAS threads per worker, and CPUs each Ray actor reserves "
        "(default: cores / workers locally, 1 with --ray)",
    )


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _thread_count(text: str) -> int:
    """A positive count of threads, at most what --threads takes (it sets OMP_NUM_THREADS
    and the BLAS pools of every worker: 5000 started 64 threads a worker on 2 cores)."""
    from tensorplan.whisper.planned.load_options import MAX_THREADS

    value = _positive_int(text)
    if value > MAX_THREADS:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_THREADS}, got {text!r}")
    return value


def run(args: argparse.Namespace) -> int:
    from tensorplan.commands import openai_flags
    from tensorplan.whisper.api import load
    from tensorplan.whisper.flags import from_args
    from tensorplan.whisper.options import TranscribeOptions
    from tensorplan.whisper.writers import (
        check_outputs,
        ensure_output_dir,
        parse_formats,
        write_outputs,
    )

    openai_flags.apply(args)
    options = from_args(TranscribeOptions, args)
    subtitles = subtitle_options(args)
    if _is_batch(args):
        return run_batch_command(args, options, subtitles)
    formats: tuple[str, ...] = ()
    out_dir = args.output_dir
    if args.output_format is not None or out_dir is not None:
        formats = parse_formats(args.output_format or "all")
        out_dir = out_dir or Path(".")
    paths = list(args.audio)  # strings: Path("./-") would become "-", stdin
    if formats:  # a bad output directory or a collision fails now, not after transcribing
        ensure_output_dir(out_dir)
        check_outputs(paths, out_dir, formats)
    opts = model_options(args, options)
    model = load(opts, audio_seconds=_audio_seconds(paths, opts, options.clip_timestamps))
    failed = 0
    for path in paths:
        try:
            result = model.transcribe(
                path, options, on_segment=_printer(args.verbose),
                progress=_progress_bar(Path(path))
            )
        except UserError as e:
            if len(paths) == 1:
                raise
            print(f"tensorplan: error: {one_line(str(e))}", file=sys.stderr)
            failed += 1
            continue
        if not args.verbose:
            print(result.text.strip())
        if formats:
            write_outputs(result, path, out_dir, formats, subtitles)
    return 2 if failed else 0


def _audio_seconds(paths: list[Path], opts: ModelOptions,
                   clips: Sequence[float]) -> float | None:
    """What will be transcribed of the files (their duration, cut to the clips), for
    backend auto to weigh PyTorch's start-up against; probed only where it decides
    something (auto, float32 weights, torch installed)."""
    from tensorplan.backends import torch_available
    from tensorplan.whisper.planned import backend_choice

    if opts.backend != "auto" or opts.compute_type == "int8" or not torch_available():
        return None
    return backend_choice.audio_seconds(paths, clips)


def _is_batch(args: argparse.Namespace) -> bool:
    return (
        args.workers is not None
        or args.ray is not None
        or any(Path(a).is_dir() for a in args.audio)
        or (len(args.audio) > 1 and args.output_dir is not None)
    )


def run_batch_command(args: argparse.Namespace, options: TranscribeOptions,
                      subtitles: SubtitleOptions | None = None) -> int:
    """Batch mode: every input to --output-dir through a pool; 2 if any file failed."""
    from tensorplan import batch
    from tensorplan.batch.jobs import output_names
    from tensorplan.files import writable_target
    from tensorplan.whisper.writers import parse_formats

    if args.output_dir is None:
        raise UserError("--output-dir is needed with --workers, --ray or a directory of audio")
    formats = parse_formats(args.output_format or "all")
    inputs = batch.collect_inputs(args.audio)
    for item in inputs:  # a directory where an output goes: said now, not mid-batch
        for name in output_names(item.key, formats):
            writable_target(Path(args.output_dir) / name)
    spec = batch.ModelSpec.of(model_options(args, options))

    def make_pool(n_files: int) -> batch.Pool:
        if args.ray is not None:
            from tensorplan.batch.ray_pool import RayPool

            return RayPool(
                spec,
                options,
                args.ray,
                n_workers=args.workers,
                cpus_per_worker=args.cpus_per_worker or 1,
                max_workers=n_files,
            )
        if args.workers is not None:
            n_workers = min(args.workers, n_files)
            return batch.LocalPool(spec, options, n_workers, threads=args.cpus_per_worker)
        return batch.InProcessPool(spec, options)

    report = batch.run_batch(
        inputs,
        args.output_dir,
        formats,
        spec=spec,
        options=options,
        make_pool=make_pool,
        verbose=args.verbose,
        subtitles=subtitles,
    )
    print(f"tensorplan: {report.summary()}", file=sys.stderr)
    return report.exit_code


def _printer(verbose: bool) -> Callable[[Segment], None]:
    from tensorplan.whisper.writers import format_timestamp

    def on_segment(seg: Segment) -> None:
        if verbose:
            start, end = format_timestamp(seg.start), format_timestamp(seg.end)
            print(f"[{start} --> {end}] {seg.text}", flush=True)

    return on_segment


def _progress_bar(path: Path) -> Callable[[int, int], None] | None:
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


def model_options(args: argparse.Namespace, options: TranscribeOptions,
                  **changes: Any) -> ModelOptions:
    """The ModelOptions of the flags (and `changes`); the KV cache sized for the decoding
    options unless --max-batch says otherwise. Every command that decodes with flags loads
    through here: `live` and `wyoming` with --beam-size 8 failed every decode on a cache
    planned for 5."""
    from tensorplan.whisper.options import max_batch
    from tensorplan.whisper.planned.load_options import model_options_from_args

    opts = model_options_from_args(args, **changes)
    return opts if opts.max_batch is not None else opts.replace(max_batch=max_batch(options))



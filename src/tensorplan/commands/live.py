"""`tensorplan live SOURCE`: transcribe as the audio arrives, with the live engine the
server's /v1/realtime uses (tensorplan.live).

SOURCE is a file (played at real-time pace with --realtime, else as fast as the decoding
goes), `-` for raw PCM on standard input (--rate, --channels, --encoding as sox and ffmpeg
spell them), or `--mic` for the microphone (the optional `sounddevice` package). On a
terminal the uncertain tail is shown dimmed after the committed words and rewritten in
place; piped, each turn is printed as one line once it is committed. -o/-f write the
turns with `transcribe`'s writers at the end.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tensorplan.errors import UserError

PIECE_S = 0.1  # audio handed to the stream at a time
MAX_AHEAD_S = 30.0  # a fast source waits while this much audio waits for decoding
DECODING_FLAGS = ("language", "beam_size", "best_of", "patience", "temperature",
                  "initial_prompt", "suppress_tokens", "no_speech_threshold",
                  "logprob_threshold", "compression_ratio_threshold")
MIC_HINT = "the microphone needs the sounddevice package: pip install 'tensorplan[live]'"


def register(sub: Any) -> None:
    from tensorplan.live.options import TurnDetection
    from tensorplan.whisper.flags import add_arguments
    from tensorplan.whisper.options import TranscribeOptions
    from tensorplan.whisper.planned.load_options import add_model_arguments

    p = sub.add_parser(
        "live", help="transcribe a live stream: a microphone, raw PCM on stdin, or a file",
        description="Transcribe audio as it arrives: committed words never change; on a "
        "terminal the uncertain tail is shown dimmed and rewritten.")
    p.add_argument("source", nargs="?", default=None,
                   help="an audio file (any format ffmpeg reads), or '-' for raw PCM on "
                   "standard input; none with --mic")
    src = p.add_argument_group("source")
    src.add_argument("--mic", action="store_true", help="listen to the default microphone")
    src.add_argument("--realtime", action="store_true",
                     help="play a file at real-time pace (default: as fast as it decodes)")
    src.add_argument("--rate", "-r", type=int, default=16000,
                     help="stdin's sample rate in Hz (default: 16000)")
    src.add_argument("--channels", "-c", type=int, default=1,
                     help="stdin's channels, mixed to mono (default: 1)")
    src.add_argument("--encoding", "-e", choices=("s16le", "mulaw", "alaw"), default="s16le",
                     help="stdin's samples (default: s16le, ffmpeg's -f s16le)")
    out = p.add_argument_group("output")
    out.add_argument("--output-dir", "-o", type=Path, default=None,
                     help="write the turns here at the end (default: none; '.' with -f)")
    out.add_argument("--output-format", "-f", default=None,
                     help="comma list of txt,vtt,srt,tsv,json or 'all' (default: all with -o)")
    add_arguments(p.add_argument_group("turns (OpenAI's server VAD)"), TurnDetection)
    decoding = p.add_argument_group("decoding")
    add_arguments(decoding, TranscribeOptions, only=DECODING_FLAGS)
    add_model_arguments(p.add_argument_group("model"), p.add_argument_group("memory planning"))
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import dataclasses

    from tensorplan.commands.transcribe import model_options
    from tensorplan.files import check_writable_dir
    from tensorplan.live import LiveEngine, LiveOptions, TurnDetection
    from tensorplan.whisper.api import load
    from tensorplan.whisper.flags import from_args
    from tensorplan.whisper.limits import check_token_ids
    from tensorplan.whisper.options import TranscribeOptions
    from tensorplan.whisper.writers import check_outputs, ensure_output_dir, parse_formats

    reader = _reader(args)  # a bad source or flag fails before the model loads
    decoding = from_args(TranscribeOptions, args)
    detection = from_args(TurnDetection, args)
    formats = None
    out_dir = args.output_dir or Path(".")
    if args.output_dir is not None or args.output_format is not None:
        # before the model loads: a live session's text cannot be had again at the end
        formats = parse_formats(args.output_format or "all")
        ensure_output_dir(out_dir)
        check_writable_dir(out_dir)
        check_outputs([_name(args)], out_dir, formats)
    language = _language_code(decoding.language)
    model = load(model_options(args, decoding))
    if language not in (None, "en") and not model.is_multilingual:
        raise UserError(f"--language {decoding.language}: {model.name} is English-only")
    # before the first turn: else every turn's decode fails on it
    check_token_ids([t for t in decoding.suppress_tokens or () if t >= 0],
                    model.dims.n_vocab, "--suppress-tokens")
    options = LiveOptions(decoding=dataclasses.replace(decoding, initial_prompt=None),
                          prompt=decoding.initial_prompt)
    printer = Printer(sys.stdout)
    interrupted: KeyboardInterrupt | None = None
    stopped = True
    with model.session() as session:
        @contextmanager
        def lend() -> Any:
            yield session

        engine = LiveEngine(lend, workers=1)
        stream = engine.open(options, detection, printer.take)
        try:
            try:
                reader(stream)
            except KeyboardInterrupt as e:  # Ctrl-C (the microphone's way to stop) or SIGTERM
                interrupted = e
            stream.commit()  # the last turn still gets its text
            while not stream.idle():
                time.sleep(0.05)
        except KeyboardInterrupt as e:  # again while the last turn decodes: stop waiting
            interrupted = interrupted or e
        finally:
            stopped = _shut_down(engine)
    with _uninterrupted():  # a late Ctrl-C must not cut the outputs short
        printer.finish()
        if formats is not None:
            _write(printer, out_dir, _name(args), formats, decoding.language or "en")
    if printer.failed:
        raise UserError(f"{printer.failed} turn(s) could not be transcribed: "
                        f"{printer.failure}")
    if not stopped:  # a decode is still in native code: leave without tearing it down
        sys.stdout.flush()
        sys.stderr.write("tensorplan: interrupted\n")
        sys.stderr.flush()
        os._exit(130)
    if interrupted is not None and not (args.mic and type(interrupted) is KeyboardInterrupt):
        raise interrupted  # the CLI's one line and exit code (130, or 143 for SIGTERM)
    return 0


def _name(args: argparse.Namespace) -> str:
    return "live" if args.source in (None, "-") else str(args.source)


@contextmanager
def _uninterrupted() -> Iterator[None]:
    """Ctrl-C ignored inside (the outputs take milliseconds to write): under load a second
    Ctrl-C sent right after the first could land in the write, and lose the file."""
    try:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread: signals are not ours to handle
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _shut_down(engine: Any) -> bool:
    """Stop the engine's worker after the decode in flight; False if another interrupt
    came first (the worker may still be inside a kernel)."""
    try:
        engine.shutdown()
    except KeyboardInterrupt:
        return False
    return True


class Printer:
    """Committed words as they come; the tail after them, dimmed, on a terminal only."""

    def __init__(self, out: Any) -> None:
        self.out = out
        self.tty = out.isatty()
        self.completed: list[Any] = []
        self._line = ""  # the committed text of the turn on screen
        self._lock = threading.Lock()
        self.failed = 0  # turns whose decode failed
        self.failure = ""  # the first one's message
        self.closed = False  # stdout's reader left (`| head`): the turns are still kept

    def take(self, events: list[Any]) -> None:
        from tensorplan.live import Completed, Delta, Tail
        from tensorplan.live.events import Failed

        with self._lock:
            for e in events:
                if isinstance(e, Failed):
                    self.failed += 1
                    self.failure = self.failure or e.message
                elif isinstance(e, Completed):
                    self.completed.append(e)
                    self._show(e.transcript, "", end=True)
                    self._line = ""
                elif isinstance(e, Delta):
                    self._line += e.text
                    self._show(self._line, "")
                elif isinstance(e, Tail):
                    self._show(self._line, e.text)

    def _show(self, committed: str, tail: str, end: bool = False) -> None:
        if self.closed:
            return
        try:
            if self.tty:
                dim = f"\033[2m{tail}\033[0m" if tail else ""
                self.out.write(f"\r\033[K{committed}{dim}" + ("\n" if end else ""))
            elif end and committed:
                self.out.write(committed + "\n")
            self.out.flush()
        except BrokenPipeError:  # in the engine's thread: it would fail the next turn
            self.closed = True

    def finish(self) -> None:
        if self.closed:
            # what Python would print at exit, flushing into the closed pipe, is silenced
            os.dup2(os.open(os.devnull, os.O_WRONLY), self.out.fileno())
            return
        self.out.flush()


def _reader(args: argparse.Namespace) -> Any:
    if args.mic:
        if args.source is not None:
            raise UserError("give either SOURCE or --mic, not both")
        return _microphone()
    if args.source is None:
        raise UserError("no source: give an audio file, '-' for raw PCM on stdin, or --mic")
    if args.source == "-":
        from tensorplan.live.pcm import PcmDecoder

        if sys.stdin is None:  # started with stdin closed (`<&-`)
            raise UserError("-: standard input is closed: pipe raw PCM into it")

        try:
            decoder = PcmDecoder(args.encoding, args.rate, args.channels)
        except ValueError as e:
            raise UserError(f"--rate/--channels: {e}") from None
        return lambda stream: _stdin(stream, decoder)
    path = Path(args.source)
    if path.is_dir():
        raise UserError(f"{args.source}: is a directory, not an audio file")
    if not path.exists():  # not is_file(): /dev/stdin and named pipes are read as files are
        raise UserError(f"{args.source}: no such file")
    return lambda stream: _file(stream, path, args.realtime)


def _feed(stream: Any, samples: Any) -> None:
    while stream.backlog_s() > MAX_AHEAD_S:  # bounded: the decoding sets the pace
        time.sleep(0.05)
    stream.append(samples)


def _file(stream: Any, path: Path, realtime: bool) -> None:
    from tensorplan.whisper.audio.decode import load_audio

    audio = load_audio(str(path))
    step = int(PIECE_S * 16000)
    t0 = time.monotonic()
    for i in range(0, len(audio), step):
        _feed(stream, audio[i:i + step])
        if realtime:
            time.sleep(max(0.0, t0 + (i + step) / 16000 - time.monotonic()))


def _stdin(stream: Any, decoder: Any) -> None:
    piece = max(decoder.frame_bytes, int(decoder.rate * PIECE_S) * decoder.frame_bytes)
    source = sys.stdin.buffer
    read = 0
    while data := source.read(piece):
        read += len(data)
        _feed(stream, decoder.decode(data))
    if not read:  # an upstream ffmpeg that failed, or nothing piped: say so, not silence
        raise UserError("-: standard input ended before any audio (0 bytes)")
    _feed(stream, decoder.decode(b"", last=True))


def _microphone() -> Any:
    try:
        import sounddevice
    except ImportError:
        raise UserError(MIC_HINT) from None
    except OSError as e:  # the package is there, PortAudio is not
        raise UserError(f"the microphone needs PortAudio for sounddevice ({e}): e.g. "
                        "apt-get install libportaudio2") from None
    import queue

    def listen(stream: Any) -> None:
        pieces: queue.SimpleQueue[Any] = queue.SimpleQueue()
        with sounddevice.InputStream(samplerate=16000, channels=1, dtype="float32",
                                     blocksize=int(16000 * PIECE_S),
                                     callback=lambda data, *_: pieces.put(data[:, 0].copy())):
            print("tensorplan: listening; Ctrl-C stops", file=sys.stderr)
            while True:
                stream.append(pieces.get())

    return listen


def _write(printer: Printer, out_dir: Path, name: str, formats: Any, language: str) -> None:
    from tensorplan.whisper.result import Segment, TranscriptionResult, Word
    from tensorplan.whisper.writers import write_outputs

    segments: list[Segment] = []
    for e in printer.completed:
        if not e.words:
            continue
        words = tuple(Word(w.text, round(w.start, 2), round(w.end, 2), round(w.probability, 4))
                      for w in e.words)
        segments.append(Segment(id=len(segments), seek=0, start=words[0].start,
                                end=words[-1].end, text=" " + e.transcript, tokens=(),
                                temperature=0.0, avg_logprob=0.0, compression_ratio=0.0,
                                no_speech_prob=0.0, words=words))
    result = TranscriptionResult(text="".join(s.text for s in segments),
                                 segments=tuple(segments), language=language)
    write_outputs(result, name, out_dir, formats)


def _language_code(language: str | None) -> str | None:
    """--language as a code ('English' is 'en'), checked before the model loads."""
    from tensorplan.whisper.tokenizer import to_language_code

    if language is None:
        return None
    try:
        return to_language_code(language)
    except UserError as e:
        raise UserError(f"--language {language}: {e}") from None

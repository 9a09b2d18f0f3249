"""Output writers compatible with openai-whisper's CLI: txt, vtt, srt, tsv and json.

Every format renders to a string first; `write_outputs` then writes each file atomically (a
temp file in the same directory, fsync, os.replace), so no reader ever sees a partial file.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from tensorplan.errors import UserError
from tensorplan.files import quote, same_file, writable_target, write_atomic
from tensorplan.whisper.result import Segment, TranscriptionResult, Word

FORMATS = ("txt", "vtt", "srt", "tsv", "json")  # what "all" means


@dataclass(frozen=True, slots=True)
class SubtitleOptions:
    """openai's --max_line_width etc.; they only change vtt/srt, and only with word timings."""

    max_line_width: int | None = None  # characters per line
    max_line_count: int | None = None  # lines per subtitle; regroups words with a width
    max_words_per_line: int | None = None  # ignored when both of the above are given
    highlight_words: bool = False  # underline each word while it is spoken

    def __post_init__(self) -> None:
        for name in ("max_line_width", "max_line_count", "max_words_per_line"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise UserError(f"{name} must be a positive integer, got {value}")


def format_timestamp(
    seconds: float, always_include_hours: bool = False, decimal_marker: str = "."
) -> str:
    """openai's format: [HH:]MM:SS.mmm, rounded to the millisecond (Python's round)."""
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"a timestamp must be finite and non-negative, got {seconds}")
    hours, ms = divmod(round(seconds * 1000.0), 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    secs, ms = divmod(ms, 1_000)
    hours_marker = f"{hours:02d}:" if always_include_hours or hours > 0 else ""
    return f"{hours_marker}{minutes:02d}:{secs:02d}{decimal_marker}{ms:03d}"


def parse_formats(formats: str | Iterable[str]) -> tuple[str, ...]:
    """ "srt,vtt", ["json", ".txt"] or "all" → known formats, in order, each once."""
    names = formats.split(",") if isinstance(formats, str) else list(formats)
    chosen: list[str] = []
    for name in (n.strip().lower().lstrip(".") for n in names):
        if name not in (*FORMATS, "all"):
            raise UserError(
                f"unknown output format {name!r} (choose from {', '.join(FORMATS)}, all)"
            )
        chosen += [f for f in (FORMATS if name == "all" else (name,)) if f not in chosen]
    if not chosen:
        raise UserError("no output format given")
    return tuple(chosen)


def render(result: TranscriptionResult, fmt: str, options: SubtitleOptions | None = None) -> str:
    """One format's whole file content."""
    return _RENDERERS[fmt](result, options or SubtitleOptions())


def write_outputs(
    result: TranscriptionResult,
    audio_path: str | os.PathLike[str],
    output_dir: str | os.PathLike[str],
    formats: str | Iterable[str],
    options: SubtitleOptions | None = None,
) -> list[Path]:
    """Write `<audio stem>.<ext>` for each format into output_dir (created if needed).

    All formats are rendered before any file is touched. A failed write leaves neither a
    partial file nor a temp file; files written before it stay. OSErrors become UserErrors.
    """
    texts = {fmt: render(result, fmt, options) for fmt in parse_formats(formats)}
    output_dir = Path(output_dir)
    ensure_output_dir(output_dir)
    check_outputs([audio_path], output_dir, tuple(texts))
    paths = []
    for fmt, text in texts.items():
        path = output_path(audio_path, output_dir, fmt)
        write_atomic(path, text.encode("utf-8"))
        paths.append(path)
    return paths


def output_path(audio_path: str | os.PathLike[str], output_dir: Path, fmt: str) -> Path:
    return output_dir / f"{Path(audio_path).stem}.{fmt}"


def check_outputs(audio_paths: Sequence[str | os.PathLike[str]], output_dir: Path,
                  formats: Sequence[str]) -> None:
    """UserError, before anything is written, if two inputs would write the same output
    (a/x.wav and b/x.wav both make x.txt) or an output would replace an input (an audio
    file named notes.txt, transcribed to txt in its own folder) or land on something that
    is not a regular file (a directory, a FIFO: found at write time, after the decode, it
    left the other formats written and the transcript lost)."""
    writers: dict[Path, str | os.PathLike[str]] = {}
    for audio in audio_paths:
        for fmt in formats:
            path = output_path(audio, output_dir, fmt)
            if path in writers:
                raise UserError(f"{quote(writers[path])} and {quote(audio)} would both write "
                                f"{quote(path)}: rename one or transcribe them separately")
            writers[path] = audio
            writable_target(path)
            for other in audio_paths:
                if same_file(path, other):
                    raise UserError(f"{quote(path)}: is an input audio file; its transcript "
                                    "would overwrite it (choose another --output-dir)")


# renderers


def _render_txt(result: TranscriptionResult, options: SubtitleOptions) -> str:
    return "".join(f"{s.text.strip()}\n" for s in result.segments)


def _render_vtt(result: TranscriptionResult, options: SubtitleOptions) -> str:
    cues = _cues(result, options, format_timestamp)
    return "WEBVTT\n\n" + "".join(f"{start} --> {end}\n{text}\n\n" for start, end, text in cues)


def _render_srt(result: TranscriptionResult, options: SubtitleOptions) -> str:
    def timestamp(seconds: float) -> str:
        return format_timestamp(seconds, always_include_hours=True, decimal_marker=",")

    cues = _cues(result, options, timestamp)
    return "".join(f"{i}\n{s} --> {e}\n{text}\n\n" for i, (s, e, text) in enumerate(cues, 1))


def _render_tsv(result: TranscriptionResult, options: SubtitleOptions) -> str:
    """Integer milliseconds, so no locale can turn the decimal point into a comma."""
    rows = ["start\tend\ttext\n"]
    for s in result.segments:
        text = s.text.strip().replace("\t", " ")
        rows.append(f"{round(1000 * s.start)}\t{round(1000 * s.end)}\t{text}\n")
    return "".join(rows)


def _render_json(result: TranscriptionResult, options: SubtitleOptions) -> str:
    return json.dumps(result.to_dict())


_RENDERERS: dict[str, Callable[[TranscriptionResult, SubtitleOptions], str]] = {
    "txt": _render_txt,
    "vtt": _render_vtt,
    "srt": _render_srt,
    "tsv": _render_tsv,
    "json": _render_json,
}


# subtitle cues (openai's SubtitlesWriter.iterate_result)


class _Placed(NamedTuple):
    """A word placed in a subtitle: its text may start with the "\\n" of a line break."""

    text: str
    start: float
    end: float


def _cues(
    result: TranscriptionResult, options: SubtitleOptions, timestamp: Callable[[float], str]
) -> Iterator[tuple[str, str, str]]:
    """(start, end, text) per cue: one per segment, or regrouped words when there are any."""
    if not result.has_words:
        for s in result.segments:
            yield timestamp(s.start), timestamp(s.end), s.text.strip().replace("-->", "->")
        return
    for subtitle in _LineBreaker(options, result.segments).subtitles():
        if options.highlight_words:
            yield from _highlighted(subtitle, timestamp)
        else:
            text = "".join(w.text for w in subtitle)
            yield timestamp(subtitle[0].start), timestamp(subtitle[-1].end), text


def _highlighted(
    subtitle: list[_Placed], timestamp: Callable[[float], str]
) -> Iterator[tuple[str, str, str]]:
    """One cue per word with that word in <u></u>, plus plain cues to fill gaps."""
    plain = "".join(w.text for w in subtitle)
    last = timestamp(subtitle[0].start)
    for i, word in enumerate(subtitle):
        start, end = timestamp(word.start), timestamp(word.end)
        if last != start:
            yield last, start, plain
        marked = (_underline(w.text) if j == i else w.text for j, w in enumerate(subtitle))
        yield start, end, "".join(marked)
        last = end


def _underline(text: str) -> str:
    return re.sub(r"^(\s*)(.*)$", r"\1<u>\2</u>", text)


class _LineBreaker:
    """Groups word timings into subtitles of lines, exactly as openai-whisper does.

    Without both max_line_width and max_line_count, each segment (or each chunk of
    max_words_per_line words) is its own subtitle, wrapped at max_line_width. With both,
    subtitles are cut after max_line_count lines or at a pause of more than 3 s.
    """

    def __init__(self, options: SubtitleOptions, segments: tuple[Segment, ...]) -> None:
        self.preserve_segments = options.max_line_count is None or options.max_line_width is None
        self.max_line_width = options.max_line_width or 1000
        self.max_line_count = options.max_line_count
        self.max_words_per_line = options.max_words_per_line or 1000
        self.segments = segments
        self.line_len = 0
        self.line_count = 1
        self.subtitle: list[_Placed] = []
        first_word = next((w for s in segments for w in s.words or ()), None)
        self.last = first_word.start if first_word else segments[0].start if segments else 0.0

    def subtitles(self) -> Iterator[list[_Placed]]:
        n = self.max_words_per_line
        for segment in self.segments:
            words = segment.words or ()
            for chunk in (words[i : i + n] for i in range(0, len(words), n)):
                for i, word in enumerate(chunk):
                    if (finished := self._place(word, starts_chunk=i == 0)) is not None:
                        yield finished
        if self.subtitle:
            yield self.subtitle

    def _place(self, word: Word, starts_chunk: bool) -> list[_Placed] | None:
        """Add a word to the current line, a new line or a new subtitle; return the
        subtitle it finished, if any."""
        text, finished = word.word, None
        long_pause = not self.preserve_segments and word.start - self.last > 3.0
        has_room = self.line_len + len(text) <= self.max_line_width
        segment_break = starts_chunk and bool(self.subtitle) and self.preserve_segments
        if self.line_len > 0 and has_room and not long_pause and not segment_break:
            self.line_len += len(text)
        else:
            text = text.strip()
            full = self.max_line_count is not None and (
                long_pause or self.line_count >= self.max_line_count
            )
            if segment_break or (self.subtitle and full):
                finished, self.subtitle, self.line_count = self.subtitle, [], 1
            elif self.line_len > 0:
                self.line_count += 1
                text = "\n" + text
            self.line_len = len(text.strip())
        self.subtitle.append(_Placed(text, word.start, word.end))
        self.last = word.start
        return finished


# atomic files


def ensure_output_dir(output_dir: Path) -> None:
    if output_dir.exists() and not output_dir.is_dir():
        raise UserError(f"output directory {output_dir} is not a directory")
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create output directory {output_dir}: {_reason(e)}") from None


def _reason(e: OSError) -> str:
    if e.strerror:
        return e.strerror
    return str(e).splitlines()[0] if str(e) else type(e).__name__

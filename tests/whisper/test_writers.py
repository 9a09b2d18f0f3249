"""Writers: exact openai formats, parsed back by small parsers here, and atomic files."""

from __future__ import annotations

import errno
import json
import os
import re
from pathlib import Path

import pytest

from tensorplan import files
from tensorplan.errors import UserError
from tensorplan.whisper.result import Segment, TranscriptionResult, Word
from tensorplan.whisper.writers import (
    FORMATS,
    SubtitleOptions,
    format_timestamp,
    parse_formats,
    render,
    write_outputs,
)


def _segment(
    i: int, start: float, end: float, text: str, words: list[Word] | None = None
) -> Segment:
    return Segment(
        id=i,
        seek=int(start * 100),
        start=start,
        end=end,
        text=text,
        tokens=(50364 + i, 400 + i, 50414 + i),
        temperature=0.0,
        avg_logprob=-0.25,
        compression_ratio=1.5,
        no_speech_prob=0.01,
        words=None if words is None else tuple(words),
    )


SEGMENTS = (
    _segment(0, 0.0, 2.5, " And so my fellow Americans,"),
    _segment(1, 2.5, 65.1234, " ask not\twhat --> your country"),
    _segment(2, 3600.5, 3725.0004, " can do for you."),
)
RESULT = TranscriptionResult(
    text="".join(s.text for s in SEGMENTS), segments=SEGMENTS, language="en"
)


def _words_result(second_start: float = 5.3) -> TranscriptionResult:
    segments = (
        _segment(
            0,
            0.0,
            1.0,
            " Hello world.",
            [Word(" Hello", 0.0, 0.5, 0.9), Word(" world.", 0.5, 1.0, 0.8)],
        ),
        _segment(
            1,
            5.0,
            6.0,
            " How are you?",
            [
                Word(" How", 5.0, 5.3, 0.7),
                Word(" are", second_start, 5.5, 0.6),
                Word(" you?", 5.5, 6.0, 0.5),
            ],
        ),
    )
    return TranscriptionResult(" Hello world. How are you?", segments, "en")


# small parsers: times in seconds, texts as written


def _seconds(stamp: str) -> float:
    *hours, minutes, seconds = re.split("[:]", stamp.replace(",", "."))
    return int(hours[0] if hours else 0) * 3600 + int(minutes) * 60 + float(seconds)


def _parse_cues(blocks: list[str], with_index: bool) -> list[tuple[float, float, str]]:
    cues = []
    for n, block in enumerate(blocks, 1):
        lines = block.split("\n")
        if with_index:
            assert lines.pop(0) == str(n)
        start, end = lines[0].split(" --> ")
        cues.append((_seconds(start), _seconds(end), "\n".join(lines[1:])))
    return cues


def parse_srt(text: str) -> list[tuple[float, float, str]]:
    assert text.endswith("\n\n") or text == ""
    assert all(
        re.fullmatch(r"\d{2,}:\d\d:\d\d,\d{3}", t)
        for t in re.findall(r"\S+(?= -->)|(?<=--> )\S+", text)
    )
    return _parse_cues(text.split("\n\n")[:-1], with_index=True)


def parse_vtt(text: str) -> list[tuple[float, float, str]]:
    header, *blocks = text.split("\n\n")
    assert header == "WEBVTT" and blocks[-1] == ""
    assert all(
        re.fullmatch(r"(\d{2,}:)?\d\d:\d\d\.\d{3}", t)
        for t in re.findall(r"\S+(?= -->)|(?<=--> )\S+", text)
    )
    return _parse_cues(blocks[:-1], with_index=False)


def parse_tsv(text: str) -> list[tuple[float, float, str]]:
    header, *rows = text.split("\n")[:-1]
    assert header == "start\tend\ttext"
    return [(int(s) / 1000, int(e) / 1000, t) for s, e, t in (row.split("\t") for row in rows)]


def _expected(
    result: TranscriptionResult, arrow: bool, tab: bool
) -> list[tuple[float, float, str]]:
    def text(s: Segment) -> str:
        t = s.text.strip()
        return t.replace("-->", "->") if arrow else t.replace("\t", " ") if tab else t

    return [
        (round(s.start * 1000) / 1000, round(s.end * 1000) / 1000, text(s)) for s in result.segments
    ]


# format_timestamp


@pytest.mark.parametrize(
    "seconds, hours, marker, expected",
    [
        (0, False, ".", "00:00.000"),
        (0, True, ",", "00:00:00,000"),
        (59.999, False, ".", "00:59.999"),
        (59.9999, False, ".", "01:00.000"),  # rounds up into the next minute
        (3599.9999, False, ".", "01:00:00.000"),  # …and into the first hour, which then shows
        (3600, False, ".", "01:00:00.000"),
        (3661.001, True, ",", "01:01:01,001"),
        (360_000, False, ".", "100:00:00.000"),
        (0.0625, False, ".", "00:00.062"),  # exactly half a millisecond: Python's round, to even
        (0.1875, False, ".", "00:00.188"),
    ],
)
def test_format_timestamp(seconds: float, hours: bool, marker: str, expected: str) -> None:
    assert format_timestamp(seconds, always_include_hours=hours, decimal_marker=marker) == expected


@pytest.mark.parametrize("seconds", [-0.001, float("nan"), float("inf")])
def test_format_timestamp_rejects(seconds: float) -> None:
    with pytest.raises(ValueError, match="finite and non-negative"):
        format_timestamp(seconds)


# each format, parsed back


def test_srt_round_trip() -> None:
    text = render(RESULT, "srt")
    assert text.startswith("1\n00:00:00,000 --> 00:00:02,500\nAnd so my fellow Americans,\n\n2\n")
    assert parse_srt(text) == _expected(RESULT, arrow=True, tab=False)
    assert "01:02:05,000" in text


def test_vtt_round_trip() -> None:
    text = render(RESULT, "vtt")
    assert text.startswith("WEBVTT\n\n00:00.000 --> 00:02.500\nAnd so my fellow Americans,\n\n")
    assert parse_vtt(text) == _expected(RESULT, arrow=True, tab=False)
    assert "01:00:00.500 --> 01:02:05.000" in text  # hours only where needed


def test_tsv_round_trip() -> None:
    text = render(RESULT, "tsv")
    assert "\n3600500\t3725000\tcan do for you.\n" in text
    assert parse_tsv(text) == _expected(RESULT, arrow=False, tab=True)


def test_txt() -> None:
    assert render(RESULT, "txt").split("\n") == [s.text.strip() for s in SEGMENTS] + [""]


def test_json_round_trip() -> None:
    loaded = json.loads(render(RESULT, "json"))
    assert list(loaded) == ["text", "segments", "language"]
    assert list(loaded["segments"][0]) == [
        "id", "seek", "start", "end", "text", "tokens",
        "temperature", "avg_logprob", "compression_ratio", "no_speech_prob",
    ]  # fmt: skip
    assert TranscriptionResult.from_dict(loaded) == RESULT
    words = _words_result()
    loaded = json.loads(render(words, "json"))
    assert loaded["segments"][1]["words"][2] == {
        "word": " you?",
        "start": 5.5,
        "end": 6.0,
        "probability": 0.5,
    }
    assert TranscriptionResult.from_dict(loaded) == words


def test_empty_result() -> None:
    empty = TranscriptionResult("", (), "en")
    assert [render(empty, f) for f in ("txt", "vtt", "srt", "tsv")] == [
        "",
        "WEBVTT\n\n",
        "",
        "start\tend\ttext\n",
    ]


# word-level subtitles (openai's SubtitlesWriter)


@pytest.mark.parametrize(
    "options, cues",
    [
        (SubtitleOptions(), [(0.0, 1.0, "Hello world."), (5.0, 6.0, "How are you?")]),
        (
            SubtitleOptions(max_words_per_line=2),
            [(0.0, 1.0, "Hello world."), (5.0, 5.5, "How are"), (5.5, 6.0, "you?")],
        ),
        (  # one line per subtitle, cut at the width or the > 3 s pause
            SubtitleOptions(max_line_width=10, max_line_count=1),
            [(0.0, 0.5, "Hello"), (0.5, 1.0, "world."), (5.0, 5.5, "How are"), (5.5, 6.0, "you?")],
        ),
        (
            SubtitleOptions(max_line_width=10, max_line_count=2),
            [(0.0, 1.0, "Hello\nworld."), (5.0, 6.0, "How are\nyou?")],
        ),
        (
            SubtitleOptions(max_line_width=10),
            [(0.0, 1.0, "Hello\nworld."), (5.0, 6.0, "How are\nyou?")],
        ),
    ],
)
def test_word_subtitles(options: SubtitleOptions, cues: list[tuple[float, float, str]]) -> None:
    assert parse_srt(render(_words_result(), "srt", options)) == cues
    assert parse_vtt(render(_words_result(), "vtt", options)) == cues


def test_highlight_words() -> None:
    options = SubtitleOptions(highlight_words=True)
    assert parse_vtt(render(_words_result(second_start=5.4), "vtt", options)) == [
        (0.0, 0.5, "<u>Hello</u> world."),
        (0.5, 1.0, "Hello <u>world.</u>"),
        (5.0, 5.3, "<u>How</u> are you?"),
        (5.3, 5.4, "How are you?"),  # the gap before " are" shows the plain line
        (5.4, 5.5, "How <u>are</u> you?"),
        (5.5, 6.0, "How are <u>you?</u>"),
    ]


def test_options_validated() -> None:
    with pytest.raises(UserError, match="max_line_width must be a positive integer, got 0"):
        SubtitleOptions(max_line_width=0)


# write_outputs


def test_parse_formats() -> None:
    assert parse_formats("all") == FORMATS
    assert parse_formats("srt, VTT,.json,srt") == ("srt", "vtt", "json")
    assert parse_formats(["tsv", "all"]) == ("tsv", "txt", "vtt", "srt", "json")
    with pytest.raises(UserError, match="unknown output format 'docx'"):
        parse_formats("srt,docx")
    with pytest.raises(UserError, match="no output format"):
        parse_formats([])


def test_write_all(tmp_path: Path) -> None:
    out = tmp_path / "new" / "dir"
    paths = write_outputs(RESULT, "/audio/talk.part1.wav", out, "all")
    assert paths == [out / f"talk.part1.{f}" for f in FORMATS]
    assert all(
        p.read_text(encoding="utf-8") == render(RESULT, f)
        for p, f in zip(paths, FORMATS, strict=True)
    )
    assert sorted(os.listdir(out)) == sorted(p.name for p in paths)  # no temp files left
    mode = (out / "talk.part1.srt").stat().st_mode & 0o777
    umask = os.umask(0)
    os.umask(umask)
    assert mode == 0o666 & ~umask  # like open(), not mkstemp's 0o600


@pytest.mark.parametrize(
    "error", [OSError(errno.ENOSPC, "No space left on device"), RuntimeError("boom")]
)
def test_failed_write_leaves_no_partial_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    (tmp_path / "talk.srt").write_text("old subtitles\n", encoding="utf-8")
    real_write_all = files._write_all

    def write_half_then_fail(fd: int, data: bytes) -> None:
        if data.startswith(b"1\n00:00:00,000 --> "):  # the srt file
            real_write_all(fd, data[: len(data) // 2])
            raise error
        real_write_all(fd, data)

    monkeypatch.setattr(files, "_write_all", write_half_then_fail)
    with pytest.raises(UserError if isinstance(error, OSError) else RuntimeError) as info:
        write_outputs(RESULT, "talk.wav", tmp_path, "all")
    if isinstance(error, OSError):
        assert str(info.value) == f"{tmp_path / 'talk.srt'}: cannot write: No space left on device"
    assert sorted(os.listdir(tmp_path)) == ["talk.srt", "talk.txt", "talk.vtt"]  # no temp, no tsv
    assert (tmp_path / "talk.srt").read_text(encoding="utf-8") == "old subtitles\n"
    assert (tmp_path / "talk.txt").read_text(encoding="utf-8") == render(RESULT, "txt")
    assert (tmp_path / "talk.vtt").read_text(encoding="utf-8") == render(RESULT, "vtt")


def test_output_dir_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("", encoding="utf-8")
    with pytest.raises(UserError) as info:
        write_outputs(RESULT, "talk.wav", tmp_path / "f", "txt")
    assert str(info.value) == f"output directory {tmp_path / 'f'} is not a directory"
    with pytest.raises(UserError) as info:
        write_outputs(RESULT, "talk.wav", tmp_path / "f" / "sub", "txt")
    assert str(info.value).startswith(f"cannot create output directory {tmp_path / 'f' / 'sub'}: ")
    assert "\n" not in str(info.value)


def test_unwritable_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_open = os.open

    def refuse_temp_files(path: str | os.PathLike[str], flags: int, mode: int = 0o777) -> int:
        if str(path).endswith(".tmp"):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, flags, mode)

    monkeypatch.setattr(os, "open", refuse_temp_files)
    with pytest.raises(UserError) as info:
        write_outputs(RESULT, "talk.wav", tmp_path, "srt")
    assert str(info.value) == f"cannot write to output directory {tmp_path}: Permission denied"
    assert os.listdir(tmp_path) == []


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root ignores modes")
def test_read_only_dir(tmp_path: Path) -> None:
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(
            UserError, match=f"cannot write to output directory {re.escape(str(tmp_path))}"
        ):
            write_outputs(RESULT, "talk.wav", tmp_path, "txt")
    finally:
        tmp_path.chmod(0o700)

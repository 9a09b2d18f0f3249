"""srt/vtt with --max-line-width, --max-line-count, --max-words-per-line and
--highlight-words: our writers against openai-whisper's, on hypothesis-made segments.

openai-whisper is not installed here, so `reference_cues` below restates the algorithm of
its `SubtitlesWriter.iterate_result` (whisper/utils.py, release 20250625) over plain dicts,
the shape openai's writers receive, and `reference_file` its WriteVTT / WriteSRT output. It
shares no code with tensorplan.whisper.writers, so a drift in either shows up here.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tensorplan.whisper.result import Segment, TranscriptionResult, Word
from tensorplan.whisper.writers import SubtitleOptions, render

Cue = tuple[str, str, str]


# ---- the reference: openai-whisper's subtitle algorithm, over dicts --------------------------
def reference_timestamp(seconds: float, hours: bool, marker: str) -> str:
    ms = round(seconds * 1000.0)
    h, ms = ms // 3_600_000, ms % 3_600_000
    m, ms = ms // 60_000, ms % 60_000
    s, ms = ms // 1_000, ms % 1_000
    return (f"{h:02d}:" if hours or h > 0 else "") + f"{m:02d}:{s:02d}{marker}{ms:03d}"


def _reference_subtitles(segments: list[dict[str, Any]], width: int | None,
                         count: int | None, per_line: int | None) -> list[list[dict[str, Any]]]:
    """Word timings grouped into subtitles; a word's text may start with a line break."""
    keep_segments = count is None or width is None  # without both, a segment is a subtitle
    width, per_line = width or 1000, per_line or 1000
    first_start = next((w["start"] for s in segments for w in s["words"]),
                       segments[0]["start"] if segments else None)
    last = first_start or 0.0
    subtitles: list[list[dict[str, Any]]] = []
    current: list[dict[str, Any]] = []
    line_len, lines = 0, 1
    for segment in segments:
        words = segment["words"]
        for begin in range(0, len(words), per_line):
            for k, word in enumerate(words[begin:begin + per_line]):
                text = word["word"]
                pause = not keep_segments and word["start"] - last > 3.0
                new_segment = k == 0 and bool(current) and keep_segments
                if line_len > 0 and line_len + len(text) <= width and not pause \
                        and not new_segment:
                    line_len += len(text)  # the line goes on
                else:
                    text = text.strip()
                    if new_segment or (current and count is not None
                                       and (pause or lines >= count)):
                        subtitles.append(current)  # the subtitle is full
                        current, lines = [], 1
                    elif line_len > 0:
                        lines += 1
                        text = "\n" + text
                    line_len = len(text.strip())
                current.append({**word, "word": text})
                last = word["start"]
    if current:
        subtitles.append(current)
    return subtitles


def reference_cues(result: dict[str, Any], options: SubtitleOptions,
                   ts: Callable[[float], str]) -> list[Cue]:
    segments = result["segments"]
    if not segments or "words" not in segments[0]:
        return [(ts(s["start"]), ts(s["end"]), s["text"].strip().replace("-->", "->"))
                for s in segments]
    cues: list[Cue] = []
    for sub in _reference_subtitles(segments, options.max_line_width, options.max_line_count,
                                    options.max_words_per_line):
        texts = [w["word"] for w in sub]
        whole = "".join(texts)
        if not options.highlight_words:
            cues.append((ts(sub[0]["start"]), ts(sub[-1]["end"]), whole))
            continue
        previous_end = ts(sub[0]["start"])
        for i, word in enumerate(sub):
            start, end = ts(word["start"]), ts(word["end"])
            if previous_end != start:
                cues.append((previous_end, start, whole))
            marked = [re.sub(r"^(\s*)(.*)$", r"\1<u>\2</u>", t) if j == i else t
                      for j, t in enumerate(texts)]
            cues.append((start, end, "".join(marked)))
            previous_end = end
    return cues


def reference_file(result: dict[str, Any], fmt: str, options: SubtitleOptions) -> str:
    if fmt == "vtt":
        cues = reference_cues(result, options, lambda s: reference_timestamp(s, False, "."))
        return "WEBVTT\n\n" + "".join(f"{a} --> {b}\n{t}\n\n" for a, b, t in cues)
    cues = reference_cues(result, options, lambda s: reference_timestamp(s, True, ","))
    return "".join(f"{i}\n{a} --> {b}\n{t}\n\n" for i, (a, b, t) in enumerate(cues, 1))


# ---- generated transcripts --------------------------------------------------------------------
# gaps between word starts: openai measures a pause from the previous word's start, and
# exactly 3 s is not yet one. Steps of 1/64 s add up exactly in binary floating point, so
# such a gap stays exact however many words come before it.
gaps = st.sampled_from([0.0, 0.5, 3.0, 3.5]) | st.integers(0, 320).map(lambda k: k / 64)
word_text = st.builds(lambda space, text: space + text, st.sampled_from(["", " ", "  "]),
                      st.text(alphabet="ab.,?-> \n", max_size=9))


@st.composite
def transcripts(draw: st.DrawFn) -> TranscriptionResult:
    with_words = draw(st.booleans())
    clock = draw(gaps)
    segments = []
    for i in range(draw(st.integers(0, 4))):
        seg_words = []
        for _ in range(draw(st.integers(0, 7)) if with_words else 0):
            clock += draw(gaps)
            seg_words.append(Word(draw(word_text), clock, clock + draw(gaps), 0.5))
        start = seg_words[0].start if seg_words else clock
        text = draw(st.text(alphabet="ab -->.", max_size=12))
        segments.append(Segment(i, 0, start, start + draw(gaps), text, (), 0.0, -0.1, 1.0, 0.0,
                                tuple(seg_words) if with_words else None))
    return TranscriptionResult("".join(s.text for s in segments), tuple(segments), "en")


line_limit = st.none() | st.integers(1, 30)
subtitle_options = st.builds(SubtitleOptions, line_limit, st.none() | st.integers(1, 4),
                             st.none() | st.integers(1, 5), st.booleans())


@settings(max_examples=400, deadline=None)
@given(transcripts(), subtitle_options, st.sampled_from(["srt", "vtt"]))
def test_same_files_as_openai_whisper(result: TranscriptionResult, options: SubtitleOptions,
                                      fmt: str) -> None:
    assert render(result, fmt, options) == reference_file(result.to_dict(), fmt, options)


# ---- hand-checked ---------------------------------------------------------------------------
def _result(*timed: tuple[str, float, float]) -> TranscriptionResult:
    ws = tuple(Word(text, start, end, 0.9) for text, start, end in timed)
    seg = Segment(0, 0, ws[0].start, ws[-1].end, "".join(w.word for w in ws), (), 0.0, -0.1,
                  1.0, 0.0, ws)
    return TranscriptionResult(seg.text, (seg,), "en")


SPEECH = _result((" And", 0.0, 0.3), (" so", 0.3, 0.5), (" my", 0.5, 0.7),
                 (" fellow", 0.7, 1.1), (" Americans,", 1.1, 1.9), (" ask", 5.5, 5.8),
                 (" not", 5.8, 6.0))


def test_width_and_count_break_lines_and_subtitles() -> None:
    options = SubtitleOptions(max_line_width=10, max_line_count=2)
    assert render(SPEECH, "srt", options) == (
        "1\n00:00:00,000 --> 00:00:01,100\nAnd so my\nfellow\n\n"
        "2\n00:00:01,100 --> 00:00:01,900\nAmericans,\n\n"  # two lines full
        "3\n00:00:05,500 --> 00:00:06,000\nask not\n\n")  # and a pause of more than 3 s


def test_words_per_line_alone_splits_each_segment() -> None:
    options = SubtitleOptions(max_words_per_line=3)
    assert render(SPEECH, "vtt", options) == (
        "WEBVTT\n\n00:00.000 --> 00:00.700\nAnd so my\n\n"
        "00:00.700 --> 00:05.800\nfellow Americans, ask\n\n00:05.800 --> 00:06.000\nnot\n\n")


def test_highlight_fills_the_gaps_with_the_plain_line() -> None:
    speech = _result((" ask", 5.5, 5.8), (" not", 6.0, 6.2))
    assert render(speech, "vtt", SubtitleOptions(highlight_words=True)) == (
        "WEBVTT\n\n00:05.500 --> 00:05.800\n<u>ask</u> not\n\n"
        "00:05.800 --> 00:06.000\nask not\n\n00:06.000 --> 00:06.200\nask <u>not</u>\n\n")

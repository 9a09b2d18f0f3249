"""Word timestamps: DTW against paths built here, the median filter against scipy, openai's
heuristics, the monotone repair, the seek and hallucination rules, and jfk.wav on tiny.en
against an independent float64 alignment of the same attention scores."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import scipy.ndimage
import scipy.special
from whisper_helpers import JFK_TEXT, normalize

from tensorplan.whisper.decoding.seek_loop import Window, WindowSegments
from tensorplan.whisper.decoding.timing import (
    WordAligner,
    WordTiming,
    alignment_matrix,
    clamp_sentence_ends,
    dtw,
    is_segment_anomaly,
    make_monotone,
    median_filter,
    merge_punctuations,
)
from tensorplan.whisper.decoding.window import DecodingResult
from tensorplan.whisper.options import TranscribeOptions
from tensorplan.whisper.result import (
    APPEND_PUNCTUATIONS,
    PREPEND_PUNCTUATIONS,
    Segment,
    TranscriptionResult,
    Word,
)

# ---- DTW ---------------------------------------------------------------------------------------


def random_path(rng: np.random.Generator, n: int, m: int) -> list[tuple[int, int]]:
    """A monotone path from (0, 0) to (n-1, m-1) of random diagonal, down and right moves."""
    i, j, path = 0, 0, [(0, 0)]
    while (i, j) != (n - 1, m - 1):
        moves = [(di, dj) for di, dj in ((1, 1), (1, 0), (0, 1)) if i + di < n and j + dj < m]
        di, dj = moves[rng.integers(len(moves))]
        i, j = i + di, j + dj
        path.append((i, j))
    return path


@pytest.mark.parametrize("n, m", [(1, 1), (1, 9), (9, 1), (10, 20), (32, 16), (37, 77),
                                  (100, 30)])
def test_dtw_finds_the_path_that_was_made_cheapest(n: int, m: int) -> None:
    # every cell of the path costs less than 0 and every other cell at least 0: any other
    # path misses a negative cell, so the constructed path is the unique optimum
    rng = np.random.default_rng(n * 1000 + m)
    path = random_path(rng, n, m)
    cost = rng.random((n, m))
    rows, cols = np.array(path).T
    cost[rows, cols] -= 1
    got_rows, got_cols = dtw(cost)
    np.testing.assert_array_equal(got_rows, rows)
    np.testing.assert_array_equal(got_cols, cols)


def dtw_by_the_recurrence(x: np.ndarray) -> list[tuple[int, int]]:
    """openai's dtw_cpu rule as scalar code: diagonal or down only when strictly cheaper
    than both others, else right; float32 running cost."""
    n, m = x.shape
    acc = np.full((n + 1, m + 1), np.inf, dtype=np.float32)
    acc[0, 0] = 0
    step = np.zeros((n + 1, m + 1), dtype=int)
    for j in range(1, m + 1):
        for i in range(1, n + 1):
            c0, c1, c2 = acc[i - 1, j - 1], acc[i - 1, j], acc[i, j - 1]
            if c0 < c1 and c0 < c2:
                c, t = c0, 0
            elif c1 < c0 and c1 < c2:
                c, t = c1, 1
            else:
                c, t = c2, 2
            acc[i, j] = x[i - 1, j - 1] + c
            step[i, j] = t
    step[0, :], step[:, 0] = 2, 1
    i, j, path = n, m, []
    while i > 0 or j > 0:
        path.append((i - 1, j - 1))
        i, j = (i - 1, j - 1) if step[i, j] == 0 else (i - 1, j) if step[i, j] == 1 else (i, j - 1)
    return path[::-1]


def test_dtw_breaks_ties_as_openai_does() -> None:
    # small integers make many equal costs, where the tie rule decides the path
    rng = np.random.default_rng(7)
    for n, m in [(5, 5), (6, 11), (12, 4)]:
        x = rng.integers(0, 3, size=(n, m)).astype(np.float64)
        rows, cols = dtw(x)
        assert list(zip(rows.tolist(), cols.tolist(), strict=True)) == dtw_by_the_recurrence(x)


# ---- median filter and the attention matrix -----------------------------------------------------


@pytest.mark.parametrize("width", [1, 3, 5, 7])
@pytest.mark.parametrize("shape", [(40,), (6, 50), (3, 5, 64), (2, 4, 8)])
def test_median_filter_matches_scipy_with_torch_reflect_padding(shape: tuple[int, ...],
                                                                 width: int) -> None:
    x = np.random.default_rng(width).standard_normal(shape).astype(np.float32)
    # torch's (and numpy's) "reflect" does not repeat the edge sample: scipy's "mirror"
    want = scipy.ndimage.median_filter(x, size=(1,) * (x.ndim - 1) + (width,), mode="mirror")
    np.testing.assert_array_equal(median_filter(x, width), want)


def test_median_filter_leaves_too_short_rows_and_refuses_even_widths() -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(median_filter(x, 7), x)  # 3 samples cannot reflect 3
    with pytest.raises(ValueError, match="odd"):
        median_filter(x, 4)


def test_alignment_matrix_standardises_each_head_over_the_tokens() -> None:
    rng = np.random.default_rng(3)
    n_heads, n_tokens, n_audio, num_frames, n_sot = 3, 9, 40, 50, 2
    scores = rng.standard_normal((n_heads, n_tokens, n_audio)).astype(np.float32) * 3
    got = alignment_matrix(scores, num_frames, n_sot, medfilt_width=1)

    p = scipy.special.softmax(scores[:, :, :25].astype(np.float64), axis=-1)
    z = (p - p.mean(axis=1, keepdims=True)) / p.std(axis=1, ddof=0, keepdims=True)
    assert got.shape == (n_tokens - n_sot - 1, 25)  # sot rows and the eot row dropped
    np.testing.assert_allclose(got, z.mean(axis=0)[n_sot:-1], rtol=1e-4, atol=1e-5)

    padding_changed = scores.copy()
    padding_changed[:, :, 25:] = 100.0  # audio positions past the content are ignored
    np.testing.assert_array_equal(alignment_matrix(padding_changed, num_frames, n_sot),
                                  alignment_matrix(scores, num_frames, n_sot))


# ---- openai's heuristics -------------------------------------------------------------------------


def timing(word: str, start: float, end: float, *tokens: int) -> WordTiming:
    return WordTiming(word, tokens or (hash(word) % 1000,), start, end, 0.9)


def test_punctuation_merges_into_the_neighbouring_word_keeping_its_times() -> None:
    words = [timing(" (", 0.0, 0.2, 1), timing("Hello", 0.2, 0.6, 2), timing(",", 0.6, 0.7, 3),
             timing(" world", 0.7, 1.0, 4), timing(".", 1.0, 1.5, 5), timing(")", 1.5, 1.6, 6),
             timing(" -", 1.6, 1.7, 7), timing("ok", 1.7, 2.0, 8)]
    merged = merge_punctuations(words, PREPEND_PUNCTUATIONS, APPEND_PUNCTUATIONS)
    assert [(t.word, t.tokens, t.start, t.end) for t in merged] == [
        ("", (), 0.0, 0.2),
        (" (Hello,", (1, 2, 3), 0.2, 0.6),
        ("", (), 0.6, 0.7),
        (" world.)", (4, 5, 6), 0.7, 1.0),
        ("", (), 1.0, 1.5),
        ("", (), 1.5, 1.6),
        ("", (), 1.6, 1.7),
        (" -ok", (7, 8), 1.7, 2.0)]
    assert len(merged) == len(words)  # entries stay: their tokens still count per segment


def test_words_at_sentence_ends_are_cut_to_twice_the_median() -> None:
    words = [timing(" Yes", 0.0, 0.5), timing(".", 0.5, 3.0), timing(" No", 3.0, 6.0),
             timing(" way", 6.0, 9.0)]
    clamped = clamp_sentence_ends(words, max_duration=1.0)
    assert [(t.start, t.end) for t in clamped] == [(0.0, 0.5), (0.5, 1.5), (5.0, 6.0),
                                                   (6.0, 9.0)]


# ---- the monotone guarantee ----------------------------------------------------------------------


def segment(start: float, end: float, words: list[tuple[str, float, float]] | None,
            text: str | None = None) -> Segment:
    ws = None if words is None else tuple(Word(w, a, b, 0.9) for w, a, b in words)
    return Segment(id=-1, seek=0, start=start, end=end,
                   text=text if text is not None else "".join(w for w, _, _ in words or ()),
                   tokens=(), temperature=0.0, avg_logprob=-0.1, compression_ratio=1.0,
                   no_speech_prob=0.0, words=ws)


def check_monotone(segments: list[Segment], floor: float = 0.0) -> None:
    """Nothing starts before the previous word (or segment with text) ends; segments span
    their words exactly."""
    previous = floor
    for s in segments:
        assert previous <= s.start <= s.end, (previous, s)
        if s.words:
            assert (s.start, s.end) == (s.words[0].start, s.words[-1].end)
            for w in s.words:
                assert previous <= w.start <= w.end, (previous, w)
                previous = w.end
        elif s.text.strip():
            previous = s.end


def test_overlapping_words_are_repaired_into_order() -> None:
    segments = [
        segment(1.0, 3.0, [(" a", 0.8, 1.4),     # starts before the previous window's end
                           (" b", 1.2, 2.9),     # starts inside a: a is cut to 1.2
                           (" c", 2.5, 2.7)]),   # inside b: b is cut to 2.5
        segment(2.6, 4.0, [(" d", 2.6, 3.5),     # overlaps c by 0.1 across segments
                           (" e", 3.9, 3.2)]),   # ends before it starts
        segment(4.0, 5.0, None, text=" ?"),     # no words but text: kept at the floor
        segment(4.5, 6.0, [(" f", 4.2, 5.0)]),
    ]
    fixed, floor = make_monotone(segments, floor=1.0)
    words = [(w.word, w.start, w.end) for s in fixed for w in s.words or ()]
    assert words == [(" a", 1.0, 1.2), (" b", 1.2, 2.5), (" c", 2.5, 2.6), (" d", 2.6, 3.5),
                     (" e", 3.9, 3.9), (" f", 5.0, 5.0)]
    assert [(s.start, s.end) for s in fixed] == [(1.0, 2.6), (2.6, 3.9), (4.0, 5.0), (5.0, 5.0)]
    assert floor == 5.0
    check_monotone(fixed, 1.0)


def test_monotone_words_pass_unchanged() -> None:
    segments = [segment(0.0, 2.0, [(" a", 0.0, 0.5), (" b", 0.5, 2.0)]),
                segment(2.0, 3.0, [(" c", 2.2, 3.0)])]
    fixed, floor = make_monotone(segments, floor=0.0)
    assert [s.words for s in fixed] == [s.words for s in segments]
    assert [(s.start, s.end) for s in fixed] == [(0.0, 2.0), (2.2, 3.0)]  # spans its words
    assert floor == 3.0


# ---- seeking and hallucinations -----------------------------------------------------------------


def window_of(segments: list[Segment], next_seek: int, *, seek: int = 0, n_frames: int = 3000,
              single_ending: bool = False, content_frames: int = 9000) -> WindowSegments:
    result = DecodingResult(tokens=(), text="", language="en", temperature=0.0)
    window = Window(seek, n_frames, np.zeros((1, 3000), dtype=np.float32))
    return WindowSegments(window, result, tuple(segments), next_seek, single_ending,
                          content_frames)


def aligner(threshold: float | None = None) -> WordAligner:
    options = TranscribeOptions(word_timestamps=True, hallucination_silence_threshold=threshold)
    return WordAligner(model=None, options=options)  # type: ignore[arg-type]  # reseek only


def speech(start: float) -> Segment:
    """Three plausible words from `start` to `start` + 1.5 s."""
    words = [(" one", start, start + 0.4), (" two", start + 0.4, start + 0.9),
             (" three", start + 0.9, start + 1.5)]
    return segment(start, start + 1.5, words)


def test_seek_moves_to_the_last_word_unless_the_window_ended_on_a_lone_timestamp() -> None:
    decoded = window_of([speech(1.0)], next_seek=1300)
    assert aligner().reseek(decoded)[0].next_seek == 250
    lone = window_of([speech(1.0)], next_seek=3000, single_ending=True)
    assert aligner().reseek(lone)[0].next_seek == 3000


def test_with_a_silence_threshold_a_short_tail_of_the_window_is_not_decoded_again() -> None:
    assert aligner(threshold=2.0).reseek(window_of([speech(1.0)], 1300))[0].next_seek == 250
    assert aligner(threshold=2.0).reseek(window_of([speech(27.0)], 2900))[0].next_seek == 3000


class ScriptedAligner(WordAligner):
    """A WordAligner whose alignment step returns the given segments, window by window."""

    def __init__(self, *windows: list[Segment]) -> None:
        options = TranscribeOptions(word_timestamps=True)
        super().__init__(model=None, options=options)  # type: ignore[arg-type]
        self.windows = iter(windows)

    def add_word_timestamps(self, decoded: WindowSegments) -> list[Segment]:
        return next(self.windows)


def test_words_stay_ordered_across_windows_and_the_seek_always_advances() -> None:
    run = ScriptedAligner([speech(1.0)], [segment(2.5, 4.0, [(" on", 2.3, 4.0)])],
                          [segment(4.0, 4.0, [(" blip", 4.0, 4.004)])])
    first = run(window_of([], next_seek=300))
    assert first.next_seek == 250 and run.floor == 2.5
    second = run(window_of([], next_seek=400, seek=250))
    assert second.segments[0].words == (Word(" on", 2.5, 4.0, 0.9),)  # not back to 2.3
    third = run(window_of([], next_seek=3400, seek=400))
    assert third.next_seek == 401  # the last word ends within this window's first frame


def test_anomaly_score_counts_improbable_short_and_long_words() -> None:
    assert Word(" a", 0.0, 0.5, 0.9).anomaly_score() == 0
    assert Word(" a", 0.0, 0.5, 0.1).anomaly_score() == 1
    assert Word(" a", 0.0, 0.033, 0.9).anomaly_score() == pytest.approx(1.5)
    assert Word(" a", 0.0, 3.5, 0.9).anomaly_score() == pytest.approx(1.5)
    junk = segment(0, 1, [(" x", 0.0, 0.02), (" y", 0.02, 0.04)])
    assert is_segment_anomaly(junk) and not is_segment_anomaly(speech(1.0))
    assert not is_segment_anomaly(None) and not is_segment_anomaly(segment(0, 1, []))


def hallucinated(start: float) -> list[tuple[str, float, float]]:
    return [(" la", start, start + 0.02), (" la", start + 0.02, start + 0.04),
            (" la", start + 0.04, start + 0.06)]


def test_hallucination_between_silences_is_dropped_and_skipped() -> None:
    said = speech(1.0)
    junk = segment(12.0, 12.06, hallucinated(12.0))  # 9.5 s of silence either side
    decoded = window_of([said, junk], next_seek=1206, single_ending=True)
    out, skipped = aligner(threshold=2.0).reseek(decoded)
    assert not skipped and out.segments == (said,)
    assert out.next_seek == 1200  # to the hallucination's start: decode it again from there


def test_hallucination_without_silence_around_it_stays() -> None:
    said = speech(1.0)
    junk = segment(2.6, 2.66, hallucinated(2.6))
    after = segment(3.0, 4.5, [(" four", 3.0, 4.5)])
    decoded = window_of([said, junk, after], next_seek=3000, single_ending=True)
    out, _ = aligner(threshold=2.0).reseek(decoded)
    assert out.segments == (said, junk, after)


def test_a_leading_hallucination_after_silence_skips_the_window_to_it() -> None:
    junk = segment(5.0, 5.06, hallucinated(5.0))
    decoded = window_of([junk, speech(6.0)], next_seek=750, seek=100)
    out, skipped = aligner(threshold=1.0).reseek(decoded)
    assert skipped and out.segments == () and out.next_seek == 100 + 400  # 4 s gap


def test_a_hallucination_at_the_end_of_the_audio_ends_the_transcription() -> None:
    said, junk = speech(61.0), segment(88.0, 88.06, hallucinated(88.0))
    decoded = window_of([said, junk], next_seek=8900, seek=6000, n_frames=2900,
                        content_frames=8900, single_ending=True)
    out, _ = aligner(threshold=2.0).reseek(decoded)
    assert out.segments == (said,) and out.next_seek == 8900  # no audio left after it


# ---- jfk.wav on tiny.en ------------------------------------------------------------------------


def reference_word_starts(scores: np.ndarray, num_frames: int, n_sot: int) -> np.ndarray:
    """Each text token's start time, by an independent float64 route: scipy for the softmax
    and the median filter, a textbook DTW (minimum of the three predecessors)."""
    p = scipy.special.softmax(scores[:, :, : num_frames // 2].astype(np.float64), axis=-1)
    z = (p - p.mean(axis=1, keepdims=True)) / p.std(axis=1, keepdims=True)
    z = scipy.ndimage.median_filter(z, size=(1, 1, 7), mode="mirror")
    cost = -z.mean(axis=0)[n_sot:-1]
    n, m = cost.shape
    acc = np.full((n + 1, m + 1), math.inf)
    acc[0, 0] = 0.0
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            acc[i, j] = cost[i - 1, j - 1] + min(acc[i - 1, j - 1], acc[i - 1, j], acc[i, j - 1])
    i, j, first_column = n, m, {}
    while i > 0 and j > 0:  # walk back; the smallest column seen on each row is its start
        first_column[i - 1] = j - 1
        i, j = min(((i - 1, j - 1), (i - 1, j), (i, j - 1)), key=lambda c: acc[c])
    return np.array([first_column.get(r, 0) for r in range(n)]) * 0.02


JfkWords = tuple[TranscriptionResult, list[int], np.ndarray, Any]


@pytest.fixture(scope="module")
def jfk_words(tiny_model_factory: Any, jfk_audio: np.ndarray) -> JfkWords:
    session = tiny_model_factory("joint").session()
    result = session.transcribe(jfk_audio, beam_size=None, word_timestamps=True)
    model, tok = session.state, session.state.tokenizer
    # jfk is one window: the session still holds it, so the same scores can be read again
    text = [t for s in result.segments for t in s.tokens if t < tok.eot]
    sot = tok.sot_sequence("en")
    scores = model.align([*sot, tok.no_timestamps, *text, tok.eot], []).scores
    num_frames = min(3000, len(jfk_audio) // 160)  # the one window's frames of audio
    return result, text, reference_word_starts(scores, num_frames, len(sot)), tok


def test_jfk_words_are_ordered_inside_their_segments_and_spell_the_text(
        jfk_words: JfkWords) -> None:
    result, _, _, _ = jfk_words
    assert normalize(result.text) == normalize(JFK_TEXT)
    check_monotone(list(result.segments))
    for s in result.segments:
        assert s.words and "".join(w.word for w in s.words) == s.text
        assert all(w.start < w.end and 0 < w.probability <= 1 for w in s.words)


def test_jfk_word_starts_match_an_independent_alignment(jfk_words: JfkWords) -> None:
    result, text, token_starts, tok = jfk_words
    words = [w for s in result.segments for w in s.words or ()]
    checked = 0
    for name in ("Americans", "country"):
        first_tokens = tok.encode(" " + name)
        at = [k for k in range(len(text)) if text[k:k + len(first_tokens)] == first_tokens]
        mine = [w.start for w in words if w.word.strip(" ,.") == name]
        assert len(at) == len(mine) >= 1, (name, at, mine)
        for k, start in zip(at, mine, strict=True):
            assert start == pytest.approx(token_starts[k], abs=0.2), name
            checked += 1
    assert checked == 3  # Americans, country twice
    americans = next(w for w in words if w.word.strip(" ,") == "Americans")
    assert americans.start <= 1.8 <= americans.end  # openai's own test_transcribe check

"""The seek loop with a scripted model: fallback, silence, segments, seeking, prompts."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from fakes import FakeModel, FakeTokenizer, Window, script

from tensorplan.errors import UserError
from tensorplan.whisper.decoding.seek_loop import PaddedMel, SeekLoop, WindowSegments, transcribe
from tensorplan.whisper.options import TranscribeOptions
from tensorplan.whisper.result import Segment

TOK: Any = FakeTokenizer()  # Any: it stands in for the real Tokenizer
HELLO, WORLD, FOO, BAR, BAZ, BLANK = (TOK.id(w) for w in
                                      (" hello", " world", " foo", " bar", " baz", " "))
REPEAT = [TOK.ts(0), *[TOK.id(" w1")] * 60, TOK.ts(10)]  # compresses far beyond 2.4
GREEDY = TranscribeOptions(beam_size=None)


def ts(seconds: float) -> int:
    return int(TOK.ts(seconds))


def mel(n_frames: int) -> np.ndarray:
    """Frame i holds i + 1, then 30 s of zero padding (openai's layout)."""
    m = np.zeros((80, n_frames + 3000), np.float32)
    m[:, :n_frames] = np.arange(1, n_frames + 1)
    return m


def run(n_frames: int, *windows: Window, options: TranscribeOptions = GREEDY, **kw: object
        ) -> tuple[FakeModel, list[Segment]]:
    model = FakeModel(TOK, script(TOK, windows))
    result = transcribe(model, mel(n_frames), options, **kw)  # type: ignore[arg-type]
    return model, list(result.segments)


def spans(segments: list[Segment]) -> list[tuple[float, float, str]]:
    return [(round(s.start, 3), round(s.end, 3), s.text) for s in segments]


def seeks(model: FakeModel) -> list[int]:
    """The first mel frame of every encoded window (frame i holds i + 1)."""
    return [int(m[0, 0]) - 1 for m in model.encoded]


# ---- segments and seeking ---------------------------------------------------------------------

def test_timestamp_pairs_split_segments_and_a_lone_final_timestamp_seeks_a_whole_window() -> None:
    model, segments = run(
        4000,
        Window([ts(0), HELLO, WORLD, ts(2), ts(2), FOO, ts(5)]),  # ends with a lone timestamp
        Window([ts(0), BAR, ts(1.5)]))  # no pair: one segment up to the last timestamp
    assert spans(segments) == [(0.0, 2.0, " hello world"), (2.0, 5.0, " foo"),
                               (30.0, 31.5, " bar")]
    assert seeks(model) == [0, 3000]
    assert [s.id for s in segments] == [0, 1, 2] and [s.seek for s in segments] == [0, 0, 3000]
    assert segments[1].tokens == (ts(2), FOO, ts(5))


def test_an_unfinished_last_segment_is_dropped_and_decoded_again_from_its_start() -> None:
    model, segments = run(
        600,
        Window([ts(0), HELLO, ts(1), ts(1), FOO, ts(2.5), ts(2.5), BAR]),
        Window([ts(0), BAR, WORLD]))  # no pair, only <|0.00|>: ends with the window
    assert seeks(model) == [0, 250]
    assert spans(segments) == [(0.0, 1.0, " hello"), (1.0, 2.5, " foo"),
                               (2.5, 6.0, " bar world")]


def test_one_window_keeps_the_unfinished_segment_and_encodes_once() -> None:
    """A live partial update: the same first window, its text after the last pair kept
    up to the window's end (not decoded again from a second window), and no more
    windows even where the audio is longer than one."""
    model, segments = run(
        600, Window([ts(0), HELLO, ts(1), ts(1), FOO, ts(2.5), ts(2.5), BAR]),
        one_window=True)
    assert seeks(model) == [0]
    assert spans(segments) == [(0.0, 1.0, " hello"), (1.0, 2.5, " foo"), (2.5, 6.0, " bar")]
    model, segments = run(4000, Window([ts(0), HELLO, ts(1), ts(1), FOO, ts(2.5)]),
                          one_window=True)  # 40 s of audio, a finished transcript
    assert seeks(model) == [0]
    assert spans(segments) == [(0.0, 1.0, " hello"), (1.0, 2.5, " foo")]
    model, segments = run(4000, Window([ts(0), HELLO, ts(1), ts(1), FOO, ts(2.5), ts(2.5), BAR]),
                          one_window=True)  # a whole window: the tail ends at 30 s
    assert seeks(model) == [0] and spans(segments)[-1] == (2.5, 30.0, " bar")
    model, segments = run(4000, Window([ts(0), HELLO, ts(1)]), one_window=True,
                          options=dataclasses.replace(GREEDY, clip_timestamps=(0, 5, 12, 20)))
    assert seeks(model) == [0] and spans(segments) == [(0.0, 1.0, " hello")]  # no 2nd clip


def test_no_later_window_starts_where_the_speech_has_ended() -> None:
    """A live turn's last decode knows where its speech ended (its VAD): the silence after
    a timestamp pair at the last word is not decoded as a window of its own, but a window
    that starts before the speech ends still is, and the first window always."""
    first = Window([ts(0), HELLO, ts(1), ts(1), FOO, ts(2.5), ts(2.5), BAR])
    model, segments = run(600, first, Window([ts(0), BAR, WORLD]), speech_until_s=2.5)
    assert seeks(model) == [0]  # the second window would start at 2.5 s: no speech left
    assert spans(segments) == [(0.0, 1.0, " hello"), (1.0, 2.5, " foo")]
    model, segments = run(600, first, Window([ts(0), BAR, WORLD]), speech_until_s=2.52)
    assert seeks(model) == [0, 250]  # 20 ms of speech after 2.5 s: decoded
    assert spans(segments)[-1] == (2.5, 6.0, " bar world")
    model, _ = run(600, first, speech_until_s=0.0)
    assert seeks(model) == [0]


def test_each_window_is_zero_padded_to_3000_frames() -> None:
    model, _ = run(600, Window([ts(0), HELLO, ts(1), ts(1), FOO, ts(2.5), ts(2.5), BAR]),
                   Window([ts(0), BAR, ts(1)]))
    second = model.encoded[1]
    assert second[0, 349] == 600 and not second[:, 350:].any()


def test_segments_without_text_are_dropped() -> None:
    _, segments = run(1000, Window([ts(0), BLANK, ts(1), ts(1), HELLO, ts(2)]))
    assert spans(segments) == [(1.0, 2.0, " hello")]
    assert segments[0].id == 0


def test_clip_timestamps_restrict_the_windows() -> None:
    options = dataclasses.replace(GREEDY, clip_timestamps=(10.0, 12.0, 40.0))
    model, segments = run(5000, Window([ts(0), HELLO, ts(1)]), options=options)
    assert seeks(model) == [1000, 4000]
    assert not model.encoded[0][:, 200:].any()  # the clip ends 200 frames in
    assert spans(segments) == [(10.0, 11.0, " hello"), (40.0, 41.0, " hello")]


def test_lazy_mel_frames_give_the_same_windows() -> None:
    full = mel(4000)

    class Frames:
        n_frames = 4000

        def window(self, seek: int, n: int) -> np.ndarray:
            return full[:, seek:seek + n]

    windows = [Window([ts(0), HELLO, ts(1)]), Window([ts(0), WORLD, ts(1)])]
    lazy, eager = (FakeModel(TOK, script(TOK, windows)) for _ in range(2))
    assert transcribe(lazy, Frames(), GREEDY) == transcribe(eager, full, GREEDY)
    for a, b in zip(lazy.encoded, eager.encoded, strict=True):
        np.testing.assert_array_equal(a, b)


def test_callbacks_see_each_segment_and_the_progress() -> None:
    seen: list[Segment] = []
    done: list[tuple[int, int]] = []
    _, segments = run(4000, Window([ts(0), HELLO, ts(1)]), Window([ts(0), WORLD, ts(1)]),
                      on_segment=seen.append, progress=lambda a, b: done.append((a, b)))
    assert seen == segments
    assert done == [(3000, 4000), (4000, 4000)]


# ---- fallback and silence ---------------------------------------------------------------------

def test_repetition_falls_back_to_a_higher_temperature() -> None:
    options = dataclasses.replace(GREEDY, temperature=(0.0, 0.2, 0.4), best_of=3)
    model, segments = run(1000, Window([REPEAT, [ts(0), HELLO, WORLD, ts(2)]]), options=options)
    assert [s.n_batch for s in model.sessions] == [1, 3]  # greedy, then best_of samples
    assert spans(segments) == [(0.0, 2.0, " hello world")]
    assert segments[0].temperature == 0.2


def test_when_every_temperature_fails_the_most_probable_non_repetitive_result_wins() -> None:
    words = [ts(0), HELLO, WORLD, FOO, BAR, BAZ, ts(2)]
    options = dataclasses.replace(GREEDY, temperature=(0.0, 0.2, 0.4), best_of=2)
    windows = [Window([REPEAT, words, words], confidence=c) for c in (1.0, 0.15, 0.05)]
    responses = [script(TOK, [w]) for w in windows]
    model = FakeModel(TOK, lambda q: responses[q.session](q))
    result = transcribe(model, mel(1000), options)
    assert len(model.sessions) == 3
    assert [s.temperature for s in result.segments] == [0.2]
    assert result.segments[0].avg_logprob < -1


def test_silence_is_skipped_without_fallback() -> None:
    quiet = Window([ts(0), HELLO, WORLD, FOO, BAR, ts(1)], no_speech=0.9, confidence=0.1)
    model, segments = run(4000, quiet, Window([ts(0), BAZ, ts(1)]))
    assert [s.window for s in model.sessions] == [0, 1]  # one decode per window
    assert spans(segments) == [(30.0, 31.0, " baz")]


def test_confident_speech_is_kept_despite_a_high_no_speech_probability() -> None:
    _, segments = run(1000, Window([ts(0), HELLO, ts(1)], no_speech=0.9))
    assert spans(segments) == [(0.0, 1.0, " hello")]


# ---- prompts ---------------------------------------------------------------------------------

W0 = [ts(0), HELLO, ts(1)]


def second_window_prompt(options: TranscribeOptions, first: Window | None = None) -> list[int]:
    model, _ = run(4000, first or Window(W0), Window([ts(0), WORLD, ts(1)]), options=options)
    initial = model.windows_sessions(1)[0].initial_tokens
    return initial[:initial.index(TOK.sot)]


def test_each_window_is_prompted_with_the_previous_tokens_timestamps_included() -> None:
    assert second_window_prompt(GREEDY) == [TOK.sot_prev, *W0]
    no_condition = dataclasses.replace(GREEDY, condition_on_previous_text=False)
    assert second_window_prompt(no_condition) == []


def test_initial_prompt_starts_the_context_and_can_be_carried() -> None:
    options = dataclasses.replace(GREEDY, initial_prompt="foo bar")
    assert second_window_prompt(options) == [TOK.sot_prev, FOO, BAR, *W0]
    model, _ = run(1000, Window(W0), options=options)
    assert model.sessions[0].initial_tokens[:3] == [TOK.sot_prev, FOO, BAR]
    carried = dataclasses.replace(options, condition_on_previous_text=False,
                                  carry_initial_prompt=True)
    assert second_window_prompt(carried) == [TOK.sot_prev, FOO, BAR]
    dropped = dataclasses.replace(options, condition_on_previous_text=False)
    assert second_window_prompt(dropped) == []


def test_a_hot_window_resets_the_prompt() -> None:
    options = dataclasses.replace(GREEDY, temperature=(0.0, 0.6), best_of=1)
    first = Window([REPEAT, W0])
    assert second_window_prompt(options, first) == []
    cooler = dataclasses.replace(options, prompt_reset_on_temperature=0.7)
    assert second_window_prompt(cooler, first) == [TOK.sot_prev, *W0]


def test_prefix_starts_the_first_window_only() -> None:
    options = dataclasses.replace(GREEDY, prefix="foo")
    model, segments = run(4000, Window([ts(0), FOO, HELLO, ts(1)]),
                          Window([ts(0), WORLD, ts(1)]), options=options)
    assert model.sessions[0].initial_tokens == [TOK.sot, ts(0), FOO]
    assert TOK.sot_prev in model.sessions[1].initial_tokens
    assert model.sessions[1].initial_tokens[-1] == TOK.sot
    assert [s.text for s in segments] == [" foo hello", " world"]


# ---- language and hooks ---------------------------------------------------------------------

def test_multilingual_models_detect_the_language_on_the_first_window() -> None:
    tok: Any = FakeTokenizer(multilingual=True)
    de = tok.language_tokens["de"]
    respond = script(tok, [Window([tok.ts(0), HELLO, tok.ts(1)])])
    bias = 40.0 * (np.arange(tok.n_vocab) == de)
    model = FakeModel(tok, lambda q: respond(q) + (bias if q.content is None else 0))
    result = transcribe(model, mel(1000), GREEDY)
    assert result.language == "de" and result.language_probs is not None
    assert len(model.encoded) == 1  # detection encodes the first window; decoding reuses it
    assert model.sessions[-1].initial_tokens == [tok.sot, de, tok.transcribe]
    given = transcribe(FakeModel(tok, respond), mel(1000), dataclasses.replace(GREEDY,
                                                                               language="French"))
    assert given.language == "fr" and given.language_probs is None


def test_word_timestamps_need_an_aligner_which_sees_every_window() -> None:
    options = dataclasses.replace(GREEDY, word_timestamps=True)
    model = FakeModel(TOK, script(TOK, [Window([ts(0), HELLO, ts(1), ts(1), FOO])]))
    with pytest.raises(UserError, match="aligner"):
        transcribe(model, mel(200), options)

    seen: list[WindowSegments] = []

    def aligner(decoded: WindowSegments) -> WindowSegments:
        seen.append(decoded)
        return dataclasses.replace(decoded, next_seek=decoded.window.seek + 3000)

    result = transcribe(model, mel(4000), options, aligner=aligner)
    assert [d.window.seek for d in seen] == [0, 3000]
    assert seen[0].next_seek == 100 and not seen[0].single_timestamp_ending
    assert len(result.segments) == 2


def test_seek_loop_steps_are_usable_alone() -> None:
    model = FakeModel(TOK, script(TOK, [Window(W0)]))
    loop = SeekLoop(model, PaddedMel(mel(6000)),
                    dataclasses.replace(GREEDY, clip_timestamps=(5.0,)))
    assert loop.clips() == [(500, 6000)]
    assert loop.window(5990, 10).mel.shape == (80, 3000)

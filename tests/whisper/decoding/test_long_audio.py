"""Long synthetic speech (espeak-ng, ~52 s, known text) across 30 s windows."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from whisper_helpers import normalize

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fixtures"))
import make_speech  # noqa: E402

pytestmark = pytest.mark.skipif(not make_speech.available(),
                                reason="espeak-ng is not installed (apt-get install espeak-ng)")


def word_error_rate(reference: str, hypothesis: str) -> float:
    ref, hyp = normalize(reference).split(), normalize(hypothesis).split()
    prev = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        cur = [i]
        for j, h in enumerate(hyp, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (r != h)))
        prev = cur
    return prev[-1] / len(ref)


def test_word_error_rate_counts_edits():
    assert word_error_rate("a b c d", "a x c d e") == pytest.approx(2 / 4)


@pytest.fixture(scope="module")
def speech(tmp_path_factory):
    from tensorplan.whisper.audio.decode import load_audio

    path = make_speech.make_speech(tmp_path_factory.mktemp("speech") / "gettysburg.wav")
    return load_audio(path)


@pytest.mark.slow
def test_long_speech_crosses_windows_without_losing_or_repeating(tiny_model_factory, speech):
    result = tiny_model_factory("joint").transcribe(speech, beam_size=None)
    duration = len(speech) / 16000
    assert duration > 45
    assert word_error_rate(make_speech.TEXT, result.text) <= 0.2, result.text
    words = normalize(result.text).split()
    trigrams = [tuple(words[i : i + 3]) for i in range(len(words) - 2)]
    assert max(trigrams.count(t) for t in trigrams) <= 3, "a repetition loop"
    starts = [s.start for s in result.segments]
    assert starts == sorted(starts)
    assert all(s.start <= s.end <= duration + 1e-6 for s in result.segments)
    assert result.segments[-1].end > duration - 8  # the end of the speech is transcribed

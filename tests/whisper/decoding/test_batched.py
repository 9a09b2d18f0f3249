"""Batched transcription (whisper/decoding/batched.py): a batch decodes each chunk exactly as a
batch of one does, token for token; partial batches, silence, word timestamps, options."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from tensorplan.errors import UserError
from tensorplan.whisper.audio.chunks import MAX_CHUNK_SECONDS, AudioChunk, cut, energy_spans
from tensorplan.whisper.audio.constants import SAMPLE_RATE
from tensorplan.whisper.flags import add_arguments, from_args
from tensorplan.whisper.options import TranscribeOptions

BENCH = Path(__file__).resolve().parents[3] / "bench"
JFK_CLIPS = (0.0, 4.0, 4.0, 8.3, 8.3, 11.0)  # three chunks of jfk.wav, cut at pauses


@pytest.fixture(scope="module")
def tiny(tiny_model_factory):
    # numpy: its int8 product is row by row; the torch backend quantizes each product's rows
    # with one range (FBGEMM), so rows batched together round alike, not as alone
    return tiny_model_factory(backend="numpy", compute_type="int8")


@pytest.fixture(scope="module")
def speech_75s(tmp_path_factory: pytest.TempPathFactory) -> tuple[np.ndarray, str]:
    """~75 s of espeak-ng speech in several voices (bench/batched.py's generator): three
    chunks or more, so a batch holds several, and a few minutes less of the test set
    than the two minutes it was."""
    if shutil.which("espeak-ng") is None:  # .ci/run installs it; a bare machine skips
        pytest.skip("espeak-ng is not installed (apt-get install -y espeak-ng)")
    bench = _bench()
    return bench.synthesize(75, 1, tmp_path_factory.mktemp("speech"))


def _bench():
    sys.path.insert(0, str(BENCH))
    import batched  # noqa: PLC0415

    return batched


def tokens_of(result) -> list[tuple[int, ...]]:
    return [s.tokens for s in result.segments]


def test_a_batch_equals_batches_of_one_on_jfk_chunks(tiny, jfk_audio) -> None:
    opts = {"beam_size": None, "clip_timestamps": JFK_CLIPS}
    one = tiny.transcribe(jfk_audio, batch_size=1, **opts)
    full = tiny.transcribe(jfk_audio, batch_size=4, **opts)  # 3 chunks in a batch of 4
    partial = tiny.transcribe(jfk_audio, batch_size=2, **opts)  # 2, then 1 in a batch of 2
    assert len(one.segments) >= 3
    assert tokens_of(full) == tokens_of(one) == tokens_of(partial)
    assert [s.start for s in full.segments] == [s.start for s in one.segments]
    assert "ask not what your country can do for you" in full.text
    starts = [s.start for s in full.segments]
    assert starts == sorted(starts) and full.segments[-1].end <= 11.0


def test_beam_search_batch_equals_batches_of_one(tiny, jfk_audio) -> None:
    opts = {"beam_size": 5, "clip_timestamps": JFK_CLIPS}
    one = tiny.transcribe(jfk_audio, batch_size=1, **opts)
    full = tiny.transcribe(jfk_audio, batch_size=3, **opts)
    assert tokens_of(full) == tokens_of(one)


def test_long_synthetic_speech_batched_equals_one_at_a_time(tiny, speech_75s) -> None:
    samples, reference = speech_75s
    bench = _bench()
    chunks = cut(samples)
    assert 3 <= len(chunks) and all(c.n_samples <= MAX_CHUNK_SECONDS * SAMPLE_RATE
                                    for c in chunks)
    clips = tuple(t for c in chunks for t in (c.start / SAMPLE_RATE, c.end / SAMPLE_RATE))
    one = tiny.transcribe(samples, batch_size=1, beam_size=None, clip_timestamps=clips)
    full = tiny.transcribe(samples, batch_size=8, beam_size=None)  # its own VAD cut
    assert tokens_of(full) == tokens_of(one)
    assert bench.wer(reference, full.text) < 0.3  # tiny.en on espeak: ~0.15


def test_silent_and_empty_audio_give_no_segments(tiny) -> None:
    rng = np.random.default_rng(0)
    for audio in (np.zeros(SAMPLE_RATE * 40, np.float32),
                  (rng.standard_normal(SAMPLE_RATE * 20) * 1e-4).astype(np.float32),
                  np.zeros(0, np.float32)):
        result = tiny.transcribe(audio, batch_size=4, beam_size=None)
        assert result.segments == () and result.text == ""


def test_word_timestamps_in_batched_mode(tiny, jfk_audio) -> None:
    result = tiny.transcribe(jfk_audio, batch_size=2, beam_size=None, word_timestamps=True,
                             clip_timestamps=JFK_CLIPS)
    words = [w for s in result.segments for w in s.words or ()]
    assert [w.word.strip(" ,.") for w in words][:3] == ["And", "so", "my"]
    assert all(a.end <= b.start + 1e-6 for a, b in zip(words, words[1:], strict=False))
    country = [w for w in words if "country" in w.word]
    assert len(country) == 2 and country[0].end < 8.3 < country[1].start  # chunk offsets
    for s in result.segments:
        assert all(s.start - 1e-6 <= w.start <= w.end <= s.end + 1e-6 for w in s.words or ())


def test_energy_cut_never_splits_inside_speech() -> None:
    """Without VAD: 70 s of 'speech' (tone bursts of 2-6 s, 0.5 s pauses) cut only in pauses."""
    rng = np.random.default_rng(3)
    pieces, speech = [], []
    t = 0
    while t < 70 * SAMPLE_RATE:
        n = int(rng.uniform(2, 6) * SAMPLE_RATE)
        pieces.append(0.3 * np.sin(np.arange(n) * 0.05 * rng.uniform(1, 3)))
        speech.append((t, t + n))
        pause = SAMPLE_RATE // 2
        pieces.append(np.zeros(pause))
        t += n + pause
    audio = np.concatenate(pieces).astype(np.float32)
    chunks = cut(audio, use_vad=False)
    assert len(chunks) >= 3
    for c in chunks:
        assert c.n_samples <= MAX_CHUNK_SECONDS * SAMPLE_RATE
        for a, b in speech:  # no burst straddles a chunk boundary
            assert not (a < c.start < b) and not (a < c.end < b)
    covered = sum(min(b, c.end) - max(a, c.start) for c in chunks for a, b in speech
                  if min(b, c.end) > max(a, c.start))
    assert covered == sum(b - a for a, b in speech)
    assert energy_spans(np.zeros(SAMPLE_RATE * 5, np.float32)) == []


def test_batch_size_flag_and_validation() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser, TranscribeOptions)
    assert from_args(TranscribeOptions, parser.parse_args(["--batch-size", "8"])).batch_size == 8
    assert from_args(TranscribeOptions, parser.parse_args([])).batch_size is None
    for bad in ("0", "65"):
        with pytest.raises(UserError, match="batch.size"):
            from_args(TranscribeOptions, parser.parse_args(["--batch-size", bad]))
    for bad_value in (0, -1, 65):
        with pytest.raises(ValueError, match="batch_size"):
            TranscribeOptions(batch_size=bad_value)


def test_chunks_are_planned_once_per_shape(tiny) -> None:
    a = tiny.model.window_batch(2, 1)
    assert tiny.model.window_batch(2, 1) is a and a.n_seq == 2
    assert a.nbytes > 0 and AudioChunk(0, 16000).offset == 0.0


def test_plan_says_what_a_batch_holds(capsys) -> None:
    from tensorplan.cli import main

    assert main(["plan", "--plan", "joint", "--batch-size", "2"]) == 0
    out = capsys.readouterr().out
    assert "batch 2, greedy" in out and "batch 2, beam 5" in out and "faster-whisper" in out

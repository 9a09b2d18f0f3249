"""Voice activity detection (`--vad-filter`): Silero's ONNX model run without torch, the
chunking state machine against silero-vad's own, the time map, and the wiring in
`Whisper.transcribe`.

Tests that run the model skip, with the reason, when onnxruntime or silero-vad is missing
(`pip install onnxruntime && pip install --no-deps silero-vad`); the rest need neither.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from vad_available import needs_vad
from whisper_helpers import JFK, normalize

from tensorplan.errors import UserError
from tensorplan.whisper import api
from tensorplan.whisper.audio import vad
from tensorplan.whisper.audio.vad import (
    SpeechChunk,
    SpeechTimestampsMap,
    VadOptions,
    chunks_from_probabilities,
    collect_chunks,
    get_speech_timestamps,
)
from tensorplan.whisper.flags import add_arguments, from_args
from tensorplan.whisper.options import TranscribeOptions
from tensorplan.whisper.result import Segment, TranscriptionResult, Word

SR = vad.SAMPLE_RATE




def silero_package_dir() -> Path | None:
    spec = importlib.util.find_spec("silero_vad")  # finds without importing (torch)
    return Path(next(iter(spec.submodule_search_locations or []))) if spec else None


# --- a speech–silence–speech file from jfk.wav ---------------------------------------------

# jfk.wav: "And so my fellow Americans" is speech from 0.4 to 2.2 s, a pause follows until
# 3.3 s; "ask what you can do for your country" runs from 8.3 to 10.6 s.
FIRST_END, SECOND_START, GAP = 3.0, 8.0, 5.0  # seconds


@pytest.fixture(scope="module")
def speech_gap_speech(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    """The first 3 s of jfk, 5 s of faint noise (-60 dBFS), the last 3 s: a 16-bit WAV file
    and its samples. The second phrase starts at 8.3 s in both files."""
    from scipy.io import wavfile

    from tensorplan.whisper.audio.decode import load_audio

    jfk = load_audio(JFK)
    noise = np.random.default_rng(0).standard_normal(int(GAP * SR)) * 1e-3
    samples = np.concatenate([jfk[:int(FIRST_END * SR)], noise, jfk[int(SECOND_START * SR):]])
    path = tmp_path_factory.mktemp("vad") / "speech_gap_speech.wav"
    wavfile.write(path, SR, np.round(samples * 32768).astype(np.int16))
    return path, load_audio(path)


@needs_vad
def test_finds_the_two_phrases(speech_gap_speech: tuple[Path, np.ndarray]) -> None:
    _, samples = speech_gap_speech
    chunks = get_speech_timestamps(samples)
    assert len(chunks) == 2, chunks
    first, second = chunks
    # speech from 0.4 s, padded 0.4 s: from the start; ends 0.4 s after 2.2 s, before the gap
    assert first.start == 0
    assert 2.2 < first.end / SR <= FIRST_END
    # speech again at 8.3 s, padded 0.4 s; runs to the end of the file
    assert FIRST_END + GAP - 0.5 < second.start / SR < 8.3
    assert second.end == len(samples)


@needs_vad
def test_silence_and_noise_have_no_speech() -> None:
    rng = np.random.default_rng(1)
    assert get_speech_timestamps(np.zeros(5 * SR, np.float32)) == []
    for level in (1e-3, 1e-2):
        noise = (rng.standard_normal(5 * SR) * level).astype(np.float32)
        assert get_speech_timestamps(noise) == []
    assert get_speech_timestamps(np.zeros(0, np.float32)) == []


@needs_vad
@pytest.mark.parametrize("cut", [3 * SR + 100, 11 * SR])  # a partial last window; several runs
def test_model_windows_match_silero_sequence_model(cut: int) -> None:
    """The one-window-at-a-time model (state and 64-sample context carried by hand) and
    silero-vad's whole-sequence export, read in runs of SEQUENCE_RUN windows with (h, c)
    carried, give the same probabilities; the sequence model is the one used."""
    path = vad.model_path()
    if not (path.parent / vad.SEQUENCE_MODEL_FILE).is_file():
        pytest.skip(f"{vad.SEQUENCE_MODEL_FILE} ships only with newer silero-vad releases")
    from tensorplan.whisper.audio.decode import load_audio

    audio = load_audio(JFK)[:cut]
    one_by_one = vad.SileroVad(path, sequence=False)(audio)
    assert len(one_by_one) == -(-len(audio) // vad.WINDOW_SAMPLES)
    assert vad.load_vad_model().sequence
    np.testing.assert_allclose(vad.load_vad_model()(audio), one_by_one, atol=1e-5)


@needs_vad
@pytest.mark.parametrize("piece", [1, 100, 511, 512, 4000])
def test_live_probabilities_fed_in_pieces_match_the_whole(piece: int) -> None:
    """The live stream's VAD takes audio in whatever sizes a client sends, down to less
    than one window (a G.711 append of 800 bytes at 8 kHz is 100 ms): fed piece by piece
    it says what the model says of the whole audio, window for window."""
    from tensorplan.live.speech import SpeechProbability
    from tensorplan.whisper.audio.decode import load_audio

    audio = load_audio(JFK)[:SR + 3 * vad.WINDOW_SAMPLES + 7]
    if piece == 1:
        audio = audio[:4 * vad.WINDOW_SAMPLES]  # sample by sample: keep it short
    live = SpeechProbability()
    probs = np.concatenate([live.feed(audio[i:i + piece]) for i in range(0, len(audio), piece)])
    whole = vad.load_vad_model()(audio)
    n = len(audio) // vad.WINDOW_SAMPLES  # the whole windows; the live stream waits for more
    assert len(probs) == n
    np.testing.assert_allclose(probs, whole[:n], atol=1e-5)


@needs_vad
def test_torch_is_never_imported() -> None:
    """silero_vad's own package imports torch; only its data files may be used."""
    code = (
        "import sys, numpy as np\n"
        "from tensorplan.whisper.audio.decode import load_audio\n"
        "from tensorplan.whisper.audio.vad import get_speech_timestamps\n"
        f"assert get_speech_timestamps(load_audio({str(JFK)!r})[:3 * 16000])\n"
        "print(sorted(m for m in ('torch', 'silero_vad') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_missing_packages_say_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    vad._vad_model.cache_clear()
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import fails
    with pytest.raises(UserError, match="pip install onnxruntime && pip install --no-deps"):
        vad.load_vad_model()
    monkeypatch.undo()

    real_find_spec = importlib.util.find_spec

    def no_silero(name: str, *args: Any) -> Any:
        return None if name == "silero_vad" else real_find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", no_silero)
    with pytest.raises(UserError, match="pip install --no-deps silero-vad"):
        vad.model_path()


# --- the state machine, against silero-vad's own -----------------------------------------


@pytest.fixture(scope="module")
def silero_timestamps_from_probs() -> Any:
    """silero-vad's `get_speech_timestamps_from_probs`, lifted out of its utils_vad.py
    without executing that module (it imports torch)."""
    package = silero_package_dir()
    source = package / "utils_vad.py" if package else None
    if source is None or not source.is_file():
        pytest.skip(f"silero-vad is not installed ({vad.INSTALL_HINT})")
    tree = ast.parse(source.read_text())
    found = [n for n in tree.body if isinstance(n, ast.FunctionDef)
             and n.name == "get_speech_timestamps_from_probs"]
    if not found:
        pytest.skip("this silero-vad has no get_speech_timestamps_from_probs")
    namespace: dict[str, Any] = {"List": list}
    module = ast.Module(body=list[ast.stmt](found), type_ignores=[])
    exec(compile(module, str(source), "exec"), namespace)
    return namespace["get_speech_timestamps_from_probs"]


# Runs of probabilities at a few levels: around both thresholds, so that every branch
# (start, pause, resumed speech, end, split) is taken.
runs = st.lists(st.tuples(st.sampled_from([0.0, 0.2, 0.36, 0.4, 0.5, 0.7, 1.0]),
                          st.integers(1, 80)), max_size=30)
options = st.builds(
    VadOptions,
    threshold=st.sampled_from([0.3, 0.5, 0.6]),
    min_speech_duration_ms=st.sampled_from([0, 250]),
    max_speech_duration_s=st.sampled_from([math.inf, 1.5, 3.0]),
    min_silence_duration_ms=st.sampled_from([0, 100, 500, 2000]),
    speech_pad_ms=st.sampled_from([0, 30, 400]),
)


@settings(max_examples=300, deadline=None)
@given(runs=runs, options=options, tail=st.integers(0, 511))
def test_chunks_match_silero_legacy_state_machine(
        silero_timestamps_from_probs: Any, runs: list[tuple[float, int]], options: VadOptions,
        tail: int) -> None:
    """faster-whisper's algorithm is silero-vad's with `use_max_poss_sil_at_max_speech=False`
    (split a long chunk at the last pause rather than the longest)."""
    reference = silero_timestamps_from_probs
    probs = [p for level, n in runs for p in [level] * n]
    n_samples = max(0, len(probs) * vad.WINDOW_SAMPLES - tail)
    expected = reference(
        probs, threshold=options.threshold, neg_threshold=options.exit_threshold,
        min_speech_duration_ms=options.min_speech_duration_ms,
        max_speech_duration_s=options.max_speech_duration_s,
        min_silence_duration_ms=options.min_silence_duration_ms,
        speech_pad_ms=options.speech_pad_ms, use_max_poss_sil_at_max_speech=False,
        audio_length_samples=n_samples)
    got = chunks_from_probabilities(probs, n_samples, options)
    assert got == [SpeechChunk(d["start"], d["end"]) for d in expected]



def test_default_options_are_faster_whispers() -> None:
    o = VadOptions()
    assert (o.threshold, o.exit_threshold, o.min_speech_duration_ms, o.max_speech_duration_s,
            o.min_silence_duration_ms, o.speech_pad_ms) == (0.5, 0.35, 0, math.inf, 2000, 400)
    assert VadOptions(threshold=0.1).exit_threshold == 0.01
    with pytest.raises(ValueError):
        VadOptions(neg_threshold=0.6)


def test_pauses_shorter_than_min_silence_do_not_split() -> None:
    w = vad.WINDOW_SAMPLES
    probs = [0.0] * 10 + [0.9] * 20 + [0.1] * 20 + [0.9] * 20 + [0.0] * 100
    no_pad = VadOptions(speech_pad_ms=0, min_silence_duration_ms=1000)  # 31.25 windows
    assert chunks_from_probabilities(probs, len(probs) * w, no_pad) == [
        SpeechChunk(10 * w, 70 * w)]
    short = VadOptions(speech_pad_ms=0, min_silence_duration_ms=300)
    assert chunks_from_probabilities(probs, len(probs) * w, short) == [
        SpeechChunk(10 * w, 30 * w), SpeechChunk(50 * w, 70 * w)]
    # 0.4 is between the thresholds: it keeps speech going, but never starts it
    held = [0.9] * 5 + [0.4] * 200
    assert chunks_from_probabilities(held, len(held) * w, short) == [SpeechChunk(0, 205 * w)]
    assert chunks_from_probabilities([0.4] * 50, 50 * w, short) == []


# --- joined time → original time -----------------------------------------------------------

# Speech at 1-3 s and 10-12 s of the original: 1 s removed before the first chunk, 8 s in all
# before the second. In the joined audio the first chunk is 0-2 s, the second 2-4 s.
CHUNKS = [SpeechChunk(1 * SR, 3 * SR), SpeechChunk(10 * SR, 12 * SR)]


def test_collect_chunks_joins_the_speech() -> None:
    audio = np.arange(13 * SR, dtype=np.float32)
    joined = collect_chunks(audio, CHUNKS)
    assert len(joined) == 4 * SR
    assert joined[0] == SR and joined[2 * SR - 1] == 3 * SR - 1 and joined[2 * SR] == 10 * SR
    assert collect_chunks(audio, []).shape == (0,)


def test_map_back_to_original_time() -> None:
    ts_map = SpeechTimestampsMap(CHUNKS)
    assert ts_map.get_original_time(0.0) == 1.0
    assert ts_map.get_original_time(1.5) == 2.5
    assert ts_map.get_original_time(2.5) == 10.5
    assert ts_map.get_original_time(4.0) == 12.0
    assert ts_map.get_original_time(9.0) == 17.0  # past the end: the last chunk's offset
    # 2.0 s is both the end of the first chunk and the start of the second
    assert ts_map.get_original_time(2.0) == 10.0
    assert ts_map.get_original_time(2.0, is_end=True) == 3.0
    assert ts_map.get_original_time(2.0, chunk_index=0) == 3.0
    assert ts_map.get_original_time(1.234567) == 2.23  # two decimals, as faster-whisper


def segment(start: float, end: float, text: str, words: tuple[Word, ...] | None = None,
            id: int = 0) -> Segment:
    return Segment(id=id, seek=0, start=start, end=end, text=text, tokens=(1, 2),
                   temperature=0.0, avg_logprob=-0.1, compression_ratio=1.0,
                   no_speech_prob=0.0, words=words)


def test_restore_segment_and_its_words() -> None:
    ts_map = SpeechTimestampsMap(CHUNKS)
    assert vad.restore_segment(segment(0.5, 2.0, " a"), ts_map).end == 3.0
    # words follow the chunk of their middle; the segment then spans its words
    words = (Word(" one", 1.5, 1.9, 0.9), Word(" two", 1.98, 2.5, 0.9),
             Word(" three", 3.0, 3.6, 0.8))
    restored = vad.restore_segment(segment(1.4, 3.6, " one two three", words), ts_map)
    assert [(w.start, w.end) for w in restored.words or ()] == [
        (2.5, 2.9), (9.98, 10.5), (11.0, 11.6)]
    assert (restored.start, restored.end) == (2.5, 11.6)


# --- the wiring in Whisper.transcribe and the CLI ----------------------------------------


def fake_whisper(monkeypatch: pytest.MonkeyPatch) -> api.Whisper:
    """A Whisper whose sessions hold nothing: the tests using it fake the decoding loop."""
    monkeypatch.setattr(api, "WhisperSession", lambda model: SimpleNamespace(model=model))
    return api.Whisper(SimpleNamespace(dims=SimpleNamespace(n_mels=80)), "fake")  # type: ignore[arg-type]


def test_transcribe_decodes_the_speech_and_restores_times(monkeypatch: pytest.MonkeyPatch) -> None:
    """With fixed chunks and a fake decoding loop: the loop sees the joined speech, and both
    the result and the segments passed to on_segment are in original time."""
    monkeypatch.setattr(vad, "get_speech_timestamps", lambda audio, options=None: CHUNKS)
    seen: dict[str, Any] = {}

    def fake_transcribe(model: Any, mel: np.ndarray, options: TranscribeOptions, *,
                        on_segment: Any = None, **kwargs: Any) -> TranscriptionResult:
        seen["frames"] = mel.n_frames  # content frames, without the 30 s of padding
        segments = (segment(0.0, 1.8, " first", id=0), segment(2.2, 4.0, " second", id=1))
        for s in segments:
            on_segment(s)
        return TranscriptionResult(text=" first second", segments=segments, language="en")

    monkeypatch.setattr(api, "transcribe", fake_transcribe)
    emitted: list[Segment] = []
    result = fake_whisper(monkeypatch).transcribe(np.zeros(13 * SR, np.float32), vad_filter=True,
                                       on_segment=emitted.append)
    assert seen["frames"] == 400  # 4 s of speech
    assert [(s.start, s.end) for s in result.segments] == [(1.0, 2.8), (10.2, 12.0)]
    assert list(result.segments) == emitted
    assert result.text == " first second"


def test_transcribe_without_speech_decodes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vad, "get_speech_timestamps", lambda audio, options=None: [])

    def fail(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("decoded audio without speech")

    monkeypatch.setattr(api, "transcribe", fail)
    result = fake_whisper(monkeypatch).transcribe(np.zeros(5 * SR, np.float32), vad_filter=True)
    assert (result.text, result.segments, result.language) == ("", (), "en")
    result = fake_whisper(monkeypatch).transcribe(np.zeros(SR, np.float32), vad_filter=True,
                                       language="German")
    assert result.language == "de"


def test_cli_flag_and_its_abbreviation() -> None:
    def parse(argv: list[str]) -> TranscribeOptions:
        parser = argparse.ArgumentParser(exit_on_error=False)
        add_arguments(parser, TranscribeOptions)
        return from_args(TranscribeOptions, parser.parse_args(argv))

    assert not parse([]).vad_filter
    assert parse(["--vad-filter"]).vad_filter
    # argparse takes any unambiguous prefix, so `--vad` works while no other flag starts so
    assert parse(["--vad"]).vad_filter
    assert not parse(["--vad-filter", "--no-vad-filter"]).vad_filter
    with pytest.raises(UserError, match="clip_timestamps"):
        parse(["--vad", "--clip-timestamps=1,2"])


@needs_vad
def test_transcription_times_are_in_the_original_audio(
        speech_gap_speech: tuple[Path, np.ndarray], tiny_model_factory: Any) -> None:
    """tiny.en decodes the joined speech (5.3 s here) as one segment; its words show each
    phrase where it is in the file: the second after the 5 s gap, not 5 s earlier."""
    path, samples = speech_gap_speech
    joined = sum(c.end - c.start for c in get_speech_timestamps(samples)) / SR
    emitted: list[Segment] = []
    result = tiny_model_factory("joint").transcribe(
        path, vad_filter=True, beam_size=None, word_timestamps=True, on_segment=emitted.append)
    text = normalize(result.text)
    assert "fellow americans" in text and "ask what you can do for your country" in text
    assert "ask not" not in text  # the cut middle stays cut
    segments = result.segments
    assert segments and list(segments) == emitted
    assert segments[0].start < 1.0
    assert segments[-1].end > joined + GAP - 1.0
    assert segments[-1].end == pytest.approx(len(samples) / SR, abs=0.6)
    words = {normalize(w.word): w for s in segments for w in s.words or ()}
    assert words["americans"].end < FIRST_END
    # "ask" is spoken at 8.3-8.6 s; mapped through the chunk of its middle
    assert FIRST_END + GAP / 2 < words["ask"].start < 8.4 < words["ask"].end
    assert words["country"].end > 10.0

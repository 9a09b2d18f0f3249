"""Round two (issue #15) through the Python API: option values, arrays, streamed audio."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from synth_audio import pcm16, silence_pieces, tone, wav, write_flac

from tensorplan.errors import UserError
from tensorplan.files import quote, read_bytes
from tensorplan.whisper.audio.decode import StreamedAudio, as_samples, load_audio
from tensorplan.whisper.audio.mel import MelFrames
from tensorplan.whisper.limits import MAX_SEQUENCES, check_kv_budget
from tensorplan.whisper.options import DecodingOptions, TranscribeOptions


@pytest.mark.parametrize("field,value", [
    ("temperature", (math.nan,)), ("temperature", (math.inf,)), ("temperature", (1e-300,)),
    ("temperature", ()), ("patience", math.inf), ("beam_size", MAX_SEQUENCES + 1),
    ("best_of", 0), ("seed", -1), ("seed", 2**64), ("max_initial_timestamp", -1.0),
    ("max_initial_timestamp", math.inf), ("clip_timestamps", (5.0, 3.0)),
    ("clip_timestamps", (math.nan,)), ("clip_timestamps", (1e308,)),
    ("no_speech_threshold", 1.5),
    ("compression_ratio_threshold", math.nan), ("suppress_tokens", (-2,)),
    ("sample_len", 0), ("audio_stream", -1), ("beam_size", True),
])
def test_transcribe_options_refuse(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        TranscribeOptions(**{field: value})  # type: ignore[arg-type]


def test_decoding_options_refuse_non_finite_temperature() -> None:
    for t in (math.nan, math.inf, -0.5, 1e-9):
        with pytest.raises(ValueError, match="temperature"):
            DecodingOptions(temperature=t)


def test_reasonable_values_pass() -> None:
    TranscribeOptions(temperature=(0.0, 0.5, 1.0), beam_size=MAX_SEQUENCES, patience=2.0,
                      clip_timestamps=(0.0, 5.0, 5.0, 9.5, 20.0), seed=2**63)


@pytest.mark.parametrize("dtype,value,expected", [
    ("int16", -32768, -1.0), ("int16", 16384, 0.5), ("int32", 2**30, 0.5),
    ("uint8", 128, 0.0), ("uint8", 0, -1.0), ("float64", 0.25, 0.25),
])
def test_integer_pcm_is_scaled_by_its_dtype(dtype: str, value: int, expected: float) -> None:
    out = as_samples(np.full(4, value, dtype))
    assert out.dtype == np.float32 and np.allclose(out, expected)


def test_arrays_with_nan_name_the_first_bad_index() -> None:
    x = np.zeros(100, np.float32)
    x[37] = np.nan
    x[50] = np.inf
    with pytest.raises(ValueError, match="audio sample 37"):
        as_samples(x)


@pytest.mark.parametrize("array", [np.zeros(4, complex), np.zeros(4, object), np.zeros((2, 4))])
def test_other_arrays_are_refused(array: np.ndarray) -> None:
    with pytest.raises(ValueError):
        as_samples(array)


def test_streamed_windows_equal_the_whole_file(tmp_path: Path) -> None:
    path = tmp_path / "t.wav"
    path.write_bytes(wav(pcm16(np.concatenate([tone(70.0), np.zeros(16000 * 20)]))))
    whole, streamed = MelFrames(load_audio(path)), MelFrames(StreamedAudio(path))
    assert whole.max_log == streamed.max_log
    for seek in (0, 2500, 6000, 9000):  # forward, as the seek loop reads
        assert np.array_equal(whole.window(seek), streamed.window(seek))
    assert np.array_equal(whole.window(0), streamed.window(0))  # behind: decodes again


def test_streamed_audio_holds_a_bounded_number_of_samples(tmp_path: Path) -> None:
    """By construction: KEEP_SECONDS of history plus the read, whatever the length."""
    audio = StreamedAudio(write_flac(tmp_path / "q.flac", silence_pieces(20 * 60)))
    mel, most = MelFrames(audio), 0
    for seek in range(0, mel.n_frames, 3000):
        mel.window(seek)
        most = max(most, audio.held)
    window = 30 * 16000
    assert most <= (StreamedAudio.KEEP_SECONDS * 16000 + window + 2 * 16000)
    assert len(audio) == 20 * 60 * 16000


def test_kv_budget_is_checked_before_allocating() -> None:
    class Large:
        n_text_layer, n_text_ctx, n_text_state = 32, 448, 1280

    check_kv_budget(Large, 5, "float32")
    with pytest.raises(UserError, match="KV cache"):
        check_kv_budget(Large, MAX_SEQUENCES, "float32")


def test_bounded_read_refuses_devices_and_large_files(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="character device"):
        read_bytes("/dev/zero", 1 << 20)
    big = tmp_path / "big"
    big.write_bytes(b"x" * 100)
    with pytest.raises(UserError, match="larger than"):
        read_bytes(big, 10)


def test_quote_makes_names_one_line() -> None:
    assert quote("plain/name.wav") == "plain/name.wav"
    assert "\n" not in quote("bad\nname.wav")

"""Audio decoding and log-mel features, against an independent float64 reference: a direct
DFT (no FFT library) of the framed signal with a mel filterbank built here from the Slaney
formula with plain loops."""

from __future__ import annotations

import io
import math
import os
import struct
from pathlib import Path

import av
import numpy as np
import pytest
from av_encode import encode_pcm16

from tensorplan.errors import AudioError
from tensorplan.whisper.audio import decode as audio
from tensorplan.whisper.audio import mel
from tensorplan.whisper.audio.constants import N_SAMPLES
from tensorplan.whisper.audio.decode import load_audio
from tensorplan.whisper.audio.mel import MelFrames, log_mel_spectrogram, mel_filters

JFK = Path(__file__).resolve().parents[3] / "samples" / "jfk.wav"


@pytest.fixture(scope="module")
def jfk() -> np.ndarray:
    return load_audio(JFK)


# --- the independent reference -----------------------------------------------------------------


def _hz_to_mel(f: float) -> float:
    return f / (200 / 3) if f < 1000 else 15 + math.log(f / 1000) * 27 / math.log(6.4)


def _mel_to_hz(m: float) -> float:
    return m * (200 / 3) if m < 15 else 1000 * math.exp((m - 15) * math.log(6.4) / 27)


def _reference_filters(n_mels: int) -> np.ndarray:
    top = _hz_to_mel(8000)
    edges = [_mel_to_hz(top * i / (n_mels + 1)) for i in range(n_mels + 2)]
    weights = np.zeros((n_mels, 201))
    for m in range(n_mels):
        lo, mid, hi = edges[m : m + 3]
        for k in range(201):
            f = k * 16000 / 400
            if lo < f <= mid:
                weights[m, k] = (f - lo) / (mid - lo)
            elif mid < f < hi:
                weights[m, k] = (hi - f) / (hi - mid)
        weights[m] *= 2 / (hi - lo)  # Slaney: constant energy per filter
    return weights


def _reference_log_mel(x: np.ndarray, n_mels: int = 80, padding: int = 0) -> np.ndarray:
    signal = np.concatenate([x.astype(np.float64), np.zeros(padding)])
    padded = np.pad(signal, 200, mode="reflect")
    n = 1 + (padded.size - 400) // 160 - 1  # torch.stft(center=True) frames, last dropped
    frames = np.stack([padded[i * 160 : i * 160 + 400] for i in range(n)])
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(400) / 400)  # periodic Hann
    dft = np.exp(-2j * np.pi * np.outer(np.arange(400), np.arange(201)) / 400)
    power = np.abs((frames * window) @ dft) ** 2
    log_mel = np.log10(np.maximum(_reference_filters(n_mels) @ power.T, 1e-10))
    normalized: np.ndarray = (np.maximum(log_mel, log_mel.max() - 8) + 4) / 4
    return normalized


# --- log-mel -----------------------------------------------------------------------------------


@pytest.mark.parametrize("n_mels", [80, 128])
def test_mel_filters_match_the_formula(n_mels: int) -> None:
    filters = mel_filters(n_mels)
    assert filters.shape == (n_mels, 201) and filters.dtype == np.float32
    assert not filters.flags.writeable
    np.testing.assert_allclose(filters, _reference_filters(n_mels), rtol=0, atol=1e-8)
    assert (filters.max(axis=1) > 0).all()  # no empty filter


def test_log_mel_of_jfk_matches_the_reference(jfk: np.ndarray) -> None:
    mel = log_mel_spectrogram(jfk)
    assert mel.shape == (80, 1100) and mel.dtype == np.float32
    assert np.abs(mel - _reference_log_mel(jfk)).max() <= 1e-5


def test_log_mel_with_transcribe_padding_and_128_mels(jfk: np.ndarray) -> None:
    clip = jfk[: 3 * 16000]
    mel = log_mel_spectrogram(clip, n_mels=128, padding=N_SAMPLES)
    assert mel.shape == (128, 300 + 3000)
    assert np.abs(mel - _reference_log_mel(clip, 128, N_SAMPLES)).max() <= 1e-5


def test_log_mel_of_noise_and_short_inputs() -> None:
    rng = np.random.default_rng(0)
    noise = (0.1 * rng.standard_normal(5 * 16000)).astype(np.float32)
    assert np.abs(log_mel_spectrogram(noise) - _reference_log_mel(noise)).max() <= 1e-5
    short = rng.uniform(-1, 1, 333).astype(np.float32)  # shorter than the reflect pad
    mel = log_mel_spectrogram(short)
    assert mel.shape == (80, 2)
    assert np.abs(mel - _reference_log_mel(short)).max() <= 1e-5
    assert log_mel_spectrogram(short[:159]).shape == (80, 0)


@pytest.mark.parametrize("keep", [True, False], ids=["kept", "recomputed"])
def test_chunked_frames_equal_the_whole_spectrogram(
    jfk: np.ndarray, monkeypatch: pytest.MonkeyPatch, keep: bool
) -> None:
    if not keep:  # a long recording's windows are recomputed from the samples
        monkeypatch.setattr(mel, "KEEP_MEL_BYTES", 0)
    monkeypatch.setattr(mel, "CHUNK_FRAMES", 700)  # chunk boundaries everywhere
    whole = log_mel_spectrogram(jfk, padding=N_SAMPLES)
    monkeypatch.setattr(mel, "CHUNK_FRAMES", 333)
    frames = MelFrames(jfk)  # transcribe's padding: 30 s of zeros
    assert (frames.n_frames, frames.n_total) == (1100, 4100) and whole.shape[1] == 4100
    assert np.abs(frames.frames(0, 4100) - whole).max() <= 1e-6
    for seek in (0, 1, 555, 1099):
        np.testing.assert_array_equal(frames.window(seek), whole[:, seek : seek + 3000])
        np.testing.assert_array_equal(frames.window(seek, 17), whole[:, seek : seek + 17])
    # past the end: 0.0, the normalized-domain padding of pad_or_trim
    window = frames.window(4000)
    np.testing.assert_array_equal(window[:, :100], whole[:, 4000:])
    assert window.shape == (80, 3000) and not window[:, 100:].any()
    assert not frames.window(5000, 10).any()
    with pytest.raises(IndexError):
        frames.frames(10, 4101)
    unpadded = MelFrames(jfk, padding=0)
    np.testing.assert_array_equal(unpadded.frames(0, 1100), log_mel_spectrogram(jfk))


@pytest.mark.parametrize("padding", [0, 200, 201, 1000, N_SAMPLES])
@pytest.mark.parametrize("n_samples", [0, 150, 16000, 16123, 16000 * 7 + 77])
def test_padding_frames_are_filled_bit_for_bit(
    monkeypatch: pytest.MonkeyPatch, n_samples: int, padding: int
) -> None:
    """Frames that see only padding zeros are filled, not transformed: equal bit for bit to
    transforming them, at every chunk boundary and whatever the padding's length."""
    x = np.random.default_rng(n_samples).uniform(-0.5, 0.5, n_samples).astype(np.float32)
    monkeypatch.setattr(mel, "CHUNK_FRAMES", 97)  # silent starts inside and at chunk edges
    for keep in (16 << 20, 0):
        monkeypatch.setattr(mel, "KEEP_MEL_BYTES", keep)
        filled = MelFrames(x, padding=padding)
        with monkeypatch.context() as m:
            m.setattr(MelFrames, "_first_silent_frame", lambda self: self.n_total)
            computed = MelFrames(x, padding=padding)
            want = computed.frames(0, computed.n_total)
        assert filled.max_log == computed.max_log
        np.testing.assert_array_equal(filled.frames(0, filled.n_total), want)
    if padding >= 1000:
        assert filled._first_silent_frame() < filled.n_total  # the fill did run


@pytest.mark.parametrize("n_mels", [80, 128])
def test_mel_product_is_scipys_sparse_product_bit_for_bit(n_mels: int) -> None:
    # the taps sum each mel's terms in the order a CSR matrix-vector product does
    scipy_sparse = pytest.importorskip("scipy.sparse")
    power = np.random.default_rng(0).random((777, 201)) ** 4 * 100
    want = scipy_sparse.csr_array(mel_filters(n_mels).astype(np.float64)) @ power.T
    np.testing.assert_array_equal(mel._mel_power(power, n_mels), want)


def test_global_max_comes_from_the_whole_recording() -> None:
    # a loud burst late in the file sets the floor of an early, quiet window
    rng = np.random.default_rng(1)
    x = (1e-4 * rng.standard_normal(40 * 16000)).astype(np.float32)
    x[35 * 16000 : 36 * 16000] *= 1e4
    frames = MelFrames(x, padding=0)
    whole = log_mel_spectrogram(x)
    assert frames.max_log == pytest.approx(whole.max() * 4 - 4, abs=1e-6)
    np.testing.assert_array_equal(frames.window(0), whole[:, :3000])
    assert whole[:, :3000].min() == pytest.approx((frames.max_log - 8 + 4) / 4)
    # normalizing the quiet part on its own would give different values
    assert not np.allclose(log_mel_spectrogram(x[: 30 * 16000]), whole[:, :3000])


# --- decoding ----------------------------------------------------------------------------------


def _wav(x: np.ndarray, rate: int, float32: bool = False) -> bytes:
    """A canonical RIFF/WAVE file: int16 PCM, or IEEE float32 (format 3)."""
    channels = 1 if x.ndim == 1 else x.shape[1]
    data = x.astype("<f4" if float32 else "<i2").tobytes()
    width = 4 if float32 else 2
    fmt = struct.pack(
        "<HHIIHH",
        3 if float32 else 1,
        channels,
        rate,
        rate * channels * width,
        channels * width,
        8 * width,
    )
    chunks = b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data))
    return b"RIFF" + struct.pack("<I", 4 + len(chunks) + len(data)) + b"WAVE" + chunks + data


def _encode(path: Path, x: np.ndarray, rate: int, codec: str) -> Path:
    """Encode int16 mono samples with PyAV (the container comes from the file suffix)."""
    with av.open(str(path), "w") as out:
        encode_pcm16(out, codec, rate, [x])
    return path


def _jfk_int16() -> np.ndarray:
    data = JFK.read_bytes()
    return np.frombuffer(data, "<i2", offset=data.index(b"data") + 8)


def test_jfk_wav_is_exact_int16_over_32768(jfk: np.ndarray) -> None:
    assert jfk.dtype == np.float32 and jfk.shape == (176000,)
    np.testing.assert_array_equal(jfk, _jfk_int16() / np.float32(32768))


@pytest.mark.parametrize(
    ("suffix", "codec", "min_corr"),
    [
        ("flac", "flac", 1.0),
        ("mp3", "libmp3lame", 0.99),
        ("ogg", "libopus", 0.99),
        ("webm", "libopus", 0.99),
    ],
)
def test_compressed_formats_decode_to_the_same_samples(
    tmp_path: Path, jfk: np.ndarray, suffix: str, codec: str, min_corr: float
) -> None:
    path = _encode(tmp_path / f"jfk.{suffix}", _jfk_int16(), 16000, codec)
    got = load_audio(path)
    assert got.dtype == np.float32 and abs(got.size - jfk.size) <= 16
    n = min(got.size, jfk.size)
    if min_corr == 1.0:
        np.testing.assert_array_equal(got, jfk)  # lossless
    else:
        assert np.corrcoef(got[:n], jfk[:n])[0, 1] >= min_corr


def test_m4a_decodes(tmp_path: Path, jfk: np.ndarray) -> None:
    got = load_audio(_encode(tmp_path / "jfk.m4a", _jfk_int16(), 16000, "aac"))
    # AAC keeps its 1024-sample priming delay in mp4 without an edit list
    assert abs(got.size - jfk.size) <= 2048 and np.isfinite(got).all()
    assert np.sqrt(np.mean(got**2)) == pytest.approx(np.sqrt(np.mean(jfk**2)), rel=0.1)


@pytest.mark.parametrize("rate", [8000, 22050, 44100, 48000])
def test_resampling_gives_the_right_length_and_pitch(rate: int) -> None:
    n = 2 * rate + 7
    tone = 0.3 * np.sin(2 * np.pi * 440 * np.arange(n) / rate)
    got = load_audio(_wav((tone * 32767).astype(np.int16), rate))
    assert abs(got.size - n * 16000 / rate) <= 1
    spectrum = np.abs(np.fft.rfft(got[:32000]))
    assert np.argmax(spectrum) * 16000 / 32000 == pytest.approx(440, abs=1)
    assert np.abs(got[1000:-1000]).max() == pytest.approx(0.3, abs=0.01)


def test_stereo_is_averaged_to_mono() -> None:
    tone = 0.5 * np.sin(2 * np.pi * 300 * np.arange(16000) / 16000)
    for right, peak in ((tone, 0.5), (0 * tone, 0.25), (-tone, 0.0)):
        stereo = (np.stack([tone, right], axis=1) * 32767).astype(np.int16)
        assert np.abs(load_audio(_wav(stereo, 16000))).max() == pytest.approx(peak, abs=1e-3)


def test_bytes_and_stdin(monkeypatch: pytest.MonkeyPatch, jfk: np.ndarray) -> None:
    data = JFK.read_bytes()
    np.testing.assert_array_equal(load_audio(data), jfk)

    class Stdin:
        buffer = io.BytesIO(data)

    monkeypatch.setattr("sys.stdin", Stdin)
    np.testing.assert_array_equal(load_audio("-"), jfk)


# --- bad inputs: one-line AudioError naming the input ---------------------------------------------


def _fails(source: str | Path | bytes, match: str) -> None:
    with pytest.raises(AudioError, match=match) as info:
        load_audio(source)
    message = str(info.value)
    assert "\n" not in message
    if not isinstance(source, bytes):
        assert str(source) in message


def test_missing_directory_and_empty(tmp_path: Path) -> None:
    _fails(tmp_path / "missing.wav", "no such file")
    _fails(tmp_path, "is a directory")
    (tmp_path / "empty.wav").write_bytes(b"")
    _fails(tmp_path / "empty.wav", "empty file")
    _fails(b"", "empty input")


def test_permission_denied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "secret.wav"
    path.write_bytes(JFK.read_bytes())
    if os.geteuid() == 0:  # root reads anything: make open() fail as it would for a user

        def denied(*args: object, **kwargs: object) -> None:
            raise PermissionError(13, "Permission denied")

        monkeypatch.setattr(audio, "open", denied, raising=False)
    else:
        path.chmod(0)
    _fails(path, "permission denied")


def test_not_audio(tmp_path: Path) -> None:
    text = tmp_path / "notes.wav"
    text.write_text("these are meeting notes, not audio\n" * 50)
    _fails(text, "not a readable audio file")
    noise = tmp_path / "noise.mp3"
    noise.write_bytes(np.random.default_rng(0).bytes(4096))
    _fails(noise, "not a readable audio file|no audio")


def test_truncated_files(tmp_path: Path) -> None:
    wav = JFK.read_bytes()
    cut = tmp_path / "cut.wav"
    cut.write_bytes(wav[: len(wav) // 2])
    _fails(cut, "truncated WAV")
    cut.write_bytes(wav[:30])  # inside the header
    _fails(cut, "truncated|not a readable")
    for suffix, codec, match in (
        ("flac", "flac", "corrupt or truncated"),
        ("mp3", "libmp3lame", "truncated: decoded"),
    ):
        data = _encode(tmp_path / f"jfk.{suffix}", _jfk_int16(), 16000, codec).read_bytes()
        cut = tmp_path / f"cut.{suffix}"
        cut.write_bytes(data[: len(data) // 2])
        _fails(cut, match)


def test_zero_samples_and_non_finite_samples(tmp_path: Path) -> None:
    path = tmp_path / "silence.wav"
    path.write_bytes(_wav(np.zeros(0, np.int16), 16000))
    _fails(path, "no audio samples")
    for bad in (np.nan, np.inf, -np.inf):
        path.write_bytes(_wav(np.array([0.0, 0.5, bad, 0.1] * 100, np.float32), 16000, True))
        _fails(path, "NaN or infinite")
    path.write_bytes(_wav(np.array([0.0, 0.5, -0.25] * 100, np.float32), 16000, True))
    np.testing.assert_allclose(load_audio(path)[:3], [0.0, 0.5, -0.25], atol=1 / 32768)


def test_mel_frames_serve_the_windows_of_transcribes_padded_mel(jfk: np.ndarray) -> None:
    transcribe = pytest.importorskip("tensorplan.whisper.decoding.seek_loop")
    padded = transcribe.PaddedMel(log_mel_spectrogram(jfk, padding=N_SAMPLES))
    frames = MelFrames(jfk)
    assert frames.n_frames == padded.n_frames
    for seek, n in ((0, 1100), (300, 800), (1000, 3000)):
        np.testing.assert_array_equal(frames.window(seek, n), padded.window(seek, n))


def test_a_plain_wav_is_read_without_ffmpeg_to_the_same_samples(
    tmp_path: Path, jfk: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    pcm = np.round(jfk[:40000] * 32768).astype(np.int16)
    plain = tmp_path / "plain.wav"
    plain.write_bytes(_wav(pcm, 16000))
    assert audio._pcm16_wav(open(plain, "rb"), 16000) is not None
    assert audio.plain_wav_seconds(plain) == 40000 / 16000
    direct = load_audio(plain)
    streamed = MelFrames(audio.StreamedAudio(plain)).window(0)
    monkeypatch.setattr(audio, "_pcm16_wav", lambda file, sr: None)  # everything by ffmpeg
    np.testing.assert_array_equal(direct, load_audio(plain))
    np.testing.assert_array_equal(streamed, MelFrames(audio.StreamedAudio(plain)).window(0))


@pytest.mark.parametrize(("rate", "stereo", "float32"),
                         [(8000, False, False), (16000, True, False), (16000, False, True)])
def test_other_wavs_go_to_ffmpeg(tmp_path: Path, rate: int, stereo: bool, float32: bool) -> None:
    x = np.zeros((1600, 2) if stereo else 1600, np.float32 if float32 else np.int16)
    path = tmp_path / "other.wav"
    path.write_bytes(_wav(x, rate, float32))
    assert audio._pcm16_wav(open(path, "rb"), 16000) is None
    assert audio.plain_wav_seconds(path) is None

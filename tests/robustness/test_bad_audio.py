"""Audio a user might pass to `tensorplan transcribe`: every broken kind is one error line
naming the file (exit 2); every odd-but-valid kind transcribes (exit 0).

Each case runs through `load_audio` (the API the CLI calls); a representative subset also
runs through the real CLI in a subprocess. Fixtures are generated here, nothing downloaded.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from clirun import FAST, assert_ok, assert_user_error, run_cli
from synth_audio import RATE, encoded, half, pcm16, pcm24, png, tone, wav

from tensorplan.errors import AudioError
from tensorplan.whisper.audio import decode as audio
from tensorplan.whisper.audio.decode import load_audio


def _file(name: str, make: Callable[[], bytes]) -> Callable[[Path], Path]:
    def build(tmp: Path) -> Path:
        path = tmp / name
        path.write_bytes(make())
        return path
    return build


def _missing(tmp: Path) -> Path:
    return tmp / "nowhere" / "talk.wav"


def _directory(tmp: Path) -> Path:
    (tmp / "talk.wav").mkdir()
    return tmp / "talk.wav"


NAN_SAMPLES = np.array([0.0, 0.5, np.nan, -0.5] * 400, "<f4")
INF_SAMPLES = np.array([0.0, np.inf, -0.5] * 400, "<f4")

# kind -> (build the input under tmp_path, words the error must contain, also via the CLI?)
BROKEN: dict[str, tuple[Callable[[Path], Path], str, bool]] = {
    "empty file": (_file("empty.wav", bytes), "empty file", False),
    "header only": (_file("header.wav", lambda: wav(b"", declared=32000)), "truncated WAV",
                    False),
    "truncated wav": (_file("cut.wav", lambda: half(wav(pcm16(tone(2))))),
                      "truncated WAV", True),
    "truncated flac": (_file("cut.flac", lambda: half(encoded("flac", "flac"))),
                       "corrupt or truncated", True),
    "truncated mp3": (_file("cut.mp3", lambda: half(encoded("libmp3lame", "mp3"))),
                      "truncated: decoded", False),
    "picture with an audio extension": (_file("photo.wav", png),
                                        "not a self-contained audio or video file", False),
    "text file": (_file("notes.mp3", lambda: b"minutes of the meeting\n" * 40),
                  "not a readable audio file", True),
    "binary garbage": (_file("noise.wav", lambda: np.random.default_rng(7).bytes(8192)),
                       "not a readable audio file", False),
    "a directory": (_directory, "is a directory", False),
    "missing path": (_missing, "no such file", True),
    "zero-length audio": (_file("silence.wav", lambda: wav(b"")), "no audio samples", False),
    "NaN samples": (_file("nan.wav", lambda: wav(NAN_SAMPLES, bits=32, fmt_tag=3)),
                    "NaN or infinite", True),
    "Inf samples": (_file("inf.wav", lambda: wav(INF_SAMPLES, bits=32, fmt_tag=3)),
                    "NaN or infinite", False),
    "huge declared length, short body": (
        _file("liar.wav", lambda: wav(pcm16(tone(0.1)), declared=0x7FFF0000)),
        "data chunk declares 2147418112 bytes", False),
    "1 Hz sample rate (would expand 16000x)": (
        _file("slow.wav", lambda: wav(np.zeros(4000, "<i2"), rate=1)), "sample rate 1 Hz",
        False),
    "1.66 GHz sample rate (libswresample: 12 s, 1.8 GB)": (
        _file("fast.wav", lambda: wav(pcm16(tone(0.1)), rate=1_660_960_384)),
        "sample rate 1660960384 Hz is beyond", False),
    "zero channels": (_file("nochan.wav", lambda: wav(pcm16(tone(0.5)), channels=0)),
                      "corrupt or truncated", False),
}


@pytest.mark.parametrize("kind", list(BROKEN))
def test_broken_audio_is_one_audio_error(tmp_path: Path, kind: str) -> None:
    build, words, _ = BROKEN[kind]
    path = build(tmp_path)
    with pytest.raises(AudioError) as info:
        load_audio(path)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{path}: ") and words in message


@pytest.mark.parametrize("kind", [k for k, (_, _, cli) in BROKEN.items() if cli])
def test_broken_audio_through_the_cli(tmp_path: Path, kind: str) -> None:
    build, words, _ = BROKEN[kind]
    path = build(tmp_path)
    run = run_cli("transcribe", path)
    assert_user_error(run.rc, run.stderr, str(path), words)


def test_no_read_permission(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _file("secret.wav", lambda: wav(pcm16(tone(0.5))))(tmp_path)

    def denied(*args: object, **kwargs: object) -> None:  # root reads anything: simulate
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(audio, "open", denied, raising=False)
    with pytest.raises(AudioError, match=f"^{path}: permission denied$"):
        load_audio(path)


def test_empty_stdin_through_the_cli() -> None:
    run = run_cli("transcribe", "-", stdin=b"")
    assert_user_error(run.rc, run.stderr, "<stdin>", "empty input")


# --- odd but valid: these must transcribe ------------------------------------------------

VALID: dict[str, tuple[Callable[[], bytes], float]] = {  # kind -> (file bytes, seconds)
    "8 channels": (lambda: wav(pcm16(tone(1, channels=8)), channels=8), 1.0),
    "8 kHz": (lambda: wav(pcm16(tone(1, 8000)), 8000), 1.0),
    "96 kHz": (lambda: wav(pcm16(tone(1, 96000)), 96000), 1.0),
    "24-bit": (lambda: wav(pcm24(tone(1)), bits=24), 1.0),
    "float32": (lambda: wav(tone(1).astype("<f4"), bits=32, fmt_tag=3), 1.0),
    "1 sample": (lambda: wav(np.array([1000], "<i2")), 1 / RATE),
    "mp3 named .wav": (lambda: encoded("libmp3lame", "mp3"), 2.0),
}


@pytest.mark.parametrize("kind", list(VALID))
def test_valid_odd_audio_decodes(kind: str) -> None:
    make, seconds = VALID[kind]
    samples = load_audio(make())
    assert samples.dtype == np.float32 and np.isfinite(samples).all()
    assert abs(samples.size - seconds * RATE) <= 0.05 * RATE + 1152  # mp3 adds its padding
    if samples.size > 1000:  # the tone survives channel mixing, resampling and bit depth
        assert np.abs(samples[500:-500]).max() == pytest.approx(0.3, abs=0.02)


def test_valid_odd_audio_transcribes_through_the_cli(tmp_path: Path) -> None:
    """One process, so the model loads once: 24-bit 8-channel 96 kHz, a single sample, and
    float32 8 kHz read from stdin (`-`)."""
    a = tmp_path / "a.wav"
    a.write_bytes(wav(pcm24(tone(0.5, 96000, channels=8)), 96000, channels=8, bits=24))
    b = wav(tone(0.5, 8000).astype("<f4"), 8000, bits=32, fmt_tag=3)
    c = tmp_path / "c.wav"
    c.write_bytes(VALID["1 sample"][0]())
    assert_ok(run_cli("transcribe", *FAST, a, "-", c, stdin=b))

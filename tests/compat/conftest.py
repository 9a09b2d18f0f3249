"""Both libraries over the same CTranslate2 directory (tensorplan's bundled tiny.en), on the
same audio: faster-whisper itself is the reference these tests hold tensorplan's API to."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
import make_speech  # noqa: E402

faster_whisper = pytest.importorskip("faster_whisper")

SAMPLES = Path(__file__).resolve().parents[2] / "samples"
JFK = SAMPLES / "jfk.wav"
SHORT_TEXTS = ("The quick brown fox jumps over the lazy dog near the river bank.",
               "Please call Stella and ask her to bring these things with her from the store.")


@pytest.fixture(scope="session")
def model_dir() -> str:
    from tensorplan.whisper.model_files.find import resolve_model

    return str(resolve_model("tiny.en"))


@pytest.fixture(scope="session")
def fw(model_dir: str):  # the real faster-whisper: CPU, float32 (CTranslate2's compute type)
    return faster_whisper.WhisperModel(model_dir, device="cpu", compute_type="float32",
                                       cpu_threads=2)


@pytest.fixture(scope="session")
def tp():  # tensorplan's compat API: CPU, float32 (tensorplan's compute type)
    from tensorplan.compat.faster_whisper import WhisperModel

    return WhisperModel("tiny.en", device="cpu", compute_type="float32", cpu_threads=2)


@pytest.fixture(scope="session")
def jfk() -> np.ndarray:
    return faster_whisper.decode_audio(str(JFK))


def _speech(tmp_path_factory: pytest.TempPathFactory, name: str, text: str) -> np.ndarray:
    if not make_speech.available():
        pytest.skip("espeak-ng is not installed (apt-get install espeak-ng)")
    path = make_speech.make_speech(tmp_path_factory.mktemp("speech") / f"{name}.wav", text)
    return faster_whisper.decode_audio(str(path))


@pytest.fixture(scope="session")
def short_clips(tmp_path_factory: pytest.TempPathFactory) -> list[np.ndarray]:
    return [_speech(tmp_path_factory, f"short{i}", t) for i, t in enumerate(SHORT_TEXTS)]


@pytest.fixture(scope="session")
def long_clip(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    """~52 s of speech: two 30 s windows at least."""
    return _speech(tmp_path_factory, "gettysburg", make_speech.TEXT)

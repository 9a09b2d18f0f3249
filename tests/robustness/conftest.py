"""tests/whisper's ct2_writer (the independent model.bin writer) is shared with these tests,
and so are two module-scoped fixtures: the bundled tiny.en directory and a 1 s talk.wav."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "whisper"))


@pytest.fixture(scope="module")
def tiny() -> Path:
    """The bundled tiny.en model directory (skips when it is not installed)."""
    from tensorplan.errors import ModelError
    from tensorplan.whisper.model_files.find import resolve_model

    try:
        return resolve_model("tiny.en")
    except ModelError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def talk(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second of a 440 Hz tone as a 16-bit WAV file."""
    from synth_audio import pcm16, tone, wav

    path = tmp_path_factory.mktemp("audio") / "talk.wav"
    path.write_bytes(wav(pcm16(tone(1.0))))
    return path

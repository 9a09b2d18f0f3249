"""--backend auto: numpy for short float32 work, torch where its start-up is repaid."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tensorplan.whisper.planned import backend_choice as bc

JFK = Path(__file__).resolve().parents[3] / "samples" / "jfk.wav"


@pytest.mark.parametrize(("compute_type", "seconds", "want"), [
    ("float32", 11.0, "numpy"),  # jfk.wav on the CLI
    ("float32", bc.TORCH_MIN_AUDIO_S, "torch"),
    ("float32", None, "torch"),  # the API, workers, servers: long-lived
    ("int8", 11.0, "torch"),  # numpy's int8 kernel is a slow reference
])
def test_auto_with_torch_installed(monkeypatch: pytest.MonkeyPatch, compute_type: str,
                                   seconds: float | None, want: str) -> None:
    monkeypatch.setattr(bc.backends, "torch_available", lambda: True)
    assert bc.resolve("auto", compute_type, seconds) == want


def test_auto_without_torch_and_explicit_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bc.backends, "torch_available", lambda: False)
    assert bc.resolve("auto", "int8", None) == "numpy"
    assert bc.resolve("torch", "float32", 1.0) == "torch"  # make_backend says if it is missing
    assert bc.resolve("numpy", "int8", None) == "numpy"


def test_audio_seconds_reads_headers(tmp_path: Path) -> None:
    assert bc.audio_seconds([JFK]) == pytest.approx(11.0, abs=0.01)
    assert bc.audio_seconds([JFK, JFK]) == pytest.approx(22.0, abs=0.02)
    assert bc.audio_seconds([JFK, tmp_path / "missing.wav"]) is None
    (tmp_path / "junk.wav").write_bytes(b"RIFF junk")
    assert bc.audio_seconds([tmp_path / "junk.wav"]) is None


@pytest.mark.parametrize(("clips", "want"), [
    ((), 11.0),
    ((0.0, 30.0), 11.0),  # past the end: only what is there
    ((2.0, 5.0), 3.0),
    ((1.0, 2.0, 8.0), 4.0),  # an odd count: the last clip runs to the end
    ((20.0,), 0.0),  # starts after the end
])
def test_only_the_clips_count(clips: tuple[float, ...], want: float) -> None:
    assert bc.clipped_seconds(11.0, clips) == pytest.approx(want)
    assert bc.audio_seconds([JFK], clips) == pytest.approx(want, abs=0.01)


def test_cli_default_on_a_short_file_never_imports_torch() -> None:
    pytest.importorskip("torch")
    code = ("import sys\nfrom tensorplan.cli import main\n"
            f"rc = main(['transcribe', {str(JFK)!r}, '--no-verbose', '--beam-size', '1'])\n"
            "print(rc, 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "0 False", out.stdout

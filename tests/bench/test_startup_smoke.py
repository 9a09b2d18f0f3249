"""bench/startup.py and bench/concurrency.py cannot rot: their --smoke modes run here."""

from __future__ import annotations

import subprocess
import sys
import wave
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import concurrency  # noqa: E402


def _row(stdout: str, first_cell: str) -> list[str]:
    row = next(line for line in stdout.splitlines() if line.startswith(f"| {first_cell} "))
    return [c.strip() for c in row.strip("|").split("|")]


def test_startup_smoke_times_every_phase() -> None:
    proc = subprocess.run([sys.executable, str(BENCH / "startup.py"), "--smoke"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    cells = _row(proc.stdout, "tensorplan")
    phases = [float(c) for c in cells[1:6]]  # import, load, first, done, exit
    assert phases == sorted(phases) and phases[0] > 0, cells
    assert float(cells[6]) > 50, cells  # peak RSS MB


def test_concurrency_smoke_runs_one_and_two_processes() -> None:
    proc = subprocess.run([sys.executable, str(BENCH / "concurrency.py"), "--smoke"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    cells = _row(proc.stdout, "jfk")
    assert cells[1] == "default" and float(cells[2]) > 0 and float(cells[3]) == 1.0, cells


def test_tiled_wav_is_speech_and_silence(tmp_path: Path) -> None:
    path = concurrency.tiled_wav(tmp_path / "long.wav", 30.0)
    with wave.open(str(path)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getnframes()) == (16000, 1, 480000)

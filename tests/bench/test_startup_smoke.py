"""bench/startup.py and bench/concurrency.py cannot rot: their --smoke modes run here."""

from __future__ import annotations

import sys
import wave
from pathlib import Path

import pytest
from bench_run import BENCH, row_cells, run_bench

sys.path.insert(0, str(BENCH))

import concurrency  # noqa: E402


@pytest.mark.slow
def test_startup_smoke_times_every_phase() -> None:
    out = run_bench("startup.py", "--smoke")
    cells = row_cells(out, "tensorplan ")
    phases = [float(c) for c in cells[1:6]]  # import, load, first, done, exit
    assert phases == sorted(phases) and phases[0] > 0, cells
    assert float(cells[6]) > 50, cells  # peak RSS MB
    api = [float(c) for c in row_cells(out, "api ")[1:6]]  # the Python API's path
    assert api == sorted(api) and api[0] > 0, api


@pytest.mark.slow
def test_concurrency_smoke_runs_one_and_two_processes() -> None:
    cells = row_cells(run_bench("concurrency.py", "--smoke", timeout=900), "jfk ")
    assert cells[1] == "default" and float(cells[2]) > 0 and float(cells[3]) == 1.0, cells


def test_tiled_wav_is_speech_and_silence(tmp_path: Path) -> None:
    path = concurrency.tiled_wav(tmp_path / "long.wav", 30.0)
    with wave.open(str(path)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getnframes()) == (16000, 1, 480000)

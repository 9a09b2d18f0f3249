"""bench/peers.py cannot rot: its --smoke mode (tensorplan only, jfk.wav once) runs here."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from bench_run import BENCH, row_cells, run_bench

sys.path.insert(0, str(BENCH))

import peers  # noqa: E402


@pytest.mark.slow
def test_smoke_run_prints_a_table_and_the_golden_text() -> None:
    cells = row_cells(run_bench("peers.py", "--smoke"), "tensorplan")
    assert cells[1] == "1" and float(cells[2]) > 0 and float(cells[3]) > 0, cells
    assert cells[-1] == "jfk ok", cells


def test_long_audio_is_tiled_speech_and_silence() -> None:
    speech = np.ones(16000 * 3, np.float32)
    long = peers.tile(speech, 10.0, gap_s=1.0)
    assert long.shape == (160000,) and long.dtype == np.float32
    assert not long[48000:64000].any() and long[64000:112000].all()


def test_skipped_peers_are_reported() -> None:
    w = peers.Worker("whisper.cpp", 5, None, error="pywhispercpp is not installed")
    ours = peers.Worker("tensorplan", 5, None, times={"jfk": [2.0, 1.0, 3.0]},
                        texts={"jfk": "And so my fellow Americans ask not what your country can "
                                      "do for you, ask what you can do for your country."})
    text = peers.report([ours, w], ["jfk"])
    assert "| tensorplan" in text and "jfk ok" in text and "2.00" in text
    assert "skipped: pywhispercpp is not installed" in text

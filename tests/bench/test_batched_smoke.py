"""bench/batched.py cannot rot: its --smoke mode (tensorplan only, 40 s of espeak-ng speech,
batch 4, once) runs here; its WER is checked on known cases."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import batched  # noqa: E402


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs espeak-ng")
def test_smoke_run_prints_a_table() -> None:
    proc = subprocess.run([sys.executable, str(BENCH / "batched.py"), "--smoke"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    row = next(line for line in proc.stdout.splitlines() if line.startswith("| int8"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:3] == ["int8", "1", "4"], row
    assert float(cells[3]) > 0 and float(cells[4]) < 0.5 and float(cells[5]) > 0, row


def test_wer_counts_edits_over_reference_words() -> None:
    assert batched.wer("the cat sat", "The cat sat.") == 0.0
    assert batched.wer("the cat sat on the mat", "the cat on the hat") == pytest.approx(2 / 6)
    assert batched.wer("a b", "x a b y") == pytest.approx(1.0)
    assert batched.wer("", "") == 0.0

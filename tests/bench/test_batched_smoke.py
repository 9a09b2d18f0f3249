"""bench/batched.py cannot rot: its --smoke mode (tensorplan only, 40 s of espeak-ng speech,
batch 4, once) runs here; its WER is checked on known cases."""

from __future__ import annotations

import shutil
import sys

import pytest
from bench_run import BENCH, row_cells, run_bench

sys.path.insert(0, str(BENCH))

import batched  # noqa: E402


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs espeak-ng")
def test_smoke_run_prints_a_table() -> None:
    cells = row_cells(run_bench("batched.py", "--smoke"), "int8")
    assert cells[:3] == ["int8", "1", "4"], cells
    assert float(cells[3]) > 0 and float(cells[4]) < 0.5 and float(cells[5]) > 0, cells


def test_wer_counts_edits_over_reference_words() -> None:
    assert batched.wer("the cat sat", "The cat sat.") == 0.0
    assert batched.wer("the cat sat on the mat", "the cat on the hat") == pytest.approx(2 / 6)
    assert batched.wer("a b", "x a b y") == pytest.approx(1.0)
    assert batched.wer("", "") == 0.0

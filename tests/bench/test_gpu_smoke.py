"""bench/gpu.py cannot rot: it runs here on the CPU (tiny dims, one token), checks the
op table within its bounds, and prints a row per measurement with peers skipped by reason."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_gpu_bench_runs_on_the_cpu() -> None:
    proc = subprocess.run([sys.executable, str(BENCH / "gpu.py"), "--device", "cpu",
                           "--dims", "tiny", "--repeats", "1", "--tokens", "1"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "all within bounds" in proc.stdout, proc.stdout
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| tiny |")]
    assert [r.split("|")[2].strip() for r in rows] == ["encoder", "decoder b1", "decoder b5"]
    for row in rows:
        eager, graphs = (float(c) for c in row.split("|")[3:5])
        assert eager > 0 and graphs > 0, row
    for peer in ("openai", "hf"):  # measured, or skipped with a reason
        assert f"tiny {peer}: skipped: " in proc.stdout or "skipped" not in proc.stdout

"""bench/serve.py cannot rot: its --quick run starts a server and fills its table."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.mark.skipif(importlib.util.find_spec("uvicorn") is None,
                    reason="tensorplan[serve] not installed")
def test_quick_run_reports_each_level() -> None:
    proc = subprocess.run([sys.executable, str(BENCH / "serve.py"), "--quick"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| int8 ")]
    assert [r.split("|")[3].strip() for r in rows] == ["sequential", "1", "2"], proc.stdout
    for row in rows[1:]:
        throughput, ratio = (float(c) for c in row.split("|")[5:7])
        assert throughput > 0 and ratio > 0, row

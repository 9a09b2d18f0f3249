"""What the bench smoke tests share: run a bench script the way CI does, and read a row of
the markdown table it prints."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def run_bench(script: str, *args: str, timeout: float = 600) -> str:
    """`python bench/SCRIPT ARGS` in a fresh interpreter; asserts exit 0 (showing the tails of
    its output) and returns its stdout."""
    proc = subprocess.run([sys.executable, str(BENCH / script), *args],
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout


def row_cells(stdout: str, first_cell: str) -> list[str]:
    """The stripped cells of the first table row whose first cell starts with first_cell."""
    row = next(line for line in stdout.splitlines() if line.startswith(f"| {first_cell}"))
    return [c.strip() for c in row.strip("|").split("|")]

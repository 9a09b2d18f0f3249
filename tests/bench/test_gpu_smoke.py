"""bench/gpu.py cannot rot: it runs here on the CPU (tiny dims, one token), checks the
op table within its bounds, and prints a row per measurement with peers skipped by reason."""

from __future__ import annotations

import pytest
from bench_run import run_bench

pytest.importorskip("torch")


@pytest.mark.slow
def test_gpu_bench_runs_on_the_cpu() -> None:
    stdout = run_bench("gpu.py", "--device", "cpu", "--dims", "tiny", "--repeats", "1",
                       "--tokens", "1", timeout=900)
    assert "all within bounds" in stdout, stdout
    rows = [line for line in stdout.splitlines() if line.startswith("| tiny |")]
    assert [r.split("|")[2].strip() for r in rows] == ["encoder", "decoder b1", "decoder b5"]
    for row in rows:
        eager, graphs = (float(c) for c in row.split("|")[3:5])
        assert eager > 0 and graphs > 0, row
    for peer in ("openai", "hf"):  # measured, or skipped with a reason
        assert f"tiny {peer}: skipped: " in stdout or "skipped" not in stdout

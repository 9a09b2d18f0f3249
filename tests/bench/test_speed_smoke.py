"""bench/speed.py cannot rot: its --smoke mode runs here, and what it checks per token holds."""

from __future__ import annotations

import pytest
from bench_run import run_bench


@pytest.mark.slow
def test_smoke_run_reports_every_backend_and_no_per_token_plans_or_views() -> None:
    stdout = run_bench("speed.py", "--smoke", timeout=900)
    rows = [line for line in stdout.splitlines() if line.startswith(("| numpy ", "| torch "))]
    assert rows and rows[0].startswith("| numpy float32"), stdout
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        encoder_s, macs, floor_s = (float(c) for c in cells[1:4])
        assert encoder_s > 0 and macs > 1 and 0 < floor_s < encoder_s * 10, row
        plans, views, alloc = (c.strip() for c in cells[-1].split("/"))
        assert plans == "0" and views == "0", row  # nothing planned or bound per token
        assert float(alloc.split()[0]) < 1024, row  # KiB: block scratch, never a tensor

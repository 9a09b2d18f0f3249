"""bench/serve.py cannot rot: its --quick run starts a server and fills its table."""

from __future__ import annotations

import importlib.util

import pytest
from bench_run import run_bench


@pytest.mark.skipif(importlib.util.find_spec("uvicorn") is None,
                    reason="tensorplan[serve] not installed")
@pytest.mark.slow
def test_quick_run_reports_each_level() -> None:
    stdout = run_bench("serve.py", "--quick")
    rows = [line for line in stdout.splitlines() if line.startswith("| int8 ")]
    # | compute | beam | engine | file | clients | requests | throughput | ratio | ...
    assert [r.split("|")[5].strip() for r in rows] == ["sequential", "1", "2"], stdout
    for row in rows[1:]:
        throughput, ratio = (float(c) for c in row.split("|")[7:9])
        assert throughput > 0 and ratio > 0, row

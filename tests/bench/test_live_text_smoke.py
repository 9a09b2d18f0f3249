"""bench/live_text.py cannot rot: a short run fills its table, fast and on a simulated slow
machine (with its words' latency there), for espeak speech and jfk. Its own module, so the
test runner can run it beside bench/live.py's smoke run."""

from __future__ import annotations

import pytest
from bench_run import run_bench
from vad_available import needs_vad

pytestmark = needs_vad  # every test here runs live streams (Silero VAD)


@pytest.mark.slow  # 5 s of espeak and jfk, in-process, fast and on a simulated slow machine
def test_live_text_bench_fills_its_table() -> None:
    stdout = run_bench("live_text.py", "--seconds", "5", "--slow", "4", "--seeds", "1")
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in stdout.splitlines()
            if line.startswith("| ") and "WER" not in line]
    machines = {tuple(cells[:3]) for cells in rows}
    for clip in ("espeak 5 s", "jfk"):
        assert {(clip, "server VAD", "fast"), (clip, "server VAD", "slow x4"),
                (clip, "commit", "fast")} <= machines, stdout
    assert all(float(cells[4]) <= 0.1 for cells in rows if cells[0] == "jfk"), stdout
    # the simulated machine times its words (on its own clock), fast mode cannot
    for cells in rows:
        if cells[2] == "fast":
            assert cells[5] == "-", stdout
        else:
            median, p95 = (float(x) for x in cells[5].split("/"))
            assert 0 < median <= p95 < 30, stdout

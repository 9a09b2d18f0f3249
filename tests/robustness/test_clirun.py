"""The harness itself: run_cli's peak RSS is the CLI's own, not inherited from pytest."""

from __future__ import annotations

import numpy as np
from clirun import run_cli


def test_peak_rss_is_the_childs_own_not_the_test_process() -> None:
    ballast = np.ones(64 << 20)  # 512 MB resident in this (the parent) process
    run = run_cli("--version")
    assert run.rc == 0 and run.stdout.startswith("tensorplan ")
    assert run.maxrss_kb < 256_000, run.maxrss_kb  # `--version` alone needs ~40 MB
    assert ballast[-1] == 1.0  # keep the ballast alive across the run


def test_exit_status_of_the_cli_comes_through_the_launcher() -> None:
    run = run_cli("transcribe", "--beam-size", "-3", "nowhere.wav")
    assert run.rc == 2 and "--beam-size" in run.stderr

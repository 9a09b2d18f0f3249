"""The idle trimmer: memory handed back once work has stopped for a while, never between
pieces of work that follow each other closely."""

from __future__ import annotations

import time

from tensorplan.serve.idle_trim import IdleTrimmer


def test_a_quiet_spell_after_work_trims_once() -> None:
    calls: list[float] = []
    trimmer = IdleTrimmer(idle_s=0.2, trim=lambda: calls.append(time.monotonic()))
    try:
        time.sleep(0.4)
        assert calls == []  # nothing ran yet: nothing to give back
        with trimmer.active():
            pass
        ended = time.monotonic()
        deadline = ended + 10
        while not calls and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(calls) == 1 and calls[0] - ended >= 0.2
        time.sleep(0.4)
        assert len(calls) == 1 and trimmer.trims == 1  # once per quiet spell
    finally:
        trimmer.close()


def test_work_that_keeps_coming_is_never_trimmed_under() -> None:
    calls: list[int] = []
    trimmer = IdleTrimmer(idle_s=0.5, trim=lambda: calls.append(1))
    try:
        for _ in range(20):  # back to back for a second: each gap far under idle_s
            with trimmer.active():
                time.sleep(0.05)
        assert calls == []
        with trimmer.active():  # long work: no trim while it runs either
            time.sleep(0.8)
            assert calls == []
    finally:
        trimmer.close()


def test_close_stops_the_thread_at_once() -> None:
    trimmer = IdleTrimmer(idle_s=60, trim=lambda: None)
    with trimmer.active():
        pass
    start = time.monotonic()
    trimmer.close()
    assert time.monotonic() - start < 5

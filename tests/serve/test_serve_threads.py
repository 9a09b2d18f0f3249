"""How a server sizes its sessions and threads (serve/threads.py)."""

from __future__ import annotations

import pytest

from tensorplan.serve.threads import MAX_LIVE_SESSIONS, default_sessions, threads_for


@pytest.mark.parametrize(("cores", "want"), [(1, 1), (2, 1), (3, 1), (16, 8)])
def test_without_the_engine_sessions_have_two_threads_each(cores: int, want: int) -> None:
    assert default_sessions(cores) == want
    assert threads_for(want, engine=False, n_cores=cores) == max(1, cores // want)


@pytest.mark.parametrize(("cores", "want"), [(1, 1), (2, 2), (4, 4), (64, MAX_LIVE_SESSIONS)])
def test_with_the_engine_live_updates_get_a_session_per_core(cores: int, want: int) -> None:
    """The sessions serve only live updates then, which split the cores while they run at
    once; the process's pools keep every core for the engine's thread."""
    assert default_sessions(cores, engine=True) == want
    assert threads_for(want, engine=True, n_cores=cores) == cores

"""One model, many sessions: shared weights and plans, per-stream arenas and KV caches.

Threads must get exactly the single-thread transcripts; a failed or poisoned session must
never reach its next run dirty; a second session must cost its planned bytes, not another
copy of the weights.
"""

from __future__ import annotations

import gc
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from whisper_helpers import BACKEND_NAMES, JFK_TEXT, normalize

from tensorplan.whisper.planned.session import NonFiniteError

OPTION_SETS = ({"beam_size": None}, {"beam_size": 5}, {"beam_size": None, "word_timestamps": True})


def _fingerprint(result: Any) -> list[Any]:
    """Everything a transcript says, bit for bit: tokens, times, scores and words."""
    return [(s.tokens, s.start, s.end, s.avg_logprob, s.no_speech_prob,
             [(w.word, w.start, w.end, w.probability) for w in s.words or ()])
            for s in result.segments]


@pytest.mark.parametrize("backend", BACKEND_NAMES)
def test_threads_sharing_one_model_get_the_single_thread_transcripts(
        tiny_model_factory: Any, jfk_audio: np.ndarray, backend: str) -> None:
    model = tiny_model_factory("joint", backend=backend)
    clips = (jfk_audio, jfk_audio[: 16_000 * 6])  # different lengths interleave differently
    n_threads, n_calls = 2, 2  # a thread per core; each thread's session is used twice
    # (clip, option set) of call m of thread t: three pairs, both clips, every option set,
    # one pair run by both threads
    plan = {(t, m): ((t + m) % len(clips), (t + 2 * m) % len(OPTION_SETS))
            for t in range(n_threads) for m in range(n_calls)}
    want = {(c, o): _fingerprint(model.transcribe(clips[c], **OPTION_SETS[o]))
            for c, o in sorted(set(plan.values()))}
    got: dict[tuple[int, int, int], Any] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(n_threads)

    def worker(t: int) -> None:
        try:
            start.wait()
            for m in range(n_calls):
                c, o = plan[t, m]
                got[t, m, c * 10 + o] = _fingerprint(model.transcribe(clips[c],
                                                                      **OPTION_SETS[o]))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    assert len(got) == n_threads * n_calls
    for (_, _, key), fingerprint in got.items():
        assert fingerprint == want[divmod(key, 10)]


def test_a_nan_sample_is_a_value_error_and_the_model_stays_golden(
        tiny_model_factory: Any, jfk_audio: np.ndarray) -> None:
    model = tiny_model_factory("joint")
    bad = jfk_audio.copy()
    bad[12_345] = np.nan
    with pytest.raises(ValueError, match="sample 12345"):
        model.transcribe(bad, beam_size=None)
    for beam in (None, 5):
        assert normalize(model.transcribe(jfk_audio, beam_size=beam).text) == normalize(JFK_TEXT)


def _poison(session: Any) -> None:
    """Fill every byte a session owns with NaN, as a run that went wrong could leave it."""
    for buf in session.state.buffers.values():
        buf.data.view(np.float32)[:] = np.nan


def test_a_session_that_raised_mid_run_is_golden_on_its_next_use(
        tiny_model_factory: Any, jfk_audio: np.ndarray) -> None:
    session = tiny_model_factory("joint").session()

    def stop(segment: Any) -> None:
        raise KeyboardInterrupt  # a user's Ctrl-C while the first window is decoded

    with pytest.raises(KeyboardInterrupt):
        session.transcribe(jfk_audio, beam_size=5, on_segment=stop)
    assert session.dirty
    _poison(session)  # the worst a failed run could leave behind
    assert normalize(session.transcribe(jfk_audio, beam_size=5).text) == normalize(JFK_TEXT)
    assert not session.dirty


def test_non_finite_values_are_an_error_and_reset_the_session(
        tiny_model_factory: Any, jfk_audio: np.ndarray) -> None:
    """NaN left in the KV caches (beyond the mask: 0 * NaN is NaN) reach the logits; the run
    says so instead of decoding garbage, and the session's next run starts clean."""
    session = tiny_model_factory("joint").session()
    _poison(session)
    with pytest.raises(NonFiniteError):
        session.transcribe(jfk_audio, beam_size=None)
    assert normalize(session.transcribe(jfk_audio, beam_size=None).text) == normalize(JFK_TEXT)


def test_one_session_runs_one_transcription_at_a_time(
        tiny_model_factory: Any, jfk_audio: np.ndarray) -> None:
    session = tiny_model_factory("joint").session()
    inner: list[BaseException] = []

    def reenter(segment: Any) -> None:
        try:
            session.transcribe(jfk_audio, beam_size=None)
        except RuntimeError as e:
            inner.append(e)

    session.transcribe(jfk_audio, beam_size=None, on_segment=reenter)
    assert inner and "one transcription at a time" in str(inner[0])


def _rss() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs Linux /proc")
def test_a_second_session_costs_its_planned_bytes_not_the_weights(
        tiny_model_factory: Any, jfk_audio: np.ndarray) -> None:
    model = tiny_model_factory("joint", backend="numpy")
    first = model.session()
    first.transcribe(jfk_audio, beam_size=5)  # every kernel and view warmed up
    gc.collect()
    before = _rss()
    second = model.session()
    second.transcribe(jfk_audio, beam_size=5)
    gc.collect()
    grew = _rss() - before
    weights = sum(t.nbytes for t in model.model.param.tensors.values())
    assert second.nbytes == model.session_bytes
    assert grew <= model.session_bytes + 24_000_000, (grew, model.session_bytes)
    assert grew < weights / 2, (grew, weights)


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
def test_each_transcription_of_a_file_closes_its_decoder(tiny_model_factory: Any) -> None:
    """A file is decoded as it is read; the decoder (its file and ffmpeg's threads) must
    go when the transcription ends, not when a garbage collection finds it."""
    from whisper_helpers import JFK

    model = tiny_model_factory("joint")
    model.transcribe(JFK, beam_size=None)  # every pool started
    gc.collect()
    gc.disable()
    try:
        tasks, fds = len(os.listdir("/proc/self/task")), len(os.listdir("/proc/self/fd"))
        for _ in range(4):
            model.transcribe(JFK, beam_size=None)
        assert len(os.listdir("/proc/self/task")) <= tasks
        assert len(os.listdir("/proc/self/fd")) <= fds
    finally:
        gc.enable()


def test_a_closed_session_lets_go_of_its_memory(tiny_model_factory: Any,
                                                 jfk_audio: np.ndarray) -> None:
    import weakref

    session = tiny_model_factory("joint").session()
    session.transcribe(jfk_audio, beam_size=None)
    held = [weakref.ref(b.data.base if b.data.base is not None else b.data)
            for b in session.state.buffers.values()]
    session.close()
    gc.collect()
    assert all(r() is None for r in held)  # the arenas and KV caches are gone
    with pytest.raises(RuntimeError, match="Session is closed"):  # not an internal error
        session.transcribe(jfk_audio, beam_size=None)

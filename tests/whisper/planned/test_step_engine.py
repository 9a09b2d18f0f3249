"""The step engine (whisper/planned/step_engine.py): requests decoded together in one
batched pass per step give the transcripts each gives alone, whatever joins or leaves
around them."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensorplan.whisper.decoding.window import decode
from tensorplan.whisper.options import DecodingOptions

SPOKEN = "Four score and seven years ago our fathers brought forth a new nation."


class Stop(Exception):
    pass


@pytest.fixture(scope="module")
def tiny(tiny_model_factory):
    # float32: the engine's steps are the same code for every weight type, and numpy's
    # int8 kernel widens the 80 MB token embedding at every step (decoding 1.6x slower);
    # batched int8 on numpy is bit for bit in tests/whisper/decoding/test_batched.py
    return tiny_model_factory(backend="numpy", compute_type="float32")


@pytest.fixture(scope="module")
def spoken(tmp_path_factory) -> np.ndarray:
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (apt-get install -y espeak-ng)")
    from tensorplan.whisper.audio.decode import load_audio

    path = tmp_path_factory.mktemp("engine") / "spoken.wav"
    subprocess.run(["espeak-ng", "-v", "en-us", "-w", str(path), SPOKEN], check=True,
                   capture_output=True)
    return load_audio(path)


def requests(jfk: np.ndarray, spoken: np.ndarray) -> list[tuple[np.ndarray, dict[str, Any]]]:
    return [
        (jfk, {}),
        (jfk, {"beam_size": 5}),
        (jfk, {"word_timestamps": True}),
        (spoken, {"initial_prompt": "Gettysburg, Lincoln."}),
        # every window fails the log-probability test: each temperature is decoded (best_of
        # 5 samples at T > 0) and the best result kept. Hot temperatures, so the results
        # differ: equal texts would tie on avg_logprob up to the last bits
        (spoken, {"logprob_threshold": -0.01, "beam_size": None,
                  "temperature": (0.0, 0.8, 1.0)}),
        (spoken, {"beam_size": 5, "word_timestamps": True}),
    ]


def shape(result) -> list[tuple]:
    """What must match: every segment's tokens, times, temperature and words."""
    return [(s.tokens, s.start, s.end, s.temperature,
             tuple((w.word, w.start, w.end) for w in s.words or ())) for s in result.segments]


def run_together(engine, jobs, sessions=None) -> list[Any]:
    out: list[Any] = [None] * len(jobs)

    def work(i: int) -> None:
        audio, kw = jobs[i]
        session = sessions[i] if sessions else engine.session()
        try:
            out[i] = session.transcribe(audio, **kw)
        except Exception as e:  # noqa: BLE001 - compared by the test
            out[i] = e

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


@pytest.fixture(scope="module")
def alone(tiny, jfk_audio, spoken) -> list[Any]:
    """Each request of `requests`, transcribed on its own (no engine)."""
    return [tiny.transcribe(audio, **kw) for audio, kw in requests(jfk_audio, spoken)]


def test_concurrent_requests_give_what_each_gives_alone(tiny, jfk_audio, spoken,
                                                        alone) -> None:
    jobs = requests(jfk_audio, spoken)
    assert alone[2].segments[0].words  # word timestamps did run
    with tiny.engine(windows=4) as engine:  # 6 requests, 4 slots: some wait for a slot
        together = run_together(engine, jobs)
        stats = engine.stats()
    for a, b in zip(alone, together, strict=True):
        assert not isinstance(b, Exception), b
        assert shape(b) == shape(a)
        assert b.text == a.text
    # one window each, and the fallback request decoded it at its three temperatures
    assert stats["engine_decodings"] == len(jobs) + 2
    assert stats["engine_tasks"] == 0 and stats["engine_waiting"] == 0
    # steps were shared: fewer batched passes than task steps
    assert stats["engine_steps"] < stats["engine_task_steps"]


@pytest.fixture
def aside(monkeypatch: pytest.MonkeyPatch) -> None:
    """Engines encode on a session and thread of their own (as on PyTorch's CPU kernels
    with two cores or more; numpy's products give the same bytes either way)."""
    from tensorplan.whisper.planned import step_engine

    monkeypatch.setattr(step_engine, "encodes_aside", lambda model: True)


def test_windows_encoded_beside_the_steps_give_what_each_gives_alone(tiny, jfk_audio, spoken,
                                                                    alone, aside) -> None:
    jobs = requests(jfk_audio, spoken)
    with tiny.engine(windows=4) as engine:
        together = run_together(engine, jobs)
        stats = engine.stats()
    for a, b in zip(alone, together, strict=True):
        assert not isinstance(b, Exception), b
        assert shape(b) == shape(a)
    # the encoder's thread took the windows that came while it was idle, the engine's
    # thread some that waited while it was busy
    assert 1 <= stats["engine_encoded_aside"] <= len(jobs)


def test_a_stream_s_next_window_encoded_aside_is_the_one_it_decodes(
        tiny, jfk_audio, aside, monkeypatch: pytest.MonkeyPatch) -> None:
    """A request of several windows whose windows go to the encoder's thread (as they do
    while other work is active: the engine is made to look busy), while the engine's own
    graphs (prompts, alignment) still hold the stream's last one: they must take the new
    one."""
    from tensorplan.whisper.planned.step_engine import StepEngine

    monkeypatch.setattr(StepEngine, "_idle", lambda self: False)
    audio = np.concatenate([jfk_audio] * 3)
    want = tiny.transcribe(audio, word_timestamps=True)
    with tiny.engine(windows=2) as engine:
        got = engine.transcribe(audio, word_timestamps=True)
        stats = engine.stats()
    assert stats["engine_encoded_aside"] >= 2
    assert shape(got) == shape(want)


def test_a_lone_request_encodes_on_the_engine_s_thread(tiny, jfk_audio, aside) -> None:
    """Nothing else decoding: each window is encoded where it is decoded (no copy into the
    engine's graphs, no second thread), and the text is a lone session's."""
    audio = np.concatenate([jfk_audio] * 3)
    want = tiny.transcribe(audio, word_timestamps=True)
    with tiny.engine(windows=2) as engine:
        got = engine.transcribe(audio, word_timestamps=True)
        stats = engine.stats()
    assert stats["engine_encoded_aside"] == 0
    assert shape(got) == shape(want)


def test_two_windows_asked_for_together_encode_one_on_each_thread(tiny, jfk_audio,
                                                                  aside) -> None:
    """The first window of an idle engine is encoded on its own thread; one asked for
    while that runs goes to the encoder's thread, not into the queue behind it (the
    engine looked idle while it encoded: its thread had taken the job off the queue)."""
    from tensorplan.whisper.planned.step_engine import StepEngine

    with tiny.engine(windows=2) as engine:
        core, encode = engine.core, StepEngine.encode
        started = threading.Event()

        def slow_encode(self, stream, mel) -> None:  # the second asks while this runs
            started.set()
            time.sleep(0.5)
            encode(self, stream, mel)

        core.encode = slow_encode.__get__(core)
        first = threading.Thread(target=lambda: engine.transcribe(jfk_audio))
        first.start()
        assert started.wait(30)
        second = engine.transcribe(jfk_audio)
        first.join()
        stats = engine.stats()
    assert stats["engine_encoded_aside"] == 1
    assert second.text == tiny.transcribe(jfk_audio).text


def test_a_request_cancelled_mid_decode_leaves_the_others_alone(tiny, jfk_audio, spoken,
                                                                alone) -> None:
    every = requests(jfk_audio, spoken)
    jobs = [every[1], every[3], every[0]]  # jfk beam 5, the prompted clip, jfk
    want = [alone[1], alone[3], alone[0]]
    calls = [0]

    def check() -> None:  # the first request stops in the middle of its first window
        calls[0] += 1
        if calls[0] > 8:
            raise Stop

    with tiny.engine(windows=4) as engine:
        sessions = [engine.session(check), engine.session(), engine.session()]
        out = run_together(engine, jobs, sessions)
        assert engine.stats()["engine_tasks"] == 0  # its slot was given back
        again = engine.session().transcribe(jfk_audio, beam_size=5)  # the engine still works
    assert isinstance(out[0], Stop)
    assert shape(out[1]) == shape(want[1]) and shape(out[2]) == shape(want[2])
    assert shape(again) == shape(want[0])


_ALONE: dict[tuple, Any] = {}


@settings(max_examples=4, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=st.lists(st.tuples(st.integers(0, 2), st.sampled_from([1, 5]),
                               st.integers(0, 12)), min_size=2, max_size=4))
def test_tasks_joining_and_leaving_at_any_step_decode_as_alone(tiny, jfk_audio, plan) -> None:
    """Each task: (which window of jfk, beam size, the engine step it starts after)."""
    from tensorplan.whisper.audio.mel import log_mel_spectrogram
    from tensorplan.whisper.planned.session import WhisperSession

    starts = (0.0, 2.5, 5.0)

    def mel(which: int) -> np.ndarray:
        audio = jfk_audio[int(starts[which] * 16000):]
        m = log_mel_spectrogram(np.concatenate([audio, np.zeros(480000, np.float32)]),
                                n_mels=tiny.dims.n_mels)
        return m[:, :3000]

    def options(beam: int) -> DecodingOptions:
        return DecodingOptions(language="en", beam_size=beam if beam > 1 else None)

    for which, beam, _ in plan:
        if (which, beam) not in _ALONE:
            session = WhisperSession(tiny.model)
            session.encode(mel(which))
            _ALONE[which, beam] = decode(session, options(beam)).tokens
    with tiny.engine(windows=2) as engine:
        out: list[Any] = [None] * len(plan)
        step = threading.Condition()
        waiting = set(range(len(plan)))
        running = [0]

        def may_start(i: int) -> bool:
            if engine.stats()["engine_steps"] >= plan[i][2]:
                return True
            # nothing decoding, so the steps will not advance: the next task in start
            # order goes now (rather than every waiter sitting out the timeout)
            return running[0] == 0 and i == min(waiting, key=lambda k: (plan[k][2], k))

        def work(i: int) -> None:
            which, beam, _ = plan[i]
            with step:
                step.wait_for(lambda: may_start(i), timeout=5)
                waiting.discard(i)
                running[0] += 1
            stream = engine.session().state
            try:
                stream.encode(mel(which))
                out[i] = decode(stream, options(beam)).tokens
            finally:
                stream.close()  # its window store goes back to the engine
                with step:
                    running[0] -= 1

        def tick() -> None:
            while any(o is None for o in out):
                with step:
                    step.notify_all()
                    step.wait(0.005)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(plan))]
        ticker = threading.Thread(target=tick)
        for t in threads:
            t.start()
        ticker.start()
        for t in threads:
            t.join()
        ticker.join()
    assert out == [_ALONE[which, beam] for which, beam, _ in plan]


@pytest.fixture(scope="module")
def long_speech(tmp_path_factory) -> np.ndarray:
    """About two minutes of espeak-ng speech (four windows)."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (apt-get install -y espeak-ng)")
    sys_path = Path(__file__).resolve().parents[2] / "fixtures"
    import sys

    sys.path.insert(0, str(sys_path))
    from make_speech import TEXT, make_speech  # noqa: PLC0415

    from tensorplan.whisper.audio.decode import load_audio

    path = tmp_path_factory.mktemp("engine") / "long.wav"
    return load_audio(make_speech(path, f"{TEXT} {TEXT}"))


def test_a_short_clip_behind_a_long_file_finishes_first(tiny, jfk_audio,
                                                        long_speech) -> None:
    """The short request's one window joins the long file's decoding at the next step
    boundary: it does not wait for the file's remaining windows."""
    assert len(long_speech) > 90 * 16000
    alone = tiny.transcribe(jfk_audio, beam_size=None)  # greedy: fairness, not search
    events: list[str] = []
    windows_done: list[int] = []
    first_window = threading.Event()

    def progress(done: int, total: int) -> None:
        windows_done.append(done)
        first_window.set()

    with tiny.engine(windows=4) as engine:
        long_run = threading.Thread(target=lambda: (
            engine.transcribe(long_speech, beam_size=None, progress=progress),
            events.append("long")))
        long_run.start()
        assert first_window.wait(timeout=600)
        short = engine.transcribe(jfk_audio, beam_size=None)
        events.append("short")
        long_windows_before = len(windows_done)
        long_run.join()
    assert events == ["short", "long"]
    assert long_windows_before < len(windows_done)  # the file still had windows to go
    assert shape(short) == shape(alone)


@pytest.mark.parametrize("encoder_aside", [False, True])
def test_the_planner_says_what_an_engine_holds_before_it_exists(
        tiny, jfk_audio, encoder_aside: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """engine_bytes(windows, groups) is what the engine, once it has made and bound those
    batches, reports holding (each buffer once; the encoder's session where it has one),
    so a memory budget can be turned into windows before anything is allocated."""
    from tensorplan.whisper.options import TranscribeOptions
    from tensorplan.whisper.planned import step_engine

    monkeypatch.setattr(step_engine, "encodes_aside", lambda model: encoder_aside)
    if encoder_aside:
        alone = tiny.engine_bytes(3, (2,)) - tiny.model.session_bytes
        monkeypatch.setattr(step_engine, "encodes_aside", lambda model: False)
        assert tiny.engine_bytes(3, (2,)) == alone
        monkeypatch.setattr(step_engine, "encodes_aside", lambda model: True)
    predicted = tiny.engine_bytes(3, (2,))
    with tiny.engine(3, prepare=(2,)) as engine:
        assert engine.nbytes == predicted - tiny.model.align_bytes  # no words aligned yet
        words = TranscribeOptions(beam_size=2, word_timestamps=True, temperature=(0.0,))
        assert engine.transcribe(jfk_audio, words).segments[0].words
        assert engine.nbytes == predicted
    assert tiny.engine_bytes(3, (2, 2)) == predicted  # a group size counts once
    assert tiny.engine_bytes(3, (1, 2)) > predicted > tiny.engine_bytes(2, (2,))


@pytest.mark.parametrize("budget_windows", [0, 1, 3, 5])
def test_a_memory_budget_buys_the_most_windows_that_fit(tiny, budget_windows: int) -> None:
    groups = (5,)
    nbytes = tiny.engine_bytes(budget_windows, groups) if budget_windows else \
        tiny.engine_bytes(1, groups) - 2
    for slack in (0, 1):  # exactly its size, and a byte more: the same count
        got = tiny.engine_windows_within(nbytes + slack, groups, most=64)
        assert got == budget_windows
    assert tiny.engine_windows_within(10**15, groups, most=6) == 6  # capped by `most`

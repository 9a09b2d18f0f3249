"""GET /v1/realtime through the official openai client and raw WebSocket frames, against
the real server process of conftest.py (tiny.en, greedy, an API key, two sessions)."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import numpy as np
import pytest
from realtime_helpers import (
    GOLDEN,
    PACED_WORD_EDITS,
    PREFIX,
    TAIL,
    Feeder,
    appends,
    check_deltas_join,
    collect,
    current_update,
    jfk_pcm24,
    normalize,
    of,
    pcm24,
    transcripts,
    word_edits,
)
from serve_helpers import KEY, ServerProcess, quiet, trimmed
from vad_available import needs_vad

from tensorplan.serve.realtime_session import MAX_PROMPT_CHARS

pytestmark = needs_vad  # every test here runs live streams (Silero VAD)

websockets_sync = pytest.importorskip("websockets.sync.client")


def ws_url(server: ServerProcess) -> str:
    return server.url.replace("http://", "ws://") + "/v1/realtime?intent=transcription"


def connect(server: ServerProcess, **kwargs: Any) -> Any:
    headers = kwargs.pop("headers", {"Authorization": f"Bearer {KEY}"})
    return websockets_sync.connect(ws_url(server), additional_headers=headers,
                                   max_size=None, **kwargs)


def realtime(client: Any) -> Any:
    return client.realtime.connect(extra_query={"intent": "transcription"}, max_retries=0)


def wait_streams_closed(server: ServerProcess, timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        h = server.health()
        if h["live_streams"] == 0 or time.monotonic() > deadline:
            return h
        time.sleep(0.1)


def test_jfk_in_real_time_one_turn_through_the_openai_client(client: Any) -> None:
    """jfk's two pauses stay inside one turn at 1200 ms: words arrive while it speaks."""
    parsed: list[Any] = []
    with realtime(client) as conn:
        conn.send(current_update({"type": "server_vad", "silence_duration_ms": 1200}))
        feeder = Feeder(conn.send, appends(jfk_pcm24()), speed=1.0)
        feeder.start()
        events = collect(conn.recv_bytes, on_event=lambda raw, e: parsed.append(
            conn.parse_event(raw)))  # the client must take every event, the tail included
    assert feeder.error is None
    types = [e["type"] for e in events]
    assert types[:2] == ["session.created", "session.updated"]
    assert len(of(events, "input_audio_buffer.speech_started")) == 1
    stopped = types.index("input_audio_buffer.speech_stopped")
    assert f"{PREFIX}.delta" in types[:stopped], "no committed words while it spoke"
    assert TAIL in types
    (transcript,) = transcripts(events)
    assert word_edits(GOLDEN, transcript) <= PACED_WORD_EDITS, transcript
    check_deltas_join(events)
    tails = of(events, TAIL)
    assert all(set(t) >= {"event_id", "item_id", "content_index", "text"} for t in tails)
    assert [p.type for p in parsed] == types
    started = of(events, "input_audio_buffer.speech_started")[0]
    assert 0 <= started["audio_start_ms"] < 1000
    assert of(events, "input_audio_buffer.committed")[0]["item_id"] == started["item_id"]


def test_default_silence_makes_turns_that_join_to_the_text(client: Any) -> None:
    """OpenAI's 500 ms splits jfk at its pauses; sent 4x faster than real time."""
    with realtime(client) as conn:
        conn.send(current_update())
        feeder = Feeder(conn.send, appends(jfk_pcm24()), speed=4.0)
        feeder.start()
        events = collect(conn.recv_bytes)
    texts = transcripts(events)
    assert len(texts) >= 2, texts
    assert word_edits(GOLDEN, " ".join(texts)) <= PACED_WORD_EDITS, texts
    check_deltas_join(events)
    items = [e["item_id"] for e in of(events, "input_audio_buffer.committed")]
    previous = [e["previous_item_id"] for e in of(events, "input_audio_buffer.committed")]
    assert previous == [None, *items[:-1]]


def test_the_beta_transcription_session_shape(server: ServerProcess) -> None:
    """The older client: `client.beta.realtime` sends OpenAI-Beta: realtime=v1 (and
    always wss:// unless told the WebSocket address)."""
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0,
                           websocket_base_url=server.url.replace("http", "ws") + "/v1")
    with client.beta.realtime.connect(model="whisper-1",
                                      extra_query={"intent": "transcription"}) as conn:
        conn.send({"type": "transcription_session.update", "session": {
            "input_audio_format": "pcm16",
            "input_audio_transcription": {"model": "whisper-1", "language": "en"},
            "turn_detection": {"type": "server_vad", "silence_duration_ms": 1200}}})
        feeder = Feeder(conn.send, appends(jfk_pcm24()), speed=0)
        feeder.start()
        parsed: list[Any] = []
        events = collect(conn.recv_bytes, on_event=lambda raw, e: parsed.append(
            conn.parse_event(raw)))
    assert feeder.error is None
    assert events[0]["type"] == "transcription_session.created"
    assert [p.type for p in parsed] == [e["type"] for e in events]
    updated = of(events, "transcription_session.updated")[0]["session"]
    assert updated["input_audio_format"] == "pcm16"
    assert updated["turn_detection"]["silence_duration_ms"] == 1200
    assert normalize(" ".join(transcripts(events))) == normalize(GOLDEN)
    check_deltas_join(events)


def test_a_server_that_only_served_realtime_hands_memory_back(server: ServerProcess,
                                                               client: Any) -> None:
    """Live updates count as work for the idle trim, so a server whose clients only
    stream keeps no more than it needs once they are gone (a flood of 20 connections
    left it 860 MiB bigger until a trim)."""
    trims = quiet(server)
    with realtime(client) as conn:
        conn.send(current_update(None))
        feeder = Feeder(conn.send, appends(jfk_pcm24(0.3)), speed=0,
                        closing=({"type": "input_audio_buffer.commit"},))
        feeder.start()
        assert transcripts(collect(conn.recv_bytes))  # decoded: live updates ran
    assert trimmed(server, trims)["memory_trims"] == trims + 1  # no request ran meanwhile


def test_without_turn_detection_the_client_commits(client: Any) -> None:
    with realtime(client) as conn:
        conn.send(current_update(None))
        feeder = Feeder(conn.send, appends(jfk_pcm24(0.3)), speed=0,
                        closing=({"type": "input_audio_buffer.commit"},))
        feeder.start()
        events = collect(conn.recv_bytes)
    types = [e["type"] for e in events]
    assert "input_audio_buffer.speech_started" not in types
    assert of(events, "session.updated")[0]["session"]["audio"]["input"]["turn_detection"] \
        is None
    assert types.count("input_audio_buffer.committed") == 1
    (transcript,) = transcripts(events)
    assert normalize(transcript) == normalize(GOLDEN)
    check_deltas_join(events)
    assert all("logprobs" not in e for e in events)  # not asked for: none, as OpenAI's


def _check_logprobs(event: dict[str, Any], text: str) -> None:
    entries = event["logprobs"]
    assert "".join(e["token"] for e in entries) == text, (entries, text)
    for e in entries:
        assert -1e3 < e["logprob"] <= 0
        assert bytes(e["bytes"]) == e["token"].encode()


@pytest.mark.parametrize("shape", ["current", "beta"])
def test_include_logprobs_gives_each_words_logprob(client: Any, shape: str) -> None:
    """`include: ["item.input_audio_transcription.logprobs"]`: one entry per word, joining
    to the delta and the transcript; the client parses them as OpenAI's type."""
    include = ["item.input_audio_transcription.logprobs"]
    if shape == "current":
        update = current_update(None)
        update["session"]["include"] = include
    else:
        update = {"type": "transcription_session.update",
                  "session": {"turn_detection": None, "include": include}}
    parsed: list[Any] = []
    with realtime(client) as conn:
        conn.send(update)
        feeder = Feeder(conn.send, appends(jfk_pcm24(0.3)), speed=0,
                        closing=({"type": "input_audio_buffer.commit"},))
        feeder.start()
        events = collect(conn.recv_bytes, on_event=lambda raw, e: parsed.append(
            conn.parse_event(raw)))
    updated = next(e for e in events if e["type"].endswith("session.updated"))
    assert updated["session"]["include"] == include
    deltas = of(events, f"{PREFIX}.delta")
    assert deltas
    for d in deltas:
        _check_logprobs(d, d["delta"])
    (done,) = of(events, f"{PREFIX}.completed")
    assert normalize(done["transcript"]) == normalize(GOLDEN)
    _check_logprobs(done, done["transcript"])
    # most of jfk is heard clearly: its words' mean probability is well above chance
    assert np.mean([np.exp(e["logprob"]) for e in done["logprobs"]]) > 0.5
    (typed,) = [p for p in parsed if p.type == f"{PREFIX}.completed"]
    assert len(typed.logprobs) == len(done["logprobs"])


def test_16khz_pcm_is_an_extension(client: Any) -> None:
    from realtime_helpers import samples16k
    from serve_helpers import JFK

    pcm16k = (np.clip(samples16k(JFK), -1, 1) * 32767).astype("<i2").tobytes()
    with realtime(client) as conn:
        conn.send(current_update(None, rate=16000))
        feeder = Feeder(conn.send, appends(pcm16k, rate=16000), speed=0,
                        closing=({"type": "input_audio_buffer.commit"},))
        feeder.start()
        events = collect(conn.recv_bytes)
    assert normalize(" ".join(transcripts(events))) == normalize(GOLDEN)


def test_the_beta_shape_says_16khz_where_it_has_no_name_for_it(server: ServerProcess) -> None:
    with connect(server) as ws:
        ws.recv(timeout=30)
        ws.send(json.dumps(current_update(None, rate=16000)))
        assert json.loads(ws.recv(timeout=30))["type"] == "session.updated"
        ws.send(json.dumps({"type": "transcription_session.update", "session": {}}))
        reply = json.loads(ws.recv(timeout=30))
    assert reply["type"] == "transcription_session.updated"
    assert reply["session"]["input_audio_format"] == {"type": "audio/pcm", "rate": 16000}


def test_g711_mulaw(client: Any) -> None:
    import soxr
    from realtime_helpers import samples16k
    from serve_helpers import JFK

    from tensorplan.live.pcm import _TABLES

    # encode as the nearest μ-law code (the decoder's table, sorted)
    table = _TABLES["mulaw"]
    order = np.argsort(table)
    x = np.clip(soxr.resample(samples16k(JFK), 16000, 8000), -1, 1)
    i = np.clip(np.searchsorted(table[order], x), 1, 255)
    nearer = np.where(np.abs(table[order][i - 1] - x) < np.abs(table[order][i] - x), i - 1, i)
    ulaw = order[nearer].astype(np.uint8).tobytes()
    pieces = [{"type": "input_audio_buffer.append",
               "audio": base64.b64encode(ulaw[i:i + 800]).decode()}
              for i in range(0, len(ulaw), 800)]
    with realtime(client) as conn:
        conn.send({"type": "session.update", "session": {"type": "transcription", "audio": {
            "input": {"format": {"type": "audio/pcmu"}, "turn_detection": None}}}})
        feeder = Feeder(conn.send, pieces, speed=0,
                        closing=({"type": "input_audio_buffer.commit"},))
        feeder.start()
        events = collect(conn.recv_bytes)
    (transcript,) = transcripts(events)
    words = set(normalize(transcript).split())
    assert len(words & set(normalize(GOLDEN).split())) >= 12, transcript  # telephone quality


@pytest.mark.parametrize("noise", ["silence", "noise"])
def test_silence_and_noise_say_nothing(client: Any, noise: str) -> None:
    rng = np.random.default_rng(0)
    audio = np.zeros(16000 * 6, np.float32) if noise == "silence" else \
        (rng.standard_normal(16000 * 6) * 0.05).astype(np.float32)
    with realtime(client) as conn:
        conn.send(current_update())
        Feeder(conn.send, appends(pcm24(audio)), speed=0).start()
        events = collect(conn.recv_bytes)
        assert not of(events, "input_audio_buffer.speech_started")
        conn.send(current_update(None))  # the client commits: still nothing said
        Feeder(conn.send, appends(pcm24(audio)), speed=0,
               closing=({"type": "input_audio_buffer.commit"},)).start()
        events = collect(conn.recv_bytes)
    assert transcripts(events) == [""]
    assert not of(events, f"{PREFIX}.delta")


# --- bad events, limits and keys


def _exchange(ws: Any, frame: str | bytes) -> dict[str, Any]:
    ws.send(frame)
    return json.loads(ws.recv(timeout=30))  # type: ignore[no-any-return]


@pytest.mark.parametrize("frame, code, param", [
    ('{"type": "response.create"}', "unknown_event_type", "type"),
    ('{"type": ', "invalid_json", None),
    # past Python's 4,300 digits for int(): a ValueError, which closed the connection (1011)
    ('{"type": "input_audio_buffer.commit", "n": ' + "9" * 5000 + "}", "invalid_json", None),
    ('[1, 2]', "invalid_event", "type"),
    (b"\x00\x01", "invalid_event", None),
    ('{"type": "input_audio_buffer.append", "audio": "not base64!"}', "invalid_base64",
     "audio"),
    ('{"type": "input_audio_buffer.append", "audio": "AAAA"}', "invalid_audio_format", "audio"),
    ('{"type": "input_audio_buffer.append", "audio": 5}', "invalid_audio", "audio"),
    ('{"type": "input_audio_buffer.commit", "event_id": "c1"}',
     "input_audio_buffer_commit_empty", None),
    ('{"type": "session.update", "session": {"type": "transcription", "audio": {"input": '
     '{"format": {"type": "audio/pcm", "rate": 44100}}}}}', "invalid_session",
     "session.audio.input.format.rate"),
    ('{"type": "session.update", "session": {"type": "transcription", "audio": {"input": '
     '{"format": {"type": "audio/flac"}}}}}', "invalid_session",
     "session.audio.input.format.type"),
    ('{"type": "session.update", "session": {"type": "transcription", "audio": {"input": '
     '{"format": {"type": ["audio/pcm"]}}}}}', "invalid_session",
     "session.audio.input.format.type"),
    ('{"type": "session.update", "session": {"type": "transcription", "audio": {"input": '
     '{"format": {"type": "audio/pcm", "rate": 24000.0}}}}}', "invalid_session",
     "session.audio.input.format.rate"),
    ('{"type": "transcription_session.update", "session": {"input_audio_format": {}}}',
     "invalid_session", "session.input_audio_format"),
    ('{"type": "session.update", "session": {"type": "transcription", "audio": {"input": '
     '{"turn_detection": {"type": "server_vad", "threshold": 1.5}}}}}', "invalid_session",
     "session.audio.input.turn_detection.threshold"),
    ('{"type": "session.update", "session": {"type": "realtime"}}', "invalid_session",
     "session.type"),
    ('{"type": "session.update", "session": {"type": "transcription", "audio": {"input": '
     '{"turn_detection": {"type": "semantic_vad"}}}}}', "invalid_session",
     "session.audio.input.turn_detection.type"),
    ('{"type": "session.update", "session": {"type": "transcription", "audio": {"input": '
     '{"transcription": {"model": "no-such-model"}}}}}', "invalid_session",
     "session.audio.input.transcription.model"),
    ('{"type": "session.update", "session": {"type": "transcription", "include": '
     '"item.input_audio_transcription.logprobs"}}', "invalid_session", "session.include"),
    ('{"type": "transcription_session.update", "session": {"include": ["item.other"]}}',
     "invalid_session", "session.include"),
    # a JSON escape of half a surrogate pair: accepted, it made every turn fail after it
    ('{"type": "session.update", "session": {"type": "transcription", "audio": {"input": '
     '{"transcription": {"prompt": "hi \\ud800"}}}}}', "invalid_session",
     "session.audio.input.transcription.prompt"),
    ('{"type": "transcription_session.update", "session": {"input_audio_transcription": '
     '{"prompt": "' + "x" * (MAX_PROMPT_CHARS + 1) + '"}}}', "invalid_session",
     "session.input_audio_transcription.prompt"),
])
def test_bad_events_get_error_events_and_the_connection_stays_usable(
        server: ServerProcess, frame: str | bytes, code: str, param: str | None) -> None:
    with connect(server) as ws:
        assert json.loads(ws.recv(timeout=30))["type"] == "session.created"
        reply = _exchange(ws, frame)
        assert reply["type"] == "error", reply
        assert reply["error"]["code"] == code
        assert reply["error"]["param"] == param
        assert reply["error"]["type"] == "invalid_request_error"
        assert reply["error"]["message"]
        assert len(reply["error"]["message"]) < 300  # a client's value is not echoed whole
        if code == "input_audio_buffer_commit_empty":
            assert reply["error"]["event_id"] == "c1"
        ok = _exchange(ws, json.dumps(current_update(None)))
        assert ok["type"] == "session.updated"


def test_an_error_echoes_a_long_event_id_cut_short(server: ServerProcess) -> None:
    from tensorplan.serve.realtime import MAX_CLIENT_ID

    long_id = "e" * 10_000
    with connect(server) as ws:
        assert json.loads(ws.recv(timeout=30))["type"] == "session.created"
        reply = _exchange(ws, json.dumps({"type": "no.such.event", "event_id": long_id}))
        echoed = reply["error"]["event_id"]
        assert len(echoed) == MAX_CLIENT_ID and echoed.endswith("...")
        assert long_id.startswith(echoed[:-3])
        short = _exchange(ws, json.dumps({"type": "no.such.event", "event_id": "c7"}))
        assert short["error"]["event_id"] == "c7"


@pytest.mark.parametrize(("words", "text", "tokens"), [
    ([" And", " so"], "And so", ["And", " so"]),  # a turn's first delta
    ([" ask", " not"], " ask not", [" ask", " not"]),  # a later one
    ([" ", " Hello"], "Hello", ["", "Hello"]),  # a first word of spaces only
    (["", " Hi"], "Hi", ["", "Hi"]),
    ([" ", " "], "", ["", ""]),
])
def test_logprob_tokens_join_to_the_text(words: list[str], text: str,
                                         tokens: list[str]) -> None:
    from tensorplan.serve.realtime import _unspaced

    assert _unspaced(list(words), len(text)) == tokens
    assert "".join(tokens) == text


def test_an_append_over_the_limit_is_refused(server: ServerProcess) -> None:
    from tensorplan.serve.realtime import MAX_APPEND_BYTES

    too_big = base64.b64encode(bytes(MAX_APPEND_BYTES)).decode()
    with connect(server) as ws:
        ws.recv(timeout=30)
        reply = _exchange(ws, json.dumps({"type": "input_audio_buffer.append", "audio": too_big}))
        assert reply["error"]["code"] == "audio_too_large"
        assert _exchange(ws, json.dumps({"type": "input_audio_buffer.clear"}))["type"] == \
            "input_audio_buffer.cleared"


@pytest.mark.parametrize("how", ["none", "wrong header", "wrong subprotocol"])
def test_a_missing_or_wrong_key_closes_with_1008(server: ServerProcess, how: str) -> None:
    from websockets.exceptions import ConnectionClosed

    headers = {"Authorization": "Bearer nope"} if how == "wrong header" else {}
    protocols = ["realtime", "openai-insecure-api-key.nope"] if how == "wrong subprotocol" \
        else None
    with connect(server, headers=headers, subprotocols=protocols) as ws:
        reply = json.loads(ws.recv(timeout=30))
        assert reply["error"]["code"] == "invalid_api_key"
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=30)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008


def test_the_key_in_a_browser_subprotocol(server: ServerProcess) -> None:
    with connect(server, headers={}, subprotocols=[
            "realtime", f"openai-insecure-api-key.{KEY}", "openai-beta.realtime-v1"]) as ws:
        assert ws.subprotocol == "realtime"
        assert json.loads(ws.recv(timeout=30))["type"] == "transcription_session.created"


def test_a_connection_dropped_mid_turn_frees_its_state(server: ServerProcess) -> None:
    with connect(server) as ws:
        ws.recv(timeout=30)
        for event in appends(jfk_pcm24()[: 24000 * 2 * 4]):  # 4 s: inside the first turn
            ws.send(json.dumps(event))
        while json.loads(ws.recv(timeout=30))["type"] != "input_audio_buffer.speech_started":
            pass
        assert server.health()["live_streams"] >= 1
    health = wait_streams_closed(server)
    assert health["live_streams"] == 0


def test_a_frame_of_invalid_utf8_closes_with_1007_and_logs_one_line(
        server: ServerProcess) -> None:
    """uvicorn logged each such frame with its traceback: any client could fill the log."""
    from websockets.exceptions import ConnectionClosed
    from websockets.frames import Frame, Opcode

    with connect(server) as ws:
        ws.recv(timeout=30)  # session.created
        # under the client's own check, which would refuse to send it
        with ws.protocol_mutex:
            ws.protocol.send_frame(Frame(Opcode.TEXT, b'{"type":"\xff\xfe"}'))
            ws.send_data()
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=30)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1007
    deadline = time.monotonic() + 10
    while "Invalid UTF-8" not in server.output(whole=True) and time.monotonic() < deadline:
        time.sleep(0.1)
    log = server.output(whole=True)
    assert "Invalid UTF-8" in log and "Traceback" not in log, log[-3000:]
    assert server.health()["status"] == "ok"

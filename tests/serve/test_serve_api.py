"""The OpenAI client against a real server: each response_format, streaming, models, health.
Every transcript equals what the Python API (and `tensorplan transcribe`) gives."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from serve_helpers import JFK, ROOT, ServerProcess


def _create(client: Any, **kwargs: Any) -> Any:
    with open(JFK, "rb") as f:
        return client.audio.transcriptions.create(model="whisper-1", file=f, **kwargs)


def test_json(client: Any, reference: Any) -> None:
    got = _create(client)
    assert got.text == reference().text.strip()


def test_text_srt_vtt_equal_the_cli(client: Any, tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "tensorplan", "transcribe", str(JFK), "--beam-size",
                    "none", "-o", str(tmp_path), "-f", "txt,srt,vtt", "--no-verbose"],
                   check=True, cwd=ROOT, capture_output=True)
    for fmt in ("srt", "vtt"):
        got = _create(client, response_format=fmt)
        assert got == (tmp_path / f"jfk.{fmt}").read_text(), fmt
    text = _create(client, response_format="text")
    assert text.strip() == " ".join((tmp_path / "jfk.txt").read_text().split("\n")).strip()


def test_verbose_json_segments(client: Any, reference: Any) -> None:
    got = _create(client, response_format="verbose_json", timestamp_granularities=["segment"])
    want = reference()
    assert got.language == "en" and got.duration == pytest.approx(11.0, abs=0.01)
    assert got.text == want.text.strip()
    # the server batches decoder steps across requests (docs/engine.md): a row's logits
    # can differ in their last bits, so log probabilities compare to 6 places
    assert [_rounded(s.model_dump(exclude_none=True)) for s in got.segments] == \
        [_rounded({k: v for k, v in s.to_dict().items() if k != "words"})
         for s in want.segments]
    assert got.words is None


def _rounded(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: round(v, 6) if isinstance(v, float) else v for k, v in fields.items()}


def test_verbose_json_words_and_segments(client: Any, reference: Any) -> None:
    got = _create(client, response_format="verbose_json",
                  timestamp_granularities=["word", "segment"])
    want = reference(word_timestamps=True)
    words = [w for s in want.segments for w in s.words]
    assert [(w.word, w.start, w.end) for w in got.words] == \
        [(w.word.strip(), w.start, w.end) for w in words]
    assert len(got.segments) == len(want.segments)
    only_words = _create(client, response_format="verbose_json", timestamp_granularities=["word"])
    assert only_words.segments is None and len(only_words.words) == len(words)


def test_extra_decoding_fields(client: Any, reference: Any) -> None:
    """tensorplan's own fields ride along as extra form fields (here: a prompt, no
    conditioning); the result equals the Python API's with the same options."""
    got = _create(client, response_format="verbose_json", prompt="JFK's inaugural address.",
                  extra_body={"condition_on_previous_text": "false"})
    want = reference(initial_prompt="JFK's inaugural address.",
                     condition_on_previous_text=False)
    assert got.text == want.text.strip()
    assert [s.tokens for s in got.segments] == [list(s.tokens) for s in want.segments]


def test_streaming_events(client: Any, reference: Any) -> None:
    with open(JFK, "rb") as f:
        stream = client.audio.transcriptions.create(model="whisper-1", file=f, stream=True)
        events = list(stream)
    want = reference()
    deltas = [e for e in events if e.type == "transcript.text.delta"]
    assert len(deltas) == len(want.segments) and events[-1].type == "transcript.text.done"
    assert "".join(e.delta for e in deltas) == events[-1].text == want.text.strip()


def test_first_segment_streams_before_the_end(server: ServerProcess) -> None:
    """On audio of several windows the first event arrives long before the last."""
    import httpx
    import numpy as np

    from tensorplan.whisper.audio.decode import load_audio

    speech = load_audio(str(JFK))
    long = np.concatenate([speech, np.zeros(16000 * 20, np.float32)] * 3)
    wav = _wav_bytes(long)
    times: list[float] = []
    start = time.monotonic()
    with httpx.Client(timeout=120) as http, http.stream(
            "POST", server.url + "/v1/audio/transcriptions",
            headers={"Authorization": "Bearer " + _key()},
            files={"file": ("long.wav", wav, "audio/wav")}, data={"stream": "true"}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data:"):
                times.append(time.monotonic() - start)
                kind = json.loads(line[5:])["type"]
    assert kind == "transcript.text.done" and len(times) >= 4
    assert times[0] < 0.6 * times[-1], times


def test_models_and_aliases(client: Any, server: ServerProcess) -> None:
    ids = [m.id for m in client.models.list()]
    assert ids == ["tiny.en", "whisper-1"]
    assert client.models.retrieve("whisper-1").id == "whisper-1"
    with open(JFK, "rb") as f:
        assert client.audio.transcriptions.create(model="tiny.en", file=f).text


def test_unknown_model_is_openais_model_not_found(client: Any) -> None:
    import openai

    with pytest.raises(openai.NotFoundError) as e, open(JFK, "rb") as f:
        client.audio.transcriptions.create(model="gpt-9-transcribe", file=f)
    assert e.value.body["code"] == "model_not_found"


def test_translation_on_an_english_only_model_is_a_400(client: Any) -> None:
    import openai

    with pytest.raises(openai.BadRequestError, match="English-only"), open(JFK, "rb") as f, \
            pytest.warns(DeprecationWarning):  # the client's, not ours: OpenAI keeps the route
        client.audio.translations.create(model="whisper-1", file=f)


def test_health_and_readiness(server: ServerProcess) -> None:
    import httpx

    assert httpx.get(server.url + "/ready").status_code == 200
    h = server.health()
    assert h["status"] == "ok" and h["ready"] and h["sessions"] == 2
    assert {"busy_sessions", "queued", "rss_bytes", "threads"} <= set(h)


def _key() -> str:
    from serve_helpers import KEY

    return KEY


def _wav_bytes(samples: Any) -> bytes:
    import io
    import wave

    import numpy as np

    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return buf.getvalue()

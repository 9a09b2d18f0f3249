"""Clients of /v1/realtime for the tests: audio as OpenAI's clients send it (PCM16 at
24 kHz, base64, in 100 ms pieces), and a reader that collects the server's events."""

from __future__ import annotations

import base64
import json
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import soxr
from serve_helpers import JFK
from transcripts import normalize, word_edits  # noqa: F401 - the realtime tests' helpers

GOLDEN = ("And so my fellow Americans ask not what your country can do for you ask what you "
          "can do for your country")
TAIL = "tensorplan.transcription.tail"
PREFIX = "conversation.item.input_audio_transcription"


# Paced in real time, where a stream's updates fall depends on the machine's speed; two
# updates can agree on a misheard word ("am I fellow Americans" before "my" is heard in
# full), which LocalAgreement then commits. Such streams may differ from the file's text
# by this many words (docs/realtime.md); streams sent at once update at fixed points.
# Measured in-process on jfk in one turn, at update cadences drawn at random (decodes
# costing 0.5-2x (0.3 + s/10) s): 0 to 3 edits ("am I" 2, "asked not" 1, "you are" 2),
# 3 in a quarter of the draws; CI's loaded fast set once got "asked" and "you are".
PACED_WORD_EDITS = 3


def samples16k(path: Path | str) -> np.ndarray:
    from tensorplan.whisper.audio.decode import load_audio

    return load_audio(str(path))


def pcm24(samples: np.ndarray) -> bytes:
    """16 kHz float samples as OpenAI's input: PCM16 at 24 kHz."""
    up = soxr.resample(np.asarray(samples, np.float32), 16000, 24000)
    return (np.clip(up, -1, 1) * 32767).astype("<i2").tobytes()


def jfk_pcm24(silence_s: float = 1.5) -> bytes:
    return pcm24(np.concatenate([samples16k(JFK), np.zeros(int(silence_s * 16000),
                                                           np.float32)]))


def espeak(text: str, voice: str = "en-us", speed: int = 160) -> np.ndarray:
    """Speech from espeak-ng, 16 kHz float."""
    with tempfile.TemporaryDirectory() as tmp:
        wav = Path(tmp) / "speech.wav"
        subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed), "-w", str(wav), text],
                       check=True, capture_output=True)
        return samples16k(wav)


def appends(pcm: bytes, piece_ms: int = 100, rate: int = 24000) -> list[dict[str, Any]]:
    step = rate * 2 * piece_ms // 1000
    return [{"type": "input_audio_buffer.append",
             "audio": base64.b64encode(pcm[i:i + step]).decode()}
            for i in range(0, len(pcm), step)]


def current_update(turn_detection: Any = "default", rate: int = 24000,
                   **transcription: Any) -> dict[str, Any]:
    inp: dict[str, Any] = {"format": {"type": "audio/pcm", "rate": rate}}
    if turn_detection != "default":
        inp["turn_detection"] = turn_detection
    if transcription:
        inp["transcription"] = transcription
    return {"type": "session.update", "session": {"type": "transcription", "audio": {"input": inp}}}


class Feeder(threading.Thread):
    """Sends events, paced at `speed` times real time (0: as fast as it can), then the
    closing events (a commit, and always a clear: its `cleared` marks the end)."""

    def __init__(self, send: Any, events: list[dict[str, Any]], piece_s: float = 0.1,
                 speed: float = 1.0, closing: tuple[dict[str, Any], ...] = ()) -> None:
        super().__init__(daemon=True)
        self.send, self.events, self.piece_s, self.speed = send, events, piece_s, speed
        self.closing = (*closing, {"type": "input_audio_buffer.clear"})
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            t0 = time.monotonic()
            for i, event in enumerate(self.events):
                self.send(event)
                if self.speed:
                    time.sleep(max(0.0, t0 + (i + 1) * self.piece_s / self.speed
                                   - time.monotonic()))
            for event in self.closing:
                self.send(event)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e


def collect(recv: Any, timeout: float = 240.0, on_event: Any = None) -> list[dict[str, Any]]:
    """The server's events until the feeder's closing `cleared` arrived and every committed
    item has its completed (or failed) event."""
    events: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        raw = recv()
        event = json.loads(raw)
        event["_t"] = time.monotonic()
        events.append(event)
        if on_event is not None:
            on_event(raw, event)
        if event["type"] == "error" and event["error"]["code"] == "invalid_api_key":
            break
        committed = {e["item_id"] for e in events if e["type"] == "input_audio_buffer.committed"}
        done = {e["item_id"] for e in events
                if e["type"] in (f"{PREFIX}.completed", f"{PREFIX}.failed")}
        if any(e["type"] == "input_audio_buffer.cleared" for e in events) and committed <= done:
            return events
    raise AssertionError(f"no end after {timeout} s: {[e['type'] for e in events][-20:]}")


def of(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == kind]


def transcripts(events: list[dict[str, Any]]) -> list[str]:
    return [e["transcript"] for e in of(events, f"{PREFIX}.completed")]


def check_deltas_join(events: list[dict[str, Any]]) -> None:
    """Each turn's deltas join to its completed transcript."""
    for done in of(events, f"{PREFIX}.completed"):
        deltas = [e["delta"] for e in of(events, f"{PREFIX}.delta")
                  if e["item_id"] == done["item_id"]]
        assert "".join(deltas) == done["transcript"], (deltas, done["transcript"])

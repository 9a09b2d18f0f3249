"""`stream=true`: server-sent events in OpenAI's shapes, one delta per decoded segment.

Each `transcript.text.delta` carries the segment's text; concatenated they give the final
`transcript.text.done` text. Extra keys (`segment` with its id and times, `outputs` with
rendered files when `stream_outputs` asks) are additions OpenAI's clients ignore.
"""

from __future__ import annotations

import json
from typing import Any

from tensorplan.whisper.result import Segment, TranscriptionResult
from tensorplan.whisper.writers import render

MEDIA_TYPE = "text/event-stream"


def event(data: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


def delta_event(segment: Segment, first: bool) -> bytes:
    text = segment.text.lstrip() if first else segment.text
    return event({"type": "transcript.text.delta", "delta": text,
                  "segment": {"id": segment.id, "start": segment.start, "end": segment.end}})


def done_event(result: TranscriptionResult, outputs: tuple[str, ...]) -> bytes:
    body: dict[str, Any] = {"type": "transcript.text.done", "text": result.text.strip()}
    if outputs:
        body["outputs"] = {fmt: render(result, fmt) for fmt in outputs}
    return event(body)

"""A finished transcription as each OpenAI response_format spells it."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse, PlainTextResponse, Response

from tensorplan.whisper.result import Segment, TranscriptionResult
from tensorplan.whisper.writers import render


def render_response(result: TranscriptionResult, response_format: str, *, task: str,
                    duration: float, granularities: frozenset[str]) -> Response:
    if response_format == "json":
        return JSONResponse({"text": result.text.strip(), "usage": _usage(duration)})
    if response_format == "text":
        return PlainTextResponse(result.text.strip() + "\n")
    if response_format in ("srt", "vtt"):  # byte for byte what `tensorplan transcribe` writes
        return PlainTextResponse(render(result, response_format))
    return JSONResponse(verbose_json(result, task=task, duration=duration,
                                     granularities=granularities))


def verbose_json(result: TranscriptionResult, *, task: str, duration: float,
                 granularities: frozenset[str]) -> dict[str, Any]:
    """OpenAI's TranscriptionVerbose: segments unless only words were asked for, words when
    asked for (flattened across segments, as OpenAI lists them)."""
    body: dict[str, Any] = {"task": task, "language": result.language, "duration": duration,
                            "text": result.text.strip()}
    if "segment" in granularities or not granularities:
        body["segments"] = [_segment(s) for s in result.segments]
    if "word" in granularities:
        body["words"] = [{"word": w.word.strip(), "start": w.start, "end": w.end,
                          "probability": w.probability}
                         for s in result.segments for w in (s.words or ())]
    body["usage"] = _usage(duration)
    return body


def _segment(s: Segment) -> dict[str, Any]:
    d = s.to_dict()
    d.pop("words", None)  # OpenAI lists words once, at the top level
    return d


def _usage(duration: float) -> dict[str, Any]:
    return {"type": "duration", "seconds": round(duration, 3)}

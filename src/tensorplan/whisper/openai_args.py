"""openai-whisper's `transcribe()` keyword arguments, taken the way it takes them.

Code written for `whisper.load_model(name).transcribe(audio, **kw)` passes these to
`Whisper.transcribe` here. Each one is a TranscribeOptions field, some given in openai's
looser forms (a float or a sequence for `temperature`, "0" or "1.5,3" for
`clip_timestamps`, "-1" for `suppress_tokens`, lists for tuples), or handled below
(`verbose`, `fp16`), or refused with a line that names it (`prompt`). Anything else is
refused with a TypeError naming the argument, as Python refuses an unknown keyword.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Mapping
from typing import Any

# openai-whisper 20250625, whisper/transcribe.py: transcribe()'s own keyword arguments,
# then DecodingOptions' fields, which it takes through **decode_options.
TRANSCRIBE_ARGS = (
    "verbose", "temperature", "compression_ratio_threshold", "logprob_threshold",
    "no_speech_threshold", "condition_on_previous_text", "initial_prompt",
    "carry_initial_prompt", "word_timestamps", "prepend_punctuations", "append_punctuations",
    "clip_timestamps", "hallucination_silence_threshold",
)
DECODE_ARGS = (
    "task", "language", "temperature", "sample_len", "best_of", "beam_size", "patience",
    "length_penalty", "prompt", "prefix", "suppress_tokens", "suppress_blank",
    "without_timestamps", "max_initial_timestamp", "fp16",
)
# taken but not TranscribeOptions fields: handled by `split` below
HANDLED_HERE = ("verbose", "fp16")
REFUSED = {
    "prompt": "openai's transcribe() replaces it with the previous windows' text before "
              "every window; pass initial_prompt (and carry_initial_prompt=True) instead",
}

Printer = Callable[[Any], None]


def split(overrides: Mapping[str, Any], fields: Mapping[str, Any]
          ) -> tuple[dict[str, Any], Printer | None]:
    """(TranscribeOptions field values, a segment printer for verbose=True or None) from
    the keyword arguments a caller passed. `fields`: TranscribeOptions' field names.
    Raises TypeError for an argument this API does not take, naming it."""
    changes: dict[str, Any] = {}
    printer: Printer | None = None
    for name, value in overrides.items():
        if name in REFUSED:
            raise TypeError(f"transcribe(): {name}: {REFUSED[name]}")
        if name == "verbose":  # openai: True prints each segment; False a progress bar
            printer = print_segment if value else None
        elif name == "fp16":
            if value:  # openai's own words when it falls back on a CPU
                warnings.warn("FP16 is not supported on CPU; using FP32 instead", stacklevel=4)
        elif name not in fields:
            raise TypeError(f"transcribe() got an unexpected keyword argument {name!r}")
        else:
            changes[name] = loosen(name, value)
    return changes, printer


def loosen(name: str, value: Any) -> Any:
    """openai's forms of a field's value, as TranscribeOptions holds it."""
    if name == "temperature" and isinstance(value, int | float) and not isinstance(value, bool):
        return (value,)  # one temperature: no fallback
    if name == "clip_timestamps" and isinstance(value, str):
        return _numbers(value, float, name)
    if name == "suppress_tokens" and isinstance(value, str):
        return _numbers(value, int, name)
    if name in ("temperature", "clip_timestamps", "suppress_tokens") and isinstance(value, list):
        return tuple(value)
    return value


def _numbers(text: str, kind: type, name: str) -> tuple[Any, ...]:
    try:
        return tuple(kind(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"{name} must be comma-separated numbers, got {text[:40]!r}") from None


def print_segment(segment: Any) -> None:
    """openai's verbose line: [MM:SS.mmm --> MM:SS.mmm] text."""
    from tensorplan.whisper.writers import format_timestamp

    print(f"[{format_timestamp(segment.start)} --> {format_timestamp(segment.end)}] "
          f"{segment.text}", file=sys.stdout, flush=True)

"""faster-whisper's result types, field for field and in its order (its transcribe.py), so
code that reads `segment.words[0].probability` or `dataclasses.asdict(info)` runs unchanged.
Mutable dataclasses, as faster-whisper's are (callers adjust times in place)."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tensorplan.whisper.audio.vad import VadOptions


@dataclass
class Word:
    start: float
    end: float
    word: str
    probability: float

    def _asdict(self) -> dict[str, Any]:
        """faster-whisper keeps this from its namedtuple days, deprecated: code that dumps
        words with it still runs."""
        return _deprecated_asdict(self)


@dataclass
class Segment:
    id: int  # from 1, as faster-whisper numbers them
    seek: int  # first mel frame of the window the segment was decoded from
    start: float
    end: float
    text: str
    tokens: list[int]
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    words: list[Word] | None
    temperature: float | None

    def _asdict(self) -> dict[str, Any]:
        """As Word._asdict: deprecated in faster-whisper, still there."""
        return _deprecated_asdict(self)


def _deprecated_asdict(item: Any) -> dict[str, Any]:
    name = type(item).__name__
    warnings.warn(f"{name}._asdict() is deprecated, use dataclasses.asdict({name}) instead",
                  DeprecationWarning, stacklevel=3)
    return dataclasses.asdict(item)


@dataclass
class TranscriptionOptions:
    """The options a transcription ran with, under faster-whisper's names."""

    beam_size: int
    best_of: int
    patience: float
    length_penalty: float
    repetition_penalty: float
    no_repeat_ngram_size: int
    log_prob_threshold: float | None
    no_speech_threshold: float | None
    compression_ratio_threshold: float | None
    condition_on_previous_text: bool
    prompt_reset_on_temperature: float
    temperatures: list[float]
    initial_prompt: str | Iterable[int] | None
    prefix: str | None
    suppress_blank: bool
    suppress_tokens: list[int] | None
    without_timestamps: bool
    max_initial_timestamp: float
    word_timestamps: bool
    prepend_punctuations: str
    append_punctuations: str
    multilingual: bool
    max_new_tokens: int | None
    clip_timestamps: str | list[float]
    hallucination_silence_threshold: float | None
    hotwords: str | None


@dataclass
class TranscriptionInfo:
    language: str
    language_probability: float
    duration: float
    duration_after_vad: float
    all_language_probs: list[tuple[str, float]] | None
    transcription_options: TranscriptionOptions
    vad_options: VadOptions | dict[str, Any] | None  # as given when vad_filter is off

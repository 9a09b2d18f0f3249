"""Options for decoding one 30-second window and for transcribing long audio.

The frozen dataclasses below are the one source of truth: each field's default, type and
help text generate the CLI flags (flags.py: `add_arguments`), which read back with `from_args`.
Flags are kebab-case versions of openai-whisper's names (`--beam-size`, `--no-speech-threshold`).

Defaults, chosen deliberately (docs/decoding.md):
- `beam_size=5`, `best_of=5`, as the openai CLI, faster-whisper and whisper.cpp all do (only
  openai's Python API defaults to greedy). Our output then matches the tools users compare us
  with, and speed comparisons with them are like for like. `beam_size=None` selects greedy.
- The two apply to different temperatures, so they never conflict: `beam_size`/`patience` at
  T=0, `best_of` at T>0. This is the rule openai's `transcribe()` applies by deleting options
  before each fallback; here it is the meaning of the fields, also for a single `decode()`.
- Sampling at T>0 uses `seed`, so a run is reproducible.
- Everything else follows openai-whisper: `suppress_tokens=(-1,)` (non-speech symbols),
  timestamps on, `max_initial_timestamp=1.0`, temperatures 0.0..1.0 step 0.2, thresholds
  2.4 / -1.0 / 0.6, conditioning on previous text.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import numpy as np

from tensorplan.whisper.audio.constants import CHUNK_LENGTH
from tensorplan.whisper.flags import option
from tensorplan.whisper.limits import (
    MAX_CLIP_SECONDS,
    MAX_CLIP_SPANS,
    MAX_PATIENCE,
    MAX_SEED,
    MAX_SEQUENCES,
    MAX_TEMPERATURE,
    MIN_TEMPERATURE,
)
from tensorplan.whisper.result import APPEND_PUNCTUATIONS, PREPEND_PUNCTUATIONS

Task = Literal["transcribe", "translate"]
MAX_BATCH_SIZE = 64  # windows decoded together; 64 tiny windows hold 1.2 GB of cross K/V
MAX_SAMPLE_LEN = 1 << 16  # a sanity bound: decoding stops at the model's context (448) anyway


@dataclass(frozen=True, slots=True)
class SearchOptions:
    """Fields shared by DecodingOptions and TranscribeOptions."""

    # task
    task: Task = option("transcribe", "transcribe speech, or translate it to English",
                      group="everyday")
    language: str | None = option(None, "language code such as 'en'; None detects it",
                                group="everyday")
    # search
    sample_len: int | None = option(None, "most tokens to sample per window (None: n_text_ctx/2)")
    best_of: int | None = option(5, "number of candidates when sampling at temperature > 0")
    beam_size: int | None = option(5, "beams at temperature 0; None decodes greedily",
                                 group="everyday")
    patience: float | None = option(None, "beam search patience factor (None: 1.0)")
    length_penalty: float | None = option(
        None, "ranking length penalty alpha in (5+len)/6)^alpha; None divides by the length")
    seed: int = option(0, "seed of the random generator used when sampling at temperature > 0")
    # prompt
    prefix: str | None = option(None, "text that starts the transcript of the (first) window")
    hotwords: str | None = option(
        None, "words put before the previous text in the prompt; ignored with a prefix")
    # suppression
    suppress_tokens: tuple[int, ...] = option(
        (-1,), "comma-separated token ids to suppress; -1 means the non-speech symbols")
    suppress_blank: bool = option(True, "forbid a blank or end of text as the first token")
    # timestamps
    without_timestamps: bool = option(False, "sample text tokens only, no timestamp tokens")
    max_initial_timestamp: float | None = option(1.0, "latest first timestamp in seconds")

    def __post_init__(self) -> None:
        # Every number is checked here, once, so the CLI, the API and batch workers refuse
        # the same values with the same message (flag names: the CLI spells them with dashes).
        check(self.task in ("transcribe", "translate"), f"unknown task {self.task!r}")
        check_int(self, "beam_size", 1, MAX_SEQUENCES, optional=True)
        check_int(self, "best_of", 1, MAX_SEQUENCES, optional=True)
        check_int(self, "sample_len", 1, MAX_SAMPLE_LEN, optional=True)
        check_int(self, "seed", 0, MAX_SEED)
        check_float(self, "patience", optional=True)
        check(self.patience is None or 0 < self.patience <= MAX_PATIENCE,
              f"patience must be in (0, {MAX_PATIENCE:g}], got {self.patience}")
        check(self.patience is None or self.beam_size is not None, "patience needs beam_size")
        check_float(self, "length_penalty", optional=True)
        check(self.length_penalty is None or 0 <= self.length_penalty <= 1,
              "length_penalty must be between 0 and 1")
        check(isinstance(self.suppress_tokens, tuple)
              and all(_is_int(t) and t >= -1 for t in self.suppress_tokens),
              f"suppress_tokens must be token ids (-1: the non-speech symbols), got "
              f"{_short(self.suppress_tokens)}")
        check_float(self, "max_initial_timestamp", optional=True)
        check(self.max_initial_timestamp is None
              or 0 <= self.max_initial_timestamp <= CHUNK_LENGTH,
              f"max_initial_timestamp must be between 0 and {CHUNK_LENGTH} seconds, got "
              f"{self.max_initial_timestamp}")


def check(ok: Any, message: str) -> None:  # Any: numpy comparisons give numpy bools
    if not ok:
        raise ValueError(message)


def _is_int(value: Any) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def check_int(options: Any, name: str, lo: int, hi: int, optional: bool = False) -> None:
    value = getattr(options, name)
    if value is None and optional:
        return
    check(_is_int(value) and lo <= value <= hi,
          f"{name} must be an integer from {lo} to {hi}, got {_short(value)}")


def check_float(options: Any, name: str, optional: bool = False) -> None:
    """A real, finite number (NaN compares false with everything, so range checks alone
    would let it through; inf overflows the sizes computed from it)."""
    value = getattr(options, name)
    if value is None and optional:
        return
    check(isinstance(value, int | float | np.integer | np.floating)
          and not isinstance(value, bool) and math.isfinite(value),
          f"{name} must be a finite number, got {_short(value)}")


def check_temperature(value: Any, name: str = "temperature") -> None:
    check(isinstance(value, int | float | np.integer | np.floating)
          and not isinstance(value, bool) and math.isfinite(value)
          and (value == 0 or MIN_TEMPERATURE <= value <= MAX_TEMPERATURE),
          f"{name} must be 0 or between {MIN_TEMPERATURE:g} and {MAX_TEMPERATURE:g}, "
          f"got {_short(value)}")


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


@dataclass(frozen=True, slots=True)
class DecodingOptions(SearchOptions):
    """How to decode one 30-second window (`decoding.decode`)."""

    temperature: float = option(0.0, "sampling temperature; 0 is greedy or beam search")
    prompt: str | tuple[int, ...] | None = option(
        None, "previous text (or its tokens) that conditions the decoder")

    def __post_init__(self) -> None:
        SearchOptions.__post_init__(self)
        check_temperature(self.temperature)
        check(self.prompt is None or isinstance(self.prompt, str)
              or all(_is_int(t) and t >= 0 for t in self.prompt),
              "prompt must be text or token ids")


@dataclass(frozen=True, slots=True)
class TranscribeOptions(SearchOptions):
    """How to transcribe long audio window by window (`transcribe.transcribe`)."""

    # temperature fallback
    temperature: tuple[float, ...] = option(
        (0.0, 0.2, 0.4, 0.6, 0.8, 1.0), "comma-separated temperatures tried in turn",
        group="everyday")
    compression_ratio_threshold: float | None = option(
        2.4, "retry at a higher temperature when the gzip compression ratio is above this")
    logprob_threshold: float | None = option(
        -1.0, "retry at a higher temperature when the average log probability is below this")
    no_speech_threshold: float | None = option(
        0.6, "a window is silent when the no-speech probability is above this and the "
             "average log probability is below --logprob-threshold")
    # prompting across windows
    condition_on_previous_text: bool = option(
        True, "prompt each window with the text of the previous ones")
    prompt_reset_on_temperature: float = option(
        0.5, "stop conditioning on previous text after a window decoded above this temperature")
    initial_prompt: str | None = option(None, "text that prompts the first window",
                                      group="everyday")
    carry_initial_prompt: bool = option(
        False, "put --initial-prompt before the prompt of every window")
    clip_timestamps: tuple[float, ...] = option(
        (), "comma-separated start,end,start,end,... seconds to transcribe; empty: all")
    # word timestamps
    word_timestamps: bool = option(False, "align each word with the audio", group="everyday")
    prepend_punctuations: str = option(
        PREPEND_PUNCTUATIONS, "with word timestamps: merge these symbols into the next word")
    append_punctuations: str = option(
        APPEND_PUNCTUATIONS, "with word timestamps: merge these symbols into the previous word")
    hallucination_silence_threshold: float | None = option(
        None, "with word timestamps: skip silences longer than this many seconds around a "
              "possible hallucination")
    # input
    audio_stream: int | None = option(
        None, "which audio stream of a file to read, from 0 (default: ffmpeg's choice)")
    # voice activity detection (whisper/audio/vad.py)
    vad_filter: bool = option(
        False, "transcribe only the speech Silero VAD finds (needs onnxruntime and silero-vad)")

    # batched transcription (whisper/decoding/batched.py)
    batch_size: int | None = option(
        None, "cut the audio at pauses into chunks of at most 30 s and decode this many "
              "together, each without the previous text (faster-whisper's batched pipeline); "
              "None: one window after another")

    def __post_init__(self) -> None:
        SearchOptions.__post_init__(self)
        check(isinstance(self.temperature, tuple) and 1 <= len(self.temperature) <= 100,
              "temperature needs one to 100 values")
        for t in self.temperature:
            check_temperature(t)
        for name in ("compression_ratio_threshold", "logprob_threshold", "no_speech_threshold",
                     "hallucination_silence_threshold"):
            check_float(self, name, optional=True)
        check(self.no_speech_threshold is None or 0 <= self.no_speech_threshold <= 1,
              f"no_speech_threshold is a probability, between 0 and 1; got "
              f"{self.no_speech_threshold}")
        check(self.hallucination_silence_threshold is None
              or self.hallucination_silence_threshold > 0,
              "hallucination_silence_threshold must be positive")
        check_float(self, "prompt_reset_on_temperature")
        check_int(self, "audio_stream", 0, 1 << 16, optional=True)
        check_clips(self.clip_timestamps)
        check(self.batch_size is None or 1 <= self.batch_size <= MAX_BATCH_SIZE,
              f"batch_size must be between 1 and {MAX_BATCH_SIZE}")
        if self.hallucination_silence_threshold is not None and not self.word_timestamps:
            raise ValueError("hallucination_silence_threshold needs word_timestamps")
        if self.vad_filter and self.clip_timestamps:  # clip times: original or speech-only?
            raise ValueError("vad_filter and clip_timestamps cannot be combined")

    def decoding(self, temperature: float, prompt: Sequence[int] | None,
                 prefix: str | None) -> DecodingOptions:
        """The DecodingOptions for one window decoded at `temperature`."""
        shared = {f.name: getattr(self, f.name) for f in dataclasses.fields(SearchOptions)}
        shared["prefix"] = prefix
        return DecodingOptions(**shared, temperature=temperature,
                               prompt=tuple(prompt) if prompt else None)


Number = TypeVar("Number", int, float)


def group_sizes(options: TranscribeOptions) -> tuple[int, ...]:
    """The sequences one window decodes together at each kind of temperature it may use:
    the beams (or 1, greedy) at temperature 0, the best-of samples above 0."""
    temps = options.temperature
    temps = temps if isinstance(temps, tuple | list) else (temps,)
    beams = (options.beam_size or 1,) if any(t == 0 for t in temps) else ()
    samples = (options.best_of or 1,) if any(t > 0 for t in temps) else ()
    return beams + samples


def max_batch(options: TranscribeOptions) -> int:
    """Sequences decoded together (`group_sizes`, the largest); it sizes the KV cache, so
    a greedy run without fallback keeps one sequence's worth."""
    return max(group_sizes(options), default=1)


def clip_spans(points: Sequence[Number], end: Number) -> list[tuple[Number, Number]]:
    """clip_timestamps' start, end, start, ... as (start, end) spans in any unit (seconds,
    frames), each end at most `end`; a lone last start runs to `end`, and no points at all
    mean [0, end)."""
    edges: list[Number] = list(points) or [end - end]
    if len(edges) % 2:
        edges.append(end)
    return [(start, min(stop, end)) for start, stop in zip(edges[::2], edges[1::2],
                                                            strict=True)]


def check_clips(clips: Any) -> None:
    """start,end,start,end,... seconds: finite, non-negative, each span non-empty and after
    the one before (the seek loop only moves forward; a lone last start runs to the end)."""
    check(isinstance(clips, tuple), "clip_timestamps must be a list of seconds")
    check(len(clips) <= 2 * MAX_CLIP_SPANS, f"clip_timestamps: {(len(clips) + 1) // 2} spans, "
          f"more than {MAX_CLIP_SPANS} (each is decoded as at least one 30 s window)")
    for t in clips:
        check(isinstance(t, int | float | np.integer | np.floating) and not isinstance(t, bool)
              and 0 <= t <= MAX_CLIP_SECONDS and math.isfinite(t),  # 10**400: no overflow
              f"clip_timestamps must be seconds from 0 to {MAX_CLIP_SECONDS:g}, "
              f"got {_short(t)}")
    for i in range(1, len(clips)):
        if i % 2:  # an end after its start
            check(clips[i] > clips[i - 1], f"clip_timestamps: span {i // 2 + 1} ends at "
                  f"{clips[i]} s, not after its start {clips[i - 1]} s")
        else:  # a start at or after the previous end
            check(clips[i] >= clips[i - 1], f"clip_timestamps: span {i // 2 + 1} starts at "
                  f"{clips[i]} s, before the previous span ends ({clips[i - 1]} s)")

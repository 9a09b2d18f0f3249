"""Options for decoding one 30-second window and for transcribing long audio.

The frozen dataclasses below are the one source of truth: each field's default, type and
help text generate the CLI flags (`add_arguments`), which read back with `from_args`.
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

import argparse
import dataclasses
import math
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, Union

import numpy as np

from tensorplan.errors import UserError
from tensorplan.whisper.limits import (
    DEFAULT_MAX_AUDIO_SECONDS as DEFAULT_MAX_AUDIO_SECONDS,  # re-exported for the server
)
from tensorplan.whisper.limits import (
    MAX_CLIP_SPANS,
    MAX_PATIENCE,
    MAX_SEED,
    MAX_SEQUENCES,
    MAX_TEMPERATURE,
    MIN_TEMPERATURE,
)

Task = Literal["transcribe", "translate"]
MAX_BATCH_SIZE = 64  # windows decoded together; 64 tiny windows hold 1.2 GB of cross K/V
PREPEND_PUNCTUATIONS = "\"'“¿([{-"
APPEND_PUNCTUATIONS = "\"'.。,，!！?？:：”)]}、"
CHUNK_SECONDS = 30  # one model window
MAX_SAMPLE_LEN = 1 << 16  # a sanity bound: decoding stops at the model's context (448) anyway


def _opt(default: Any, help: str, **cli: Any) -> Any:
    """A dataclass field with its CLI help text (and optional extra keys, such as the
    `group` of its flag: "everyday" for those `transcribe --help` lists first)."""
    return field(default=default, metadata={"help": help, **cli})


@dataclass(frozen=True, slots=True)
class SearchOptions:
    """Fields shared by DecodingOptions and TranscribeOptions."""

    # task
    task: Task = _opt("transcribe", "transcribe speech, or translate it to English",
                      group="everyday")
    language: str | None = _opt(None, "language code such as 'en'; None detects it",
                                group="everyday")
    # search
    sample_len: int | None = _opt(None, "most tokens to sample per window (None: n_text_ctx/2)")
    best_of: int | None = _opt(5, "number of candidates when sampling at temperature > 0")
    beam_size: int | None = _opt(5, "beams at temperature 0; None decodes greedily",
                                 group="everyday")
    patience: float | None = _opt(None, "beam search patience factor (None: 1.0)")
    length_penalty: float | None = _opt(
        None, "ranking length penalty alpha in (5+len)/6)^alpha; None divides by the length")
    seed: int = _opt(0, "seed of the random generator used when sampling at temperature > 0")
    # prompt
    prefix: str | None = _opt(None, "text that starts the transcript of the (first) window")
    hotwords: str | None = _opt(
        None, "words put before the previous text in the prompt; ignored with a prefix")
    # suppression
    suppress_tokens: tuple[int, ...] = _opt(
        (-1,), "comma-separated token ids to suppress; -1 means the non-speech symbols")
    suppress_blank: bool = _opt(True, "forbid a blank or end of text as the first token")
    # timestamps
    without_timestamps: bool = _opt(False, "sample text tokens only, no timestamp tokens")
    max_initial_timestamp: float | None = _opt(1.0, "latest first timestamp in seconds")

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
              or 0 <= self.max_initial_timestamp <= CHUNK_SECONDS,
              f"max_initial_timestamp must be between 0 and {CHUNK_SECONDS} seconds, got "
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

    temperature: float = _opt(0.0, "sampling temperature; 0 is greedy or beam search")
    prompt: str | tuple[int, ...] | None = _opt(
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
    temperature: tuple[float, ...] = _opt(
        (0.0, 0.2, 0.4, 0.6, 0.8, 1.0), "comma-separated temperatures tried in turn",
        group="everyday")
    compression_ratio_threshold: float | None = _opt(
        2.4, "retry at a higher temperature when the gzip compression ratio is above this")
    logprob_threshold: float | None = _opt(
        -1.0, "retry at a higher temperature when the average log probability is below this")
    no_speech_threshold: float | None = _opt(
        0.6, "a window is silent when the no-speech probability is above this and the "
             "average log probability is below --logprob-threshold")
    # prompting across windows
    condition_on_previous_text: bool = _opt(
        True, "prompt each window with the text of the previous ones")
    prompt_reset_on_temperature: float = _opt(
        0.5, "stop conditioning on previous text after a window decoded above this temperature")
    initial_prompt: str | None = _opt(None, "text that prompts the first window",
                                      group="everyday")
    carry_initial_prompt: bool = _opt(
        False, "put --initial-prompt before the prompt of every window")
    clip_timestamps: tuple[float, ...] = _opt(
        (), "comma-separated start,end,start,end,... seconds to transcribe; empty: all")
    # word timestamps
    word_timestamps: bool = _opt(False, "align each word with the audio", group="everyday")
    prepend_punctuations: str = _opt(
        PREPEND_PUNCTUATIONS, "with word timestamps: merge these symbols into the next word")
    append_punctuations: str = _opt(
        APPEND_PUNCTUATIONS, "with word timestamps: merge these symbols into the previous word")
    hallucination_silence_threshold: float | None = _opt(
        None, "with word timestamps: skip silences longer than this many seconds around a "
              "possible hallucination")
    # input
    audio_stream: int | None = _opt(
        None, "which audio stream of a file to read, from 0 (default: ffmpeg's choice)")
    # voice activity detection (whisper/vad.py)
    vad_filter: bool = _opt(
        False, "transcribe only the speech Silero VAD finds (needs onnxruntime and silero-vad)")

    # batched transcription (whisper/batched.py)
    batch_size: int | None = _opt(
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
              and math.isfinite(t) and t >= 0,
              f"clip_timestamps must be finite, non-negative seconds, got {_short(t)}")
    for i in range(1, len(clips)):
        if i % 2:  # an end after its start
            check(clips[i] > clips[i - 1], f"clip_timestamps: span {i // 2 + 1} ends at "
                  f"{clips[i]} s, not after its start {clips[i - 1]} s")
        else:  # a start at or after the previous end
            check(clips[i] >= clips[i - 1], f"clip_timestamps: span {i // 2 + 1} starts at "
                  f"{clips[i]} s, before the previous span ends ({clips[i - 1]} s)")


# ---------------------------------------------------------------------------------------------
# CLI flags generated from the fields

OptionsT = TypeVar("OptionsT")


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup,
                  cls: type[Any], exclude: Sequence[str] = (),
                  group: str | None = None, only: Sequence[str] | None = None) -> None:
    """Add one flag per field of `cls` (a dataclass) to `parser`; with `group`, only the
    fields whose metadata names that group ("decoding" when it names none); with `only`,
    only the fields named.

    bool fields become `--x/--no-x`; `X | None` fields also accept "none"; tuples read a
    comma-separated list; Literal fields get choices. The parsed value lands in
    `args.<field name>` and defaults to the field's default.
    """
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in exclude or group not in (None, f.metadata.get("group", "decoding")):
            continue
        if only is not None and f.name not in only:
            continue
        shown = _format(f.default).replace("%", "%%") or '""'
        kwargs: dict[str, Any] = {"dest": f.name, "default": f.default,
                                  "help": f"{f.metadata['help']} (default: {shown})"}
        kind, optional = _strip_none(hints[f.name])
        if kind is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            parse, choices = _parser_for(kind)
            kwargs["type"] = _or_none(parse) if optional else parse
            kwargs["metavar"] = _metavar(kind, choices)
            if choices:
                kwargs["choices"] = list(choices) + ([None] if optional else [])
        parser.add_argument(flag_name(f.name), **kwargs)


def from_args(cls: type[OptionsT], args: argparse.Namespace) -> OptionsT:
    """Build `cls` from parsed flags; fields without a flag keep their default.
    Inconsistent flags raise UserError."""
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    values = {name: getattr(args, name) for name in names if hasattr(args, name)}
    try:
        return cls(**values)
    except ValueError as e:  # messages open with the field's name: say the flag instead
        first, _, rest = str(e).partition(" ")
        field_name = first.rstrip(":")
        if field_name in names:
            first = flag_name(field_name) + first[len(field_name):]
        raise UserError(f"{first} {rest}") from None


def to_argv(options: Any) -> list[str]:
    """The flags that parse back to `options` (those that differ from the defaults)."""
    argv: list[str] = []
    for f in dataclasses.fields(options):
        value = getattr(options, f.name)
        if value == f.default:
            continue
        if isinstance(value, bool):
            argv.append(flag_name(f.name) if value else "--no-" + flag_name(f.name)[2:])
        else:
            argv.append(f"{flag_name(f.name)}={_format(value)}")
    return argv


def _format(value: Any) -> str:
    """A value as its flag would spell it."""
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return "none" if value is None else str(value)


def _strip_none(kind: Any) -> tuple[Any, bool]:
    """(the type without None, whether None was allowed)."""
    if typing.get_origin(kind) in (Union, types.UnionType):
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        stripped = args[0] if len(args) == 1 else Union[tuple(args)]  # noqa: UP007
        return stripped, len(args) < len(typing.get_args(kind))
    return kind, False


def _parser_for(kind: Any) -> tuple[Callable[[str], Any], tuple[Any, ...]]:
    """(a function parsing one flag value, the allowed choices or ())."""
    origin = typing.get_origin(kind)
    if origin is Literal:
        choices = typing.get_args(kind)
        return type(choices[0]), choices
    if origin is tuple:
        return _comma_list(typing.get_args(kind)[0]), ()
    if origin in (Union, types.UnionType):
        if str in typing.get_args(kind):  # e.g. a prompt given as text or as token ids
            return str, ()
        raise TypeError(f"no CLI parser for {kind}")
    if kind in (int, float, str):
        return typing.cast(Callable[[str], Any], kind), ()
    raise TypeError(f"no CLI parser for {kind}")


def _comma_list(item: Callable[[str], Any]) -> Callable[[str], tuple[Any, ...]]:
    def parse(text: str) -> tuple[Any, ...]:
        return tuple(item(part) for part in text.split(",") if part.strip())

    parse.__name__ = f"comma-separated {getattr(item, '__name__', 'value')} list"
    return parse


def _or_none(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse_or_none(text: str) -> Any:
        return None if text.lower() == "none" else parse(text)

    parse_or_none.__name__ = getattr(parse, "__name__", "value")
    return parse_or_none


def _metavar(kind: Any, choices: tuple[Any, ...]) -> str | None:
    if choices:
        return "{" + ",".join(map(str, choices)) + "}"
    if typing.get_origin(kind) is tuple:
        return "X,Y,..."
    return None

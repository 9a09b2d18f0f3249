"""faster-whisper's transcribe() arguments → tensorplan's TranscribeOptions, and the
arguments tensorplan cannot honour, refused by name (never silently ignored).

`REFUSED` is the documented list (docs/compat.md): each entry is an argument, the values
that are accepted, and why others are refused.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from tensorplan.errors import UserError
from tensorplan.whisper.api import to_language_code
from tensorplan.whisper.audio.vad import VadOptions
from tensorplan.whisper.options import TranscribeOptions

log = logging.getLogger("tensorplan.compat.faster_whisper")
CHUNK_SECONDS = 30  # one model window: the only chunk_length tensorplan runs


class Unsupported(ValueError):
    """An argument (or value) faster-whisper takes that tensorplan cannot honour."""

    def __init__(self, name: str, value: Any, why: str) -> None:
        super().__init__(f"{name}={value!r} is not supported by tensorplan's faster-whisper "
                         f"API: {why}")
        self.name = name


# argument: (accepted value?, why other values are refused)
REFUSED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "repetition_penalty": (lambda v: v == 1, "tensorplan's decoder has no repetition "
                           "penalty (1 is accepted)"),
    "no_repeat_ngram_size": (lambda v: v == 0, "tensorplan's decoder has no n-gram "
                             "blocking (0 is accepted)"),
    "length_penalty": (lambda v: v == 1, "tensorplan ranks beams by the mean log "
                       "probability, which is CTranslate2's length_penalty=1; its other "
                       "penalty is openai's ((5+n)/6)^alpha, not CTranslate2's n^alpha"),
    "chunk_length": (lambda v: v in (None, CHUNK_SECONDS), "tensorplan decodes 30-second "
                     "windows only (None or 30 are accepted)"),
    "language_detection_segments": (lambda v: v == 1, "tensorplan detects the language on "
                                    "the first 30 seconds only (1 is accepted)"),
    "initial_prompt": (lambda v: v is None or isinstance(v, str), "give the prompt as "
                       "text; token ids are not accepted"),
    "device_index": (lambda v: v == 0, "one device only (0 is accepted)"),
    "files": (lambda v: v is None, "models load from a directory or an installed name"),
    "revision": (lambda v: v is None, "nothing is downloaded: models come from installed "
                 "packages or a directory"),
    "use_auth_token": (lambda v: v in (None, False), "nothing is downloaded: models come "
                       "from installed packages or a directory"),
    "split_stereo": (lambda v: v is False, "audio is decoded to mono"),
}
# The batched pipeline decodes each chunk on its own at the first temperature: these have
# no effect there (faster-whisper's own pipeline ignores them silently); a value other than
# the signature's default is refused.
BATCHED_UNUSED = ("compression_ratio_threshold", "condition_on_previous_text",
                  "prompt_reset_on_temperature", "prefix", "hallucination_silence_threshold")
# only the multilingual=True of an English-only model is accepted (faster-whisper turns it
# off with a warning); per-window language detection is not implemented
MULTILINGUAL_WHY = "per-window language detection is not implemented (False is accepted)"


def refuse(name: str, value: Any) -> None:
    """Raise Unsupported unless `value` is one tensorplan honours for `name`."""
    accepted, why = REFUSED[name]
    if not accepted(value):
        raise Unsupported(name, value, why)


def refuse_unused(args: Mapping[str, Any], defaults: Mapping[str, Any]) -> None:
    for name in BATCHED_UNUSED:
        if args[name] != defaults[name]:
            raise Unsupported(name, args[name], "the batched pipeline decodes each chunk on "
                              f"its own and does not use it (leave it at {defaults[name]!r})")


def clip_points(clip_timestamps: str | Iterable[float]) -> tuple[float, ...]:
    """"0,10.5,12" or [0, 10.5, 12] as seconds; the default "0" (all the audio) as ()."""
    if isinstance(clip_timestamps, str):
        parts = [p for p in clip_timestamps.split(",") if p.strip()]
        try:
            points = tuple(float(p) for p in parts)
        except ValueError:
            raise ValueError(f"clip_timestamps must be comma-separated seconds, got "
                             f"{clip_timestamps!r}") from None
    else:
        try:
            points = tuple(float(t) for t in clip_timestamps)
        except (TypeError, ValueError):
            raise ValueError("clip_timestamps must be seconds (a list of numbers or "
                             f"'0,10.5,12'), got {clip_timestamps!r}") from None
    return () if points in ((), (0.0,)) else points


def vad_options(vad_parameters: Mapping[str, Any] | Any | None, **changes: Any) -> VadOptions:
    """faster-whisper's vad_parameters (a dict, its VadOptions or ours) as VadOptions."""
    if vad_parameters is None:
        fields: dict[str, Any] = {}
    elif isinstance(vad_parameters, Mapping):
        fields = dict(vad_parameters)
    elif not dataclasses.is_dataclass(vad_parameters):  # "x", 0.9: never silently ignored
        raise ValueError("vad_parameters must be a dict or a VadOptions, got "
                         f"{type(vad_parameters).__name__}")
    else:  # a VadOptions of faster-whisper's or ours: the same fields
        fields = {f.name: getattr(vad_parameters, f.name)
                  for f in dataclasses.fields(VadOptions) if hasattr(vad_parameters, f.name)}
    fields.update(changes)
    try:
        return VadOptions(**fields)
    except TypeError as e:  # an unknown key
        raise ValueError(f"vad_parameters: {e}") from None
    except ValueError as e:
        raise ValueError(f"vad_parameters: {e}") from None


# tensorplan's field names in its messages → the argument names the caller used
_RENAMED = {"logprob_threshold": "log_prob_threshold", "sample_len": "max_new_tokens"}


def transcribe_options(args: Mapping[str, Any], *, clips: tuple[float, ...],
                       **extra: Any) -> TranscribeOptions:
    """TranscribeOptions for faster-whisper's arguments `args` (already refused where
    unsupported; the language is set later)."""
    temperature = args["temperature"]
    try:  # float("0.0,0.5") named no argument
        temperatures = tuple(float(t) for t in temperature) \
            if isinstance(temperature, list | tuple) else (float(temperature),)
    except (TypeError, ValueError):
        raise ValueError("temperature must be a number or a list of numbers, got "
                         f"{repr(temperature)[:40]}") from None
    beam_size = args["beam_size"]
    greedy = beam_size == 1  # CTranslate2's beam_size=1 is greedy search
    suppress = args["suppress_tokens"]
    fields: dict[str, Any] = {
        "task": args["task"],
        "beam_size": None if greedy else beam_size,
        "best_of": args["best_of"],
        "patience": None if greedy or args["patience"] == 1 else args["patience"],
        "temperature": temperatures,
        "compression_ratio_threshold": args["compression_ratio_threshold"],
        "logprob_threshold": args["log_prob_threshold"],
        "no_speech_threshold": args["no_speech_threshold"],
        "condition_on_previous_text": args["condition_on_previous_text"],
        "prompt_reset_on_temperature": args["prompt_reset_on_temperature"],
        "initial_prompt": args["initial_prompt"],
        "prefix": args["prefix"],
        "suppress_blank": args["suppress_blank"],
        "suppress_tokens": tuple(suppress) if suppress else (),
        "without_timestamps": args["without_timestamps"],
        "max_initial_timestamp": args["max_initial_timestamp"],
        "word_timestamps": args["word_timestamps"],
        "prepend_punctuations": args["prepend_punctuations"],
        "append_punctuations": args["append_punctuations"],
        "sample_len": args["max_new_tokens"],
        "clip_timestamps": clips,
        # faster-whisper (as openai-whisper) applies it only with word timestamps
        "hallucination_silence_threshold": args["hallucination_silence_threshold"]
        if args["word_timestamps"] else None,
        "hotwords": args["hotwords"],
        **extra,
    }
    try:
        return TranscribeOptions(**fields)
    except ValueError as e:
        message = str(e)
        for ours, theirs in _RENAMED.items():
            message = message.replace(ours, theirs)
        raise ValueError(message) from None


def check_common(args: Mapping[str, Any], multilingual_model: bool) -> dict[str, Any]:
    """Refuse what tensorplan cannot honour; returns `args` with faster-whisper's own
    adjustments for an English-only model (language and multilingual, with its warnings)."""
    for name in ("repetition_penalty", "no_repeat_ngram_size", "length_penalty",
                 "chunk_length", "language_detection_segments", "initial_prompt"):
        refuse(name, args[name])
    args = dict(args)
    for name in ("language", "prefix", "hotwords"):  # else an AttributeError deep inside
        if args[name] is not None and not isinstance(args[name], str):
            raise ValueError(f"{name} must be a string or None, got "
                             f"{type(args[name]).__name__} {args[name]!r}")
    if args["multilingual"]:
        if multilingual_model:
            raise Unsupported("multilingual", True, MULTILINGUAL_WHY)
        log.warning("The current model is English-only but the multilingual parameter is "
                    "set to True; setting to False instead.")
        args["multilingual"] = False
    if args["language"] is not None:  # 'EN', 'english': info.language says 'en'
        try:
            args["language"] = to_language_code(args["language"])
        except UserError as e:  # faster-whisper's ValueError for a language it lacks
            raise ValueError(str(e)) from None
    if not multilingual_model and args["language"] not in (None, "en"):
        log.warning("The current model is English-only but the language parameter is set "
                    "to '%s'; using 'en' instead.", args["language"])
        args["language"] = "en"
    return args

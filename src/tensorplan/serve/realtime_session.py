"""A Realtime transcription session's settings, read from and written as both of OpenAI's
shapes: the current `session.update` (`session.type = "transcription"`, `audio.input.*`)
and the older beta `transcription_session.update` (`input_audio_format`,
`input_audio_transcription`, `turn_detection`). docs/realtime.md lists what is honoured.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from tensorplan.errors import UserError
from tensorplan.live.options import TurnDetection
from tensorplan.whisper.api import to_language_code

# OpenAI's transcription models: a client written for them gets the served model
OPENAI_MODELS = ("whisper-1", "gpt-4o-transcribe", "gpt-4o-mini-transcribe",
                 "gpt-4o-transcribe-latest", "gpt-4o-mini-transcribe-2025-12-15",
                 "gpt-transcribe", "gpt-live-transcribe", "gpt-realtime-whisper")
PCM_RATES = (24000, 16000)  # OpenAI's, and 16 kHz as an extension (no resampling)
# (encoding, rate) of each format name, current shape then beta
FORMATS = {"audio/pcm": ("s16le", 24000), "audio/pcmu": ("mulaw", 8000),
           "audio/pcma": ("alaw", 8000)}
BETA_FORMATS = {"pcm16": ("s16le", 24000), "g711_ulaw": ("mulaw", 8000),
                "g711_alaw": ("alaw", 8000)}
# A prompt is tokenised before every decode of a live stream, and Whisper reads only its last
# 223 tokens (about 1,000 characters of English): a longer one costs work and echoes in
# every session.updated, and a 3.5 MB prompt made one turn's decodes 4x slower
MAX_PROMPT_CHARS = 8192
LOGPROBS = "item.input_audio_transcription.logprobs"  # the one item `include` knows
SHOWN_CHARS = 40  # of a client's value quoted back in an error


class SessionError(ValueError):
    """A bad field of a session update: answered with an `error` event naming `param`."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class RealtimeSession:
    id: str
    shape: str  # "current" or "beta": how events name the session
    model: str
    encoding: str = "s16le"
    rate: int = 24000
    language: str | None = None
    prompt: str | None = None
    turn_detection: TurnDetection | None = field(default_factory=TurnDetection)
    logprobs: bool = False  # `include` holds LOGPROBS: deltas and transcripts carry them

    # --- reading an update

    def updated(self, event: dict[str, Any], models: tuple[str, ...],
                multilingual: bool) -> RealtimeSession:
        """This session with the update event's fields applied (SessionError if bad)."""
        session = event.get("session")
        if not isinstance(session, dict):
            raise SessionError("'session' must be an object", "session")
        if event["type"] == "transcription_session.update":
            new = self._beta(session)
        else:
            new = self._current(session)
        if "include" in session:
            new = dataclasses.replace(new, logprobs=_include(session["include"]))
        if new.model not in models and new.model not in OPENAI_MODELS:
            raise SessionError(f"the model {_shown(new.model)} is not served here; use "
                               f"{models[0]!r}", _param(new.shape, "model"))
        if new.language not in (None, "en") and not multilingual:
            raise SessionError(f"{models[0]} is English-only: the language must be 'en'",
                               _param(new.shape, "language"))
        return new

    def _current(self, s: dict[str, Any]) -> RealtimeSession:
        kind = s.get("type", "transcription")
        if kind != "transcription":
            raise SessionError(f"session.type {_shown(kind)} is not served here: only "
                               "'transcription' sessions", "session.type")
        new = dataclasses.replace(self, shape="current")
        audio = _object(s, "audio", "session.audio")
        inp = _object(audio, "input", "session.audio.input")
        if "format" in inp:
            new = new._format_current(inp["format"])
        if "transcription" in inp:
            new = new._transcription(inp["transcription"], "session.audio.input.transcription")
        if "turn_detection" in inp:
            td = _turn_detection(inp["turn_detection"], "session.audio.input.turn_detection")
            new = dataclasses.replace(new, turn_detection=td)
        return new

    def _beta(self, s: dict[str, Any]) -> RealtimeSession:
        new = dataclasses.replace(self, shape="beta")
        if "input_audio_format" in s:
            name = s["input_audio_format"]
            if not isinstance(name, str) or name not in BETA_FORMATS:
                raise SessionError(f"input_audio_format {_shown(name)}: one of "
                                   f"{', '.join(BETA_FORMATS)}", "session.input_audio_format")
            encoding, rate = BETA_FORMATS[name]
            new = dataclasses.replace(new, encoding=encoding, rate=rate)
        if "input_audio_transcription" in s:
            new = new._transcription(s["input_audio_transcription"],
                                     "session.input_audio_transcription")
        if "turn_detection" in s:
            td = _turn_detection(s["turn_detection"], "session.turn_detection")
            new = dataclasses.replace(new, turn_detection=td)
        return new

    def _format_current(self, fmt: Any) -> RealtimeSession:
        param = "session.audio.input.format"
        if not isinstance(fmt, dict) or not isinstance(fmt.get("type"), str) \
                or fmt["type"] not in FORMATS:
            raise SessionError(f"{param}.type must be one of {', '.join(FORMATS)}",
                               f"{param}.type")
        encoding, rate = FORMATS[fmt["type"]]
        if encoding == "s16le":
            rate = fmt.get("rate", 24000)
            if type(rate) is not int or rate not in PCM_RATES:  # not 24000.0, not True
                raise SessionError(f"{param}.rate must be 24000 (or 16000, tensorplan's "
                                   f"extension), got {_shown(rate)}", f"{param}.rate")
        return dataclasses.replace(self, encoding=encoding, rate=rate)

    def _transcription(self, t: Any, param: str) -> RealtimeSession:
        if t is None:
            return self
        if not isinstance(t, dict):
            raise SessionError(f"{param} must be an object or null", param)
        values: dict[str, str | None] = {}
        for name in ("model", "language", "prompt"):
            value = t.get(name, getattr(self, name))
            if value is not None and not isinstance(value, str):
                raise SessionError(f"{param}.{name} must be a string", f"{param}.{name}")
            if value and not _utf8(value):  # JSON's \ud800 escape: no text to tokenise
                raise SessionError(f"{param}.{name} holds an unpaired surrogate (\\ud800-"
                                   "\\udfff): not text", f"{param}.{name}")
            values[name] = value or None
        if values["language"]:  # as the HTTP API takes it: 'en', 'English', 'EN'
            try:
                values["language"] = to_language_code(values["language"])
            except UserError:
                raise SessionError(f"{param}.language {_shown(values['language'])} is not a "
                                   "language Whisper knows: a code like 'en' or a name like "
                                   "'english'", f"{param}.language") from None
        if values["prompt"] and len(values["prompt"]) > MAX_PROMPT_CHARS:
            raise SessionError(f"{param}.prompt is {len(values['prompt'])} characters: at most "
                               f"{MAX_PROMPT_CHARS} (Whisper reads only its last 223 tokens)",
                               f"{param}.prompt")
        return dataclasses.replace(self, model=values["model"] or self.model,
                                   language=values["language"], prompt=values["prompt"])

    # --- writing it

    def created_event(self) -> str:
        return "session.created" if self.shape == "current" else "transcription_session.created"

    def updated_event(self) -> str:
        return "session.updated" if self.shape == "current" else "transcription_session.updated"

    def render(self) -> dict[str, Any]:
        transcription = {"model": self.model, "language": self.language,
                         "prompt": self.prompt}
        td = None if self.turn_detection is None else {
            "type": "server_vad", **dataclasses.asdict(self.turn_detection)}
        name = next(n for n, v in FORMATS.items() if v[0] == self.encoding)
        include = [LOGPROBS] if self.logprobs else None
        fmt_obj: dict[str, Any] = {"type": name}
        if self.encoding == "s16le":
            fmt_obj["rate"] = self.rate
        if self.shape == "beta":
            # 16 kHz PCM (set through the current shape) has no beta name: the current
            # shape's format object says what is decoded, where "pcm16" would say 24 kHz
            fmt: str | dict[str, Any] = next(
                (n for n, v in BETA_FORMATS.items() if v == (self.encoding, self.rate)),
                fmt_obj)
            return {"id": self.id, "object": "realtime.transcription_session",
                    "input_audio_format": fmt, "input_audio_transcription": transcription,
                    "turn_detection": td, "input_audio_noise_reduction": None,
                    "include": include, "modalities": ["text"]}
        return {"type": "transcription", "id": self.id,
                "object": "realtime.transcription_session",
                "audio": {"input": {"format": fmt_obj, "transcription": transcription,
                                    "turn_detection": td, "noise_reduction": None}},
                "include": include}


def _include(value: Any) -> bool:
    """Whether `session.include` (a list of item names, or null) asks for logprobs."""
    if value is None:
        return False
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SessionError("session.include must be a list of strings or null",
                           "session.include")
    unknown = [v for v in value if v != LOGPROBS]
    if unknown:
        raise SessionError(f"session.include: {_shown(unknown[0])} is not an item this "
                           f"server includes; the one known is {LOGPROBS!r}",
                           "session.include")
    return bool(value)


def _shown(value: Any) -> str:
    """A client's value as an error quotes it: repr, cut short (a frame holds megabytes)."""
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS - 3] + "..."


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _param(shape: str, name: str) -> str:
    return (f"session.audio.input.transcription.{name}" if shape == "current"
            else f"session.input_audio_transcription.{name}")


def _object(parent: dict[str, Any], key: str, param: str) -> dict[str, Any]:
    value = parent.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SessionError(f"{param} must be an object", param)
    return value


def _turn_detection(td: Any, param: str) -> TurnDetection | None:
    if td is None:
        return None
    if not isinstance(td, dict):
        raise SessionError(f"{param} must be an object or null", param)
    kind = td.get("type", "server_vad")
    if kind != "server_vad":
        raise SessionError(f"{param}.type {_shown(kind)} is not supported: 'server_vad' "
                           f"(or {param} null, for commits by the client)", f"{param}.type")
    values: dict[str, Any] = {}
    for name, kind_ in (("threshold", (int, float)), ("prefix_padding_ms", int),
                        ("silence_duration_ms", int)):
        value = td.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, kind_):
            what = "a number" if name == "threshold" else \
                "an integer number of milliseconds (no decimal point)"
            raise SessionError(f"{param}.{name} must be {what}, got {_shown(value)}",
                               f"{param}.{name}")
        values[name] = value
    try:
        return TurnDetection(**values)
    except ValueError as e:  # the message starts with the field's name
        field_name = str(e).split(" ", 1)[0]
        raise SessionError(f"{param}.{e}", f"{param}.{field_name}") from None

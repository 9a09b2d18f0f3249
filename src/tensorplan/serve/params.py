"""OpenAI's transcription form fields, plus tensorplan's decoding fields, → one request.

OpenAI's fields keep OpenAI's meaning: `prompt` is the initial prompt, `temperature=0` lets
the decoder fall back to higher temperatures (OpenAI: "the model will use log probability to
automatically increase the temperature"), another value decodes at that temperature only, and
`timestamp_granularities[]=word` turns word timestamps on (verbose_json only, as OpenAI).
Every TranscribeOptions field is accepted as an extra form field of the same name, parsed as
`tensorplan transcribe` parses its flag, so the two can never disagree.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from dataclasses import dataclass
from typing import NoReturn

from tensorplan.errors import UserError
from tensorplan.serve.errors import ApiError, bad_request
from tensorplan.serve.uploads import Form
from tensorplan.whisper.api import to_language_code
from tensorplan.whisper.flags import add_arguments, from_args
from tensorplan.whisper.options import TranscribeOptions
from tensorplan.whisper.writers import parse_formats

RESPONSE_FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
GRANULARITIES = ("word", "segment")
# OpenAI fields read here, and those accepted but meaningless for Whisper
OPENAI_FIELDS = {"model", "language", "prompt", "response_format", "temperature", "stream",
                 "timestamp_granularities[]", "timestamp_granularities"}
IGNORED_FIELDS = {"include[]", "include", "chunking_strategy"}
SERVER_FIELDS = {"stream_outputs"}  # tensorplan's: rendered files in the final stream event
# options an endpoint or an OpenAI field sets
NOT_EXTRA = {"task", "language", "temperature"}
EXTRA_FIELDS = tuple(f.name for f in dataclasses.fields(TranscribeOptions)
                     if f.name not in NOT_EXTRA)
TRUE, FALSE = {"true", "1", "yes", "on"}, {"false", "0", "no", "off"}
_FLAG = re.compile(r"(?:argument )?--([a-z][a-z-]*)")  # a flag in an options error


@dataclass(frozen=True, slots=True)
class TranscriptionRequest:
    options: TranscribeOptions
    response_format: str
    granularities: frozenset[str]
    stream: bool
    stream_outputs: tuple[str, ...]  # formats the final stream event carries (the web page)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UserError(message)


MAX_API_TEMPERATURE = 1.0


class RequestParser:
    """Reads forms against the server's default options and the names its model answers to."""

    def __init__(self, defaults: TranscribeOptions, model_names: tuple[str, ...]) -> None:
        self.defaults = defaults
        self.model_names = model_names
        self.multilingual = True  # the model's, once it is loaded: English-only refuses others
        self._flags = _Parser(add_help=False, exit_on_error=False)
        add_arguments(self._flags, TranscribeOptions)
        self._flags.set_defaults(**{f.name: getattr(defaults, f.name)
                                    for f in dataclasses.fields(TranscribeOptions)})

    def parse(self, form: Form, task: str) -> TranscriptionRequest:
        self._check_model(form.get("model"))
        unknown = set(form.fields) - OPENAI_FIELDS - IGNORED_FIELDS - SERVER_FIELDS \
            - set(EXTRA_FIELDS)
        if unknown:
            name = sorted(unknown)[0]
            raise bad_request(f"unrecognized form field {name!r}", param=name,
                              code="unknown_parameter")
        response_format = form.get("response_format") or "json"
        if response_format not in RESPONSE_FORMATS:
            raise bad_request(f"response_format must be one of {', '.join(RESPONSE_FORMATS)}, "
                              f"not {response_format!r}", param="response_format")
        granularities = frozenset(form.getall("timestamp_granularities[]")
                                  + form.getall("timestamp_granularities"))
        if not granularities <= set(GRANULARITIES):
            raise bad_request("timestamp_granularities must be 'word' and/or 'segment'",
                              param="timestamp_granularities[]")
        if granularities and response_format != "verbose_json":
            raise bad_request("timestamp_granularities needs response_format=verbose_json",
                              param="timestamp_granularities[]")
        options = self._options(form, task, words="word" in granularities)
        stream = _flag(form.get("stream") or "false", "stream")
        try:
            wanted = form.get("stream_outputs")
            outputs = parse_formats(wanted) if wanted else ()
        except UserError as e:
            raise bad_request(str(e), param="stream_outputs") from None
        return TranscriptionRequest(options, response_format, granularities, stream, outputs)

    def _check_model(self, model: str | None) -> None:
        if model is not None and model not in self.model_names:
            raise ApiError(404, f"the model {model!r} does not exist; this server has "
                           f"{', '.join(map(repr, self.model_names))}", param="model",
                           code="model_not_found")

    def _options(self, form: Form, task: str, words: bool) -> TranscribeOptions:
        argv = [f"--task={task}"]
        for name in EXTRA_FIELDS:
            value = form.get(name)
            if value is None:
                continue
            if isinstance(getattr(self.defaults, name), bool):
                argv.append(f"--{'' if _flag(value, name) else 'no-'}{name.replace('_', '-')}")
            else:
                argv.append(f"--{name.replace('_', '-')}={value}")
        if words:
            argv.append("--word-timestamps")
        if form.get("language"):
            argv.append(f"--language={form.get('language')}")
        prompt = form.get("prompt")
        if prompt and form.get("initial_prompt") is None:
            argv.append(f"--initial-prompt={prompt}")
        temperature = form.get("temperature")
        if temperature is not None and temperature.strip() not in ("", "0", "0.0"):
            argv.append(f"--temperature={temperature}")  # one value, or tensorplan's list
        try:
            options = from_args(TranscribeOptions, self._flags.parse_args(argv))
        except (UserError, argparse.ArgumentError) as e:
            raise _field_error(str(e), form) from None
        if options.language is not None:
            try:
                code = to_language_code(options.language)
            except UserError as e:
                raise bad_request(f"language: {e}", param="language") from None
            if code != "en" and not self.multilingual:  # before it waits in the queue
                raise bad_request(f"language: this model is English-only; it cannot "
                                  f"transcribe {options.language!r}", param="language")
        # OpenAI's range, "between 0 and 1": past it sampling is near uniform, and a window
        # that samples best_of tokens to the length limit at each of them took 53 s for 11 s
        if temperature is not None and max(options.temperature) > MAX_API_TEMPERATURE:
            raise bad_request(f"temperature must be between 0 and {MAX_API_TEMPERATURE:g}, "
                              f"got {form.get('temperature')}", param="temperature")
        return options


def _field_error(message: str, form: Form) -> ApiError:
    """The options' error, which names a flag (--beam-size), as the form field it came
    from (beam_size), in the message and as the error's param."""
    found = _FLAG.search(message)
    if found is None:
        return bad_request(message)
    name = found.group(1).replace("-", "_")
    if name == "initial_prompt" and form.get("initial_prompt") is None:
        name = "prompt"
    return bad_request(message[:found.start()] + name + message[found.end():], param=name)


def _flag(value: str, name: str) -> bool:
    text = value.strip().lower()
    if text in TRUE or text in FALSE:
        return text in TRUE
    raise bad_request(f"{name} must be true or false, not {value!r}", param=name)

"""Options as the one source of CLI flags: generation, parsing, round trips, validation."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from tensorplan.errors import UserError
from tensorplan.whisper.flags import add_arguments, from_args, to_argv
from tensorplan.whisper.options import (
    DecodingOptions,
    SearchOptions,
    TranscribeOptions,
    clip_spans,
)


def parser_for(cls: type[SearchOptions]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(parser, cls)
    return parser


def parse(argv: list[str], cls: type[SearchOptions] = TranscribeOptions) -> SearchOptions:
    return from_args(cls, parser_for(cls).parse_args(argv))


def test_every_field_has_help_and_a_kebab_case_flag() -> None:
    parser = parser_for(TranscribeOptions)
    flags = {s for a in parser._actions for s in a.option_strings}
    for f in dataclasses.fields(TranscribeOptions):
        assert f.metadata["help"]
        assert "--" + f.name.replace("_", "-") in flags
    # openai-whisper's names, kebab-cased; booleans can be switched off
    assert {"--beam-size", "--best-of", "--no-speech-threshold", "--logprob-threshold",
            "--condition-on-previous-text", "--no-condition-on-previous-text",
            "--initial-prompt", "--clip-timestamps", "--word-timestamps"} <= flags


def test_defaults_parse_to_the_default_options() -> None:
    assert parse([]) == TranscribeOptions()
    assert parse([], DecodingOptions) == DecodingOptions()


def test_flags_parse_to_typed_values() -> None:
    got = parse(["--beam-size", "none", "--best-of", "3", "--temperature", "0,0.5",
                 "--suppress-tokens=-1,7", "--task", "translate", "--language", "de",
                 "--no-condition-on-previous-text", "--logprob-threshold", "-2",
                 "--clip-timestamps", "1.5,3", "--no-speech-threshold", "None"])
    assert got == TranscribeOptions(beam_size=None, best_of=3, temperature=(0.0, 0.5),
                                    suppress_tokens=(-1, 7), task="translate", language="de",
                                    condition_on_previous_text=False, logprob_threshold=-2.0,
                                    clip_timestamps=(1.5, 3.0), no_speech_threshold=None)


def test_bad_values_are_rejected() -> None:
    with pytest.raises(argparse.ArgumentError):
        parse(["--task", "summarize"])
    with pytest.raises(argparse.ArgumentError):
        parse(["--beam-size", "five"])
    with pytest.raises(UserError, match="patience"):  # one line from the CLI, exit code 2
        parse(["--beam-size", "none", "--patience", "2"])


@pytest.mark.parametrize("options", [
    TranscribeOptions(),
    TranscribeOptions(beam_size=None, temperature=(0.0,), suppress_tokens=(),
                      condition_on_previous_text=False, initial_prompt="Hello, world.",
                      clip_timestamps=(0.0, 12.5), no_speech_threshold=None),
    TranscribeOptions(language="en", patience=2.0, length_penalty=0.5, suppress_blank=False,
                      word_timestamps=True, hallucination_silence_threshold=2.0,
                      prepend_punctuations="", logprob_threshold=-0.5),
])
def test_options_round_trip_through_the_command_line(options: TranscribeOptions) -> None:
    assert parse(to_argv(options)) == options


def test_validation() -> None:
    with pytest.raises(ValueError):
        TranscribeOptions(temperature=())
    with pytest.raises(ValueError):
        TranscribeOptions(hallucination_silence_threshold=1.0)  # needs word timestamps
    with pytest.raises(ValueError):
        DecodingOptions(length_penalty=2.0)
    with pytest.raises(ValueError):
        DecodingOptions(temperature=-1.0)


def test_decoding_options_for_one_window() -> None:
    options = TranscribeOptions(language="en", beam_size=3, hotwords="tensor")
    got = options.decoding(0.4, [1, 2], prefix=None)
    assert got == DecodingOptions(language="en", beam_size=3, hotwords="tensor",
                                  temperature=0.4, prompt=(1, 2))
    assert options.decoding(0.0, [], prefix="So").prompt is None


def test_clip_spans_in_frames_and_seconds() -> None:
    """The one reading of clip_timestamps that the seek loop (frames) and backend auto's
    duration (seconds) share: none is everything, a lone last start runs to the end, ends
    stop at the end."""
    assert clip_spans([], 1100) == [(0, 1100)]
    assert clip_spans([100, 300, 900], 1100) == [(100, 300), (900, 1100)]
    assert clip_spans([100, 5000], 1100) == [(100, 1100)]
    assert clip_spans([1.5, 2.5, 7.0], 11.0) == [(1.5, 2.5), (7.0, 11.0)]

"""The Python API's habits for code written against openai-whisper: load_model's real
signature in help(), and every argument openai's transcribe() takes either accepted in
openai's forms or refused with a line that names it."""

from __future__ import annotations

import dataclasses
import inspect
import pydoc

import pytest
from whisper_helpers import JFK, JFK_TEXT, normalize

import tensorplan.whisper
from tensorplan.whisper import openai_args
from tensorplan.whisper.options import TranscribeOptions
from tensorplan.whisper.planned.load_options import ModelOptions


def test_load_model_shows_its_own_signature_and_docstring() -> None:
    signature = inspect.signature(tensorplan.whisper.load_model)
    kinds = {p.kind for p in signature.parameters.values()}
    assert inspect.Parameter.VAR_KEYWORD not in kinds
    assert inspect.Parameter.VAR_POSITIONAL not in kinds
    # every model option is a keyword, with the dataclass's own default
    fields = {f.name: f.default for f in dataclasses.fields(ModelOptions) if f.name != "model"}
    keywords = {name: p.default for name, p in signature.parameters.items()
                if p.kind is inspect.Parameter.KEYWORD_ONLY and name != "options"}
    assert keywords == fields
    assert signature.parameters["name_or_path"].default == ModelOptions().model
    text = pydoc.render_doc(tensorplan.whisper.load_model)
    assert "compute_type" in text and "Load a Whisper model" in text


def test_keywords_beside_options_replace_its_fields(monkeypatch) -> None:
    from tensorplan.whisper import api

    seen: list[ModelOptions] = []
    monkeypatch.setattr(api, "load", lambda opts: seen.append(opts))
    api.load_model("tiny.en", options=ModelOptions(plan="output", threads=3),
                   compute_type="int8")
    assert (seen[0].plan, seen[0].threads, seen[0].compute_type) == ("output", 3, "int8")


def test_every_openai_transcribe_argument_is_taken_or_refused_by_name() -> None:
    fields = TranscribeOptions.__dataclass_fields__
    for name in (*openai_args.TRANSCRIBE_ARGS, *openai_args.DECODE_ARGS):
        assert (name in fields or name in openai_args.HANDLED_HERE
                or name in openai_args.REFUSED), name
    for name in openai_args.REFUSED:
        with pytest.raises(TypeError, match=f"transcribe\\(\\): {name}: "):
            openai_args.split({name: None}, fields)
    with pytest.raises(TypeError, match="'vebrose'"):
        openai_args.split({"vebrose": True}, fields)


@pytest.mark.parametrize(("name", "given", "held"), [
    ("temperature", 0.0, (0.0,)),
    ("temperature", 0, (0,)),
    ("temperature", [0.0, 0.5], (0.0, 0.5)),
    ("temperature", (0.0, 0.2), (0.0, 0.2)),
    ("clip_timestamps", "0", (0.0,)),
    ("clip_timestamps", "1.5,3", (1.5, 3.0)),
    ("clip_timestamps", [1, 2], (1, 2)),
    ("suppress_tokens", "-1", (-1,)),
    ("suppress_tokens", "-1,50257", (-1, 50257)),
    ("suppress_tokens", [], ()),
])
def test_openai_forms_become_the_options_fields(name, given, held) -> None:
    changes, _ = openai_args.split({name: given}, TranscribeOptions.__dataclass_fields__)
    assert changes == {name: held}
    TranscribeOptions(**changes)  # and the options take them


def test_a_bad_openai_form_is_a_line_naming_the_argument() -> None:
    with pytest.raises(ValueError, match="clip_timestamps must be comma-separated numbers"):
        openai_args.split({"clip_timestamps": "1,x"}, TranscribeOptions.__dataclass_fields__)


def test_openai_style_call_transcribes_jfk(tiny_model_factory, capsys) -> None:
    model = tiny_model_factory(backend="numpy")
    with pytest.warns(UserWarning, match="FP16 is not supported on CPU"):
        result = model.transcribe(str(JFK), temperature=0.0, beam_size=None,
                                  verbose=True, fp16=True, suppress_tokens="-1",
                                  clip_timestamps="0", condition_on_previous_text=True)
    assert normalize(result["text"]) == normalize(JFK_TEXT)
    assert all(s.temperature == 0.0 for s in result.segments)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("[00:00.000 --> ") and len(lines) == len(result.segments)


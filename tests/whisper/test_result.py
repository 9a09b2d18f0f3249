"""A TranscriptionResult reads as openai-whisper's transcribe() dict and keeps its attributes."""

from __future__ import annotations

import json
import pickle
from collections.abc import Mapping

import pytest

from tensorplan.whisper.result import RESULT_KEYS, Segment, TranscriptionResult, Word

WORDS = (Word(" Hello", 0.0, 0.4, 0.9), Word(" world.", 0.4, 1.0, 0.8))
SEGMENT = Segment(0, 0, 0.0, 1.0, " Hello world.", (50364, 400, 50414), 0.0, -0.2, 1.1, 0.01,
                  WORDS)
RESULT = TranscriptionResult(" Hello world.", (SEGMENT,), "en", {"en": 0.99})


def test_keys_give_openais_values() -> None:
    assert RESULT["text"] == " Hello world." and RESULT["language"] == "en"
    segments = RESULT["segments"]
    assert isinstance(segments, list) and isinstance(segments[0], dict)
    assert segments[0]["start"] == 0.0 and segments[0]["tokens"] == [50364, 400, 50414]
    assert segments[0]["words"][1] == {"word": " world.", "start": 0.4, "end": 1.0,
                                       "probability": 0.8}


def test_it_is_a_mapping_of_openais_keys() -> None:
    assert isinstance(RESULT, Mapping)
    assert list(RESULT) == list(RESULT_KEYS) == ["text", "segments", "language"]
    assert dict(RESULT) == RESULT.to_dict() and len(RESULT) == 3
    assert "segments" in RESULT and "language_probs" not in RESULT
    assert RESULT.get("nope") is None
    with pytest.raises(KeyError):
        RESULT["language_probs"]
    assert json.loads(json.dumps(dict(RESULT))) == RESULT.to_dict()


def test_attributes_and_values_stay() -> None:
    assert RESULT.segments[0] is SEGMENT and RESULT.segments[0].words == WORDS
    assert RESULT.language_probs == {"en": 0.99}
    assert TranscriptionResult.from_dict(RESULT) == TranscriptionResult.from_dict(dict(RESULT))
    assert pickle.loads(pickle.dumps(RESULT)) == RESULT
    assert RESULT != dict(RESULT)  # a dataclass's equality, not a dict's

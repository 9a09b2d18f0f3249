"""What a transcription produces: words, segments and the whole result, as frozen values.

`to_dict()` gives openai-whisper's `transcribe()` dictionary, the shape its JSON writer dumps;
`from_dict()` reads that shape back. A TranscriptionResult also reads as that dictionary
(`result["text"]`, `result["segments"][0]["start"]`), so code written for openai's runs on it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

RESULT_KEYS = ("text", "segments", "language")  # openai's transcribe() dict, in its order
# word timestamps merge these into the next and the previous word (the options' defaults)
PREPEND_PUNCTUATIONS = "\"'“¿([{-"
APPEND_PUNCTUATIONS = "\"'.。,，!！?？:：”)]}、"
PUNCTUATION = PREPEND_PUNCTUATIONS + APPEND_PUNCTUATIONS  # words the anomaly score ignores
# openai-whisper's word anomaly score (hallucination_silence_threshold): a word less likely
# than this, shorter or longer than these, is unlike real speech
IMPROBABLE_WORD = 0.15
SHORT_WORD_S = 0.133
LONG_WORD_S = 2.0
SCORED_WORDS = 8  # the anomaly checks score a segment's first words only


@dataclass(frozen=True, slots=True)
class Word:
    word: str  # as decoded, with its leading space
    start: float  # seconds
    end: float
    probability: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "word": self.word,
            "start": self.start,
            "end": self.end,
            "probability": self.probability,
        }

    def anomaly_score(self) -> float:
        """How unlike real speech the word is: improbable, very short or very long."""
        duration = self.end - self.start
        score = 0.0
        if self.probability < IMPROBABLE_WORD:
            score += 1.0
        if duration < SHORT_WORD_S:
            score += (SHORT_WORD_S - duration) * 15
        if duration > LONG_WORD_S:
            score += duration - LONG_WORD_S
        return score

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Word:
        return cls(d["word"], d["start"], d["end"], d["probability"])


def scored_words(words: Iterable[Word]) -> list[Word]:
    """The words an anomaly check scores: the first SCORED_WORDS, punctuation aside."""
    return [w for w in words if w.word not in PUNCTUATION][:SCORED_WORDS]


@dataclass(frozen=True, slots=True)
class Segment:
    id: int
    seek: int  # mel frame offset of the 30 s window this segment was decoded from
    start: float  # seconds
    end: float
    text: str
    tokens: tuple[int, ...]  # text and timestamp tokens, no SOT sequence
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    words: tuple[Word, ...] | None = None  # only with word timestamps

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "id": self.id,
            "seek": self.seek,
            "start": self.start,
            "end": self.end,
            "text": self.text,
            "tokens": list(self.tokens),
            "temperature": self.temperature,
            "avg_logprob": self.avg_logprob,
            "compression_ratio": self.compression_ratio,
            "no_speech_prob": self.no_speech_prob,
        }
        if self.words is not None:
            d["words"] = [w.to_dict() for w in self.words]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Segment:
        words = d.get("words")
        return cls(
            id=d["id"],
            seek=d["seek"],
            start=d["start"],
            end=d["end"],
            text=d["text"],
            tokens=tuple(d["tokens"]),
            temperature=d["temperature"],
            avg_logprob=d["avg_logprob"],
            compression_ratio=d["compression_ratio"],
            no_speech_prob=d["no_speech_prob"],
            words=None if words is None else tuple(Word.from_dict(w) for w in words),
        )


@dataclass(frozen=True, slots=True)
class TranscriptionResult(Mapping[str, Any]):
    """The whole transcript. Attributes hold frozen values (`result.segments` is a tuple of
    Segment); keys give openai's plain values (`result["segments"]` is a list of dicts,
    built anew on each lookup, so bind it once in a loop)."""

    text: str
    segments: tuple[Segment, ...]
    language: str
    language_probs: dict[str, float] | None = None  # from language detection; not in to_dict

    @property
    def has_words(self) -> bool:
        """Whether word timestamps were computed (openai checks the first segment)."""
        return bool(self.segments) and self.segments[0].words is not None

    def __getitem__(self, key: str) -> Any:
        if key == "segments":
            return [s.to_dict() for s in self.segments]
        if key in RESULT_KEYS:
            return getattr(self, key)
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(RESULT_KEYS)

    def __len__(self) -> int:
        return len(RESULT_KEYS)

    def to_dict(self) -> dict[str, Any]:
        return {key: self[key] for key in RESULT_KEYS}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TranscriptionResult:
        segments = tuple(Segment.from_dict(s) for s in d["segments"])
        return cls(text=d["text"], segments=segments, language=d["language"])

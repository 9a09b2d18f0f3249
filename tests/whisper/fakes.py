"""A scripted Whisper model and a word-level tokenizer, so decoding and the seek loop are
tested without weights.

FakeTokenizer lays out its vocabulary like Whisper's (text, eot, sot, languages, task tokens,
specials, 1501 timestamps) but every text token is a whole word. FakeModel answers each
`logits` request by calling `respond(Query)`; `script()` and `table()` build responders.
FakeInference checks the KV-cache contract: every call must extend the cached rows (after
any rearrangement) and ask only for positions not cached yet.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tensorplan.whisper.model_files.ct2_weights import ModelDims, WhisperConfig

WORDS = [" ", " hello", " world", " foo", " bar", " baz", " the", " end", " ♪", " [",
         *(f" w{i}" for i in range(40))]
FILLER = [f" w{i}" for i in range(40)]  # where a scripted token's leftover probability goes
BASE_LOGIT = -30.0  # every token not mentioned by a responder


class FakeTokenizer:
    def __init__(self, multilingual: bool = False):
        self.is_multilingual = multilingual
        self.words = list(WORDS)
        self.eot = len(self.words)
        self.sot = self.eot + 1
        self.language_tokens = {code: self.sot + 1 + i for i, code in enumerate(("en", "de", "fr"))}
        special = self.sot + 1 + len(self.language_tokens)
        (self.translate, self.transcribe, self.sot_lm, self.sot_prev, self.no_speech,
         self.no_timestamps) = range(special, special + 6)
        self.timestamp_begin = special + 6
        self.n_vocab = self.timestamp_begin + 1501
        self.non_speech_tokens = (self.words.index(" ♪"), self.words.index(" ["))

    def id(self, word: str) -> int:
        return self.words.index(word)

    def ts(self, seconds: float) -> int:
        return self.timestamp_begin + round(seconds / 0.02)

    def encode(self, text: str) -> list[int]:
        pieces = [" " + w for w in text.split(" ") if w] if text.strip() else [" "]
        return [self.words.index(p) for p in pieces]

    def decode(self, tokens: Sequence[int]) -> str:
        return "".join(self.words[t] for t in tokens if t < self.eot)

    def language_token(self, language: str) -> int:
        return self.language_tokens[language]

    def sot_sequence(self, language: str | None = None, task: str = "transcribe"
                     ) -> tuple[int, ...]:
        if not self.is_multilingual:
            return (self.sot,)
        assert language is not None
        task_token = self.transcribe if task == "transcribe" else self.translate
        return (self.sot, self.language_tokens[language], task_token)


@dataclass(frozen=True)
class Query:
    """One logits row the decoder asked for."""

    window: int  # how many windows were encoded before, i.e. the index of this one
    session: int  # index of the inference session within this window (one per decode)
    tokens: tuple[int, ...]  # the sequence up to and including the position asked about
    content: tuple[int, ...] | None  # tokens after the sot sequence (None: at or before it)


Respond = Callable[[Query], np.ndarray]


@dataclass
class FakeModel:
    tokenizer: Any  # a FakeTokenizer, typed loosely to stand in for the real Tokenizer
    respond: Respond
    config: WhisperConfig = field(default_factory=lambda: WhisperConfig((), (), (), ()))
    encoded: list[np.ndarray] = field(default_factory=list)  # every window encoded
    sessions: list[FakeInference] = field(default_factory=list)  # every inference session

    def __post_init__(self) -> None:
        self.is_multilingual = self.tokenizer.is_multilingual
        self.dims = ModelDims(n_mels=80, n_audio_ctx=1500, n_audio_state=8, n_audio_head=1,
                              n_audio_layer=1, n_vocab=self.tokenizer.n_vocab, n_text_ctx=448,
                              n_text_state=8, n_text_head=1, n_text_layer=1)

    def encode(self, mel: np.ndarray) -> None:
        assert mel.shape == (80, 3000) and mel.dtype == np.float32
        self.encoded.append(mel.copy())

    def inference(self, n_batch: int) -> FakeInference:
        session = sum(s.window == len(self.encoded) - 1 for s in self.sessions)
        inference = FakeInference(self, n_batch, len(self.encoded) - 1, session)
        self.sessions.append(inference)
        return inference

    def windows_sessions(self, window: int) -> list[FakeInference]:
        return [s for s in self.sessions if s.window == window]


class FakeInference:
    def __init__(self, model: FakeModel, n_batch: int, window: int, session: int):
        self.model, self.n_batch, self.window, self.session = model, n_batch, window, session
        self.cached = np.zeros((n_batch, 0), dtype=np.int32)
        self.calls: list[np.ndarray] = []  # the tokens of every logits call
        self.rearrangements: list[list[int]] = []
        self.closed = False

    @property
    def initial_tokens(self) -> list[int]:
        return [int(t) for t in self.calls[0][0]]

    def logits(self, tokens: np.ndarray, positions: Sequence[int] | None = None) -> np.ndarray:
        assert not self.closed
        n_cached = self.cached.shape[1]
        assert tokens.shape[0] == self.cached.shape[0], "batch does not match the KV cache"
        assert tokens.shape[1] > n_cached, "no new tokens"
        np.testing.assert_array_equal(tokens[:, :n_cached], self.cached, "KV cache out of sync")
        positions = [tokens.shape[1] - 1] if positions is None else list(positions)
        assert min(positions) >= n_cached, "logits asked for a cached position"
        self.cached = np.array(tokens)
        self.calls.append(np.array(tokens))
        return np.array([[self.model.respond(self._query(row[:p + 1])) for p in positions]
                         for row in tokens.tolist()], dtype=np.float32)

    def _query(self, tokens: list[int]) -> Query:
        tok = self.model.tokenizer
        if tok.sot not in tokens or tokens[-1] == tok.sot:
            return Query(self.window, self.session, tuple(tokens), None)
        begin = tokens.index(tok.sot) + 1
        while begin < len(tokens) and tok.sot < tokens[begin] < tok.timestamp_begin:
            begin += 1  # language, task, no_timestamps
        return Query(self.window, self.session, tuple(tokens), tuple(tokens[begin:]))

    def rearrange_kv_cache(self, source_indices: Sequence[int]) -> None:
        self.rearrangements.append(list(source_indices))
        self.cached = self.cached[list(source_indices)]

    def cleanup_caching(self) -> None:
        self.closed = True


# ---- responders -------------------------------------------------------------------------------

def logits_from(tok: FakeTokenizer, probs: Mapping[int, float]) -> np.ndarray:
    """Logits whose softmax gives `probs` (up to the negligible BASE_LOGIT tokens)."""
    logits = np.full(tok.n_vocab, BASE_LOGIT, dtype=np.float32)
    for token, p in probs.items():
        logits[token] = math.log(p)
    return logits


def next_token(tok: FakeTokenizer, token: int, confidence: float = 1.0,
               no_speech: float = 0.0) -> np.ndarray:
    """`token` with probability `confidence`; the rest spread over filler words and, at the
    sot position, `no_speech` on <|nospeech|>."""
    probs = {token: confidence * (1 - no_speech)}
    rest = (1 - confidence) * (1 - no_speech)
    if rest > 0:
        fillers = [tok.id(w) for w in FILLER if tok.id(w) != token]
        probs.update({f: rest / len(fillers) for f in fillers})
    if no_speech > 0:
        probs[tok.no_speech] = no_speech
    return logits_from(tok, probs)


@dataclass
class Window:
    """What the scripted model says in one window (for each decode session, if a list)."""

    tokens: Sequence[int] | Sequence[Sequence[int]]
    no_speech: float = 0.0
    confidence: float = 1.0

    def for_session(self, session: int) -> Sequence[int]:
        if self.tokens and not isinstance(self.tokens[0], int):
            sessions: Sequence[Sequence[int]] = self.tokens  # type: ignore[assignment]
            return sessions[min(session, len(sessions) - 1)]
        return self.tokens  # type: ignore[return-value]


def script(tok: FakeTokenizer, windows: Sequence[Window]) -> Respond:
    """Each window's transcript, token by token, then eot; any departure from it ends in eot.
    The sot position carries the window's no-speech probability."""

    def respond(query: Query) -> np.ndarray:
        window = windows[min(query.window, len(windows) - 1)]
        if query.content is None:  # at sot (or in the prompt): the first token and no-speech
            first = window.for_session(query.session)
            return next_token(tok, first[0] if first else tok.eot, window.confidence,
                              window.no_speech)
        expected = list(window.for_session(query.session))
        done = list(query.content)
        if done == expected[:len(done)] and len(done) < len(expected):
            return next_token(tok, expected[len(done)], window.confidence)
        return next_token(tok, tok.eot, window.confidence)

    return respond


def table(tok: FakeTokenizer, rows: Mapping[int | None, Mapping[int, float]]) -> Respond:
    """Next-token probabilities keyed by the last token (None: the first sampled token)."""

    def respond(query: Query) -> np.ndarray:
        key = query.content[-1] if query.content else None
        return logits_from(tok, rows.get(key, {tok.eot: 1.0}))

    return respond

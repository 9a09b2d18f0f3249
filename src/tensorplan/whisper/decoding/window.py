"""Decode one 30-second window into tokens, as openai-whisper does (docs/decoding.md).

The session has already encoded the window (`session.encode(mel)`); decoding only runs the
text decoder through an `Inference` session. The loop is assembled from small strategies:
LogitFilter (edit the logits before a token is chosen), TokenDecoder (greedy, sampling or
beam search) and SequenceRanker (choose among the finished candidates).
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from tensorplan.whisper.audio.constants import TIME_PRECISION
from tensorplan.whisper.limits import check_token_ids
from tensorplan.whisper.options import DecodingOptions

if TYPE_CHECKING:
    from tensorplan.whisper.model_files.ct2_weights import ModelDims, WhisperConfig
    from tensorplan.whisper.tokenizer import Tokenizer



class Inference(Protocol):
    """One decoding session over the current window; owns the self-attention KV cache."""

    def logits(self, tokens: np.ndarray, positions: Sequence[int] | None = None) -> np.ndarray:
        """Logits of the next token after each of `positions`.

        tokens : int32, shape = (n_batch, n_ctx), the whole sequences so far; only the tokens
            not yet in the KV cache are fed to the decoder.
        positions : absolute positions to return logits for (default: [n_ctx - 1]).
        returns : float32, shape = (n_batch, len(positions), n_vocab)
        """
        ...

    def rearrange_kv_cache(self, source_indices: Sequence[int]) -> None:
        """Beam reorder: batch row i takes old row source_indices[i]; n_batch may change."""
        ...

    def cleanup_caching(self) -> None:
        """Release the KV cache; the session is not used afterwards."""
        ...


class DecodingSession(Protocol):
    """One stream's view of a model (session.WhisperSession): it holds the window it
    encoded last, which every inference it starts attends to."""

    dims: ModelDims
    tokenizer: Tokenizer
    config: WhisperConfig
    is_multilingual: bool

    def encode(self, mel: np.ndarray) -> None:
        """Encode one window, mel shape = (n_mels, 3000); later inferences attend to it."""
        ...

    def inference(self, n_batch: int) -> Inference: ...


@dataclass(frozen=True, slots=True)
class DecodingResult:
    tokens: tuple[int, ...]  # the window's text and timestamp tokens, without eot
    text: str
    language: str
    avg_logprob: float = math.nan  # sum_logprob / (number of sampled tokens + 1 for eot)
    sum_logprob: float = math.nan
    no_speech_prob: float = math.nan
    temperature: float = math.nan
    compression_ratio: float = math.nan
    language_probs: Mapping[str, float] | None = None


def compression_ratio(text: str) -> float:
    """UTF-8 length over zlib-compressed length: high for repetitive text."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data))


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """log_softmax over the last axis, in float32 like the reference; rows may hold -inf."""
    x = logits.astype(np.float32, copy=False)
    x_max = np.max(x, axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        shifted = x - x_max
        result: np.ndarray = shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))
    return result


# ---------------------------------------------------------------------------------------------
# Language detection


def detect_language(model: DecodingSession, tokenizer: Tokenizer
                    ) -> tuple[str, dict[str, float] | None]:
    """The most probable language of the encoded window and every language's probability.

    One decoder pass on [sot]; the softmax is taken over the language tokens only.
    English-only models return ("en", None) without running the decoder.
    """
    if not model.is_multilingual:
        return "en", None
    codes = {token: code for code, token in tokenizer.language_tokens.items()}
    inference = model.inference(1)
    try:
        logits = inference.logits(np.array([[tokenizer.sot]], dtype=np.int32), [0])[0, 0]
    finally:
        inference.cleanup_caching()
    ids = list(codes)
    probs = np.exp(log_softmax(logits[ids]))
    by_code = {codes[i]: float(p) for i, p in zip(ids, probs, strict=True)}
    return max(by_code, key=by_code.__getitem__), by_code


# ---------------------------------------------------------------------------------------------
# Logit filters


class LogitFilter(ABC):
    @abstractmethod
    def apply(self, logits: np.ndarray, tokens: np.ndarray) -> None:
        """Edit the logits of the next token in place (forbidden tokens get -inf).

        logits : float32, shape = (n_batch, n_vocab)
        tokens : int32, shape = (n_batch, n_ctx), every token so far, initial ones included
        """


class SuppressBlank(LogitFilter):
    def __init__(self, blank_ids: Sequence[int], sample_begin: int):
        self.blank_ids = list(blank_ids)
        self.sample_begin = sample_begin

    def apply(self, logits: np.ndarray, tokens: np.ndarray) -> None:
        if tokens.shape[1] == self.sample_begin:
            logits[:, self.blank_ids] = -np.inf


class SuppressTokens(LogitFilter):
    def __init__(self, suppress_ids: Sequence[int]):
        self.suppress_ids = list(suppress_ids)

    def apply(self, logits: np.ndarray, tokens: np.ndarray) -> None:
        logits[:, self.suppress_ids] = -np.inf


class ApplyTimestampRules(LogitFilter):
    """Timestamps come in increasing pairs around text, the first token is a timestamp no
    later than `max_initial_timestamp_index`, and a timestamp is forced when all timestamps
    together are more probable than any single text token (openai-whisper's decoding.py,
    ApplyTimestampRules)."""

    def __init__(self, tokenizer: Tokenizer, sample_begin: int,
                 max_initial_timestamp_index: int | None):
        self.eot = tokenizer.eot
        self.no_timestamps = tokenizer.no_timestamps
        self.timestamp_begin = tokenizer.timestamp_begin
        self.sample_begin = sample_begin
        self.max_initial_timestamp_index = max_initial_timestamp_index

    def apply(self, logits: np.ndarray, tokens: np.ndarray) -> None:
        ts_begin = self.timestamp_begin
        logits[:, self.no_timestamps] = -np.inf
        for row, seq in zip(logits, tokens[:, self.sample_begin:].tolist(), strict=True):
            self._pair_and_order(row, seq)
        if tokens.shape[1] == self.sample_begin:
            logits[:, :ts_begin] = -np.inf
            if self.max_initial_timestamp_index is not None:
                logits[:, ts_begin + self.max_initial_timestamp_index + 1:] = -np.inf
        # compared as log probabilities, the softmax normalizer cancels out
        for row in logits:
            timestamps = row[ts_begin:]
            peak = np.max(timestamps)
            if np.isfinite(peak) and peak + np.log(np.sum(np.exp(timestamps - peak))) > \
                    np.max(row[:ts_begin]):
                row[:ts_begin] = -np.inf

    def _pair_and_order(self, row: np.ndarray, seq: list[int]) -> None:
        ts_begin = self.timestamp_begin
        last_was_ts = len(seq) >= 1 and seq[-1] >= ts_begin
        penultimate_was_ts = len(seq) < 2 or seq[-2] >= ts_begin
        if last_was_ts:
            if penultimate_was_ts:
                row[ts_begin:] = -np.inf  # a pair just closed (or began the window): text next
            else:
                row[:self.eot] = -np.inf  # text just ended: a timestamp or eot next
        timestamps = [t for t in seq if t >= ts_begin]
        if timestamps:
            # an unpaired timestamp may be repeated to close the pair; otherwise time advances
            last_allowed_below = timestamps[-1] if last_was_ts and not penultimate_was_ts \
                else timestamps[-1] + 1
            row[ts_begin:last_allowed_below] = -np.inf


# ---------------------------------------------------------------------------------------------
# Token decoders and ranking


class TokenDecoder(ABC):
    """Chooses tokens for one decoding (a new decoder per window and temperature)."""

    @abstractmethod
    def update(self, tokens: np.ndarray, logits: np.ndarray,
               sum_logprobs: np.ndarray) -> tuple[np.ndarray, bool]:
        """Choose the next token of each sequence.

        tokens : int32, shape = (n_batch, n_ctx)
        logits : float32, shape = (n_batch, n_vocab), already filtered
        sum_logprobs : float64, shape = (n_batch,), cumulative log probability, updated in place
        returns : the tokens, shape = (n_batch, n_ctx + 1), and whether decoding is complete
        """

    @abstractmethod
    def finalize(self, tokens: np.ndarray, sum_logprobs: np.ndarray
                 ) -> tuple[list[list[int]], list[float]]:
        """The candidate sequences, each ending with eot, and their sum_logprobs."""


class GreedyDecoder(TokenDecoder):
    """argmax at temperature 0; at T > 0 every row samples from softmax(logits / T)."""

    def __init__(self, temperature: float, eot: int, rng: np.random.Generator):
        self.temperature = temperature
        self.eot = eot
        self.rng = rng

    def update(self, tokens: np.ndarray, logits: np.ndarray,
               sum_logprobs: np.ndarray) -> tuple[np.ndarray, bool]:
        logprobs = log_softmax(logits)
        if self.temperature == 0:
            next_tokens = np.argmax(logits, axis=-1)
        else:
            next_tokens = self._sample(logprobs / self.temperature)
        finished = tokens[:, -1] == self.eot
        chosen = logprobs[np.arange(len(next_tokens)), next_tokens]
        sum_logprobs += np.where(finished, 0.0, chosen)
        next_tokens[finished] = self.eot
        tokens = np.concatenate([tokens, next_tokens[:, None].astype(tokens.dtype)], axis=1)
        return tokens, bool(np.all(tokens[:, -1] == self.eot))

    def _sample(self, scaled_logprobs: np.ndarray) -> np.ndarray:
        probs = np.exp(scaled_logprobs - np.max(scaled_logprobs, axis=-1, keepdims=True))
        cdf = np.cumsum(probs, axis=-1)
        draws = self.rng.random(len(cdf)) * cdf[:, -1]
        # side="right" never lands on a zero-probability (suppressed) token
        return np.array([np.searchsorted(c, u, side="right") for c, u in zip(cdf, draws,
                                                                              strict=True)])

    def finalize(self, tokens: np.ndarray, sum_logprobs: np.ndarray
                 ) -> tuple[list[list[int]], list[float]]:
        return [row + [self.eot] for row in tokens.tolist()], sum_logprobs.tolist()


class BeamSearchDecoder(TokenDecoder):
    """Beam search over one window: `beam_size` live beams (the batch rows); finished
    candidates are collected until there are round(beam_size * patience) of them."""

    def __init__(self, beam_size: int, eot: int, inference: Inference, patience: float = 1.0):
        self.beam_size = beam_size
        self.eot = eot
        self.inference = inference
        self.max_candidates = max(1, round(beam_size * patience))
        self.finished: dict[tuple[int, ...], float] = {}

    def update(self, tokens: np.ndarray, logits: np.ndarray,
               sum_logprobs: np.ndarray) -> tuple[np.ndarray, bool]:
        logprobs = log_softmax(logits)
        # every beam proposes its beam_size + 1 best tokens; equal sequences count once
        scores: dict[tuple[int, ...], float] = {}
        sources: dict[tuple[int, ...], int] = {}
        for source, (prefix, row) in enumerate(zip(tokens.tolist(), logprobs, strict=True)):
            for token in top_k(row, self.beam_size + 1):
                sequence = (*prefix, int(token))
                scores[sequence] = float(sum_logprobs[source] + row[token])
                sources[sequence] = source
        # the best candidates ending in eot are finished; the best others become the beams
        beams: list[tuple[int, ...]] = []
        newly_finished: list[tuple[int, ...]] = []
        for sequence in sorted(scores, key=scores.__getitem__, reverse=True):
            if sequence[-1] == self.eot:
                newly_finished.append(sequence)
                continue
            sum_logprobs[len(beams)] = scores[sequence]
            beams.append(sequence)
            if len(beams) == self.beam_size:
                break
        self.inference.rearrange_kv_cache([sources[s] for s in beams])
        for sequence in newly_finished:
            if len(self.finished) >= self.max_candidates:
                break
            self.finished[sequence] = scores[sequence]
        completed = len(self.finished) >= self.max_candidates
        return np.array(beams, dtype=tokens.dtype), completed

    def finalize(self, tokens: np.ndarray, sum_logprobs: np.ndarray
                 ) -> tuple[list[list[int]], list[float]]:
        candidates = dict(self.finished)
        # too few finished (the length limit was hit): the best live beams count as finished
        for row in np.argsort(-sum_logprobs, kind="stable"):
            if len(candidates) >= self.beam_size:
                break
            candidates[(*tokens[row].tolist(), self.eot)] = float(sum_logprobs[row])
        return [list(s) for s in candidates], list(candidates.values())


# a beam's candidates: tokens whose log-probability is within this of the row's best, the
# first margin that holds k of them (a selection over all 51,864 tokens per beam and step
# was about a tenth of a beam-5 decode; within 10 nats lie a few dozen, on 93% of jfk's
# rows, and every token outside a margin is below every token inside it)
TOP_K_MARGINS = (10.0, 20.0)


def top_k(row: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest values, best first; ties go to the lower index (also
    at the k-th place: of equal values, the lower indices are taken)."""
    if k >= len(row):
        top = np.arange(len(row))
        return top[np.lexsort((top, -row))]
    best = row.max()
    for margin in TOP_K_MARGINS:
        candidates = np.flatnonzero(row >= best - margin)
        if len(candidates) >= k:
            break
    else:
        candidates = np.arange(len(row))
    values = row[candidates]
    kth = np.partition(values, len(values) - k)[len(values) - k]  # the k-th largest
    above = candidates[values > kth]
    top = np.concatenate([above, candidates[values == kth][: k - len(above)]])
    return top[np.lexsort((top, -row[top]))]


class SequenceRanker(ABC):
    @abstractmethod
    def rank(self, tokens: Sequence[Sequence[int]], sum_logprobs: Sequence[float]) -> int:
        """The index of the best candidate; tokens are the sampled tokens, without eot."""


class MaximumLikelihoodRanker(SequenceRanker):
    """sum_logprob / length, or / ((5 + length) / 6) ** length_penalty (Google NMT)."""

    def __init__(self, length_penalty: float | None):
        self.length_penalty = length_penalty

    def rank(self, tokens: Sequence[Sequence[int]], sum_logprobs: Sequence[float]) -> int:
        def score(length: int, logprob: float) -> float:
            penalty: float = max(length, 1) if self.length_penalty is None \
                else ((5 + length) / 6) ** self.length_penalty
            return logprob / penalty

        scores = [score(len(t), lp) for t, lp in zip(tokens, sum_logprobs, strict=True)]
        return int(np.argmax(scores))


# ---------------------------------------------------------------------------------------------
# The decoding of one window


@dataclass(frozen=True, slots=True)
class InitialTokens:
    """[sot_prev, hotwords, prompt] + sot sequence + [<|0.00|>, prefix]: the decoder input
    before the first sampled token."""

    tokens: tuple[int, ...]
    sot_index: int  # where the no-speech probability is read
    content_begin: int  # first token of the window's transcript (the prefix, if any)

    @property
    def sample_begin(self) -> int:
        return len(self.tokens)


def initial_tokens(tokenizer: Tokenizer, options: DecodingOptions, n_text_ctx: int
                   ) -> InitialTokens:
    """The decoder input for a window. Prompt and prefix share n_text_ctx // 2 - 1 tokens,
    so at least half the context is left to sample: the prefix comes first, then the
    hotwords (faster-whisper's rule: only without a prefix), then the end of the prompt."""
    budget = n_text_ctx // 2 - 1
    prefix = _encode(tokenizer, options.prefix)[-budget:] if options.prefix else []
    context: list[int] = []
    if options.hotwords and not options.prefix:
        context = _encode(tokenizer, options.hotwords)[:budget]
    if options.prompt:
        prompt = _encode(tokenizer, options.prompt)
        room = budget - len(prefix) - len(context)
        context += prompt[max(0, len(prompt) - room):] if room > 0 else []
    tokens = [tokenizer.sot_prev, *context] if context else []
    sot_index = len(tokens)
    tokens += tokenizer.sot_sequence(options.language, options.task)
    if options.without_timestamps:
        tokens.append(tokenizer.no_timestamps)
    content_begin = len(tokens)
    if prefix and not options.without_timestamps:
        tokens.append(tokenizer.timestamp_begin)  # the prefix starts the window at 0.00
    tokens += prefix
    return InitialTokens(tuple(tokens), sot_index, content_begin)


def _encode(tokenizer: Tokenizer, text: str | Sequence[int]) -> list[int]:
    if isinstance(text, str):
        return tokenizer.encode(" " + text.strip())
    check_token_ids(text, tokenizer.n_vocab, "prompt")
    return list(text)


def suppressed_tokens(model: DecodingSession, suppress_tokens: Sequence[int]) -> list[int]:
    """Token ids never sampled: the given ids (-1: the non-speech symbols) and the specials."""
    tokenizer = model.tokenizer
    ids = {t for t in suppress_tokens if t >= 0}
    check_token_ids(ids, model.dims.n_vocab, "suppress_tokens")
    if -1 in suppress_tokens:
        ids.update(model.config.suppress_ids or tokenizer.non_speech_tokens)
    ids.update((tokenizer.transcribe, tokenizer.translate, tokenizer.sot, tokenizer.sot_prev,
                tokenizer.sot_lm, tokenizer.no_speech))
    return sorted(ids)


class DecodingTask:
    """One decoding of the encoded window with fixed options; `run()` once."""

    def __init__(self, model: DecodingSession, options: DecodingOptions):
        tokenizer = model.tokenizer
        self.tokenizer = tokenizer
        self.options = options
        self.n_ctx: int = model.dims.n_text_ctx
        self.sample_len = options.sample_len or self.n_ctx // 2
        self.initial = initial_tokens(tokenizer, options, self.n_ctx)
        sample_begin = self.initial.sample_begin
        # beam_size applies at T=0 and best_of at T>0 (see options.py)
        beam = options.temperature == 0 and options.beam_size is not None
        self.n_group: int = (options.beam_size if options.temperature == 0
                             else options.best_of) or 1

        # runs the text decoder over n_group rows and keeps their self-attention KV cache
        self.inference = model.inference(self.n_group)
        # picks the best of the n_group finished candidates
        self.ranker = MaximumLikelihoodRanker(options.length_penalty)
        # chooses the next tokens: beam search at T=0 with beam_size, else greedy/sampling
        self.decoder: TokenDecoder = (
            BeamSearchDecoder(self.n_group, tokenizer.eot, self.inference,
                              options.patience or 1.0) if beam else
            GreedyDecoder(options.temperature, tokenizer.eot,
                          np.random.default_rng(options.seed)))
        self.logit_filters: list[LogitFilter] = []
        if options.suppress_blank:
            # no blank or eot as the first sampled token
            blank = list(model.config.suppress_ids_begin or
                         [*tokenizer.encode(" "), tokenizer.eot])
            self.logit_filters.append(SuppressBlank(blank, sample_begin))
        if options.suppress_tokens:
            # never the listed tokens or the special tokens
            self.logit_filters.append(SuppressTokens(suppressed_tokens(model,
                                                                       options.suppress_tokens)))
        if not options.without_timestamps:
            # paired, increasing timestamps; the first within max_initial_timestamp. The rules
            # treat a prefix (after its <|0.00|>) as already sampled text
            max_initial = None if options.max_initial_timestamp is None else \
                round(options.max_initial_timestamp / TIME_PRECISION)
            self.logit_filters.append(
                ApplyTimestampRules(tokenizer, self.initial.content_begin, max_initial))

    def run(self) -> DecodingResult:
        tokens = np.tile(np.array(self.initial.tokens, dtype=np.int32), (self.n_group, 1))
        try:
            tokens, sum_logprobs, no_speech_prob = self._main_loop(tokens)
        finally:
            self.inference.cleanup_caching()
        return self.finish(tokens, sum_logprobs, no_speech_prob)

    def finish(self, tokens: np.ndarray, sum_logprobs: np.ndarray,
               no_speech_prob: float) -> DecodingResult:
        """The result from the final tokens: rank the candidates, decode the best."""
        candidates, candidate_logprobs = self.decoder.finalize(tokens, sum_logprobs)
        begin, eot = self.initial.sample_begin, self.tokenizer.eot
        sampled = [c[begin:c.index(eot, begin)] for c in candidates]
        best = self.ranker.rank(sampled, candidate_logprobs)
        content = (*self.initial.tokens[self.initial.content_begin:], *sampled[best])
        text = self.tokenizer.decode([t for t in content if t < eot]).strip()
        return DecodingResult(
            tokens=content, text=text, language=self.options.language or "en",
            avg_logprob=candidate_logprobs[best] / (len(sampled[best]) + 1),
            sum_logprob=candidate_logprobs[best], no_speech_prob=no_speech_prob,
            temperature=self.options.temperature, compression_ratio=compression_ratio(text))

    def _main_loop(self, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
        sum_logprobs = np.zeros(len(tokens), dtype=np.float64)
        no_speech_prob = math.nan
        for step in range(self.sample_len):
            last = tokens.shape[1] - 1
            if step == 0:
                at_sot, logits = self._first_logits(tokens, last)
                no_speech_prob = float(np.exp(log_softmax(at_sot)[self.tokenizer.no_speech]))
            else:
                logits = self.inference.logits(tokens, [last])[:, -1]
            logits = np.array(logits, dtype=np.float32)  # the filters edit a private copy
            for logit_filter in self.logit_filters:
                logit_filter.apply(logits, tokens)
            tokens, completed = self.decoder.update(tokens, logits, sum_logprobs)
            if completed or tokens.shape[1] >= self.n_ctx:
                break
        return tokens, sum_logprobs, no_speech_prob

    def _first_logits(self, tokens: np.ndarray, last: int) -> tuple[np.ndarray, np.ndarray]:
        """(the first row's logits at the sot position, every row's logits at `last`)."""
        sot = self.initial.sot_index
        if sot == last:
            logits = self.inference.logits(tokens, [last])[:, 0]
            return logits[0], logits
        logits = self.inference.logits(tokens, [sot, last])
        return logits[0, 0], logits[:, 1]


def decode(model: DecodingSession, options: DecodingOptions | None = None,
           **overrides: Any) -> DecodingResult:
    """Decode the window the model encoded last; `overrides` replace option fields.

    Detects the language first when `options.language` is None (multilingual models).
    """
    options = dataclasses.replace(options or DecodingOptions(), **overrides)
    probs = None
    if options.language is None:
        language, probs = detect_language(model, model.tokenizer)
        options = dataclasses.replace(options, language=language)
    result = DecodingTask(model, options).run()
    return dataclasses.replace(result, language_probs=probs) if probs else result

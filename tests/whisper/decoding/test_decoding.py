"""Decoding one window with a scripted model: logit filters, search, ranking, results."""

from __future__ import annotations

import math
import zlib
from typing import Any

import numpy as np
import pytest
from fakes import FakeModel, FakeTokenizer, Window, logits_from, script, table
from hypothesis import given
from hypothesis import strategies as st

from tensorplan.whisper.decoding.window import (
    ApplyTimestampRules,
    BeamSearchDecoder,
    DecodingTask,
    GreedyDecoder,
    MaximumLikelihoodRanker,
    SuppressBlank,
    SuppressTokens,
    compression_ratio,
    decode,
    detect_language,
    initial_tokens,
    suppressed_tokens,
    top_k,
)
from tensorplan.whisper.model_files.ct2_weights import WhisperConfig
from tensorplan.whisper.options import DecodingOptions

TOK: Any = FakeTokenizer()  # Any: it stands in for the real Tokenizer
HELLO, WORLD, FOO, BAR, BAZ = (TOK.id(w) for w in (" hello", " world", " foo", " bar", " baz"))
GREEDY = DecodingOptions(beam_size=None)
TEXT_ONLY = DecodingOptions(beam_size=None, without_timestamps=True)


def model_saying(*windows: Window, tok: FakeTokenizer = TOK) -> FakeModel:
    model = FakeModel(tok, script(tok, windows))
    model.encode(np.zeros((80, 3000), np.float32))
    return model


TEXT = set(range(TOK.eot))
SPECIALS = set(range(TOK.eot, TOK.timestamp_begin)) - {TOK.no_timestamps}  # eot among them


def allowed(logits: np.ndarray) -> set[int]:
    return {int(i) for i in np.flatnonzero(np.isfinite(logits))}


# ---- logit filters ------------------------------------------------------------------------

def rules(max_initial: int | None = 50) -> ApplyTimestampRules:
    return ApplyTimestampRules(TOK, sample_begin=1, max_initial_timestamp_index=max_initial)


def apply(rule: ApplyTimestampRules, sampled: list[int], logits: np.ndarray | None = None
          ) -> set[int]:
    """The tokens allowed after [sot] + sampled. The default logits make text likelier than
    all timestamps together, so that the logsumexp rule stays out of the way."""
    if logits is None:
        logits = np.where(np.arange(TOK.n_vocab) < TOK.timestamp_begin, 0.0, -10.0)
    logits = logits[None].astype(np.float32)
    rule.apply(logits, np.array([[TOK.sot, *sampled]], np.int32))
    return allowed(logits[0])


def test_first_token_is_a_timestamp_no_later_than_max_initial() -> None:
    assert apply(rules(), []) == set(range(TOK.ts(0), TOK.ts(1.0) + 1))
    assert apply(rules(None), []) == set(range(TOK.timestamp_begin, TOK.n_vocab))


def test_text_follows_a_timestamp_pair() -> None:
    after_pair = apply(rules(), [TOK.ts(0), HELLO, TOK.ts(1), TOK.ts(1)])
    assert after_pair == TEXT | SPECIALS
    assert apply(rules(), [TOK.ts(0.5)]) == TEXT | SPECIALS  # the window's first timestamp


def test_an_unpaired_timestamp_after_text_is_closed_by_an_equal_or_later_one_or_eot() -> None:
    got = apply(rules(), [TOK.ts(0), HELLO, TOK.ts(1)])
    assert got == SPECIALS | set(range(TOK.ts(1), TOK.n_vocab))


def test_timestamps_increase_and_segments_have_length() -> None:
    got = apply(rules(), [TOK.ts(0), HELLO, TOK.ts(1), TOK.ts(1), WORLD])
    assert min(t for t in got if t >= TOK.timestamp_begin) == TOK.ts(1) + 1
    assert HELLO in got and TOK.eot in got


def test_no_timestamps_token_is_always_forbidden() -> None:
    assert TOK.no_timestamps not in apply(rules(), [TOK.ts(0), HELLO])


def test_timestamps_win_when_their_total_probability_beats_every_text_token() -> None:
    # text: one token at 0.3; timestamps: 0.7 spread over 70 tokens of 0.01 each
    probs = {HELLO: 0.3, **{TOK.ts(1) + i: 0.01 for i in range(70)}}
    got = apply(rules(), [TOK.ts(0), WORLD], logits_from(TOK, probs))
    assert got == set(range(TOK.ts(0) + 1, TOK.n_vocab))
    probs = {HELLO: 0.8, **{TOK.ts(1) + i: 0.002 for i in range(100)}}
    assert HELLO in apply(rules(), [TOK.ts(0), WORLD], logits_from(TOK, probs))


def test_suppress_blank_only_at_the_first_sampled_position() -> None:
    blank = [TOK.id(" "), TOK.eot]
    suppress = SuppressBlank(blank, sample_begin=1)
    first = np.zeros((2, TOK.n_vocab), np.float32)
    suppress.apply(first, np.array([[TOK.sot]] * 2, np.int32))
    assert allowed(first[0]) == set(range(TOK.n_vocab)) - set(blank)
    later = np.zeros((1, TOK.n_vocab), np.float32)
    suppress.apply(later, np.array([[TOK.sot, HELLO]], np.int32))
    assert allowed(later[0]) == set(range(TOK.n_vocab))


def test_minus_one_expands_to_non_speech_tokens_or_the_config_list_plus_specials() -> None:
    specials = {TOK.transcribe, TOK.translate, TOK.sot, TOK.sot_prev, TOK.sot_lm, TOK.no_speech}
    model = model_saying(Window([]))
    assert set(suppressed_tokens(model, (-1,))) == set(TOK.non_speech_tokens) | specials
    assert set(suppressed_tokens(model, (FOO,))) == {FOO} | specials
    model.config = WhisperConfig((), (), suppress_ids=(BAR, BAZ), suppress_ids_begin=())
    assert set(suppressed_tokens(model, (-1, FOO))) == {FOO, BAR, BAZ} | specials
    logits = np.zeros((1, TOK.n_vocab), np.float32)
    SuppressTokens([BAR, BAZ]).apply(logits, np.zeros((1, 1), np.int32))
    assert allowed(logits[0]) == set(range(TOK.n_vocab)) - {BAR, BAZ}


# ---- initial tokens -------------------------------------------------------------------------

def test_initial_tokens_order_prompt_then_sot_sequence_then_timestamped_prefix() -> None:
    options = DecodingOptions(prompt=" hello world", prefix="foo")
    got = initial_tokens(TOK, options, n_text_ctx=448)
    assert got.tokens == (TOK.sot_prev, HELLO, WORLD, TOK.sot, TOK.ts(0), FOO)
    assert (got.sot_index, got.content_begin, got.sample_begin) == (3, 4, 6)
    no_ts = initial_tokens(TOK, DecodingOptions(without_timestamps=True, prefix="foo"), 448)
    assert no_ts.tokens == (TOK.sot, TOK.no_timestamps, FOO)


def test_prompt_keeps_its_last_tokens_after_the_hotwords() -> None:
    prompt = tuple([FOO] * 300 + [BAR])
    got = initial_tokens(TOK, DecodingOptions(prompt=prompt, hotwords="hello world"), 448)
    context = got.tokens[1:got.sot_index]
    assert len(context) == 223 and context[:2] == (HELLO, WORLD) and context[-1] == BAR
    with_prefix = initial_tokens(TOK, DecodingOptions(hotwords="hello", prefix="baz"), 448)
    assert TOK.sot_prev not in with_prefix.tokens  # hotwords are ignored with a prefix
    long_prefix = " ".join(["foo"] * 100)
    both = initial_tokens(TOK, DecodingOptions(prompt=prompt, prefix=long_prefix), 448)
    assert both.sot_index == 1 + 123 and len(both.tokens) == 1 + 123 + 1 + 1 + 100


# ---- greedy, sampling, beam search ------------------------------------------------------------

def test_greedy_follows_the_script_and_stops_at_eot() -> None:
    words = [TOK.ts(0), HELLO, WORLD, TOK.ts(1.5)]
    model = model_saying(Window(words))
    result = decode(model, GREEDY)
    assert result.tokens == tuple(words) and result.text == "hello world"
    session = model.sessions[-1]
    assert len(session.calls) == len(words) + 1 and session.closed  # + the step choosing eot


def test_greedy_stops_at_the_context_length() -> None:
    model = FakeModel(TOK, table(TOK, {None: {HELLO: 1.0}, HELLO: {HELLO: 1.0}}))
    model.encode(np.zeros((80, 3000), np.float32))
    result = decode(model, TEXT_ONLY, sample_len=1000)
    assert len(result.tokens) == 448 - 2  # sot, notimestamps


def test_avg_logprob_counts_eot_and_no_speech_is_read_at_sot() -> None:
    model = model_saying(Window([HELLO, WORLD], confidence=0.5, no_speech=0.2))
    result = decode(model, TEXT_ONLY)
    assert result.tokens == (HELLO, WORLD)
    # hello and world at 0.5 each, then eot at 0.5: three log(0.5) over 2 + 1 tokens
    assert result.sum_logprob == pytest.approx(3 * math.log(0.5), abs=1e-3)
    assert result.avg_logprob == pytest.approx(result.sum_logprob / 3)
    assert result.no_speech_prob == pytest.approx(0.2, abs=1e-6)
    data = b"hello world"
    assert result.compression_ratio == pytest.approx(len(data) / len(zlib.compress(data)))


def test_compression_ratio_is_high_for_repetition() -> None:
    assert compression_ratio(" hello" * 40) > 2.4 > compression_ratio("hello world")


def test_sampling_draws_best_of_rows_and_is_reproducible() -> None:
    rows = {None: {HELLO: 0.5, WORLD: 0.5}, HELLO: {FOO: 0.5, BAR: 0.5}, WORLD: {BAZ: 1.0}}
    results = []
    for _ in range(2):
        model = FakeModel(TOK, table(TOK, rows))
        model.encode(np.zeros((80, 3000), np.float32))
        results.append(decode(model, TEXT_ONLY, temperature=1.0, best_of=4, seed=3))
        assert [s.n_batch for s in model.sessions] == [4]
    assert results[0] == results[1] and results[0].temperature == 1.0
    assert results[0].text in {"hello foo", "hello bar", "world baz"}


def test_sampling_never_picks_a_suppressed_token() -> None:
    decoder = GreedyDecoder(1.0, TOK.eot, np.random.default_rng(0))
    logits = np.full((64, TOK.n_vocab), -np.inf, np.float32)
    logits[:, [HELLO, WORLD]] = 0.0
    tokens, _ = decoder.update(np.zeros((64, 1), np.int32), logits, np.zeros(64))
    assert set(tokens[:, -1].tolist()) == {HELLO, WORLD}


# start: hello 0.55, world 0.45. Greedy takes hello, then foo (0.34): -1.68 over 2 tokens.
# world, then eot (1.0): -0.80 over 1 token, the better length-normalized score.
BEAM_TABLE = {None: {HELLO: 0.55, WORLD: 0.45}, HELLO: {FOO: 0.34, BAR: 0.33, BAZ: 0.33},
              FOO: {TOK.eot: 1.0}, BAR: {TOK.eot: 1.0}, BAZ: {TOK.eot: 1.0},
              WORLD: {TOK.eot: 1.0}}


@given(values=st.lists(st.one_of(st.sampled_from([-np.inf, -30.0, -10.0, -9.5, 0.0]),
                                 st.floats(-60, 5, width=32)), min_size=1, max_size=80),
       k=st.integers(1, 90))
def test_top_k_is_a_stable_sort_by_value_cut_at_k(values: list[float], k: int) -> None:
    """The beams' pick: the k largest, best first, equal values in index order, also at
    the k-th place (the margins that skip most of the vocabulary change nothing)."""
    row = np.array(values, np.float32)
    want = np.lexsort((np.arange(len(row)), -row))[:k]
    assert top_k(row, k).tolist() == want.tolist()


def test_beam_search_finds_the_better_sequence_greedy_misses() -> None:
    model = FakeModel(TOK, table(TOK, BEAM_TABLE))
    model.encode(np.zeros((80, 3000), np.float32))
    assert decode(model, TEXT_ONLY).text == "hello foo"
    beam = decode(model, TEXT_ONLY, beam_size=3)
    assert beam.text == "world"
    assert beam.sum_logprob == pytest.approx(math.log(0.45), abs=1e-4)
    session = model.sessions[-1]
    assert session.n_batch == 3 and session.rearrangements and session.closed


def test_beam_search_collects_patience_times_beam_size_candidates() -> None:
    class Recorder:
        def rearrange_kv_cache(self, source_indices: list[int]) -> None:
            self.last = list(source_indices)

    def step(patience: float) -> tuple[bool, BeamSearchDecoder]:
        decoder = BeamSearchDecoder(2, TOK.eot, Recorder(), patience)  # type: ignore[arg-type]
        tokens = np.array([[TOK.sot, HELLO], [TOK.sot, WORLD]], np.int32)
        probs = [{TOK.eot: 0.6, FOO: 0.3, BAR: 0.1}, {TOK.eot: 0.5, BAZ: 0.5}]
        logits = np.stack([logits_from(TOK, p) for p in probs])
        _, completed = decoder.update(tokens, logits, np.zeros(2))
        return completed, decoder

    completed, decoder = step(1.0)
    assert completed and len(decoder.finished) == 2
    completed, decoder = step(1.5)  # round(2 * 1.5) = 3 finished needed
    assert not completed and len(decoder.finished) == 2
    assert decoder.inference.last == [1, 0]  # type: ignore[attr-defined]  # world baz, hello foo


def test_beam_search_fills_up_with_live_beams_at_the_length_limit() -> None:
    model = FakeModel(TOK, table(TOK, {None: {HELLO: 0.6, WORLD: 0.4},
                                       HELLO: {HELLO: 1.0}, WORLD: {WORLD: 1.0}}))
    model.encode(np.zeros((80, 3000), np.float32))
    result = decode(model, TEXT_ONLY, beam_size=2, sample_len=5)
    assert result.tokens == (HELLO,) * 5


def test_ranker_length_penalty() -> None:
    short, long = [HELLO], [HELLO] * 10
    # sum/len: -2/1 vs -6/10
    assert MaximumLikelihoodRanker(None).rank([short, long], [-2.0, -6.0]) == 1
    # ((5+len)/6)^1: -2/1 vs -6/2.5
    assert MaximumLikelihoodRanker(1.0).rank([short, long], [-2.0, -6.0]) == 0
    # alpha = 0: plain sums
    assert MaximumLikelihoodRanker(0.0).rank([short, long], [-2.0, -1.5]) == 1


def test_task_uses_beam_at_zero_and_best_of_when_sampling() -> None:
    model = model_saying(Window([HELLO]))
    options = DecodingOptions(beam_size=3, best_of=4, without_timestamps=True)
    assert isinstance(DecodingTask(model, options).decoder, BeamSearchDecoder)
    sampling = DecodingTask(model, DecodingOptions(beam_size=3, best_of=4, temperature=0.5))
    assert isinstance(sampling.decoder, GreedyDecoder) and sampling.n_group == 4


def test_prefix_is_part_of_the_result_and_blank_is_suppressed_after_it() -> None:
    words = [TOK.ts(0), FOO, HELLO, WORLD, TOK.ts(1)]
    model = model_saying(Window(words))
    result = decode(model, GREEDY, prefix="foo")
    assert result.tokens == tuple(words) and result.text == "foo hello world"
    assert model.sessions[-1].initial_tokens == [TOK.sot, TOK.ts(0), FOO]


def test_language_detection_reads_language_tokens_only() -> None:
    tok: Any = FakeTokenizer(multilingual=True)
    de = tok.language_tokens["de"]
    model = FakeModel(tok, lambda q: logits_from(tok, {HELLO: 0.9, de: 0.08,
                                                       tok.language_tokens["fr"]: 0.02}))
    model.encode(np.zeros((80, 3000), np.float32))
    code, probs = detect_language(model, tok)
    assert code == "de" and probs is not None
    assert probs["de"] == pytest.approx(0.8, abs=1e-6) and sum(probs.values()) == pytest.approx(1)
    english_only = model_saying(Window([HELLO]))
    assert detect_language(english_only, TOK) == ("en", None)
    assert english_only.sessions == []


def test_decode_detects_the_language_of_multilingual_models() -> None:
    tok: Any = FakeTokenizer(multilingual=True)
    fr = tok.language_tokens["fr"]
    respond = script(tok, [Window([HELLO])])
    bias = 40.0 * (np.arange(tok.n_vocab) == fr)  # at the sot position only
    model = FakeModel(tok, lambda q: respond(q) + (bias if q.content is None else 0))
    model.encode(np.zeros((80, 3000), np.float32))
    result = decode(model, TEXT_ONLY)
    assert result.language == "fr" and result.language_probs is not None
    assert model.sessions[-1].initial_tokens[:3] == [tok.sot, fr, tok.transcribe]

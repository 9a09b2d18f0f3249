"""How a live stream decodes and finds its turns (OpenAI's server VAD fields and defaults)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from tensorplan.whisper.options import TranscribeOptions

SAMPLE_RATE = 16000
# an update decodes once at least this much new audio arrived: the cadence of partial text
MIN_STEP_S = 0.5
# and takes at most this much new audio at once, so a stream sent faster than real time
# is decoded at the same steps as one that is not (work per update stays flat)
MAX_STEP_S = 3.0
# past this much audio, the buffer is trimmed at the end of a committed segment or word
TRIM_S = 12.0
# the most audio one decode sees: less than a window, however long the stream runs
MAX_WINDOW_S = 24.0
# committed text put in the prompt of the next decode (whisper_streaming's 200)
PROMPT_CHARS = 200
# agreement commits a word only where one of the two hypotheses heard it at least this
# probably: from under a second of a turn tiny.en guesses ("Like your country" for "what
# your country", at 0.12-0.41) and the next decode of about the same audio guesses alike.
# 0.3 against none, bench/live_text.py: WER against the offline pass 0.200 -> 0.160 with
# server VAD and 0.105 -> 0.079 with client commits, over its five clips; 0.4 and 0.5
# held jfk's "ask" (0.23-0.32) in one long turn until a trim left it to a decode of 3 s
# that lost six words. The cost is latency: at one stream jfk's words came a median 1.12
# s after they were said instead of 0.84 s (p95 2.3 s instead of 1.2; docs/realtime.md).
# Off by default (whisper_streaming's agreement) until a trim keeps context before a held
# word: at 0.3 CI's browser test, paced in real time, lost jfk's "ask what you can do for"
# in that way once. LiveOptions(commit_probability=SURE_PROBABILITY) turns it on.
SURE_PROBABILITY = 0.3
COMMIT_PROBABILITY = 0.0
# but no longer than until this much audio after it was decoded: in one long turn (client
# commits) a word heard unsurely every time (a rare name) would otherwise hold every word
# after it until the 24 s buffer forced them out
UNSURE_HOLD_S = 6.0
# a decode samples at most this many tokens per second of its audio, and this many more:
# speech is 3-6 tokens a second; a decode caught in a loop (". . . ." or "good ? good ?",
# which narrowed windows brought on silence) would otherwise run to 224 tokens, 2-3 s
TOKENS_PER_S = 10
TOKENS_SLACK = 16
DEFAULT_SAMPLE_LEN = 224  # what a decode samples otherwise: n_text_ctx // 2, every Whisper
# a decode of audio this much shorter than the narrowed window runs on it (below)
NARROW_MARGIN_S = 5.0
# updates of short audio decode on a window of this many seconds instead of 30: the
# encoder's pass over 30 s (mostly padding for a turn of a few seconds) was most of an
# update's time; tiny.en int8, 2 cores, jfk's first 3 s: 0.63 -> 0.24 s (docs/realtime.md)
NARROW_WINDOW_S = 10.0


@dataclass(frozen=True, slots=True)
class TurnDetection:
    """OpenAI's `server_vad`: speech starts at a Silero probability of `threshold`, and
    ends after `silence_duration_ms` below it; `prefix_padding_ms` of audio before the
    start belongs to the turn."""

    threshold: float = field(default=0.5, metadata={
        "help": "speech starts at a Silero VAD probability this high"})
    prefix_padding_ms: int = field(default=300, metadata={
        "help": "audio before the start of speech that belongs to the turn"})
    silence_duration_ms: int = field(default=500, metadata={
        "help": "silence that ends a turn (a line of output)"})

    def __post_init__(self) -> None:
        if not 0 < self.threshold < 1:
            raise ValueError("threshold must be between 0 and 1 (exclusive)")
        if not 0 <= self.prefix_padding_ms <= 5000:
            raise ValueError("prefix_padding_ms must be between 0 and 5000")
        if not 0 <= self.silence_duration_ms <= 10000:
            raise ValueError("silence_duration_ms must be between 0 and 10000")


@dataclass(frozen=True, slots=True)
class LiveOptions:
    """The decoding of each update (the whisper options, with the stream's language and
    prompt) and the update policy's sizes, in seconds."""

    decoding: TranscribeOptions = field(default_factory=TranscribeOptions)
    language: str | None = None
    prompt: str | None = None  # put before the committed text in every prompt
    min_step_s: float = MIN_STEP_S
    max_step_s: float = MAX_STEP_S
    trim_s: float = TRIM_S
    max_window_s: float = MAX_WINDOW_S
    # agreement commits a word only where one of the two hypotheses heard it this probably
    # (0: every agreed word, as whisper_streaming)
    commit_probability: float = COMMIT_PROBABILITY
    # partial updates decode greedily at the first temperature; the turn's last decode
    # uses `decoding` whole (beams, fallback). False: every update uses `decoding`.
    greedy_updates: bool = True
    # and so is a last decode shared by several turns of a stream that fell behind live
    # audio (more streams than the machine decodes in real time): load shed, so the
    # backlog stops growing; a turn decoded alone keeps `decoding`
    greedy_when_behind: bool = True
    # decodes of audio up to NARROW_MARGIN_S shorter than this run on windows of this
    # many seconds (a narrowed encoder) instead of 30; None: always 30
    narrow_window_s: float | None = NARROW_WINDOW_S
    # and so does a turn's last decode (else only partial updates do)
    narrow_finals: bool = True

    def __post_init__(self) -> None:
        if not 0 < self.min_step_s <= self.max_step_s <= self.trim_s < self.max_window_s <= 29:
            raise ValueError("need 0 < min_step_s <= max_step_s <= trim_s < max_window_s <= 29")
        if not 0 <= self.commit_probability <= 1:
            raise ValueError("commit_probability must be between 0 and 1")
        if self.narrow_window_s is not None and \
                not NARROW_MARGIN_S < self.narrow_window_s < 30:
            raise ValueError(f"narrow_window_s must be between {NARROW_MARGIN_S:g} and 30 s")

    def window_s(self, audio_s: float, final: bool) -> float | None:
        """The window a decode of `audio_s` seconds runs on: narrowed where the audio
        leaves NARROW_MARGIN_S of it as padding (a narrowed window filled to its end made
        tiny.en repeat itself), else None (30 s)."""
        narrow = self.narrow_window_s
        if narrow is None or (final and not self.narrow_finals) or \
                audio_s > narrow - NARROW_MARGIN_S:
            return None
        return narrow

    def transcribe_options(self, prompt: str | None, final: bool = True,
                           audio_s: float | None = None) -> TranscribeOptions:
        """One update's options: one window, word times, the prompt given, at most
        TOKENS_PER_S a second of its `audio_s` sampled (if given). A partial
        update (not `final`) is greedy where `greedy_updates` says so: its words are only
        committed once the next update agrees, so it is redone often and cheap matters
        more than the last bit of accuracy; the final decode gives the turn's tail."""
        decoding = self.decoding
        if self.greedy_updates and not final:
            decoding = dataclasses.replace(decoding, beam_size=None, patience=None,
                                           temperature=decoding.temperature[:1])
        if audio_s is not None:
            most = TOKENS_SLACK + math.ceil(TOKENS_PER_S * audio_s)
            if most < (decoding.sample_len or DEFAULT_SAMPLE_LEN):
                decoding = dataclasses.replace(decoding, sample_len=most)
        return dataclasses.replace(
            decoding, language=self.language or self.decoding.language,
            initial_prompt=prompt or None, carry_initial_prompt=False,
            condition_on_previous_text=False, word_timestamps=True, vad_filter=False,
            clip_timestamps=(), batch_size=None, hallucination_silence_threshold=None,
            task="transcribe")

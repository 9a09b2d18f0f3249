"""One live stream's state, and the two things done to it: audio appended (turn detection,
on the caller's thread) and a decoding update (on an engine worker, with a borrowed
session). A lock keeps the two apart; the decode itself runs outside it.

Turns: with a `TurnDetection` (server VAD) a turn runs from speech start (less the prefix
padding) to the end of the silence that stopped it; without one, a turn is everything
appended since the last commit, and the client ends it (`commit`). Each turn keeps only the
audio its next decode needs: it is trimmed at committed segment ends (docs/realtime.md).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from tensorplan.errors import UserError
from tensorplan.live.agreement import LocalAgreement, TimedWord, normalized
from tensorplan.live.buffer import SampleBuffer
from tensorplan.live.events import (
    Committed,
    Completed,
    Delta,
    Event,
    Failed,
    SpeechStarted,
    SpeechStopped,
    Tail,
)
from tensorplan.live.options import (
    COMMIT_PROBABILITY,
    PROMPT_CHARS,
    SAMPLE_RATE,
    LiveOptions,
    TurnDetection,
)
from tensorplan.live.speech import SpeechProbability, TurnDetector
from tensorplan.whisper.audio.vad import WINDOW_SAMPLES
from tensorplan.whisper.result import IMPROBABLE_WORD, Word, scored_words

log = logging.getLogger("tensorplan.live")

PREROLL_S = 6.0  # audio kept while nobody speaks: the prefix padding and the detector's lag
MIN_COMMIT_S = 0.1  # a commit needs this much audio since the last (OpenAI's 100 ms)
FORCE_KEEP_S = 5.0  # a buffer that must move on without agreement keeps this much
SPEECH_PROBABILITY = 0.5  # without turn detection: a window this likely is speech
PROMPT_WORDS = 100  # committed words remembered for prompts
# words that start this long after the turn's last speech window are not speech: Whisper
# writes "Thank you." into the silence that ends a turn, and two updates can agree on it
AFTER_SPEECH_S = 0.5
# audio that came over at least this share of its duration came live (at most 2x real time)
REAL_TIME_SHARE = 0.5
# a last segment that says only this, its first word heard less probably than this, is
# Whisper's outro: on narrowed windows it came unsqueezed ("Thank" 0.18 over 0.2 s after
# jfk's last word, 0.03-0.41 in all); espeak-ng saying it, in three voices, gave 0.61-0.98
OUTRO = "thank you"
UNSURE_OUTRO = 0.5


def hallucinated(words: list[Word]) -> bool:
    """Whether a segment starts with an improbable word and its words score, on average,
    at least one on openai-whisper's word anomaly score (improbable, very short or very
    long), or is an unsure "Thank you." alone. It catches the "Thank you." Whisper writes
    where a turn's speech ends: "Thank" comes at a probability of 0.01-0.10 and both words
    are squeezed into the last few milliseconds, so no timing rule sees them (jfk's room
    noise keeps the VAD saying speech to the file's end). The first word's probability
    spares a real sentence that the decode squeezed against the buffer's end."""
    if words and words[0].probability < UNSURE_OUTRO and \
            " ".join(normalized(w.word) for w in words) == OUTRO:
        return True
    words = scored_words(words)
    return bool(words) and words[0].probability < IMPROBABLE_WORD and \
        sum(w.anomaly_score() for w in words) + 0.01 >= len(words)


class Turn:
    def __init__(self, number: int, start: int, audio: np.ndarray,
                 commit_probability: float = COMMIT_PROBABILITY) -> None:
        self.number = number
        self.start = start  # stream sample where the turn began
        self.offset = start  # stream sample of audio[0] (moves as the front is trimmed)
        self.announced = False  # its speech_started was sent
        self.audio = SampleBuffer(audio)
        self.total = len(audio)  # samples the turn ever held
        self.decoded = 0  # samples of `audio` the last decode saw
        self.closed = False
        self.dropped = False
        self.speech_windows = 0
        self.speech_end = start  # stream sample: the end of its last speech window
        self.agreement = LocalAgreement(commit_probability)
        self.text = ""  # the deltas sent, joined
        self.tail = ""

    @property
    def offset_s(self) -> float:
        return self.offset / SAMPLE_RATE

    def heard(self, probs: np.ndarray, first_sample: int, threshold: float) -> None:
        """Count the speech windows among `probs` (the first starts at `first_sample`)."""
        speech = np.flatnonzero(probs >= threshold)
        self.speech_windows += len(speech)
        if len(speech):
            self.speech_end = max(self.speech_end,
                                  first_sample + (int(speech[-1]) + 1) * WINDOW_SAMPLES)

    def add(self, samples: np.ndarray) -> None:
        self.audio.append(samples)
        self.total += len(samples)

    def end_at(self, sample: int) -> None:
        """The turn's audio ends at stream sample `sample`."""
        keep = max(0, sample - self.offset)
        self.total -= len(self.audio) - min(keep, len(self.audio))
        self.audio.truncate(keep)


def _discard(events: list[Event]) -> None:
    """A closed stream's events go nowhere."""


class LiveStream:
    def __init__(self, options: LiveOptions, detection: TurnDetection | None,
                 emit: Callable[[list[Event]], None],
                 wake: Callable[[], None] = lambda: None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.options = options
        self._clock = clock
        # (stream samples received after an append, when): how long audio has waited
        self._arrivals: deque[tuple[int, float]] = deque()
        self.detection = detection
        self._emit = emit
        self._wake = wake
        self._lock = threading.Lock()
        self._probability = SpeechProbability()
        self._detector = TurnDetector(detection) if detection else None
        self.received = 0  # samples appended, ever
        self._windows_done = 0  # samples the detector has seen whole windows of
        self._recent = SampleBuffer()  # the last PREROLL_S of the stream
        self._recent_start = 0
        self._since_commit = 0
        self._turns: deque[Turn] = deque()  # closed ones waiting for their text, then current
        self._current: Turn | None = None
        self._numbers = 0
        # committed words of all turns, with their turn's number
        self._said: deque[tuple[int, TimedWord]] = deque(maxlen=PROMPT_WORDS)
        self.busy = False  # an engine worker is updating it (the engine's lock guards this)
        self.closed = False
        # counters, for /health and the tests
        self.decodes = 0
        self.max_span_s = 0.0  # the most audio one decode saw
        self.decode_s = 0.0

    def detach(self) -> None:
        """Forget the owner's callback (the stream is closed; an update in flight emits
        into nothing). The owner holds the stream and the callback held the owner: a
        closed connection's buffers waited for the cycle collector, 35 MB each."""
        with self._lock:
            self._emit = _discard

    # --- the caller's side: audio in, commits, clears

    def configure(self, options: LiveOptions, detection: TurnDetection | None) -> None:
        with self._lock:
            self.options = options
            if detection != self.detection:
                self.detection = detection
                self._detector = TurnDetector(detection) if detection else None
                turn = self._current
                if self._detector is not None and turn is not None:
                    self._detector.in_speech = True  # the open turn continues until silence
                    if not turn.announced:  # its speech_stopped will need a speech_started
                        turn.announced = True
                        self._emit([SpeechStarted(turn.number,
                                                  turn.start * 1000 // SAMPLE_RATE)])

    def append(self, samples: np.ndarray) -> None:
        """16 kHz mono float32 samples."""
        samples = np.asarray(samples, np.float32)
        events: list[Event] = []
        with self._lock:
            start = self.received
            self.received += len(samples)
            self._arrived()
            self._since_commit += len(samples)
            self._recent.append(samples)
            probs = self._probability.feed(samples)
            first_window = self._windows_done
            self._windows_done += len(probs) * 512
            if self._detector is None:
                if self._current is None:
                    self._open(start, samples)
                else:
                    self._current.add(samples)
                assert self._current is not None
                self._current.heard(probs, first_window, SPEECH_PROBABILITY)
            else:
                if self._current is not None:
                    self._current.add(samples)
                threshold = self._detector.detection.threshold
                at = 0  # the first window not yet counted for a turn
                for b in self._detector.windows(probs, first_window):
                    if b.kind == "start":
                        turn = self._open(b.sample, self._recent_since(b.sample))
                        turn.announced = True
                        events.append(SpeechStarted(turn.number, b.sample * 1000 // SAMPLE_RATE))
                        at = b.window
                    elif self._current is not None:
                        turn = self._current
                        turn.heard(probs[at:b.window + 1], first_window + at * WINDOW_SAMPLES,
                                   threshold)
                        at = b.window + 1
                        turn.end_at(b.sample)
                        events += [SpeechStopped(turn.number, b.sample * 1000 // SAMPLE_RATE),
                                   *self._close()]
                if self._current is not None:
                    self._current.heard(probs[at:], first_window + at * WINDOW_SAMPLES,
                                        threshold)
            self._keep_recent()
            if events:
                self._emit(events)
        self._wake()

    def commit(self) -> bool:
        """End the current turn now (the client's commit); False: nothing to commit."""
        with self._lock:
            short = self._since_commit < MIN_COMMIT_S * SAMPLE_RATE
            # without turn detection any append opens the turn: the audio's length decides
            if short and (self._current is None or self._detector is None):
                return False
            if self._current is None:  # audio without speech: a turn that will say nothing
                self._open(self.received, np.zeros(0, np.float32))
            if self._detector is not None:
                self._detector.in_speech = False
            self._emit(self._close())
        self._wake()
        return True

    def clear(self) -> None:
        """Forget the audio of the open turn (closed turns still get their text)."""
        with self._lock:
            if self._current is not None:
                self._current.dropped = True
                self._turns.remove(self._current)
                self._current = None
            if self._detector is not None:
                self._detector.in_speech = False
            self._since_commit = 0

    @property
    def current_turn(self) -> int | None:
        with self._lock:
            return self._current.number if self._current else None

    def backlog_s(self) -> float:
        """Audio appended but not yet decoded."""
        with self._lock:
            return sum(len(t.audio) - t.decoded for t in self._turns) / SAMPLE_RATE

    def idle(self) -> bool:
        """Nothing waits for a decode: every closed turn has its text."""
        with self._lock:
            return not any(t.closed for t in self._turns)

    def _open(self, start: int, audio: np.ndarray) -> Turn:
        self._numbers += 1
        turn = Turn(self._numbers, start, audio, self.options.commit_probability)
        self._current = turn
        self._turns.append(turn)
        return turn

    def _close(self) -> list[Event]:
        assert self._current is not None
        turn, self._current = self._current, None
        turn.closed = True
        self._since_commit = 0
        return [Committed(turn.number)]

    def _arrived(self) -> None:
        """Note when the audio up to `received` came; forget what no turn waits on."""
        self._arrivals.append((self.received, self._clock()))
        first = (self._turns[0].offset + self._turns[0].decoded if self._turns
                 else self.received)
        while len(self._arrivals) > 1 and self._arrivals[0][0] <= first:
            self._arrivals.popleft()

    def _behind(self, sample: int, pending_s: float) -> bool:
        """Whether the audio from stream sample `sample` on (`pending_s` of it) came about
        as fast as it plays and has waited longer than a step. A client sending faster
        than real time is never behind: its updates keep their fixed points."""
        first = next((when for end, when in self._arrivals if end > sample), None)
        if first is None:
            return False
        came_over_s = self._arrivals[-1][1] - first
        return (self._clock() - first > self.options.max_step_s
                and came_over_s >= REAL_TIME_SHARE * pending_s)

    def _recent_since(self, sample: int) -> np.ndarray:
        return self._recent.view(max(0, sample - self._recent_start)).copy()

    def _keep_recent(self) -> None:
        extra = len(self._recent) - int(PREROLL_S * SAMPLE_RATE)
        if extra > SAMPLE_RATE:  # drop in whole seconds, not on every append
            self._recent.drop_front(extra)
            self._recent_start += extra

    # --- the engine's side: one decoding update

    def has_work(self) -> bool:
        with self._lock:
            if not self._turns:
                return False
            turn = self._turns[0]
            new = len(turn.audio) - turn.decoded
            return turn.closed or new >= self.options.min_step_s * SAMPLE_RATE

    def update_all(self, session: Any) -> int:
        """Run every update that is due, one after another on this thread (what a worker
        of the stream's own would do); how many ran. For a caller without an engine: a
        file decoded as fast as it goes, a test."""
        updates = 0
        while self.has_work():
            self.step(session)
            updates += 1
        return updates

    def step(self, session: Any) -> float:
        """Decode the first turn's audio once; the seconds of audio the decode saw."""
        with self._lock:
            if not self._turns:
                return 0.0
            turn = self._turns[0]
            if turn.closed and turn.speech_windows == 0:  # no speech: no decode, no text
                self._turns.popleft()
                self._emit(self._finish(turn))
                return 0.0
            n = len(turn.audio)
            if turn.speech_windows == 0:  # nobody spoke yet: no decode, keep a second
                turn.decoded = n
                self._cut(turn, turn.offset_s + (n / SAMPLE_RATE) - 1.0)
                return 0.0
            step = int(self.options.max_step_s * SAMPLE_RATE)
            behind = self._behind(turn.offset + turn.decoded, (n - turn.decoded) / SAMPLE_RATE)
            if behind:
                # more live streams than the workers keep up with: take all that waits,
                # up to a whole window, or the stream falls further behind at every step
                step = max(step, int(self.options.max_window_s * SAMPLE_RATE) - turn.decoded)
            target = min(n, turn.decoded + step)
            final = turn.closed and target == n
            # behind, closed turns waiting after this one are decoded with it, in one window
            group = self._waiting_turns() if final and behind else [turn]
            starts = np.cumsum([0] + [len(t.audio) for t in group[:-1]])
            window = np.concatenate([turn.audio.view(0, target)]
                                    + [t.audio.view(0, len(t.audio)) for t in group[1:]])
            offset_s = turn.offset_s
            # behind with turns waiting, their shared last decode is as cheap as an update:
            # full decoding (beams, fallback) would cost every stream waiting behind this
            # one about 30% more. One turn alone keeps it (greedy writes "you" into the
            # silence that ends a turn more often)
            thorough = final and not (len(group) > 1 and self.options.greedy_when_behind)
            audio_s = len(window) / SAMPLE_RATE
            options = self.options.transcribe_options(self._prompt(turn.number, offset_s),
                                                      thorough, audio_s)
            window_s = self.options.window_s(audio_s, final)
            # a last decode needs no window over the silence after its last turn's speech
            last = group[-1]
            speech_until = ((starts[-1] + last.speech_end - last.offset) / SAMPLE_RATE
                            if final else None)
        t0 = time.perf_counter()
        # a partial update decodes one window (one encoder pass), its newest words kept
        # where the full loop would decode them again from a second window
        result = session.transcribe(window, options, one_window=not final, window_s=window_s,
                                    speech_until_s=speech_until)
        elapsed = time.perf_counter() - t0
        heard = self._heard(result.segments, group, starts)
        segment_ends = [offset_s + s.end for s in result.segments]
        span = len(window) / SAMPLE_RATE
        with self._lock:
            self.decodes += 1
            self.decode_s += elapsed
            self.max_span_s = max(self.max_span_s, span)
            if turn.dropped:
                return span
            turn.decoded = target
            if not final:
                events = self._delta(turn, turn.agreement.insert(heard[0], False,
                                                                   offset_s + span))
                events += self._trim(turn, segment_ends, offset_s + span)
                events += self._tail(turn)
            else:
                events = []
                for t, words in zip(group, heard, strict=True):
                    t.decoded = len(t.audio)
                    events += self._delta(t, t.agreement.insert(words, True))
                    self._turns.popleft()
                    events += self._finish(t)
            self._emit(events)
        return span

    def _waiting_turns(self) -> list[Turn]:
        """The first turn and the closed turns with speech right after it, as many as fit
        in one window with it: a stream that fell behind live audio decodes them at once
        (one encoder pass for all), in order."""
        group, total = [self._turns[0]], len(self._turns[0].audio)
        for t in itertools.islice(self._turns, 1, None):
            total += len(t.audio)
            if not t.closed or t.speech_windows == 0 or \
                    total > self.options.max_window_s * SAMPLE_RATE:
                break
            group.append(t)
        return group

    @staticmethod
    def _heard(segments: Any, group: list[Turn], starts: np.ndarray) -> list[list[TimedWord]]:
        """Each turn's words of a decode over its turns' audio laid end to end (the turn
        of a word is where its middle is: alignment stretches a word over the silence
        before it, across the seam), in stream time. Dropped: a turn's last segments
        (their words in it) where they look hallucinated, and words that start more than
        AFTER_SPEECH_S after a turn's last speech."""
        pieces: list[list[list[Any]]] = [[] for _ in group]  # per turn, per segment
        for segment in segments:
            last = -1
            for w in segment.words or ():
                middle = (w.start + w.end) / 2 * SAMPLE_RATE
                i = max(0, int(np.searchsorted(starts, middle, "right")) - 1)
                if i != last:
                    pieces[i].append([])
                    last = i
                pieces[i][-1].append(w)
        heard: list[list[TimedWord]] = []
        for turn, turn_pieces, start in zip(group, pieces, starts, strict=True):
            while turn_pieces and hallucinated(turn_pieces[-1]):
                turn_pieces.pop()
            shift = turn.offset_s - start / SAMPLE_RATE
            heard.append([TimedWord(w.start + shift, w.end + shift, w.word, w.probability)
                          for piece in turn_pieces for w in piece
                          if w.start + shift <= turn.speech_end / SAMPLE_RATE + AFTER_SPEECH_S])
        return heard

    def fail(self, error: BaseException) -> None:
        """A decode raised: the turn it was for fails, the stream goes on."""
        if isinstance(error, UserError):  # a bad option of the caller's: one line
            log.warning("live decode failed: %s", error)
        else:
            log.exception("live decode failed", exc_info=error)
        with self._lock:
            if self._turns:
                turn = self._turns.popleft()
                if turn is self._current:
                    self._current = None
                # the client gets what it can act on; a fault of ours is in the log only
                message = str(error) if isinstance(error, UserError) else \
                    "the transcription failed: an internal error, logged by the server"
                self._emit([Failed(turn.number, message)])

    def _prompt(self, number: int, before_s: float) -> str:
        """The committed text before turn `number`'s buffer, after the client's prompt:
        every word of the earlier turns, and the turn's own words that end before its
        trimmed buffer (those in the buffer are decoded again). Earlier turns count whole
        whatever their times: the prefix padding makes a turn's audio begin before the
        last one's ended, and a prompt cut mid-sentence ("... can do for") makes Whisper
        finish the sentence instead of hearing the turn."""
        said = "".join(w.text for n, w in self._said
                       if n < number or w.end <= before_s + 0.01)
        said = said[-PROMPT_CHARS:]
        return " ".join(p for p in (self.options.prompt, said.strip()) if p)

    def _delta(self, turn: Turn, words: list[TimedWord]) -> list[Event]:
        if not words:
            return []
        self._said.extend((turn.number, w) for w in words)
        text = "".join(w.text for w in words)
        if not turn.text:
            text = text.lstrip()
        if not text:
            return []
        turn.text += text
        return [Delta(turn.number, text, tuple(words))]

    def _tail(self, turn: Turn) -> list[Event]:
        tail = turn.agreement.tail
        if not turn.text:
            tail = tail.lstrip()
        if tail == turn.tail:
            return []
        turn.tail = tail
        return [Tail(turn.number, tail)]

    def _finish(self, turn: Turn) -> list[Event]:
        events: list[Event] = [Tail(turn.number, "")] if turn.tail else []
        turn.tail = ""
        return [*events, Completed(turn.number, turn.text, turn.total / SAMPLE_RATE,
                                   tuple(turn.agreement.committed))]

    def _trim(self, turn: Turn, segment_ends: list[float], end_s: float) -> list[Event]:
        """Drop the front of the turn's audio that the next decode no longer needs, so no
        decode sees more than max_window_s (docs/realtime.md)."""
        opts = self.options
        events: list[Event] = []
        held_s = turn.decoded / SAMPLE_RATE
        committed_end = turn.agreement.committed_end
        cut: float | None = None
        if held_s > opts.trim_s and committed_end > turn.offset_s:
            ends = [e for e in segment_ends if e <= committed_end + 0.01]
            cut = max(ends) if ends else None
        kept_s = end_s - (turn.offset_s if cut is None else cut)
        if kept_s + opts.max_step_s > opts.max_window_s:  # no whole segment was committed
            events += self._delta(turn, turn.agreement.force(end_s - FORCE_KEEP_S))
            committed_end = turn.agreement.committed_end
            cut = committed_end if committed_end > turn.offset_s else end_s - FORCE_KEEP_S
        if cut is not None:
            self._cut(turn, cut)
        return events

    @staticmethod
    def _cut(turn: Turn, at_s: float) -> None:
        n = min(turn.decoded, max(0, round((at_s - turn.offset_s) * SAMPLE_RATE)))
        turn.audio.drop_front(n)
        turn.offset += n
        turn.decoded -= n

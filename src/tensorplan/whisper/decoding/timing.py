"""Word-level timestamps from cross-attention and dynamic time warping (openai-whisper's timing.py).

The teacher-forced decoder's alignment heads attend from each text token to the audio it
transcribes; DTW turns those attention maps into a monotone token → time path, and each
word starts where the path enters its first token. The heuristics that follow are openai's.

Guarantee on top of openai (whisper.cpp users report words running backwards): word times
are monotone. Within a transcription every word has start <= end, starts no earlier than
the previous word ends (across segments and windows), and lies inside its segment, whose
bounds become its first word's start and last word's end. See `make_monotone` for the rule.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from tensorplan.errors import UserError
from tensorplan.whisper.audio.constants import FRAMES_PER_SECOND, INPUT_STRIDE
from tensorplan.whisper.decoding.seek_loop import WindowSegments
from tensorplan.whisper.options import (
    TranscribeOptions,
)
from tensorplan.whisper.result import Segment, Word, scored_words

if TYPE_CHECKING:
    from tensorplan.whisper.planned.session import Alignment
    from tensorplan.whisper.tokenizer import Tokenizer

TOKENS_PER_SECOND = FRAMES_PER_SECOND // INPUT_STRIDE  # encoder positions a second: 50
MEDIAN_FILTER_WIDTH = 7
SENTENCE_END_MARKS = ".。!！?？"


class AligningModel(Protocol):
    tokenizer: Tokenizer

    def align(self, tokens: Sequence[int], rows: Sequence[int]) -> Alignment:
        """Teacher-force `tokens` over the encoded window: alignment heads' pre-softmax
        cross-attention scores (n_heads, len(tokens), n_audio_ctx), logits of `rows`."""
        ...


@dataclass(frozen=True, slots=True)
class WordTiming:
    """A word as aligned: times in seconds from the start of the window."""

    word: str
    tokens: tuple[int, ...]
    start: float
    end: float
    probability: float


# ---- steps 3-8: attention → matrix → DTW path ---------------------------------------------
def median_filter(x: np.ndarray, width: int) -> np.ndarray:
    """Median of each `width` window along the last axis, reflect-padded (numpy "reflect",
    torch's reflect: the edge sample is not repeated; scipy calls it "mirror")."""
    if width <= 0 or width % 2 == 0:
        raise ValueError(f"median filter width must be odd and positive, got {width}")
    pad = width // 2
    if x.shape[-1] <= pad:  # too short to reflect: openai leaves it unfiltered
        return x
    padded = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(pad, pad)], mode="reflect")
    windows = sliding_window_view(padded, width, axis=-1)
    median: np.ndarray = np.partition(windows, pad, axis=-1)[..., pad]
    return median


def alignment_matrix(scores: np.ndarray, num_frames: int, n_sot: int,
                     medfilt_width: int = MEDIAN_FILTER_WIDTH) -> np.ndarray:
    """scores (n_heads, n_tokens, n_audio_ctx) of sot_sequence + [notimestamps] + text + [eot]
    → (n_text + 1, num_frames // 2): per-token attention over the audio, higher = aligned.

    The softmax covers only the audio positions of real content; standardising each head
    over the tokens removes the columns every token attends to (silence sinks), and the
    median filter removes single-frame spikes before the heads are averaged."""
    weights = scores[:, :, : num_frames // 2].astype(np.float32)
    weights = np.exp(weights - weights.max(axis=-1, keepdims=True))
    weights /= weights.sum(axis=-1, keepdims=True)
    mean = weights.mean(axis=-2, keepdims=True)
    std = weights.std(axis=-2, keepdims=True)  # population std, as torch's unbiased=False
    # a frame every token weighs alike (std 0) gives NaN, silently, as openai's torch does
    with np.errstate(divide="ignore", invalid="ignore"):
        weights = (weights - mean) / std
    weights = np.stack([median_filter(head, medfilt_width) for head in weights])
    # rows from the <|notimestamps|> position (it predicts the first text token) up to the
    # last text token (it predicts eot); the eot row itself predicts nothing
    matrix: np.ndarray = weights.mean(axis=0)[n_sot:-1]
    return matrix


def dtw(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The cheapest monotone path through cost (N, M) from (0, 0) to (N-1, M-1), moving
    diagonally, down (next row, same column) or right. Returns (row indices, column
    indices) along the path.

    Ties resolve as openai's `dtw_cpu` does (diagonal, then down, only when strictly
    cheaper; otherwise right) and the running cost is float32 as there, so the path is the
    same. Cells on one anti-diagonal depend only on the two before it, so each anti-diagonal
    is one vectorised step: N + M numpy steps instead of N·M Python ones."""
    x = np.asarray(cost, dtype=np.float64)
    n, m = x.shape
    acc = np.full((n + 1, m + 1), np.inf, dtype=np.float32)
    acc[0, 0] = 0
    trace = np.full((n + 1, m + 1), -1, dtype=np.int8)
    for d in range(2, n + m + 1):
        i = np.arange(max(1, d - m), min(n, d - 1) + 1)
        j = d - i
        c0, c1, c2 = acc[i - 1, j - 1], acc[i - 1, j], acc[i, j - 1]
        diagonal = (c0 < c1) & (c0 < c2)
        down = ~diagonal & (c1 < c0) & (c1 < c2)
        acc[i, j] = x[i - 1, j - 1] + np.where(diagonal, c0, np.where(down, c1, c2))
        trace[i, j] = np.where(diagonal, 0, np.where(down, 1, 2))
    return backtrace(trace)


def backtrace(trace: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Walk trace (N+1, M+1) (0 diagonal, 1 down, 2 right) back from the last cell."""
    trace = trace.copy()
    trace[0, :] = 2  # the borders lead back to (0, 0)
    trace[:, 0] = 1
    i, j = trace.shape[0] - 1, trace.shape[1] - 1
    path = []
    while i > 0 or j > 0:
        path.append((i - 1, j - 1))
        step = trace[i, j]
        if step == 0:
            i, j = i - 1, j - 1
        elif step == 1:
            i -= 1
        elif step == 2:
            j -= 1
        else:
            raise ValueError(f"unexpected trace value {step} at ({i}, {j})")
    rows, cols = np.array(path[::-1]).T
    return rows, cols


# ---- steps 1-2 and 8-9: one window's tokens → word timings ---------------------------------
def find_alignment(model: AligningModel, text_tokens: Sequence[int], num_frames: int, *,
                   language: str | None, task: str = "transcribe",
                   medfilt_width: int = MEDIAN_FILTER_WIDTH) -> list[WordTiming]:
    """Align a window's text tokens (no timestamps) with the audio the model has encoded.
    num_frames: mel frames of real audio in the window (the rest is padding)."""
    if not text_tokens or num_frames < 2:  # nothing to align, or no audio position to align to
        return []
    tokenizer = model.tokenizer
    sot = tokenizer.sot_sequence(language, task)
    tokens = [*sot, tokenizer.no_timestamps, *text_tokens, tokenizer.eot]
    # position p's logits predict token p + 1: text token k is predicted at len(sot) + k
    alignment = model.align(tokens, range(len(sot), len(sot) + len(text_tokens)))
    matrix = alignment_matrix(alignment.scores, num_frames, len(sot), medfilt_width)
    text_indices, time_indices = dtw(-matrix)
    probs = token_probabilities(alignment.logits, text_tokens, tokenizer.eot)
    return word_timings(tokenizer, text_tokens, language, text_indices, time_indices, probs)


def token_probabilities(logits: np.ndarray, text_tokens: Sequence[int], eot: int) -> np.ndarray:
    """Each token's probability under a softmax over the text vocabulary (ids < eot)."""
    text = logits[:, :eot].astype(np.float64)
    text = np.exp(text - text.max(axis=-1, keepdims=True))
    probs: np.ndarray = text[np.arange(len(text_tokens)), list(text_tokens)] / text.sum(axis=-1)
    return probs


def word_timings(tokenizer: Tokenizer, text_tokens: Sequence[int], language: str | None,
                 text_indices: np.ndarray, time_indices: np.ndarray,
                 token_probs: np.ndarray) -> list[WordTiming]:
    """Cut the DTW path into words: a token starts where the path first reaches its row."""
    words, word_tokens = tokenizer.split_to_word_tokens([*text_tokens, tokenizer.eot], language)
    if len(word_tokens) <= 1:  # eot alone
        return []
    boundaries = np.pad(np.cumsum([len(t) for t in word_tokens[:-1]]), (1, 0))
    jumps = np.pad(np.diff(text_indices), (1, 0), constant_values=1).astype(bool)
    jump_times = time_indices[jumps] / TOKENS_PER_SECOND
    return [WordTiming(word, tuple(tokens), float(jump_times[a]), float(jump_times[b]),
                       float(np.mean(token_probs[a:b])))
            for word, tokens, a, b in zip(words, word_tokens, boundaries[:-1], boundaries[1:],
                                          strict=False)]


# ---- step 10: openai's heuristics -------------------------------------------------------------
def median_word_duration(alignment: Sequence[WordTiming]) -> float:
    """Median of the non-zero word durations, capped at 0.7 s (0 when there are none)."""
    durations = np.array([t.end - t.start for t in alignment])
    durations = durations[durations.nonzero()]
    return min(0.7, float(np.median(durations))) if len(durations) else 0.0


def clamp_sentence_ends(alignment: Sequence[WordTiming], max_duration: float
                        ) -> list[WordTiming]:
    """A sentence mark, or the word after one, may not last longer than `max_duration`: DTW
    tends to stretch them over the pause between sentences."""
    out = list(alignment)
    for i in range(1, len(out)):
        t = out[i]
        if t.end - t.start > max_duration:
            if t.word in SENTENCE_END_MARKS:
                out[i] = dataclasses.replace(t, end=t.start + max_duration)
            elif out[i - 1].word in SENTENCE_END_MARKS:
                out[i] = dataclasses.replace(t, start=t.end - max_duration)
    return out


def merge_punctuations(alignment: Sequence[WordTiming], prepended: str, appended: str
                       ) -> list[WordTiming]:
    """Attach opening punctuation to the following word and closing punctuation to the
    previous one; the absorbed entry stays with no text and no tokens (and the kept word
    keeps its own times), as in openai."""
    out = list(alignment)
    i, j = len(out) - 2, len(out) - 1
    while i >= 0:
        previous, following = out[i], out[j]
        if previous.word.startswith(" ") and previous.word.strip() in prepended:
            out[j] = dataclasses.replace(following, word=previous.word + following.word,
                                         tokens=previous.tokens + following.tokens)
            out[i] = dataclasses.replace(previous, word="", tokens=())
        else:
            j = i
        i -= 1
    i, j = 0, 1
    while j < len(out):
        previous, following = out[i], out[j]
        if not previous.word.endswith(" ") and following.word in appended:
            out[i] = dataclasses.replace(previous, word=previous.word + following.word,
                                         tokens=previous.tokens + following.tokens)
            out[j] = dataclasses.replace(following, word="", tokens=())
        else:
            i = j
        j += 1
    return out


def assign_words(segments: Sequence[Segment], alignment: Sequence[WordTiming], eot: int,
                 time_offset: float, median_duration: float, last_speech_timestamp: float
                 ) -> list[Segment]:
    """Give each segment the words its text tokens made, in absolute seconds, and reconcile
    its first and last words with its own timestamps (openai's ±0.5 s rules)."""
    max_duration = 2 * median_duration
    out = []
    index = 0
    for segment in segments:
        n_tokens = sum(1 for t in segment.tokens if t < eot)
        saved = 0
        words: list[Word] = []
        while index < len(alignment) and saved < n_tokens:
            t = alignment[index]
            if t.word:
                words.append(Word(t.word, round(time_offset + t.start, 2),
                                  round(time_offset + t.end, 2), t.probability))
            saved += len(t.tokens)
            index += 1
        if words:
            words = _shorten_after_pause(words, last_speech_timestamp, median_duration,
                                         max_duration)
            segment, words = _reconcile_bounds(segment, words, median_duration)
            last_speech_timestamp = segment.end
        out.append(dataclasses.replace(segment, words=tuple(words)))
    return out


def _shorten_after_pause(words: list[Word], last_speech_timestamp: float,
                         median_duration: float, max_duration: float) -> list[Word]:
    """After a long pause DTW lets the first word (or two) soak up the silence before it:
    cut them to `max_duration` each."""
    first = words[0]
    if first.end - last_speech_timestamp > median_duration * 4 and (
            first.end - first.start > max_duration
            or (len(words) > 1 and words[1].end - first.start > max_duration * 2)):
        words = list(words)
        if len(words) > 1 and words[1].end - words[1].start > max_duration:
            # openai's boundary; the `/ 2` of an absolute time only matters near 0 s
            boundary = max(words[1].end / 2, words[1].end - max_duration)
            words[0] = dataclasses.replace(words[0], end=boundary)
            words[1] = dataclasses.replace(words[1], start=boundary)
        words[0] = dataclasses.replace(words[0], start=max(0.0, words[0].end - max_duration))
    return words


def _reconcile_bounds(segment: Segment, words: list[Word], median_duration: float
                      ) -> tuple[Segment, list[Word]]:
    """Trust the segment's own timestamp over a first (last) word that starts (ends) more
    than 0.5 s outside it; otherwise the segment takes the word's time."""
    words = list(words)
    first = words[0]
    if segment.start < first.end and segment.start - 0.5 > first.start:
        start = max(0.0, min(first.end - median_duration, segment.start))
        words[0] = dataclasses.replace(first, start=start)
    else:
        segment = dataclasses.replace(segment, start=first.start)
    last = words[-1]
    if segment.end > last.start and segment.end + 0.5 < last.end:
        words[-1] = dataclasses.replace(last, end=max(last.start + median_duration, segment.end))
    else:
        segment = dataclasses.replace(segment, end=last.end)
    return segment, words


# ---- our guarantee: monotone word times -------------------------------------------------------
def make_monotone(segments: Sequence[Segment], floor: float) -> tuple[list[Segment], float]:
    """Repair word times so they never run backwards; returns the segments and the new floor.

    floor: the end of the last word already emitted (0 at the start of a transcription).

    DTW's own word boundaries are shared (one word ends where the next starts); overlaps
    come only from the heuristics above, which can push a word's edge past its neighbour's
    (by at most twice the median word duration, <= 1.4 s), and from a window whose first
    word reaches back before the previous window's last. The rule:
    1. where a word ends after the next word starts, its end is cut back to that start
       (not before its own start): the later word's start is the DTW jump or a segment
       timestamp, better evidence than a lengthened end;
    2. in order, every start is raised to the previous word's end (the floor), every end to
       its own start;
    3. a segment with words spans them exactly; one without words is moved to the floor,
       and one that has text (so will be emitted) raises the floor to its end.
    """
    words = [w for s in segments for w in (s.words or ())]
    for i in range(len(words) - 1):
        if words[i].end > words[i + 1].start:
            words[i] = dataclasses.replace(words[i], end=max(words[i].start, words[i + 1].start))
    out = []
    index = 0
    for segment in segments:
        if segment.words:
            fixed = []
            for w in words[index:index + len(segment.words)]:
                start = max(w.start, floor)
                floor = max(w.end, start)
                fixed.append(dataclasses.replace(w, start=start, end=floor))
            index += len(fixed)
            out.append(dataclasses.replace(segment, start=fixed[0].start, end=fixed[-1].end,
                                           words=tuple(fixed)))
        else:
            start = max(segment.start, floor)
            segment = dataclasses.replace(segment, start=start, end=max(segment.end, start))
            if segment.text.strip():
                floor = segment.end
            out.append(segment)
    return out, floor


# ---- hallucination_silence_threshold (openai transcribe.py) -----------------------------------
def is_segment_anomaly(segment: Segment | None) -> bool:
    """Whether the segment's first 8 words (punctuation aside) look hallucinated."""
    if segment is None or not segment.words:
        return False
    words = scored_words(segment.words)
    score = sum(w.anomaly_score() for w in words)
    return score >= 3 or score + 0.01 >= len(words)


def next_words_segment(segments: Sequence[Segment]) -> Segment | None:
    return next((s for s in segments if s.words), None)


def get_end(segments: Sequence[Segment]) -> float | None:
    """The last word's end, else the last segment's end, else None."""
    return next((w.end for s in reversed(segments) for w in reversed(s.words or ())),
                segments[-1].end if segments else None)


# ---- the transcribe loop's Aligner -------------------------------------------------------------
class WordAligner:
    """Word timestamps for each window of a transcription (`transcribe.Aligner`).

    Follows openai transcribe.py's word_timestamps branch: align the window's segments, seek
    to the last word's end unless the window ended on a lone timestamp, and with
    `hallucination_silence_threshold` drop anomalous segments surrounded by silence and seek
    past them. Words and segments then pass through `make_monotone`.

    Keeps state from one window to the next (the last speech and the last word's end):
    use one WordAligner per transcription.
    """

    def __init__(self, model: AligningModel, options: TranscribeOptions) -> None:
        config = getattr(model, "config", None)
        if config is not None and not config.alignment_heads:  # nothing to align with
            raise UserError("word timestamps need alignment heads, and this model's "
                            "config.json lists none (alignment_heads: [])")
        self.model, self.options = model, options
        self.last_speech_timestamp = 0.0  # openai's: where speech last ended, for the pause rule
        self.floor = 0.0  # end of the last word emitted: no later word starts before it

    def __call__(self, decoded: WindowSegments) -> WindowSegments:
        decoded = dataclasses.replace(decoded, segments=tuple(self.add_word_timestamps(decoded)))
        decoded, skipped = self.reseek(decoded)
        if not skipped and (end := get_end(decoded.segments)) is not None:
            self.last_speech_timestamp = end
        segments, self.floor = make_monotone(decoded.segments, self.floor)
        # the loop must move on, even where openai's rules would seek back to this window
        next_seek = max(decoded.next_seek, decoded.window.seek + 1)
        return dataclasses.replace(decoded, segments=tuple(segments), next_seek=next_seek)

    def add_word_timestamps(self, decoded: WindowSegments) -> list[Segment]:
        """The window's segments with words (openai's add_word_timestamps)."""
        segments = decoded.segments
        if not segments:
            return []
        eot = self.model.tokenizer.eot
        text_tokens = [t for s in segments for t in s.tokens if t < eot]
        alignment = find_alignment(self.model, text_tokens, decoded.window.n_frames,
                                   language=decoded.result.language, task=self.options.task)
        median = median_word_duration(alignment)
        if median > 0:
            alignment = clamp_sentence_ends(alignment, 2 * median)
        alignment = merge_punctuations(alignment, self.options.prepend_punctuations,
                                       self.options.append_punctuations)
        return assign_words(segments, alignment, eot, decoded.window.time_offset, median,
                            self.last_speech_timestamp)

    def reseek(self, decoded: WindowSegments) -> tuple[WindowSegments, bool]:
        """Move the next seek to the last word's end and skip hallucinations; True when the
        whole window is skipped (openai's `continue`)."""
        window, seek = decoded.window, decoded.next_seek
        end = get_end(decoded.segments)
        if decoded.single_timestamp_ending or end is None or end <= window.time_offset:
            end = None  # the seek stays where the segments put it
        else:
            seek = round(end * FRAMES_PER_SECOND)
        threshold = self.options.hallucination_silence_threshold
        if threshold is None:
            return dataclasses.replace(decoded, next_seek=seek), False
        if end is not None and window.end_time - end <= threshold:
            seek = window.seek + window.n_frames  # too little left after the last word to redo
        first = next_words_segment(decoded.segments)
        if first is not None and is_segment_anomaly(first):
            gap = first.start - window.time_offset
            if gap > threshold:  # skip the leading silence and decode again from there
                seek = window.seek + round(gap * FRAMES_PER_SECOND)
                return dataclasses.replace(decoded, segments=(), next_seek=seek), True
        kept, seek = self.drop_hallucination(decoded, seek, threshold)
        return dataclasses.replace(decoded, segments=kept, next_seek=seek), False

    def drop_hallucination(self, decoded: WindowSegments, seek: int, threshold: float
                           ) -> tuple[tuple[Segment, ...], int]:
        """Cut the segments at the first anomalous one with silence (or more anomalies) on
        both sides, and seek to it; a hallucination ending the audio ends the transcription."""
        window, segments = decoded.window, decoded.segments
        time_offset = window.time_offset
        window_end_time = window.end_time
        last_end = self.last_speech_timestamp
        for i, segment in enumerate(segments):
            if not segment.words:
                continue
            if is_segment_anomaly(segment):
                following = next_words_segment(segments[i + 1:])
                next_start = (following.words[0].start if following and following.words
                              else time_offset + window.duration)
                silence_before = (segment.start - last_end > threshold
                                  or segment.start < threshold
                                  or segment.start - time_offset < 2.0)
                silence_after = (next_start - segment.end > threshold
                                 or is_segment_anomaly(following)
                                 or window_end_time - segment.end < 2.0)
                if silence_before and silence_after:
                    seek = round(max(time_offset + 1, segment.start) * FRAMES_PER_SECOND)
                    if decoded.content_frames / FRAMES_PER_SECOND - segment.end < threshold:
                        seek = decoded.content_frames
                    return segments[:i], seek
            last_end = segment.end
        return segments, seek

"""Transcribe long audio: decode 30-second windows one after another (as openai-whisper's
transcribe.py does).

`SeekLoop` walks a seek position (in mel frames, 100 per second) through the audio. Each
step encodes one window, decodes it with temperature fallback, skips it if silent, cuts the
tokens into segments at timestamp pairs, and moves the seek to where the transcript stopped.
Word timestamps plug in through an optional `Aligner` that sees each window's segments.

Choices where implementations differ:
- When every temperature fails, keep the result with the best avg_logprob among those that
  passed the compression test (or among all), as faster-whisper does; openai keeps the last,
  which comes from the hottest, least reliable temperature. The prompt is then reset as if
  the window had been decoded at the last temperature tried (also faster-whisper's rule).
- Segments with no text or zero length are dropped (faster-whisper); openai keeps them blank.
- `prefix` applies to the first window only (faster-whisper); openai repeats it every window.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from tensorplan.errors import UserError
from tensorplan.whisper.audio.constants import (
    FRAMES_PER_SECOND,
    INPUT_STRIDE,
    N_FRAMES,
    TIME_PRECISION,
)
from tensorplan.whisper.decoding.window import (
    DecodingResult,
    DecodingSession,
    decode,
    detect_language,
)
from tensorplan.whisper.options import TranscribeOptions, clip_spans
from tensorplan.whisper.result import Segment, TranscriptionResult
from tensorplan.whisper.tokenizer import to_language_code


class WindowSource(Protocol):
    """Log-mel frames that are computed (or loaded) a window at a time."""

    @property
    def n_frames(self) -> int:
        """Frames of audio content, without the 30 s of padding a full mel array carries."""
        ...

    def window(self, seek: int, n: int) -> np.ndarray:
        """Frames [seek, seek + n), shape = (n_mels, n), normalized log-mel."""
        ...


@dataclass(frozen=True, slots=True)
class Window:
    """One window (30 s, or fewer on a narrowed model) as the model encoded it."""

    seek: int  # first mel frame
    n_frames: int  # frames of audio in it; the rest of `mel` is zero padding
    mel: np.ndarray  # (n_mels, window frames) float32

    @property
    def time_offset(self) -> float:
        return self.seek / FRAMES_PER_SECOND

    @property
    def duration(self) -> float:
        return self.n_frames / FRAMES_PER_SECOND

    @property
    def end_time(self) -> float:
        """Where the window ends, its padding included."""
        return (self.seek + int(self.mel.shape[1])) / FRAMES_PER_SECOND


@dataclass(frozen=True, slots=True)
class WindowSegments:
    """A decoded window cut into segments, and where the next window starts."""

    window: Window
    result: DecodingResult
    segments: tuple[Segment, ...]
    next_seek: int
    single_timestamp_ending: bool  # no speech after the last timestamp: seek a whole window
    content_frames: int  # frames of audio in the whole input: where the loop stops


class Aligner(Protocol):
    """Adds word timestamps to a window's segments while the model still holds that window;
    may move `next_seek` (to the last word's end) and drop segments (hallucinations)."""

    def __call__(self, decoded: WindowSegments) -> WindowSegments: ...


SegmentCallback = Callable[[Segment], None]
ProgressCallback = Callable[[int, int], None]  # (frames done, frames in total)


def transcribe(model: DecodingSession, mel: np.ndarray | WindowSource,
               options: TranscribeOptions | None = None, *,
               on_segment: SegmentCallback | None = None,
               progress: ProgressCallback | None = None,
               aligner: Aligner | None = None,
               one_window: bool = False,
               speech_until_s: float | None = None) -> TranscriptionResult:
    """Transcribe audio of any length.

    mel : a log-mel array, shape = (n_mels, n_frames), computed from the audio followed by 30 s
        of zero samples (as openai-whisper does; the last 3000 frames are padding), or a
        `MelFrames` that makes windows on demand.
    on_segment : called with each segment as soon as it is final.
    progress : called after each window with (frames done, frames in total).
    aligner : required for `options.word_timestamps` (see `Aligner`).
    one_window : decode the first window only, its unfinished last segment kept (see
        `SeekLoop`).
    speech_until_s : where the audio's speech ends, as the caller's voice activity
        detection heard it: no window after the first starts there or later (`SeekLoop`).
    """
    frames = PaddedMel(mel) if isinstance(mel, np.ndarray) else mel
    loop = SeekLoop(model, frames, options or TranscribeOptions(), aligner=aligner,
                    on_segment=on_segment, progress=progress, one_window=one_window,
                    speech_until_s=speech_until_s)
    return loop.run()


class PaddedMel:
    """A whole mel array whose last 3000 frames are the padding of 30 s of zeros."""

    def __init__(self, mel: np.ndarray):
        if mel.ndim != 2 or mel.shape[1] < N_FRAMES:
            raise ValueError(f"expected a mel of shape (n_mels, >= {N_FRAMES}), got {mel.shape}")
        self.mel = mel
        self.n_frames = mel.shape[1] - N_FRAMES

    def window(self, seek: int, n: int) -> np.ndarray:
        return self.mel[:, seek:seek + n]


class SeekLoop:
    """The state of one transcription: seek position, emitted tokens and segments.

    `one_window`: only the first window is decoded, and a transcript that stops after its
    last timestamp pair keeps the text after it as one more segment (`with_tail`), where
    the full loop drops it and decodes it again from the next window: one encoder pass,
    for a caller that decodes the same audio again soon (a live stream's partial
    update, whose words are committed only when the next update agrees).

    `speech_until_s`: where the audio's speech ends (the caller's voice activity
    detection); no window after the first starts there or later. Whisper often ends a
    window with a timestamp pair at the last word, and the full loop then decodes the
    silence after it as a window of its own: in a live turn's last decode that cost an
    encoder pass and a beam search (some with every fallback temperature) for "Thank
    you." or dots, which the stream dropped anyway."""

    def __init__(self, model: DecodingSession, frames: WindowSource, options: TranscribeOptions, *,
                 aligner: Aligner | None = None, on_segment: SegmentCallback | None = None,
                 progress: ProgressCallback | None = None, one_window: bool = False,
                 speech_until_s: float | None = None):
        if options.word_timestamps and aligner is None:
            raise UserError("word_timestamps needs an aligner for word-level timing")
        self.model, self.frames, self.aligner = model, frames, aligner
        self.one_window = one_window
        # no window after the first starts at this frame or later
        self.last_start = (float("inf") if speech_until_s is None
                           else speech_until_s * FRAMES_PER_SECOND)
        self.encoded: tuple[int, int] | None = None  # (seek, frames) the model holds now
        self.on_segment, self.progress = on_segment, progress
        self.tokenizer = model.tokenizer
        self.content_frames = frames.n_frames
        # mel frames per window: 3000, or fewer on a narrowed model (planned/model.py)
        self.window_frames = INPUT_STRIDE * model.dims.n_audio_ctx
        self.language, self.language_probs = self._language(options)
        self.options = dataclasses.replace(options, language=self.language)
        n_prompt = model.dims.n_text_ctx // 2 - 1  # prompt tokens the decoder can take
        self.initial_prompt_tokens: list[int] = (
            self.tokenizer.encode(" " + options.initial_prompt.strip())
            if options.initial_prompt else [])
        self.carried_prompt_room = max(0, n_prompt - len(self.initial_prompt_tokens))
        self.all_tokens: list[int] = list(self.initial_prompt_tokens)  # the prompt's source
        self.prompt_reset_since = 0  # all_tokens before this index no longer prompt
        self.segments: list[Segment] = []
        self.n_windows = 0

    def run(self) -> TranscriptionResult:
        seek = 0
        for clip_start, clip_end in self.clips():
            seek = max(seek, clip_start)
            while seek < clip_end and not (self.n_windows and (
                    self.one_window or seek >= self.last_start)):
                seek = self.step(seek, clip_end)
                if self.progress:
                    self.progress(min(seek, self.content_frames), self.content_frames)
        text_tokens = [t for s in self.segments for t in s.tokens]
        return TranscriptionResult(text=self.tokenizer.decode(text_tokens),
                                   segments=tuple(self.segments), language=self.language,
                                   language_probs=self.language_probs)

    def step(self, seek: int, clip_end: int) -> int:
        """Transcribe the window at `seek`; return the next seek."""
        window = self.encode(seek, min(self.window_frames, self.content_frames - seek,
                                       clip_end - seek))
        prefix = self.options.prefix if self.n_windows == 0 else None
        self.n_windows += 1
        result, temperature = self.decode_with_fallback(self.prompt(), prefix)
        if self.is_silence(result):
            return seek + window.n_frames
        decoded = self.split_segments(window, result)
        if self.one_window:
            decoded = self.with_tail(decoded)
        if self.aligner is not None:
            decoded = self.aligner(decoded)
        self.emit(decoded.segments, temperature)
        return decoded.next_seek

    # ---- the named steps ------------------------------------------------------------------
    def clips(self) -> list[tuple[int, int]]:
        """(start, end) frame ranges to transcribe, from clip_timestamps (default: all)."""
        points = [round(t * FRAMES_PER_SECOND) for t in self.options.clip_timestamps]
        return clip_spans(points, self.content_frames)

    def window(self, seek: int, n_frames: int) -> Window:
        """Frames [seek, seek + n_frames) zero-padded (in the normalized domain) to a
        window (3000 frames)."""
        frames = self.frames.window(seek, n_frames)
        mel = np.zeros((frames.shape[0], self.window_frames), dtype=np.float32)
        mel[:, :n_frames] = frames
        return Window(seek, n_frames, mel)

    def prompt(self) -> list[int]:
        """The previous text (timestamps included) that conditions the next window."""
        if not self.options.carry_initial_prompt:
            return self.all_tokens[self.prompt_reset_since:]
        since = max(len(self.initial_prompt_tokens), self.prompt_reset_since)
        carried = self.all_tokens[since:]
        return self.initial_prompt_tokens + carried[max(0, len(carried)
                                                        - self.carried_prompt_room):]

    def decode_with_fallback(self, prompt: Sequence[int], prefix: str | None
                             ) -> tuple[DecodingResult, float]:
        """Decode at each temperature in turn until the result is acceptable (or silent).
        Returns the result and the temperature that counts for the prompt reset."""
        temperatures = self.options.temperature
        results: list[DecodingResult] = []
        for temperature in temperatures:
            result = decode(self.model, self.options.decoding(temperature, prompt, prefix))
            if self.is_silence(result) or not (self.too_repetitive(result)
                                               or self.too_improbable(result)):
                return result, temperature
            results.append(result)
        passed = [r for r in results if not self.too_repetitive(r)] or results
        return max(passed, key=lambda r: r.avg_logprob), temperatures[-1]

    def too_repetitive(self, result: DecodingResult) -> bool:
        threshold = self.options.compression_ratio_threshold
        return threshold is not None and result.compression_ratio > threshold

    def too_improbable(self, result: DecodingResult) -> bool:
        threshold = self.options.logprob_threshold
        return threshold is not None and result.avg_logprob < threshold

    def is_silence(self, result: DecodingResult) -> bool:
        """No speech is likely, and the text is not confident enough to overrule that."""
        threshold = self.options.no_speech_threshold
        if threshold is None or not result.no_speech_prob > threshold:
            return False
        logprob_threshold = self.options.logprob_threshold
        return logprob_threshold is None or not result.avg_logprob > logprob_threshold

    def split_segments(self, window: Window, result: DecodingResult) -> WindowSegments:
        """Cut the tokens after each pair of adjacent timestamps. An unfinished last segment
        is dropped and the next window starts at its timestamp; a transcript that ends with a
        lone timestamp, or has no pair, uses the whole window."""
        tokens = list(result.tokens)
        ts_begin = self.tokenizer.timestamp_begin
        is_ts = [t >= ts_begin for t in tokens]
        single_ending = is_ts[-2:] == [False, True]
        cuts = [i + 1 for i in range(len(tokens) - 1) if is_ts[i] and is_ts[i + 1]]

        def at(token: int) -> float:
            return window.time_offset + (token - ts_begin) * TIME_PRECISION

        if not cuts:
            timestamps = [t for t in tokens if t >= ts_begin]
            end = at(timestamps[-1]) if timestamps and timestamps[-1] != ts_begin \
                else window.time_offset + window.duration
            segments = [self.segment(window, result, window.time_offset, end, tokens)]
            next_seek = window.seek + window.n_frames
        else:
            if single_ending:
                cuts.append(len(tokens))
            pieces = [tokens[a:b] for a, b in zip([0, *cuts], cuts, strict=False)]
            segments = [self.segment(window, result, at(p[0]), at(p[-1]), p) for p in pieces]
            next_seek = window.seek + (window.n_frames if single_ending else
                                       (tokens[cuts[-1] - 1] - ts_begin) * INPUT_STRIDE)
        return WindowSegments(window, result, tuple(segments), next_seek, single_ending,
                              self.content_frames)

    def segment(self, window: Window, result: DecodingResult, start: float, end: float,
                tokens: Sequence[int]) -> Segment:
        # A timestamp token may point past the audio in the last window (the model sees
        # zero padding there); no segment may end after the audio it transcribes.
        limit = window.time_offset + window.duration
        start, end = min(start, limit), min(end, limit)
        return Segment(id=-1, seek=window.seek, start=start, end=end,
                       text=self.tokenizer.decode(tokens), tokens=tuple(tokens),
                       temperature=result.temperature, avg_logprob=result.avg_logprob,
                       compression_ratio=result.compression_ratio,
                       no_speech_prob=result.no_speech_prob)

    def with_tail(self, decoded: WindowSegments) -> WindowSegments:
        """The segments, and the text after the last timestamp pair as one more segment up
        to the window's end: the full loop seeks back to decode such an unfinished segment
        again in the next window, which a caller decoding one window never has (a live
        update's newest words; a batched chunk's last sentence, which often ends in eot
        without its closing timestamp)."""
        tokens, window = list(decoded.result.tokens), decoded.window
        ts_begin = self.tokenizer.timestamp_begin
        used = sum(len(s.tokens) for s in decoded.segments)
        pairs = [i for i in range(len(tokens) - 1) if tokens[i] >= ts_begin <= tokens[i + 1]]
        if not pairs or decoded.single_timestamp_ending:
            return decoded  # the whole window is in the segments already
        tail = tokens[pairs[-1] + 1 :]
        if used >= len(tokens) or not any(t < ts_begin for t in tail):
            return decoded
        start = window.time_offset + (tail[0] - ts_begin) * TIME_PRECISION
        last = self.segment(window, decoded.result, start,
                            window.time_offset + window.duration, tail)
        return dataclasses.replace(decoded, segments=(*decoded.segments, last))

    def emit(self, segments: Sequence[Segment], temperature: float) -> None:
        """Number and publish the segments that hold text; extend the prompt with them."""
        for segment in segments:
            if segment.start == segment.end or not segment.text.strip():
                continue
            segment = dataclasses.replace(segment, id=len(self.segments))
            self.segments.append(segment)
            self.all_tokens.extend(segment.tokens)
            if self.on_segment:
                self.on_segment(segment)
        if (not self.options.condition_on_previous_text
                or temperature > self.options.prompt_reset_on_temperature):
            self.prompt_reset_since = len(self.all_tokens)

    def _language(self, options: TranscribeOptions) -> tuple[str, dict[str, float] | None]:
        """The language to decode in: given (an English-only model then refuses any other),
        "en" for English-only models, or detected on the first 30 s."""
        if options.language is not None:
            return to_language_code(options.language), None
        if not self.model.is_multilingual:
            return "en", None
        self.encode(0, min(self.window_frames, self.content_frames))
        return detect_language(self.model, self.tokenizer)

    def encode(self, seek: int, n_frames: int) -> Window:
        """The window at `seek`, encoded by the model unless it holds that window already:
        language detection encodes the first window, which decoding then reuses (one
        encoder pass fewer per file with a multilingual model: 0.58 s for base)."""
        window = self.window(seek, n_frames)
        if self.encoded != (seek, n_frames):
            self.model.encode(window.mel)
            self.encoded = (seek, n_frames)
        return window

"""Batched transcription of long audio (faster-whisper's BatchedInferencePipeline).

The audio is cut at pauses into chunks of at most 30 s of speech (audio/chunks.py);
`batch_size` chunks at a time are encoded into one `WindowBatch` and decoded together
(lockstep.py). Each chunk is decoded on its own terms, as faster-whisper's pipeline does:
no previous text (only `initial_prompt`, in every chunk), the first temperature only (no
fallback), the whole chunk in one window (no seek inside it). Segments come back in time
order, their times mapped back through the chunk's pieces; word timestamps align each
chunk with its own window. Where a window's transcript stops short of its chunk's end,
the rest is decoded again; rests near each other in the audio share a window (`_Todo`).
Without timestamps, a chunk's one segment spans it whatever was written, so a chunk with
a long pause is aligned to learn where its text stops (`_Windows._spoken_end`).
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections import deque
from collections.abc import Sequence

import numpy as np

from tensorplan.machine import computing, sharing
from tensorplan.whisper.audio.chunks import AudioChunk, cut, join, pauses
from tensorplan.whisper.audio.constants import (
    HOP_LENGTH,
    N_FRAMES,
    N_SAMPLES,
    SAMPLE_RATE,
)
from tensorplan.whisper.audio.mel import MelFrames
from tensorplan.whisper.audio.vad import VadOptions, restore_segment
from tensorplan.whisper.decoding.lockstep import decode_batch
from tensorplan.whisper.decoding.seek_loop import (
    ProgressCallback,
    SeekLoop,
    SegmentCallback,
    Window,
    WindowSegments,
)
from tensorplan.whisper.decoding.timing import WordAligner, get_end
from tensorplan.whisper.decoding.window import DecodingResult, detect_language
from tensorplan.whisper.options import TranscribeOptions
from tensorplan.whisper.planned.session import WhisperSession
from tensorplan.whisper.planned.step_engine import encodes_aside
from tensorplan.whisper.planned.window_batch import WindowBatch
from tensorplan.whisper.result import Segment, TranscriptionResult
from tensorplan.whisper.tokenizer import to_language_code

MIN_REMAINDER_SECONDS = 1.5  # a shorter rest of a chunk is its trailing pause
# Decoded without timestamps, a window often ends with eot at a pause this long, and its
# segment spans the whole chunk, so nothing shows the words after the pause were never
# written: such chunks are aligned to find where the text really ends (`_spoken_end`).
# Measured by energy, whose 200 ms pads count as speech: 1 s of silence reads as 0.6 s
PAUSE_CHECK_SECONDS = 0.6
END_SLACK_SECONDS = 1.0  # the aligned last word ends this close to such a pause's start
# (energy counts a recording's room noise after the last word as speech: 0.8 s on jfk.wav)
# rests further apart in the audio never share a window: the segments after the first one
# wait for the shared window to be decoded before they are handed out
PACK_HORIZON_SECONDS = 120.0


def group_size(options: TranscribeOptions) -> int:
    """Sequences per window at the first temperature: beams, best-of samples or 1."""
    if options.temperature[0] == 0:
        return options.beam_size or 1
    return options.best_of or 1


def batch_windows(batch_size: int, n_chunks: int) -> int:
    """Windows to plan for: the batch size, or for fewer chunks the next power of two
    (a short file does not hold a full batch's memory; at most log2(64) shapes exist).
    A partial last batch runs the batch's smallest prefix that holds it."""
    if n_chunks >= batch_size:
        return batch_size
    return min(batch_size, 1 << max(0, n_chunks - 1).bit_length())


def transcribe_batched(session: WhisperSession, samples: np.ndarray,
                       options: TranscribeOptions, *, batch_size: int,
                       chunks: Sequence[AudioChunk] | None = None,
                       vad_options: VadOptions | None = None,
                       on_segment: SegmentCallback | None = None,
                       progress: ProgressCallback | None = None) -> TranscriptionResult:
    """Transcribe 16 kHz samples `batch_size` chunks at a time (`chunks`: given, or cut at
    pauses). The result lists every chunk's segments in time order."""
    chunks = list(cut(samples, vad_options) if chunks is None else chunks)
    language, probs = _language(session, samples, chunks, options)
    if not chunks:
        return TranscriptionResult(text="", segments=(), language=language)
    options = dataclasses.replace(options, language=language)
    batch = session.model.window_batch(batch_windows(batch_size, len(chunks)),
                                       group_size(options))
    windows = _Windows(session, options, samples)
    todo = _Todo(chunks, share=not options.without_timestamps)
    total, done = sum(c.n_samples for c in chunks), 0
    try:
        while part := todo.next(batch.n_windows):
            outcomes = windows.run(batch, part)
            todo.returned(outcomes)
            windows.publish(todo.first_start() / SAMPLE_RATE, on_segment)
            back = [c for rest, retries in outcomes for c in (rest, *retries) if c is not None]
            done += sum(c.n_samples for c in part) - sum(c.n_samples for c in back)
            if progress:
                progress(done // HOP_LENGTH, total // HOP_LENGTH)
    finally:
        if windows.lane is not None:
            windows.lane.close()
    text = session.tokenizer.decode([t for s in windows.segments for t in s.tokens])
    return TranscriptionResult(text=text, segments=tuple(windows.segments), language=language,
                               language_probs=probs)


class _Todo:
    """What is left to decode: first what came back (rests of rests, the parts of a shared
    window that yielded nothing; each alone) and the rests' shared windows, earliest first,
    then the cut's chunks in time order. A rest of a cut's chunk waits in `open` for others
    to share its window: it is joined by the rests after it while they fit one window and
    start within PACK_HORIZON_SECONDS of it. That grouping depends on the rests alone, never
    on the batch size, so the transcript is the same in batches of any size. With `share`
    off every rest is decoded alone: without timestamps a shared window's one segment
    cannot be split between its pieces (it went to the longest, and the pieces after it
    were decoded again: their text came twice)."""

    def __init__(self, chunks: Sequence[AudioChunk], share: bool = True) -> None:
        self.chunks, self.share = deque(chunks), share
        self.again: list[AudioChunk] = []
        self.open: list[AudioChunk] = []

    def next(self, n: int) -> list[AudioChunk]:
        """Up to n chunks to decode now (none: all is done)."""
        frontier = self.chunks[0].start if self.chunks else math.inf
        if self.open and (not self.chunks or
                          frontier - self.open[0].start > PACK_HORIZON_SECONDS * SAMPLE_RATE):
            self._close()  # no rest still to come can join the open group
        self.again.sort(key=lambda c: c.start)
        part, self.again = self.again[:n], self.again[n:]
        self.n_again = len(part)
        while len(part) < n and self.chunks:
            part.append(self.chunks.popleft())
        return part

    def returned(self, outcomes: Sequence[tuple[AudioChunk | None, tuple[AudioChunk, ...]]]
                 ) -> None:
        """What the chunks `next` gave came back with (`_Windows.run`), in their order."""
        for i, (rest, retries) in enumerate(outcomes):
            self.again += retries
            if rest is None:
                continue
            if i < self.n_again or not self.share:
                self.again.append(rest)  # a rest of a rest: decoded alone
            elif self.open and rest.start - self.open[0].start <= \
                    PACK_HORIZON_SECONDS * SAMPLE_RATE and \
                    sum(c.n_samples for c in self.open) + rest.n_samples <= N_SAMPLES:
                self.open.append(rest)
            else:
                self._close()
                self.open = [rest]

    def _close(self) -> None:
        if self.open:
            self.again.append(join(self.open))
            self.open = []

    def first_start(self) -> float:
        """The earliest sample still to decode (inf: none): no segment can come before it."""
        firsts = [*self.again, *self.open[:1], *([self.chunks[0]] if self.chunks else [])]
        return min((c.start for c in firsts), default=math.inf)


class _Windows:
    """Encodes, decodes and cuts into segments one batch of chunks after another."""

    def __init__(self, session: WhisperSession, options: TranscribeOptions,
                 samples: np.ndarray) -> None:
        self.session, self.options, self.samples = session, options, samples
        # a second encoder lane: its session's arena for the length of the transcription.
        # Not where this thread already shares the cores (a server's request beside the
        # step engine's two threads): a third thread there only took memory (its thread
        # kept ~20 MB after the lane's session was freed)
        self.lane = WhisperSession(session.model) \
            if encodes_aside(session.model) and not sharing() else None
        # SeekLoop's segment rules, reused per window (language is set: it encodes nothing)
        self.cutter = SeekLoop(session, _NoFrames(), options, aligner=_no_aligner)
        self.prompt = (tuple(session.tokenizer.encode(" " + options.initial_prompt.strip()))
                       if options.initial_prompt else None)
        self.pending: list[Segment] = []  # decoded, not yet known to be in time order
        self.segments: list[Segment] = []

    def run(self, batch: WindowBatch, chunks: Sequence[AudioChunk]
            ) -> list[tuple[AudioChunk | None, tuple[AudioChunk, ...]]]:
        """Decode the chunks; returns for each what to decode again: its rest (see
        `remainder`) and, for a shared window that yielded nothing, the chunks it joined
        (each alone, so no chunk is lost to its neighbour)."""
        windows = [_window(self.samples, chunk, self.session.dims.n_mels) for chunk in chunks]
        self._encode(batch, [w.mel for w in windows])
        decoding = self.options.decoding(self.options.temperature[0], self.prompt, None)
        results = decode_batch(self.session, batch, len(chunks), decoding)
        outcomes = []
        for slot, (chunk, window, result) in enumerate(zip(chunks, windows, results,
                                                           strict=True)):
            segments, rest = self.segments_of(batch, slot, chunk, window, result)
            self.pending += segments
            outcomes.append((rest, () if segments else chunk.parts))
        return outcomes

    def _encode(self, batch: WindowBatch, mels: Sequence[np.ndarray]) -> None:
        """Encode the windows into the batch's slots: where a second session can encode
        beside this one (`encodes_aside`), two lanes take the next window in turn, each
        on its part of the cores (machine.computing). On PyTorch that part's thread count
        can move a product's last bits (docs/engine.md); numpy's kernels use one lane."""
        if self.lane is None or len(mels) < 2:
            for slot, mel in enumerate(mels):
                self.session.encode_into(batch, slot, mel)
            return
        self.session.batch_executor(batch)  # bound here, not by two threads at once
        slots = iter(range(len(mels)))
        taking = threading.Lock()
        errors: list[BaseException] = []

        def encode_with(encoder: WhisperSession | None) -> None:
            try:
                with computing():
                    while not errors:
                        with taking:
                            slot = next(slots, None)
                        if slot is None:
                            return
                        self.session.encode_into(batch, slot, mels[slot], encoder)
            except BaseException as e:  # noqa: BLE001 - raised on the caller's thread
                errors.append(e)

        other = threading.Thread(target=encode_with, args=(self.lane,),
                                 name="tensorplan-encode-lane", daemon=True)
        other.start()
        encode_with(None)
        other.join()
        if errors:
            raise errors[0]

    def segments_of(self, batch: WindowBatch, slot: int, chunk: AudioChunk, window: Window,
                    result: DecodingResult) -> tuple[list[Segment], AudioChunk | None]:
        """The window's segments, with times in the original audio, and the rest of the
        chunk they stop short of (`remainder`), if any."""
        if self.cutter.is_silence(result):
            return [], None
        decoded = self.cutter.with_tail(self.cutter.split_segments(window, result))
        if self.options.word_timestamps:
            # a chunk's own aligner: remainders are aligned after later chunks, and the
            # aligner's floor (the last word's end) must not reach across chunks
            self.session.hold_window(batch, slot)
            decoded = WordAligner(self.session, self.options)(decoded)
        elif self.options.without_timestamps and decoded.segments:
            decoded = self._spoken_end(batch, slot, chunk, decoded)
        seek = chunk.start // HOP_LENGTH
        segments = [dataclasses.replace(to_original(s, chunk), seek=seek)
                    for s in decoded.segments if s.start != s.end and s.text.strip()]
        return segments, remainder(chunk, segments)

    def _spoken_end(self, batch: WindowBatch, slot: int, chunk: AudioChunk,
                    decoded: WindowSegments) -> WindowSegments:
        """The segments, the last one ending where its words do when that is at a long
        pause (`_ends_at_pause`), so `remainder` decodes the rest. Decoded without
        timestamps, a chunk's one segment spans the chunk whatever was written, and
        Whisper ends a window with eot at a long pause as it does with timestamps
        (docs/compat.md: 7 of 10 sentences after jfk.wav's pause were lost on base;
        faster-whisper, which shortens the pause, lost 3). Chunks without such a pause
        are not aligned (it costs a decoder pass); the segments stay without words."""
        starts = self._pause_starts(chunk)
        if not starts:
            return decoded
        self.session.hold_window(batch, slot)
        aligned = WordAligner(self.session, self.options).add_word_timestamps(decoded)
        end = get_end(aligned)
        if end is None or not _ends_at_pause(starts, decoded.window, end):
            return decoded
        last = decoded.segments[-1]
        last = dataclasses.replace(last, end=min(max(end, last.start), last.end))
        return dataclasses.replace(decoded, segments=(*decoded.segments[:-1], last))

    def _pause_starts(self, chunk: AudioChunk) -> list[float]:
        """Where the chunk's pauses of PAUSE_CHECK_SECONDS or more start (seconds into
        its window)."""
        return [a for a, b in pauses(chunk.samples(self.samples))
                if b - a >= PAUSE_CHECK_SECONDS]

    def publish(self, before: float, on_segment: SegmentCallback | None) -> None:
        """Number and hand out the pending segments that start before `before` (nothing
        still queued can come earlier), in time order."""
        self.pending.sort(key=lambda s: s.start)
        ready = [s for s in self.pending if s.start < before]
        self.pending = self.pending[len(ready):]
        for segment in ready:
            segment = dataclasses.replace(segment, id=len(self.segments))
            self.segments.append(segment)
            if on_segment:
                on_segment(segment)


class _NoFrames:
    """The frames SeekLoop is given only to cut segments: it never reads any."""

    n_frames = 0

    def window(self, seek: int, n: int) -> np.ndarray:
        raise NotImplementedError


def _ends_at_pause(pause_starts: Sequence[float], window: Window, end: float) -> bool:
    """Whether words aligned to end at `end` (seconds, window times) stop at the start of
    a long pause (`pause_starts`, seconds into the window). Only there is an aligned end
    trusted to start a rest: where the alignment said the text stopped 3.5 s short of
    continuous espeak speech, the rest decoded was the last sentence again."""
    end -= window.time_offset
    return any(abs(start - end) <= END_SLACK_SECONDS for start in pause_starts)


def remainder(chunk: AudioChunk, segments: Sequence[Segment]) -> AudioChunk | None:
    """The end of a chunk its transcript stopped short of, to decode again as a chunk of
    its own. Whisper often ends a window with eot before speech that reaches the window's
    end (a sequential transcription seeks there and decodes it in the next window): left
    alone, that is most of the batched word error rate (0.20 against 0.14, tiny.en)."""
    if not segments:
        return None  # silence, or nothing to anchor a remainder on
    end = round(max(s.end for s in segments) * SAMPLE_RATE)
    left = chunk.after(end) if end > chunk.start else None
    if left is None or left.n_samples < MIN_REMAINDER_SECONDS * SAMPLE_RATE:
        return None
    return left


def to_original(segment: Segment, chunk: AudioChunk) -> Segment:
    """`segment` (times in the chunk's joined pieces) with times in the original audio.
    Words move with the piece of their middle, and the segment spans its words. Without
    words the segment moves with the piece it overlaps most, its times clamped into that
    piece: where two pieces meet, the model puts the boundary between segments anywhere in
    the joint's pauses, so a start often falls in the previous piece's trailing silence."""
    if len(chunk.pieces) == 1:
        return shifted(segment, chunk.offset)
    if segment.words:
        return restore_segment(segment, chunk.time_map())
    best, at, best_at = -1.0, 0.0, 0.0
    for a, b in chunk.pieces:
        length = (b - a) / SAMPLE_RATE
        overlap = min(segment.end, at + length) - max(segment.start, at)
        if overlap > best:
            best, best_at, piece = overlap, at, (a, b)
        at += length
    a, b = piece
    length = (b - a) / SAMPLE_RATE
    start = a / SAMPLE_RATE + min(max(segment.start - best_at, 0.0), length)
    end = a / SAMPLE_RATE + min(max(segment.end - best_at, 0.0), length)
    return dataclasses.replace(segment, start=round(start, 2), end=round(end, 2))


def shifted(segment: Segment, seconds: float) -> Segment:
    words = tuple(dataclasses.replace(w, start=w.start + seconds, end=w.end + seconds)
                  for w in segment.words) if segment.words else segment.words
    return dataclasses.replace(segment, start=segment.start + seconds,
                               end=segment.end + seconds, words=words)


def _no_aligner(decoded: WindowSegments) -> WindowSegments:
    return decoded  # SeekLoop insists on one with word_timestamps; each chunk makes its own


def _window(samples: np.ndarray, chunk: AudioChunk, n_mels: int) -> Window:
    """The chunk's pieces joined, as log-mel on its own (normalized by its own maximum, as
    faster-whisper's feature extractor sees each chunk), zero-padded to one 30 s window.
    Its times are seconds into the joined pieces (`AudioChunk.time_map` moves them back)."""
    frames = MelFrames(chunk.samples(samples), n_mels=n_mels)
    n = min(N_FRAMES, frames.n_frames)
    mel = np.zeros((n_mels, N_FRAMES), np.float32)
    mel[:, :n] = frames.window(0, n)
    return Window(0, n, mel)


def _language(session: WhisperSession, samples: np.ndarray, chunks: Sequence[AudioChunk],
              options: TranscribeOptions) -> tuple[str, dict[str, float] | None]:
    """The given language, "en" for English-only models, or the one detected on the first
    chunk (one language per file: the batch shares one prompt)."""
    if options.language is not None:
        return to_language_code(options.language), None
    if not session.is_multilingual or not chunks:
        return "en", None
    session.encode(_window(samples, chunks[0], session.dims.n_mels).mel)
    return detect_language(session, session.tokenizer)

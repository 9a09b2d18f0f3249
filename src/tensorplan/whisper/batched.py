"""Batched transcription of long audio (faster-whisper's BatchedInferencePipeline).

The audio is cut at pauses into chunks of at most 30 s (chunks.py); `batch_size` chunks at
a time are encoded into one `WindowBatch` and decoded together (batch_decoding.py). Each
chunk is decoded on its own terms, as faster-whisper's pipeline does: no previous text
(only `initial_prompt`, in every chunk), the first temperature only (no fallback), the
whole chunk in one window (no seek inside it). Segments come back in time order with
their chunk's offset; word timestamps align each chunk with its own window.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from tensorplan.whisper.audio import MelFrames
from tensorplan.whisper.batch_decoding import decode_batch
from tensorplan.whisper.chunks import Chunk, cut
from tensorplan.whisper.decoding import DecodingResult, detect_language
from tensorplan.whisper.options import TranscribeOptions
from tensorplan.whisper.result import Segment, TranscriptionResult
from tensorplan.whisper.session import WhisperSession
from tensorplan.whisper.timing import WordAligner
from tensorplan.whisper.tokenizer import to_language_code
from tensorplan.whisper.transcribe import (
    HOP_LENGTH,
    N_FRAMES,
    ProgressCallback,
    SeekLoop,
    SegmentCallback,
    Window,
)
from tensorplan.whisper.vad import VadOptions
from tensorplan.whisper.window_batch import WindowBatch


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
                       chunks: Sequence[Chunk] | None = None,
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
    done = 0
    for first in range(0, len(chunks), batch.n_windows):
        part = chunks[first : first + batch.n_windows]
        windows.run(batch, part, on_segment)
        done += sum(c.n_samples for c in part)
        if progress:
            progress(done // HOP_LENGTH, sum(c.n_samples for c in chunks) // HOP_LENGTH)
    text = session.tokenizer.decode([t for s in windows.segments for t in s.tokens])
    return TranscriptionResult(text=text, segments=tuple(windows.segments), language=language,
                               language_probs=probs)


class _Windows:
    """Encodes, decodes and cuts into segments one batch of chunks after another."""

    def __init__(self, session: WhisperSession, options: TranscribeOptions,
                 samples: np.ndarray) -> None:
        self.session, self.options, self.samples = session, options, samples
        # SeekLoop's segment rules, reused per window (language is set: it encodes nothing)
        self.aligner = WordAligner(session, options) if options.word_timestamps else None
        self.cutter = SeekLoop(session, _NoFrames(), options, aligner=self.aligner)
        self.prompt = (tuple(session.tokenizer.encode(" " + options.initial_prompt.strip()))
                       if options.initial_prompt else None)
        self.segments: list[Segment] = []

    def run(self, batch: WindowBatch, chunks: Sequence[Chunk],
            on_segment: SegmentCallback | None) -> None:
        windows = []
        for slot, chunk in enumerate(chunks):
            window = _window(self.samples, chunk, self.session.dims.n_mels)
            self.session.encode_into(batch, slot, window.mel)
            windows.append(window)
        decoding = self.options.decoding(self.options.temperature[0], self.prompt, None)
        results = decode_batch(self.session, batch, len(chunks), decoding)
        for slot, (window, result) in enumerate(zip(windows, results, strict=True)):
            self.emit(batch, slot, window, result, on_segment)

    def emit(self, batch: WindowBatch, slot: int, window: Window, result: DecodingResult,
             on_segment: SegmentCallback | None) -> None:
        if self.cutter.is_silence(result):
            return
        decoded = self.cutter.split_segments(window, result)
        if self.aligner is not None:
            self.session.hold_window(batch, slot)
            decoded = self.aligner(decoded)
        for segment in decoded.segments:
            if segment.start == segment.end or not segment.text.strip():
                continue
            segment = dataclasses.replace(segment, id=len(self.segments))
            self.segments.append(segment)
            if on_segment:
                on_segment(segment)


class _NoFrames:
    """The frames SeekLoop is given only to cut segments: it never reads any."""

    n_frames = 0

    def window(self, seek: int, n: int) -> np.ndarray:
        raise NotImplementedError


def _window(samples: np.ndarray, chunk: Chunk, n_mels: int) -> Window:
    """The chunk's log-mel on its own (normalized by its own maximum, as faster-whisper's
    feature extractor sees each chunk), zero-padded to one 30 s window. It starts on a
    mel frame, so the window's offset (in frames) is exact."""
    seek = chunk.start // HOP_LENGTH
    frames = MelFrames(samples[seek * HOP_LENGTH : chunk.end], n_mels=n_mels)
    n = min(N_FRAMES, frames.n_frames)
    mel = np.zeros((n_mels, N_FRAMES), np.float32)
    mel[:, :n] = frames.window(0, n)
    return Window(seek, n, mel)


def _language(session: WhisperSession, samples: np.ndarray, chunks: Sequence[Chunk],
              options: TranscribeOptions) -> tuple[str, dict[str, float] | None]:
    """The given language, "en" for English-only models, or the one detected on the first
    chunk (one language per file: the batch shares one prompt)."""
    if options.language is not None:
        return to_language_code(options.language), None
    if not session.is_multilingual or not chunks:
        return "en", None
    session.encode(_window(samples, chunks[0], session.dims.n_mels).mel)
    return detect_language(session, session.tokenizer)

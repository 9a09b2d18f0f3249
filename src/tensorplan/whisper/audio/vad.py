"""Voice activity detection: find the speech in 16 kHz audio with Silero VAD, so that
`--vad-filter` transcribes only the speech (faster-whisper's `vad_filter`).

The model is the ONNX file that ships inside the `silero-vad` package, run by onnxruntime
directly: that package's Python code imports torch, so it is located with `find_spec` and
never imported, and torch never loads. Install: `pip install onnxruntime && pip install
--no-deps silero-vad`.

The pipeline, all faster-whisper's: one speech probability per 512-sample window
(`SileroVad`), chunks of speech by hysteresis between `threshold` and `neg_threshold` with a
minimum silence, split when too long, padded (`get_speech_timestamps`); the chunks are joined
(`collect_chunks`), transcribed, and each time in the joined audio is moved back to the
original audio (`SpeechTimestampsMap`, `restore_segment`).

Where this differs from faster-whisper: the audio is zero-padded up to a whole number of
windows (silero-vad's framing); faster-whisper pads one window too many when the length is
already a multiple of 512, which adds a probability for 32 ms of zeros.
"""

from __future__ import annotations

import bisect
import dataclasses
import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from tensorplan.errors import UserError
from tensorplan.whisper.audio.constants import SAMPLE_RATE
from tensorplan.whisper.result import Segment, TranscriptionResult, Word

WINDOW_SAMPLES = 512  # 32 ms: one speech probability each
CONTEXT_SAMPLES = 64  # the tail of the previous window, put before each window (v5+ models)
STATE_SHAPE = (2, 1, 128)  # the one-window model's LSTM state, carried between windows
LSTM_SHAPE = (1, 1, 128)  # the sequence model's h and c
MODEL_FILE = "silero_vad.onnx"  # what silero-vad's own load_silero_vad(onnx=True) runs
SEQUENCE_MODEL_FILE = "silero_vad_16k_sequence.onnx"  # the same model, a run of windows a call
SEQUENCE_RUN = 128  # windows per call (4 s): longer runs measured no faster
MIN_SILENCE_AT_MAX_SPEECH_MS = 98  # a pause at least this long is a place to split a long chunk
INSTALL_HINT = "pip install onnxruntime && pip install --no-deps silero-vad"


VadState = np.ndarray | tuple[np.ndarray, np.ndarray]  # the LSTM's, per model file


@dataclass(frozen=True, slots=True)
class VadOptions:
    """faster-whisper's VadOptions and its defaults (those of `vad_filter=True` in
    `WhisperModel.transcribe`; silero-vad's own are 250 / 100 / 30 ms for the last three)."""

    # a window is speech when its probability is at least this
    threshold: float = 0.5
    # inside speech, a window is silence only below this; None: max(threshold - 0.15, 0.01)
    neg_threshold: float | None = None
    # chunks of speech shorter than this are dropped
    min_speech_duration_ms: int = 0
    # longer chunks are split at their last pause of 98 ms or more, else cut hard
    max_speech_duration_s: float = float("inf")
    # a chunk ends only after this much silence
    min_silence_duration_ms: int = 2000
    # added to both sides of each chunk (less where two chunks are closer than twice this)
    speech_pad_ms: int = 400

    def __post_init__(self) -> None:
        if not 0 < self.threshold < 1:
            raise ValueError("threshold must be between 0 and 1")
        if self.neg_threshold is not None and not 0 <= self.neg_threshold <= self.threshold:
            raise ValueError("neg_threshold must be between 0 and threshold")
        if self.max_speech_duration_s <= 0:
            raise ValueError("max_speech_duration_s must be positive")
        if min(self.min_speech_duration_ms, self.min_silence_duration_ms, self.speech_pad_ms) < 0:
            raise ValueError("durations must not be negative")

    @property
    def exit_threshold(self) -> float:
        """`neg_threshold`, or its default."""
        if self.neg_threshold is not None:
            return self.neg_threshold
        return max(self.threshold - 0.15, 0.01)


@dataclass(frozen=True, slots=True)
class SpeechChunk:
    """Samples [start, end) of the original audio hold speech."""

    start: int
    end: int


# --- the model ---------------------------------------------------------------------------


class SileroVad:
    """Silero VAD in an onnxruntime session: audio in, one speech probability per window.

    The model is an LSTM: each window (with the 64 samples before it as context) is read
    with the state the previous window left, so windows run in order. silero-vad ships
    it twice: `silero_vad.onnx` takes one window per call (silero-vad's `OnnxWrapper`),
    `silero_vad_16k_sequence.onnx` takes a run of windows and the LSTM's (h, c) per call.
    Both give the same probabilities (tests/whisper/audio/test_vad.py); the sequence model
    is used when the package has it: a call costs ~0.13 ms of overhead, so 400 s of audio
    (12,630 windows) took 1.69 s one window per call and 0.75 s in runs of 128.
    """

    def __init__(self, path: str | Path, *, sequence: bool | None = None):
        """path: `silero_vad.onnx`; sequence: use the sequence model beside it (None: when
        it is there)."""
        ort = _import_onnxruntime()
        opts = ort.SessionOptions()
        # One thread, as silero-vad and faster-whisper use: the windows are tiny and
        # sequential. Two (measured, 400 s in runs of 128 windows, and live appends of 3)
        # were no faster and took 1.4-2x the CPU time in runs, 4x in live appends, where
        # onnxruntime's idle worker spins between calls on a core the decoders need.
        opts.inter_op_num_threads = 1
        opts.intra_op_num_threads = 1
        opts.log_severity_level = 3  # errors only: graph warnings mean nothing to a user
        run_of_windows = Path(path).parent / SEQUENCE_MODEL_FILE
        self.sequence = run_of_windows.is_file() if sequence is None else sequence
        self.session = ort.InferenceSession(str(run_of_windows if self.sequence else path),
                                            sess_options=opts,
                                            providers=["CPUExecutionProvider"])
        self._rate = np.array(SAMPLE_RATE, np.int64)

    def initial_state(self) -> VadState:
        """The LSTM's state before the first window."""
        if self.sequence:
            return (np.zeros(LSTM_SHAPE, np.float32), np.zeros(LSTM_SHAPE, np.float32))
        return np.zeros(STATE_SHAPE, np.float32)

    def windows(self, frames: np.ndarray, state: VadState) -> tuple[np.ndarray, VadState]:
        """frames (n, 64 + 512): each window after its context, in order -> (n,)
        probabilities and the state after the last one."""
        probs = np.empty(len(frames), np.float32)
        if self.sequence:
            h, c = state
            for i in range(0, len(frames), SEQUENCE_RUN):
                run = np.ascontiguousarray(frames[i:i + SEQUENCE_RUN], np.float32)
                probs[i:i + len(run)], h, c = self.session.run(
                    None, {"input": run, "h": h, "c": c})
            return probs, (h, c)
        for i in range(len(frames)):
            x = np.ascontiguousarray(frames[i:i + 1], np.float32)
            out, state = self.session.run(None, {"input": x, "state": state, "sr": self._rate})
            probs[i] = out[0, 0]
        return probs, state

    def __call__(self, audio: np.ndarray) -> np.ndarray:
        """audio : shape = (n_samples,), 16 kHz → shape = (ceil(n_samples / 512),) float32."""
        n_windows = -(-len(audio) // WINDOW_SAMPLES)
        if n_windows == 0:
            return np.zeros(0, np.float32)
        padded = np.zeros(CONTEXT_SAMPLES + n_windows * WINDOW_SAMPLES, np.float32)
        padded[CONTEXT_SAMPLES:CONTEXT_SAMPLES + len(audio)] = audio  # zero context before
        return self.windows(context_frames(padded, n_windows), self.initial_state())[0]


def context_frames(audio: np.ndarray, n: int) -> np.ndarray:
    """The first n windows of `audio` (whose first CONTEXT_SAMPLES are the first window's
    context), each after its context: a (n, CONTEXT_SAMPLES + WINDOW_SAMPLES) view."""
    return np.lib.stride_tricks.sliding_window_view(
        audio, CONTEXT_SAMPLES + WINDOW_SAMPLES)[:n * WINDOW_SAMPLES:WINDOW_SAMPLES]


def model_path() -> Path:
    """The ONNX model inside the installed silero-vad package, found without importing
    the package (its `__init__` imports torch)."""
    spec = importlib.util.find_spec("silero_vad")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        path = Path(location) / "data" / MODEL_FILE
        if path.is_file():
            return path
    raise UserError(f"voice activity detection needs silero-vad's {MODEL_FILE}: "
                    f"{INSTALL_HINT}")


def load_vad_model() -> SileroVad:
    """The model, loaded once per process."""
    return _vad_model()


@lru_cache(maxsize=1)
def _vad_model() -> SileroVad:
    _import_onnxruntime()  # say what is missing in the order the hint installs it
    return SileroVad(model_path())


def _import_onnxruntime() -> Any:
    try:
        import onnxruntime
    except ImportError:
        raise UserError(f"voice activity detection needs onnxruntime: {INSTALL_HINT}") from None
    return onnxruntime


# --- probabilities → chunks of speech ------------------------------------------------------


def get_speech_timestamps(audio: np.ndarray, options: VadOptions | None = None
                          ) -> list[SpeechChunk]:
    """The chunks of speech in 16 kHz mono `audio`, in samples, in order."""
    audio = np.asarray(audio, np.float32)
    if audio.ndim != 1:
        raise ValueError(f"expected mono samples, shape = (n,), got {audio.shape}")
    if len(audio) == 0:
        return []
    probs = load_vad_model()(audio)
    return chunks_from_probabilities(probs, len(audio), options or VadOptions())


def chunks_from_probabilities(probs: Sequence[float] | np.ndarray, n_samples: int,
                              options: VadOptions) -> list[SpeechChunk]:
    """faster-whisper's state machine over the window probabilities, then the padding.

    In speech, a window below `exit_threshold` starts a pause (`temp_end`); the chunk ends
    there once the pause has lasted `min_silence_duration_ms`, and a window at `threshold`
    or above cancels it. Pauses of 98 ms or more are remembered (`prev_end`, and
    `next_start` where speech came back) as places to split a chunk that grows too long.
    """
    rate = SAMPLE_RATE
    min_speech = rate * options.min_speech_duration_ms / 1000
    pad = rate * options.speech_pad_ms / 1000
    max_speech = rate * options.max_speech_duration_s - WINDOW_SAMPLES - 2 * pad
    min_silence = rate * options.min_silence_duration_ms / 1000
    min_split_silence = rate * MIN_SILENCE_AT_MAX_SPEECH_MS / 1000
    enter, leave = options.threshold, options.exit_threshold

    spans: list[list[int]] = []  # [start, end] before padding
    start: int | None = None  # start of the chunk in progress; None: not in speech
    temp_end = 0  # where the current pause began; 0: no pause
    prev_end = next_start = 0  # the last pause long enough to split at; speech after it
    for i, prob in enumerate(probs):
        sample = WINDOW_SAMPLES * i
        if prob >= enter and temp_end:
            temp_end = 0
            if next_start < prev_end:
                next_start = sample
        if prob >= enter and start is None:
            start = sample
            continue
        if start is not None and sample - start > max_speech:
            if prev_end:  # split at the last long-enough pause
                spans.append([start, prev_end])
                start = None if next_start < prev_end else next_start
                prev_end = next_start = temp_end = 0
            else:  # no pause: cut here
                spans.append([start, sample])
                start = None
                prev_end = next_start = temp_end = 0
                continue
        if prob < leave and start is not None:
            if not temp_end:
                temp_end = sample
            if sample - temp_end > min_split_silence:
                prev_end = temp_end
            if sample - temp_end < min_silence:
                continue
            if temp_end - start > min_speech:
                spans.append([start, temp_end])
            start = None
            prev_end = next_start = temp_end = 0
    if start is not None and n_samples - start > min_speech:
        spans.append([start, n_samples])
    return _pad(spans, pad, n_samples)


def _pad(spans: list[list[int]], pad: float, n_samples: int) -> list[SpeechChunk]:
    """Widen each span by `pad` samples a side; two spans closer than 2 * pad share the gap."""
    for i, span in enumerate(spans):
        if i == 0:
            span[0] = int(max(0, span[0] - pad))
        if i == len(spans) - 1:
            span[1] = int(min(n_samples, span[1] + pad))
            continue
        following = spans[i + 1]
        gap = following[0] - span[1]
        if gap < 2 * pad:
            span[1] += gap // 2
            following[0] = int(max(0, following[0] - gap // 2))
        else:
            span[1] = int(min(n_samples, span[1] + pad))
            following[0] = int(max(0, following[0] - pad))
    return [SpeechChunk(s, e) for s, e in spans]


def collect_chunks(audio: np.ndarray, chunks: Sequence[SpeechChunk]) -> np.ndarray:
    """The chunks' samples, joined."""
    if not chunks:
        return np.zeros(0, np.float32)
    return np.concatenate([audio[c.start:c.end] for c in chunks])


# --- joined time → original time -----------------------------------------------------------


class SpeechTimestampsMap:
    """Maps a time in the joined speech (`collect_chunks`) back to the original audio:
    add the silence removed before the chunk the time falls in (faster-whisper's)."""

    __slots__ = ("sampling_rate", "time_precision", "chunk_end_sample", "total_silence_before")

    def __init__(self, chunks: Sequence[SpeechChunk], sampling_rate: int = SAMPLE_RATE,
                 time_precision: int = 2):
        self.sampling_rate = sampling_rate
        self.time_precision = time_precision  # decimals of the seconds returned
        self.chunk_end_sample: list[int] = []  # each chunk's end, in joined samples
        self.total_silence_before: list[float] = []  # seconds removed before each chunk
        previous_end = removed = 0
        for chunk in chunks:
            removed += chunk.start - previous_end
            previous_end = chunk.end
            self.chunk_end_sample.append(chunk.end - removed)
            self.total_silence_before.append(removed / sampling_rate)

    def get_original_time(self, time: float, chunk_index: int | None = None,
                          is_end: bool = False) -> float:
        """`time` (seconds in the joined speech) in the original audio. `is_end`: a time
        exactly at a chunk's end belongs to that chunk, not to the next."""
        if chunk_index is None:
            chunk_index = self.get_chunk_index(time, is_end)
        return round(self.total_silence_before[chunk_index] + time, self.time_precision)

    def get_chunk_index(self, time: float, is_end: bool = False) -> int:
        sample = int(time * self.sampling_rate)
        if is_end and sample in self.chunk_end_sample:
            return self.chunk_end_sample.index(sample)
        return min(bisect.bisect(self.chunk_end_sample, sample), len(self.chunk_end_sample) - 1)


def restore_segment(segment: Segment, ts_map: SpeechTimestampsMap) -> Segment:
    """`segment` with its times (and its words') in the original audio. Each word is mapped
    through the chunk of its middle, so a word never straddles removed silence; the segment
    then spans its words (faster-whisper's `restore_speech_timestamps`)."""
    if not segment.words:
        return dataclasses.replace(segment, start=ts_map.get_original_time(segment.start),
                                   end=ts_map.get_original_time(segment.end, is_end=True))
    words = tuple(_restore_word(w, ts_map) for w in segment.words)
    return dataclasses.replace(segment, start=words[0].start, end=words[-1].end, words=words)


def _restore_word(word: Word, ts_map: SpeechTimestampsMap) -> Word:
    chunk = ts_map.get_chunk_index((word.start + word.end) / 2)
    return dataclasses.replace(word, start=ts_map.get_original_time(word.start, chunk),
                               end=ts_map.get_original_time(word.end, chunk))


def restore_result(result: TranscriptionResult, ts_map: SpeechTimestampsMap
                   ) -> TranscriptionResult:
    """`result` with every segment's times in the original audio (`seek` stays a frame of
    the joined speech: it names the window the segment was decoded from)."""
    segments = tuple(restore_segment(s, ts_map) for s in result.segments)
    return dataclasses.replace(result, segments=segments)


# --- what `vad_filter` does around a transcription -----------------------------------------


@dataclass(frozen=True, slots=True)
class SpeechOnly:
    """The speech of some audio, joined, and how to move times in it back."""

    chunks: tuple[SpeechChunk, ...]
    samples: np.ndarray  # the chunks' samples, joined
    ts_map: SpeechTimestampsMap

    @classmethod
    def find(cls, audio: Any, options: VadOptions | None = None) -> SpeechOnly:
        """`audio`: samples, or an audio.StreamedAudio (read whole for the detection)."""
        chunks = tuple(get_speech_timestamps(audio, options))
        return cls(chunks, collect_chunks(audio, chunks), SpeechTimestampsMap(chunks))

    def restore(self, result: TranscriptionResult) -> TranscriptionResult:
        return restore_result(result, self.ts_map)

    def restoring(self, on_segment: Callable[[Segment], None] | None
                  ) -> Callable[[Segment], None] | None:
        """`on_segment`, given each segment with its times already restored."""
        if on_segment is None:
            return None
        callback = on_segment

        def restored(segment: Segment) -> None:
            callback(restore_segment(segment, self.ts_map))

        return restored

    def empty_result(self, language: str | None) -> TranscriptionResult:
        """The result for audio without speech. Nothing was decoded, so no language was
        detected: it is the one asked for, else English."""
        from tensorplan.whisper.tokenizer import to_language_code

        code = to_language_code(language) if language else "en"
        return TranscriptionResult(text="", segments=(), language=code)

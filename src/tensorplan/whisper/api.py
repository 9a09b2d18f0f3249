"""The Python API: `load_model(name, compute_type=...)`, `Whisper.transcribe(audio, ...)`, sessions.

A `Whisper` is one loaded model, immutable and safe to share across threads. Each
transcription runs in a `Session`: the stream's own planned arena, KV caches and decoding
state over the shared weights and plans (whisper.cpp's context/state split). Use
`model.session()` for a stream of your own, or `model.transcribe(...)`, which borrows an
idle session from a small pool (and makes one when all are busy).
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from tensorplan.backends import make_backend
from tensorplan.errors import ModelError, UserError
from tensorplan.whisper import openai_args
from tensorplan.whisper.audio.constants import TIME_PRECISION
from tensorplan.whisper.audio.vad import SpeechOnly, VadOptions
from tensorplan.whisper.decoding.seek_loop import ProgressCallback, SegmentCallback, transcribe
from tensorplan.whisper.decoding.timing import WordAligner
from tensorplan.whisper.limits import check_batch_budget, check_kv_budget
from tensorplan.whisper.model_files import weight_cache
from tensorplan.whisper.model_files.ct2_weights import ModelDims as Dims
from tensorplan.whisper.model_files.find import DEFAULT_MODEL
from tensorplan.whisper.model_files.formats import load_model_files, source_file
from tensorplan.whisper.options import TranscribeOptions
from tensorplan.whisper.planned import backend_choice
from tensorplan.whisper.planned.load_options import (
    DEFAULT_MAX_BATCH,
    BackendName,
    ComputeType,
    Device,
    ModelOptions,
    PlanMode,
    Precision,
    Strategy,
)
from tensorplan.whisper.planned.model import WhisperModel
from tensorplan.whisper.planned.session import WhisperSession
from tensorplan.whisper.result import TranscriptionResult
from tensorplan.whisper.tokenizer import (
    to_language_code as to_language_code,  # servers check with it
)

Audio = str | os.PathLike[str] | np.ndarray


class Session:
    """One stream over a shared model: transcribe with it from one thread at a time.

    Holds `nbytes` of its own (arenas and KV caches); a run that raised leaves it dirty,
    and the next run zeroes its memory first, so nothing of a failed or non-finite run
    reaches the next one.
    """

    def __init__(self, whisper: Whisper) -> None:
        self.whisper = whisper
        self.state = WhisperSession(whisper.model)
        self.dirty = False
        self.closed = False
        self._busy = threading.Lock()

    @property
    def nbytes(self) -> int:
        return self.state.nbytes

    def transcribe(self, audio: Audio, options: TranscribeOptions | None = None, *,
                   on_segment: SegmentCallback | None = None,
                   progress: ProgressCallback | None = None,
                   vad_options: VadOptions | None = None,
                   max_audio_seconds: float | None = None,
                   one_window: bool = False,
                   window_s: float | None = None,
                   speech_until_s: float | None = None,
                   **overrides: Any) -> TranscriptionResult:
        """Transcribe a file path or 16 kHz mono samples (see Whisper.transcribe).
        `max_audio_seconds`: AudioTooLongError for longer audio, from the file's declared
        duration before decoding, else while the first pass counts its samples.
        `one_window`: decode the first 30 s window only, in one encoder pass, keeping the
        text after its last timestamp pair as a segment (for a caller that decodes the
        same audio again soon: a live stream's partial update); with clip_timestamps, the
        first clip's first window; not with batch_size (UserError).
        `window_s`: decode in windows of this many seconds instead of 30 (a narrowed
        encoder, WhisperModel.narrowed: for audio much shorter than 30 s, at some cost in
        accuracy; a live stream's updates); a multiple of 0.02 below 30.
        `speech_until_s`: where the speech in the audio ends, by the caller's voice
        activity detection: no window after the first starts there or later (a live
        turn's last decode, whose closing silence needs no window; decoding/seek_loop.py)."""
        if self.closed:  # its memory is gone: say so, not a missing buffer deep inside
            raise RuntimeError("this Session is closed: make a new one with model.session()")
        if not self._busy.acquire(blocking=False):
            raise RuntimeError("a Session runs one transcription at a time; "
                               "use one session per thread")
        try:
            if self.dirty:
                self.state.reset()
                self.dirty = False
            try:
                return self._run(audio, options, on_segment, progress, vad_options, overrides,
                                 max_audio_seconds, one_window, window_s, speech_until_s)
            except BaseException:
                self.dirty = True
                raise
        finally:
            self._busy.release()

    def _run(self, audio: Audio, options: TranscribeOptions | None,
             on_segment: SegmentCallback | None, progress: ProgressCallback | None,
             vad_options: VadOptions | None, overrides: dict[str, Any],
             max_audio_seconds: float | None = None,
             one_window: bool = False, window_s: float | None = None,
             speech_until_s: float | None = None) -> TranscriptionResult:
        from tensorplan.whisper.audio.decode import open_audio

        changes, printer = openai_args.split(overrides, TranscribeOptions.__dataclass_fields__)
        opts = dataclasses.replace(options or TranscribeOptions(), **changes)
        if printer is not None:  # verbose=True: openai's line per segment, then the caller's
            on_segment = _both(printer, on_segment)
        if one_window and opts.batch_size is not None:
            raise UserError("one_window decodes the first window only; batch_size decodes "
                            "every chunk of the file in batches: choose one")
        if window_s is not None and opts.batch_size is not None:
            raise UserError("window_s narrows the windows of one transcription; batch_size "
                            "decodes 30 s chunks in batches: choose one")
        if speech_until_s is not None and not (isinstance(speech_until_s, (int, float))
                                               and 0 <= speech_until_s < float("inf")):
            raise ValueError(f"speech_until_s must be a number of seconds >= 0, "
                             f"got {speech_until_s!r}")
        if speech_until_s is not None and (opts.batch_size is not None or opts.vad_filter):
            raise UserError("speech_until_s counts the seconds of the audio as given; "
                            "batch_size and vad_filter decode other windows of it")
        n_audio_ctx = None if window_s is None else _positions(window_s, self.whisper.dims)
        if opts.batch_size is not None:  # refused before a byte is decoded
            from tensorplan.whisper.decoding.batched import group_size

            check_batch_budget(self.whisper.dims, opts.batch_size, group_size(opts),
                               self.whisper.model.kv_dtype)
        samples = open_audio(audio, stream=opts.audio_stream,  # files streamed, arrays checked
                             max_seconds=max_audio_seconds)
        try:
            return self._decode(samples, opts, on_segment, progress, vad_options, one_window,
                                n_audio_ctx, speech_until_s)
        finally:
            if samples is not audio and hasattr(samples, "close"):  # a file being decoded
                samples.close()

    def _decode(self, samples: Any, opts: TranscribeOptions,
                on_segment: SegmentCallback | None, progress: ProgressCallback | None,
                vad_options: VadOptions | None, one_window: bool = False,
                n_audio_ctx: int | None = None,
                speech_until_s: float | None = None) -> TranscriptionResult:
        from tensorplan.whisper.audio.mel import MelFrames

        if opts.batch_size is not None:  # chunks cut at pauses over the whole file: read it
            return self._run_batched(np.asarray(samples), opts, on_segment, progress,
                                     vad_options)
        speech = None
        if opts.vad_filter:  # transcribe the speech only; its times are mapped back (audio/vad.py)
            speech = SpeechOnly.find(samples, vad_options)
            if not speech.chunks:  # nothing to decode
                return speech.empty_result(opts.language)
            samples, on_segment = speech.samples, speech.restoring(on_segment)
        # windows made on demand (two passes: the normalization needs the global max), so
        # long audio never holds its whole spectrogram; equal to openai's padded mel
        mel = MelFrames(samples, n_mels=self.whisper.dims.n_mels)
        state = self.state if n_audio_ctx is None else self.state.narrowed(n_audio_ctx)
        aligner = WordAligner(state, opts) if opts.word_timestamps else None
        result = transcribe(state, mel, opts, on_segment=on_segment, progress=progress,
                            aligner=aligner, one_window=one_window,
                            speech_until_s=speech_until_s)
        return speech.restore(result) if speech is not None else result

    def _run_batched(self, samples: np.ndarray, opts: TranscribeOptions,
                     on_segment: SegmentCallback | None, progress: ProgressCallback | None,
                     vad_options: VadOptions | None) -> TranscriptionResult:
        """Chunks cut at pauses (or the clip_timestamps, one chunk each), decoded in batches."""
        from tensorplan.whisper.audio.chunks import merge
        from tensorplan.whisper.audio.constants import N_SAMPLES, SAMPLE_RATE
        from tensorplan.whisper.audio.vad import SpeechChunk
        from tensorplan.whisper.decoding.batched import transcribe_batched

        assert opts.batch_size is not None
        chunks = None
        if opts.clip_timestamps:
            points = [round(t * SAMPLE_RATE) for t in opts.clip_timestamps]
            points += [len(samples)] if len(points) % 2 else []
            chunks = [c for a, b in zip(points[::2], points[1::2], strict=True)
                      for c in merge([SpeechChunk(a, min(b, len(samples)))], N_SAMPLES)
                      if c.n_samples > 0]
        try:
            return transcribe_batched(self.state, samples, opts, batch_size=opts.batch_size,
                                      chunks=chunks, vad_options=vad_options,
                                      on_segment=on_segment, progress=progress)
        finally:  # a batch's caches (GBs for large batches) are not kept between requests
            self.state.release_batches()

    def close(self) -> None:
        """Drop this session's memory; transcribing with it afterwards raises."""
        self.closed = True
        self.state.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _positions(window_s: float, dims: Dims) -> int:
    """The encoder positions of a window of `window_s` seconds (0.02 s each)."""
    n = round(window_s / TIME_PRECISION)
    if not (0 < n <= dims.n_audio_ctx and abs(n * TIME_PRECISION - window_s) < 1e-6):
        raise ValueError(f"window_s must be a multiple of {TIME_PRECISION} s up to "
                         f"{dims.n_audio_ctx * TIME_PRECISION:g}, got {window_s}")
    return n


def _both(first: SegmentCallback, then: SegmentCallback | None) -> SegmentCallback:
    def call(segment: Any) -> None:
        first(segment)
        if then is not None:
            then(segment)
    return call


class IdleSessionPool:
    """Idle sessions of one model, lent to one caller at a time; at most `keep` idle."""

    def __init__(self, whisper: Whisper, keep: int) -> None:
        self.whisper, self.keep = whisper, keep
        self._idle: list[Session] = []
        self._lock = threading.Lock()

    @contextmanager
    def borrow(self) -> Iterator[Session]:
        with self._lock:
            session = self._idle.pop() if self._idle else None
        session = session or Session(self.whisper)
        try:
            yield session
        finally:
            with self._lock:
                if len(self._idle) < self.keep:
                    self._idle.append(session)


class Whisper:
    """A loaded model, planned and ready to transcribe; shared freely across threads."""

    def __init__(self, model: WhisperModel, name: str,
                 options: ModelOptions | None = None) -> None:
        self.model = model
        self.name = name
        self.options = options or ModelOptions(model=name)
        self.pool = IdleSessionPool(self, keep=max(1, os.cpu_count() or 1))

    @property
    def dims(self) -> Dims:
        return self.model.dims

    @property
    def is_multilingual(self) -> bool:
        return self.model.is_multilingual

    @property
    def session_bytes(self) -> int:
        """Planned bytes one session holds (arenas and KV caches; weights are shared)."""
        return self.model.session_bytes

    def engine_bytes(self, windows: int, groups: Iterable[int]) -> int:
        """Planned bytes of `engine(windows)` once it has made the batches of these group
        sizes (1 greedy, beams, best_of), known before anything is allocated."""
        return int(self.model.engine_bytes(windows, groups))

    def engine_windows_within(self, nbytes: int, groups: Iterable[int], most: int) -> int:
        """The most windows, up to `most`, whose engine (`engine_bytes`) fits in `nbytes`;
        0 where not even one does. Memory grows with the windows, so a bisection; a
        batch past the KV cache limit (limits.check_batch_budget) does not fit either."""
        groups = tuple(groups)

        def fits(windows: int) -> bool:
            try:
                return self.engine_bytes(windows, groups) <= nbytes
            except UserError:
                return False

        lo, hi = 0, most
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
        return lo

    def session(self) -> Session:
        """A new stream of its own over this model's weights and plans."""
        return Session(self)

    def engine(self, windows: int | None = None, prepare: tuple[int, ...] = ()) -> Any:
        """A continuous-batching engine over this model (whisper/engine.py): many
        streams' decoding steps in one batched pass; `windows`: tasks decoding at once
        per group size; `prepare`: group sizes (1 greedy, beams) whose memory is taken
        now rather than on first use. Close it when done (it owns a thread)."""
        from tensorplan.whisper.engine import Engine
        from tensorplan.whisper.planned.step_engine import DEFAULT_WINDOWS

        return Engine(self, windows or DEFAULT_WINDOWS, prepare=prepare)

    def transcribe(self, audio: Audio, options: TranscribeOptions | None = None, *,
                   on_segment: SegmentCallback | None = None,
                   progress: ProgressCallback | None = None,
                   vad_options: VadOptions | None = None,
                   **overrides: Any) -> TranscriptionResult:
        """Transcribe a file path or 16 kHz mono samples (float; integer PCM is scaled by
        its dtype). `overrides` replace fields of `options` (e.g. `beam_size=5,
        language="en"`; openai-whisper's transcribe() arguments are taken in its forms,
        such as `temperature=0.0` or `verbose=True`: whisper/openai_args.py); `vad_options`
        tunes the speech detection of `vad_filter=True`.
        Safe to call from several threads at once: each call runs in its own session."""
        with self.pool.borrow() as session:
            return session.transcribe(audio, options, on_segment=on_segment,
                                      progress=progress, vad_options=vad_options, **overrides)


_DEFAULTS = ModelOptions()  # the keyword defaults below: each field's, defined once there


def load_model(name_or_path: str | os.PathLike[str] = DEFAULT_MODEL, *,
               compute_type: ComputeType = _DEFAULTS.compute_type,
               backend: BackendName = _DEFAULTS.backend,
               device: Device = _DEFAULTS.device,
               threads: int | None = _DEFAULTS.threads,
               plan: PlanMode = _DEFAULTS.plan,
               strategy: Strategy = _DEFAULTS.strategy,
               max_batch: int | None = _DEFAULTS.max_batch,
               kv_dtype: Precision = _DEFAULTS.kv_dtype,
               weights_dtype: Precision = _DEFAULTS.weights_dtype,
               options: ModelOptions | None = None) -> Whisper:
    """Load a Whisper model by name ("tiny.en", "base", "small") or path (a CTranslate2
    directory, an openai .pt, a whisper.cpp ggml .bin).

    The keywords are ModelOptions' fields (whisper/model_options.py); `options=` gives
    them all at once, and keywords given other values beside it replace its fields.
    compute_type: "int8" keeps every projection matrix and the token embedding as int8
      with per-row scales (faster-whisper's int8); "float32" computes as the reference.
    backend: "numpy" (the reference), "torch" (PyTorch's CPU kernels over the same plan),
      "device" (PyTorch tensors on `device`, CUDA graphs on a GPU) or "auto" (here: torch
      when installed, device on cuda; the CLI keeps short float32 work on numpy).
    device: "cpu" or "cuda" (the device backend; float16 weight matrices).
    threads: CPU threads for every pool (None: this machine's cores).
    plan / strategy: how memory is planned ("joint" / "offline" by default).
    max_batch: the most sequences decoded together (beam size, best-of); sizes the KV
      cache (None: 5).
    kv_dtype / weights_dtype: "float16" halves the KV caches / keeps the encoder's weight
      matrices as stored, for less memory at some speed.
    Raises UserError (a bad name, file or option) and ModelError (a broken model).
    """
    args = locals()
    given = {name: args[name] for name in _FIELDS if args[name] != getattr(_DEFAULTS, name)}
    try:
        opts = dataclasses.replace(options or _DEFAULTS, model=os.fspath(name_or_path),
                                   **given)
    except (TypeError, ValueError) as e:
        raise UserError(f"load_model: {e}") from None
    return load(opts)


_FIELDS = frozenset(f.name for f in dataclasses.fields(ModelOptions)) - {"model"}


def load(opts: ModelOptions, audio_seconds: float | None = None) -> Whisper:
    """The model `opts` describes, loaded and planned. `audio_seconds`, the audio this
    process will transcribe when known (the CLI's files), lets backend "auto" keep short
    work on numpy (planned/backend_choice.py); its options then name the backend it runs."""
    from tensorplan.backends import threads

    threads.configure(opts.threads)
    opts = opts.replace(backend=backend_choice.resolve(opts.backend, opts.compute_type,
                                                       audio_seconds, opts.device))
    try:
        runner = make_backend(opts.backend, opts.device)  # UserError: no such device here
    except (ImportError, ValueError) as e:  # torch missing, or no such backend
        raise UserError(f"backend {opts.backend!r}: {e}") from None
    weights, tokenizer = load_model_files(opts.model)  # CT2 dir, openai .pt or ggml .bin
    if len(tokenizer.vocab) != weights.dims.n_vocab:
        raise ModelError(f"{opts.model}: the tokenizer has {len(tokenizer.vocab)} tokens but "
                         f"the model's vocabulary has {weights.dims.n_vocab}")
    max_batch = opts.max_batch or DEFAULT_MAX_BATCH
    check_kv_budget(weights.dims, max_batch, opts.kv_dtype)  # before any arena is allocated
    key = weight_cache.cache_key(source_file(opts.model), compute_type=opts.compute_type,
                                 weights_dtype=opts.weights_dtype)
    cached = weight_cache.read(key)  # None: absent, off or corrupt; then convert
    model = WhisperModel(weights, tokenizer, weights.config, backend=runner, plan=opts.plan,
                         strategy=opts.strategy, max_batch=max_batch,
                         kv_dtype=opts.kv_dtype, weights_dtype=opts.weights_dtype,
                         compute_type=opts.compute_type, cached_weights=cached)
    if cached is None or model.param.arrays.keys() - cached.keys():
        weight_cache.write(key, model.param.arrays)
    return Whisper(model, opts.model, opts)

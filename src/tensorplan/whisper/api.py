"""The Python API: `load_model(name_or_path)` and `Whisper.transcribe(audio, ...)`.

This facade sits above the model, the decoding loop and the audio front end, so none of
those imports another to attach methods to it.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np

from tensorplan.backends import make_backend
from tensorplan.errors import ModelError, UserError
from tensorplan.whisper.formats import load_model_files
from tensorplan.whisper.limits import check_kv_budget
from tensorplan.whisper.model import WhisperModel
from tensorplan.whisper.models import DEFAULT_MODEL
from tensorplan.whisper.options import TranscribeOptions
from tensorplan.whisper.result import TranscriptionResult
from tensorplan.whisper.timing import WordAligner
from tensorplan.whisper.transcribe import ProgressCallback, SegmentCallback, transcribe
from tensorplan.whisper.vad import SpeechOnly, VadOptions


class Whisper:
    """A loaded model, planned and ready to transcribe."""

    def __init__(self, model: WhisperModel, name: str) -> None:
        self.model = model
        self.name = name

    @property
    def dims(self) -> Any:
        return self.model.dims

    @property
    def is_multilingual(self) -> bool:
        return self.model.is_multilingual

    def transcribe(self, audio: str | os.PathLike[str] | np.ndarray,
                   options: TranscribeOptions | None = None, *,
                   on_segment: SegmentCallback | None = None,
                   progress: ProgressCallback | None = None,
                   vad_options: VadOptions | None = None,
                   **overrides: Any) -> TranscriptionResult:
        """Transcribe a file path or 16 kHz mono float32 samples.

        `overrides` replace fields of `options` (e.g. `beam_size=5, language="en"`).
        `vad_options` tunes the speech detection of `vad_filter=True`.
        """
        from tensorplan.whisper.audio import MelFrames, open_audio

        opts = dataclasses.replace(options or TranscribeOptions(), **overrides)
        samples = open_audio(audio, stream=opts.audio_stream)  # files streamed, arrays checked
        speech = None
        if opts.vad_filter:  # transcribe the speech only; its times are mapped back (vad.py)
            speech = SpeechOnly.find(samples, vad_options)
            if not speech.chunks:  # nothing to decode
                return speech.empty_result(opts.language)
            samples, on_segment = speech.samples, speech.restoring(on_segment)
        # windows made on demand (two passes: the normalization needs the global max), so
        # long audio never holds its whole spectrogram; equal to openai's padded mel
        mel = MelFrames(samples, n_mels=self.model.dims.n_mels)
        aligner = WordAligner(self.model, opts) if opts.word_timestamps else None
        result = transcribe(self.model, mel, opts, on_segment=on_segment, progress=progress,
                            aligner=aligner)
        return speech.restore(result) if speech is not None else result


def load_model(name_or_path: str | os.PathLike[str] = DEFAULT_MODEL, *, plan: str = "joint",
               strategy: str = "offline", max_batch: int = 5, kv_dtype: str = "float32",
               weights_dtype: str = "float32", compute_type: str = "float32",
               backend: str = "auto") -> Whisper:
    """Load a CTranslate2 Whisper model by name ("tiny.en", "base", "small") or directory.

    max_batch: the most sequences decoded together (beam size, best-of); sizes the KV cache.
    kv_dtype / weights_dtype: "float16" halves the KV caches / keeps the encoder's weight
    matrices as stored, for less memory at some speed.
    compute_type: "int8" keeps every projection matrix and the token embedding as int8
    with per-row scales (a quarter of their bytes; the torch backend runs them with
    FBGEMM), as faster-whisper's int8; "float32" (default) computes as the reference does.
    backend: "numpy" (the reference), "torch" (PyTorch's CPU kernels over the same plan,
    faster; needs tensorplan[torch]) or "auto" (torch when installed).
    """
    try:
        runner = make_backend(backend)
    except (ImportError, ValueError) as e:  # torch missing, or no such backend
        raise UserError(f"backend {backend!r}: {e}") from None
    weights, tokenizer = load_model_files(name_or_path)  # CT2 dir, openai .pt or ggml .bin
    if len(tokenizer.vocab) != weights.dims.n_vocab:
        raise ModelError(f"{name_or_path}: the tokenizer has {len(tokenizer.vocab)} tokens but "
                         f"the model's vocabulary has {weights.dims.n_vocab}")
    check_kv_budget(weights.dims, max_batch, kv_dtype)  # before any arena is allocated
    model = WhisperModel(weights, tokenizer, weights.config, plan=plan, strategy=strategy,
                         max_batch=max_batch, kv_dtype=kv_dtype, weights_dtype=weights_dtype,
                         compute_type=compute_type, backend=runner)
    return Whisper(model, os.fspath(name_or_path))

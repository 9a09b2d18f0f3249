"""`WhisperModel` and `BatchedInferencePipeline` with faster-whisper 1.2's signatures, on
tensorplan's engine: `transcribe` returns a lazy generator of segments, decoded as it is
read (stream.py), and a TranscriptionInfo, as faster-whisper's does.

Eager work happens where faster-whisper does it: audio decoding, voice activity detection
and language detection run in `transcribe()` (the info needs them); windows are decoded
only while the generator is read.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import threading
from collections.abc import Iterable
from typing import Any, BinaryIO

import numpy as np

from tensorplan.compat.faster_whisper import arguments
from tensorplan.compat.faster_whisper.arguments import Unsupported, refuse
from tensorplan.compat.faster_whisper.audio import SAMPLE_RATE, samples_of
from tensorplan.compat.faster_whisper.names import model_source
from tensorplan.compat.faster_whisper.stream import OnProgress, segments_as_decoded
from tensorplan.compat.faster_whisper.types import (
    Segment,
    TranscriptionInfo,
    TranscriptionOptions,
    Word,
)
from tensorplan.errors import UserError
from tensorplan.whisper.api import Whisper, load_model
from tensorplan.whisper.audio.chunks import MAX_CHUNK_SECONDS, cut
from tensorplan.whisper.audio.constants import N_FRAMES
from tensorplan.whisper.audio.mel import MelFrames
from tensorplan.whisper.audio.vad import SpeechOnly, VadOptions
from tensorplan.whisper.decoding.window import detect_language
from tensorplan.whisper.limits import check_token_ids
from tensorplan.whisper.options import max_batch
from tensorplan.whisper.planned.load_options import MAX_THREADS, ComputeType, Device
from tensorplan.whisper.result import Segment as TpSegment
from tensorplan.whisper.tokenizer import LANGUAGES

log = logging.getLogger("tensorplan.compat.faster_whisper")
DEFAULT_TEMPERATURES = [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
PREPEND = "\"'“¿([{-"
APPEND = "\"'.。,，!！?？:：”)]}、"
# faster-whisper's compute types → tensorplan's (CPU); float16 types need device="cuda"
_COMPUTE_TYPES: dict[str, ComputeType] = {
    "default": "float32", "float32": "float32", "auto": "int8", "int8": "int8",
    "int8_float32": "int8"}
_CUDA_COMPUTE_TYPES = ("float16", "int8_float16", "bfloat16", "int8_bfloat16")


class WhisperModel:
    """faster_whisper.WhisperModel over a tensorplan model (its `whisper` attribute)."""

    def __init__(self, model_size_or_path: str, device: str = "auto",
                 device_index: int | list[int] = 0, compute_type: str = "default",
                 cpu_threads: int = 0, num_workers: int = 1, download_root: str | None = None,
                 local_files_only: bool = False, files: dict | None = None,  # type: ignore[type-arg]
                 revision: str | None = None, use_auth_token: str | bool | None = None,
                 **model_kwargs: Any) -> None:
        for name, value in (("device_index", device_index), ("files", files),
                            ("revision", revision), ("use_auth_token", use_auth_token)):
            refuse(name, value)
        if model_kwargs:
            name = sorted(model_kwargs)[0]
            raise Unsupported(name, model_kwargs[name], "CTranslate2's model options do not "
                              "apply to tensorplan")
        if not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"num_workers must be a positive integer, got {num_workers!r}")
        if not isinstance(cpu_threads, int) or not 0 <= cpu_threads <= MAX_THREADS:
            raise ValueError(f"cpu_threads must be 0 (all cores) to {MAX_THREADS}, got "
                             f"{cpu_threads!r}")
        device = _device(device)
        # local_files_only: always so (nothing is downloaded); num_workers: each call runs
        # in a session of its own, so concurrent calls from threads run in parallel anyway
        self._load = dict(name_or_path=model_source(model_size_or_path, download_root),
                          device=device, compute_type=_compute_type(compute_type, device),
                          threads=cpu_threads or None)
        self.whisper: Whisper = load_model(**self._load)  # type: ignore[arg-type]
        self._grow = threading.Lock()

    def _whisper_for(self, options: Any) -> Whisper:
        """The model, its KV cache planned for the sequences `options` decode together:
        faster-whisper takes any beam_size or best_of per call, where a tensorplan model
        plans its cache once (5 sequences by default). A call that needs more loads the
        model again with a cache that size, which serves every later call."""
        try:  # now, as a ValueError: it failed while the segments were iterated
            check_token_ids([t for t in options.suppress_tokens or () if t >= 0],
                            self.whisper.dims.n_vocab, "suppress_tokens")
        except UserError as e:
            raise ValueError(str(e)) from None
        need = max_batch(options)
        with self._grow:
            if need > self.whisper.model.max_batch:
                log.info("beam_size/best_of %d: planning the model for %d sequences", need,
                         need)
                self.whisper = load_model(**self._load, max_batch=need)  # type: ignore[arg-type]
            return self.whisper

    @property
    def supported_languages(self) -> list[str]:
        """The languages supported by the model."""
        return list(LANGUAGES) if self.whisper.is_multilingual else ["en"]

    def detect_language(self, audio: np.ndarray | None = None,
                        features: np.ndarray | None = None, vad_filter: bool = False,
                        vad_parameters: dict | VadOptions = None,  # type: ignore[assignment,type-arg]
                        language_detection_segments: int = 1,
                        language_detection_threshold: float = 0.5,
                        ) -> tuple[str, float, list[tuple[str, float]]]:
        """(language, its probability, every language's probability, most likely first),
        from the first 30 seconds of `audio` (or of its speech with `vad_filter`)."""
        refuse("language_detection_segments", language_detection_segments)
        if audio is None and features is None:
            raise ValueError("detect_language needs audio or features")
        if features is not None and audio is None:
            raise Unsupported("features", "...", "give the audio: tensorplan computes its "
                              "own log-mel frames")
        samples = samples_of(np.asarray(audio))
        if vad_filter:
            samples = SpeechOnly.find(samples, arguments.vad_options(vad_parameters)).samples
        return self._language(samples)

    def _language(self, samples: np.ndarray) -> tuple[str, float, list[tuple[str, float]]]:
        if not self.whisper.is_multilingual:
            return "en", 1.0, [("en", 1.0)]
        with self.whisper.pool.borrow() as session:
            state = session.state
            frames = MelFrames(samples, n_mels=self.whisper.dims.n_mels)
            n = min(N_FRAMES, frames.n_frames)
            mel = np.zeros((frames.n_mels, N_FRAMES), np.float32)
            mel[:, :n] = frames.window(0, n)
            state.encode(mel)
            language, probs = detect_language(state, state.tokenizer)
        ranked = sorted((probs or {language: 1.0}).items(), key=lambda kv: -kv[1])
        return language, ranked[0][1], ranked

    def transcribe(
        self,
        audio: str | BinaryIO | np.ndarray,
        language: str | None = None,
        task: str = "transcribe",
        log_progress: bool = False,
        beam_size: int = 5,
        best_of: int = 5,
        patience: float = 1,
        length_penalty: float = 1,
        repetition_penalty: float = 1,
        no_repeat_ngram_size: int = 0,
        temperature: float | list[float] | tuple[float, ...] = DEFAULT_TEMPERATURES,  # noqa: B006
        compression_ratio_threshold: float | None = 2.4,
        log_prob_threshold: float | None = -1.0,
        no_speech_threshold: float | None = 0.6,
        condition_on_previous_text: bool = True,
        prompt_reset_on_temperature: float = 0.5,
        initial_prompt: str | Iterable[int] | None = None,
        prefix: str | None = None,
        suppress_blank: bool = True,
        suppress_tokens: list[int] | None = [-1],  # noqa: B006
        without_timestamps: bool = False,
        max_initial_timestamp: float = 1.0,
        word_timestamps: bool = False,
        prepend_punctuations: str = PREPEND,
        append_punctuations: str = APPEND,
        multilingual: bool = False,
        vad_filter: bool = False,
        vad_parameters: dict | VadOptions | None = None,  # type: ignore[type-arg]
        max_new_tokens: int | None = None,
        chunk_length: int | None = None,
        clip_timestamps: str | list[float] = "0",
        hallucination_silence_threshold: float | None = None,
        hotwords: str | None = None,
        language_detection_threshold: float | None = 0.5,
        language_detection_segments: int = 1,
    ) -> tuple[Iterable[Segment], TranscriptionInfo]:
        """Transcribe `audio` (a path, a file object or 16 kHz samples): a generator of
        segments, decoded window by window as it is read, and the TranscriptionInfo."""
        args = arguments.check_common(_arguments(locals()), self.whisper.is_multilingual)
        samples = samples_of(audio)
        duration = len(samples) / SAMPLE_RATE
        clips = arguments.clip_points(args["clip_timestamps"])
        speech, vad = None, None
        if vad_filter and not clips:  # faster-whisper ignores vad_filter given clip times
            vad = arguments.vad_options(vad_parameters)
            speech = SpeechOnly.find(samples, vad)
            samples = speech.samples
        options = arguments.transcribe_options(args, clips=clips)
        language, probability, ranked = self._given_or_detected(args["language"], samples)
        options = dataclasses.replace(options, language=language)
        whisper = self._whisper_for(options)  # now: a limit fails here, not while iterating

        def run(on_segment: Any, on_progress: OnProgress) -> None:
            if speech is not None:
                if not speech.chunks:
                    return
                on_segment = speech.restoring(on_segment)
            whisper.transcribe(samples, options, on_segment=on_segment, progress=on_progress)

        segments = segments_as_decoded(run, _segment, _progress_bar(log_progress))
        info = TranscriptionInfo(
            language=language, language_probability=probability, duration=duration,
            duration_after_vad=len(samples) / SAMPLE_RATE,
            all_language_probs=ranked, transcription_options=_info_options(args),
            vad_options=vad if vad is not None else vad_parameters)
        return segments, info

    def _given_or_detected(self, language: str | None, samples: np.ndarray
                           ) -> tuple[str, float, list[tuple[str, float]] | None]:
        if language is not None:
            return language, 1, None
        if not self.whisper.is_multilingual:
            return "en", 1, None
        return self._language(samples)


class BatchedInferencePipeline:
    """faster_whisper.BatchedInferencePipeline on tensorplan's batched decoding: chunks cut
    at pauses, `batch_size` of them encoded and decoded together."""

    def __init__(self, model: WhisperModel) -> None:
        self.model = model

    def transcribe(
        self,
        audio: str | BinaryIO | np.ndarray,
        language: str | None = None,
        task: str = "transcribe",
        log_progress: bool = False,
        beam_size: int = 5,
        best_of: int = 5,
        patience: float = 1,
        length_penalty: float = 1,
        repetition_penalty: float = 1,
        no_repeat_ngram_size: int = 0,
        temperature: float | list[float] | tuple[float, ...] = DEFAULT_TEMPERATURES,  # noqa: B006
        compression_ratio_threshold: float | None = 2.4,
        log_prob_threshold: float | None = -1.0,
        no_speech_threshold: float | None = 0.6,
        condition_on_previous_text: bool = True,
        prompt_reset_on_temperature: float = 0.5,
        initial_prompt: str | Iterable[int] | None = None,
        prefix: str | None = None,
        suppress_blank: bool = True,
        suppress_tokens: list[int] | None = [-1],  # noqa: B006
        without_timestamps: bool = True,
        max_initial_timestamp: float = 1.0,
        word_timestamps: bool = False,
        prepend_punctuations: str = PREPEND,
        append_punctuations: str = APPEND,
        multilingual: bool = False,
        vad_filter: bool = True,
        vad_parameters: dict | VadOptions | None = None,  # type: ignore[type-arg]
        max_new_tokens: int | None = None,
        chunk_length: int | None = None,
        clip_timestamps: list[dict] | None = None,  # type: ignore[type-arg]
        hallucination_silence_threshold: float | None = None,
        batch_size: int = 8,
        hotwords: str | None = None,
        language_detection_threshold: float | None = 0.5,
        language_detection_segments: int = 1,
    ) -> tuple[Iterable[Segment], TranscriptionInfo]:
        """Transcribe in chunks of at most 30 s, `batch_size` at a time. Each chunk is
        decoded on its own, at the first temperature, prompted by `initial_prompt` only."""
        given = _arguments(locals())
        whisper = self.model.whisper
        arguments.refuse_unused(given, _BATCHED_DEFAULTS)
        args = arguments.check_common(given, whisper.is_multilingual)
        samples = samples_of(audio)
        duration = len(samples) / SAMPLE_RATE
        vad = None
        if clip_timestamps:  # faster-whisper: seconds, one chunk each; vad_filter ignored
            try:
                spans = [(float(c["start"]), float(c["end"])) for c in clip_timestamps]
            except (KeyError, TypeError, ValueError):
                raise ValueError("clip_timestamps must be dicts of seconds, "
                                 "[{'start': 0, 'end': 10.5}, ...], got "
                                 f"{clip_timestamps!r}") from None
        elif vad_filter:
            vad = arguments.vad_options(vad_parameters, max_speech_duration_s=MAX_CHUNK_SECONDS,
                                        **({} if vad_parameters else
                                           {"min_silence_duration_ms": 160}))
            spans = [(c.start / SAMPLE_RATE, c.end / SAMPLE_RATE)
                     for c in cut(samples, vad, use_vad=True)]
        elif duration < MAX_CHUNK_SECONDS:
            spans = [(0.0, duration)] if len(samples) else []
        else:
            raise RuntimeError("No clip timestamps found. Set 'vad_filter' to True or provide "
                               "'clip_timestamps'.")
        points = tuple(t for span in spans for t in span)
        options = arguments.transcribe_options(
            dict(args, temperature=_first(args["temperature"])), clips=points,
            batch_size=batch_size)
        first = samples[round(spans[0][0] * SAMPLE_RATE):] if spans else samples
        language, probability, ranked = self.model._given_or_detected(args["language"], first)
        options = dataclasses.replace(options, language=language)
        whisper = self.model._whisper_for(options)

        def run(on_segment: Any, on_progress: OnProgress) -> None:
            if spans:
                whisper.transcribe(samples, options, on_segment=on_segment,
                                   progress=on_progress)

        segments = segments_as_decoded(run, _batched_segment, _progress_bar(log_progress))
        info = TranscriptionInfo(
            language=language, language_probability=probability, duration=duration,
            duration_after_vad=sum(b - a for a, b in spans), all_language_probs=ranked,
            transcription_options=_info_options(args),
            vad_options=vad if vad is not None else vad_parameters)
        return segments, info


_BATCHED_DEFAULTS = {name: p.default for name, p in
                     inspect.signature(BatchedInferencePipeline.transcribe).parameters.items()}


def _first(temperature: float | list[float] | tuple[float, ...]) -> Any:
    """The batched pipeline decodes at the first temperature (faster-whisper's rule)."""
    return temperature[0] if isinstance(temperature, list | tuple) and temperature \
        else temperature  # checked as a number by transcribe_options


def _arguments(local_vars: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in local_vars.items() if k not in ("self", "audio")}


def _device(device: str) -> Device:
    if device == "auto":
        try:
            import torch

            return "cuda" if torch.cuda.is_available() else "cpu"
        except ImportError:
            return "cpu"
    if device == "cpu":
        return "cpu"
    if device == "cuda":
        return "cuda"
    raise ValueError(f"device must be 'cpu', 'cuda' or 'auto', got {device!r}")


def _compute_type(compute_type: str, device: str) -> ComputeType:
    if compute_type in _CUDA_COMPUTE_TYPES:
        if device != "cuda":
            raise Unsupported("compute_type", compute_type, "16-bit types run on device="
                              "'cuda' only; on the CPU use 'int8' or 'float32'")
        return "float32"  # the device backend keeps its weight matrices in float16
    if compute_type not in _COMPUTE_TYPES:
        known = ", ".join([*_COMPUTE_TYPES, *_CUDA_COMPUTE_TYPES])
        raise ValueError(f"compute_type must be one of {known}; got {compute_type!r}")
    return _COMPUTE_TYPES[compute_type]


def _words(segment: TpSegment) -> list[Word] | None:
    if segment.words is None:
        return None
    return [Word(start=w.start, end=w.end, word=w.word, probability=w.probability)
            for w in segment.words]


def _segment(segment: TpSegment) -> Segment:
    return Segment(id=segment.id + 1, seek=segment.seek, start=segment.start, end=segment.end,
                   text=segment.text, tokens=list(segment.tokens),
                   avg_logprob=segment.avg_logprob, compression_ratio=segment.compression_ratio,
                   no_speech_prob=segment.no_speech_prob, words=_words(segment),
                   temperature=segment.temperature)


def _batched_segment(segment: TpSegment) -> Segment:
    """faster-whisper's batched segments carry times rounded to the millisecond."""
    out = _segment(segment)
    out.start, out.end = round(out.start, 3), round(out.end, 3)
    return out


def _info_options(args: dict[str, Any]) -> TranscriptionOptions:
    temperature = args["temperature"]
    names = {f.name for f in dataclasses.fields(TranscriptionOptions)}
    values = {k: v for k, v in args.items() if k in names}
    values["temperatures"] = list(temperature) if isinstance(temperature, list | tuple) \
        else [temperature]
    return TranscriptionOptions(**values)


def _progress_bar(log_progress: bool) -> OnProgress | None:
    """faster-whisper's log_progress: a tqdm bar of the audio decoded."""
    if not log_progress:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        raise Unsupported("log_progress", True, "the progress bar needs tqdm: "
                          "pip install tqdm") from None
    bar = tqdm(total=0, unit="frames")

    def update(done: int, total: int) -> None:
        bar.total = total
        bar.update(done - bar.n)
        if done >= total:
            bar.close()

    return update



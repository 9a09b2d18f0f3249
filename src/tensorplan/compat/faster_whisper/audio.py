"""faster-whisper's `decode_audio`: a path or a file object → 16 kHz mono float32."""

from __future__ import annotations

import os
from typing import BinaryIO

import numpy as np

from tensorplan.compat.faster_whisper.arguments import refuse
from tensorplan.whisper.audio.decode import as_samples, check_rate, load_audio

SAMPLE_RATE = 16000


def decode_audio(input_file: str | BinaryIO | bytes, sampling_rate: int = 16000,
                 split_stereo: bool = False) -> np.ndarray:
    """Decode and resample to `sampling_rate`, mono. Raises AudioError naming the input
    for an unreadable file or one without samples."""
    refuse("split_stereo", split_stereo)
    check_rate(sampling_rate, "decode_audio: sampling_rate")
    if isinstance(input_file, str | os.PathLike | bytes):
        source = input_file  # bytes: a whole file's, as tensorplan's own API takes
    elif callable(getattr(input_file, "read", None)):
        source = input_file.read()
    else:
        raise TypeError("audio must be a path, a binary file object, a file's bytes or a "
                        f"numpy array of samples, got {type(input_file).__name__}")
    return load_audio(source, sr=sampling_rate)


def samples_of(audio: str | BinaryIO | bytes | np.ndarray) -> np.ndarray:
    """transcribe()'s audio as 16 kHz samples: arrays are taken as they are (float, or
    integer PCM scaled by its dtype), copied, since the segments are decoded later, while
    the caller reads them, and it may have reused its buffer by then (faster-whisper
    computes its features before it returns); an empty array is empty audio."""
    if isinstance(audio, np.ndarray):
        samples = as_samples(audio)
        return samples.copy() if np.may_share_memory(samples, audio) else samples
    return decode_audio(audio)

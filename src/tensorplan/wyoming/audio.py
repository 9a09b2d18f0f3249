"""One utterance's audio as it arrives in audio-chunk events, converted to 16 kHz mono
16-bit (wyoming's AudioChunkConverter) and bounded in length."""

from __future__ import annotations

from typing import Any, TypeGuard

import numpy as np
from wyoming.audio import AudioChunk, AudioChunkConverter

RATE, WIDTH, CHANNELS = 16000, 2, 1  # what the model hears
RATES = range(8000, 192001)  # sample rates accepted from a client
WIDTHS = (1, 2, 4)  # bytes per sample audioop converts
MAX_CHANNELS = 8
# samples as the converter reads them, to mix channels before converting: signed,
# little-endian (8-bit audio is widened to 16 bits first: _widened)
SAMPLE_TYPES: dict[int, np.dtype[Any]] = {2: np.dtype("<i2"), 4: np.dtype("<i4")}


class BadAudio(ValueError):
    """A format or length this server refuses; the message is sent as an error event."""


def whole(value: object) -> TypeGuard[int]:
    """A JSON whole number: an int, and not True or False (bool is an int in Python)."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_format(rate: object, width: object, channels: object) -> None:
    if not whole(rate) or rate not in RATES:
        raise BadAudio(f"audio rate {rate!r} Hz is not supported (8000 to 192000)")
    if not whole(width) or width not in WIDTHS:
        raise BadAudio(f"audio width {width!r} is not supported (1, 2 or 4 bytes)")
    if not whole(channels) or not 1 <= channels <= MAX_CHANNELS:
        raise BadAudio(f"audio channels {channels!r} is not supported (1 to {MAX_CHANNELS})")


class Utterance:
    """The converted samples of one audio-start ... audio-stop."""

    def __init__(self, max_seconds: float) -> None:
        self.converter = AudioChunkConverter(rate=RATE, width=WIDTH, channels=CHANNELS)
        self.pcm = bytearray()
        self.max_bytes = int(max_seconds * RATE) * WIDTH
        self.max_seconds = max_seconds

    def add(self, chunk: AudioChunk) -> None:
        check_format(chunk.rate, chunk.width, chunk.channels)
        frame = chunk.width * chunk.channels
        if len(chunk.audio) % frame:
            raise BadAudio(f"audio-chunk holds {len(chunk.audio)} bytes, not whole "
                           f"{chunk.width}-byte samples of {chunk.channels} channels")
        if chunk.width == 1:
            chunk = _widened(chunk)
        if chunk.channels > 1:
            chunk = _mono(chunk)
        self.pcm += self.converter.convert(chunk).audio
        if len(self.pcm) > self.max_bytes:
            raise BadAudio(f"the audio is longer than {self.max_seconds:g} s")

    def samples(self) -> np.ndarray:
        return np.frombuffer(bytes(self.pcm), np.int16)  # int16 PCM: the API scales it


def _widened(chunk: AudioChunk) -> AudioChunk:
    """8-bit PCM (WAV's: unsigned, silence at 128) as 16-bit signed. The package's
    converter reads 8-bit as unsigned only from some version on (1.5 read it as signed),
    and mixing it as signed made a tone beside a silent channel all positive."""
    samples = (np.frombuffer(chunk.audio, np.uint8).astype(np.int16) - 128) << 8
    return AudioChunk(rate=chunk.rate, width=2, channels=chunk.channels,
                      audio=samples.astype("<i2").tobytes(), timestamp=chunk.timestamp)


def _mono(chunk: AudioChunk) -> AudioChunk:
    """The channels' mean, in the chunk's width: the converter's own mixing (audioop's
    tomono) reads every frame as a stereo pair, so 3 to 8 channels came out time-stretched
    ("purple purple purple" for jfk in 4 channels)."""
    kind = SAMPLE_TYPES[chunk.width]
    frames = np.frombuffer(chunk.audio, kind).reshape(-1, chunk.channels)
    mixed = frames.mean(axis=1, dtype=np.float64).round().astype(kind)
    return AudioChunk(rate=chunk.rate, width=chunk.width, channels=1,
                      audio=mixed.tobytes(), timestamp=chunk.timestamp)

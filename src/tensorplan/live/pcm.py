"""Raw audio in, 16 kHz mono float32 out: PCM16 at any rate and channel count, G.711 μ-law
and A-law at 8 kHz; soxr's streaming resampler keeps its state across pieces, so pieces
of any size join without clicks."""

from __future__ import annotations

import numpy as np
import soxr

from tensorplan.live.options import SAMPLE_RATE

ENCODINGS = ("s16le", "mulaw", "alaw")
G711_RATE = 8000


def _ulaw_table() -> np.ndarray:
    """ITU-T G.711 μ-law: all 256 codes as linear values in [-1, 1]."""
    codes = ~np.arange(256, dtype=np.uint8)
    sign = codes & 0x80
    exponent = (codes >> 4) & 0x07
    mantissa = codes & 0x0F
    magnitude = (((mantissa.astype(np.int32) << 3) + 0x84) << exponent) - 0x84
    return (np.where(sign, -magnitude, magnitude) / 32768.0).astype(np.float32)


def _alaw_table() -> np.ndarray:
    """ITU-T G.711 A-law: all 256 codes as linear values in [-1, 1]."""
    codes = np.arange(256, dtype=np.uint8) ^ 0x55
    sign = codes & 0x80
    exponent = (codes >> 4) & 0x07
    mantissa = (codes & 0x0F).astype(np.int32)
    magnitude = np.where(exponent == 0, (mantissa << 4) + 8,
                         ((mantissa << 4) + 0x108) << np.maximum(exponent - 1, 0))
    return (np.where(sign, magnitude, -magnitude) / 32768.0).astype(np.float32)


_TABLES = {"mulaw": _ulaw_table(), "alaw": _alaw_table()}


class PcmDecoder:
    """Bytes of one encoding, rate and channel count → 16 kHz mono float32, piece by piece
    (a piece may end inside a sample: the rest waits for the next piece)."""

    def __init__(self, encoding: str = "s16le", rate: int = 24000, channels: int = 1) -> None:
        if encoding not in ENCODINGS:
            raise ValueError(f"unknown encoding {encoding!r}: one of {', '.join(ENCODINGS)}")
        if not 1000 <= rate <= 384000 or not 1 <= channels <= 32:
            raise ValueError("the rate must be 1000 to 384000 Hz and channels 1 to 32")
        self.encoding, self.rate, self.channels = encoding, rate, channels
        self.frame_bytes = (2 if encoding == "s16le" else 1) * channels
        self._rest = b""
        self._resampler = (None if rate == SAMPLE_RATE
                           else soxr.ResampleStream(rate, SAMPLE_RATE, 1, dtype="float32"))

    def decode(self, data: bytes, last: bool = False) -> np.ndarray:
        data = self._rest + data
        whole = len(data) - len(data) % self.frame_bytes
        data, self._rest = data[:whole], data[whole:]
        if self.encoding == "s16le":
            samples = np.frombuffer(data, "<i2").astype(np.float32) / 32768.0
        else:
            samples = _TABLES[self.encoding][np.frombuffer(data, np.uint8)]
        if self.channels > 1:
            samples = samples.reshape(-1, self.channels).mean(axis=1, dtype=np.float32)
        if self._resampler is not None:
            samples = self._resampler.resample_chunk(samples, last=last)
        return np.ascontiguousarray(samples, np.float32)

    def flush(self) -> np.ndarray:
        """The samples the resampler still holds back (its filter's delay: 36 ms at 24 kHz,
        86 ms for G.711), and a fresh start: where the audio ends (a commit, a new format),
        so they stay with the audio they belong to."""
        self._rest = b""
        if self._resampler is None:
            return np.zeros(0, np.float32)
        held = self._resampler.resample_chunk(np.zeros(0, np.float32), last=True)
        self._resampler.clear()
        return np.ascontiguousarray(held, np.float32)

    def seconds(self, n_bytes: int) -> float:
        """The audio `n_bytes` of input holds."""
        return n_bytes / self.frame_bytes / self.rate

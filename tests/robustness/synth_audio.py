"""Audio files built in memory for the robustness tests and the fuzz seeds: canonical WAV
of any layout (or a lying header), and PyAV-encoded compressed formats. Nothing downloaded."""

from __future__ import annotations

import io
import struct
import zlib
from collections.abc import Iterable, Iterator
from typing import Any

import av
import numpy as np
from av_encode import encode_pcm16  # tests/whisper: on the path (conftest.py, make_corpus.py)

RATE = 16000


def wav(samples: np.ndarray | bytes, rate: int = RATE, channels: int = 1, bits: int = 16,
        fmt_tag: int = 1, declared: int | None = None) -> bytes:
    """A canonical RIFF/WAVE file; `declared` overrides the data chunk's length field."""
    data = samples if isinstance(samples, bytes) else samples.tobytes()
    block = channels * bits // 8
    fmt = struct.pack("<HHIIHH", fmt_tag, channels, rate, rate * block, block, bits)
    size = len(data) if declared is None else declared
    chunks = b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", size)
    return b"RIFF" + struct.pack("<I", 4 + len(chunks) + len(data)) + b"WAVE" + chunks + data


def tone(seconds: float, rate: int = RATE, channels: int = 1) -> np.ndarray:
    """A 440 Hz tone at -10 dBFS, float64 in [-1, 1], shape (n,) or (n, channels)."""
    t = np.arange(int(seconds * rate)) / rate
    x = 0.3 * np.sin(2 * np.pi * 440 * t)
    return x if channels == 1 else np.repeat(x[:, None], channels, axis=1)


def pcm16(x: np.ndarray) -> np.ndarray:
    return np.round(x * 32767).astype("<i2")


def pcm24(x: np.ndarray) -> bytes:
    ints = np.round(x.reshape(-1) * (2**23 - 1)).astype("<i4")
    return ints.view(np.uint8).reshape(-1, 4)[:, :3].tobytes()  # little-endian low 3 bytes


def encoded(codec: str, fmt: str, seconds: float = 2.0, silent: bool = False) -> bytes:
    """int16 mono tone (or silence) compressed with PyAV (bundled ffmpeg)."""
    buf = io.BytesIO()
    sound = tone(seconds) * (0 if silent else 1)
    with av.open(buf, "w", format=fmt) as out:
        encode_pcm16(out, codec, RATE, [pcm16(sound)])
    return buf.getvalue()


def half(data: bytes) -> bytes:
    return data[: len(data) // 2]


def png() -> bytes:
    """A valid 4x4 PNG picture."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + data))
        return struct.pack(">I", len(data)) + kind + data + crc

    rows = b"".join(b"\0" + b"\x80" * 12 for _ in range(4))
    header = struct.pack(">IIBBBBB", 4, 4, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows))
            + chunk(b"IEND", b""))


def write_flac(path: Any, pieces: Iterable[np.ndarray], rate: int = RATE) -> Any:
    """Encode float pieces (mono, any lengths) into one FLAC file, piece by piece: a file of
    hours is written without ever holding its samples."""
    with av.open(str(path), "w", format="flac") as out:
        encode_pcm16(out, "flac", rate, (pcm16(piece[start:start + 10 * rate])
                                         for piece in pieces
                                         for start in range(0, piece.size, 10 * rate)))
    return path


def silence_pieces(seconds: float, rate: int = RATE) -> Iterator[np.ndarray]:
    """`seconds` of digital silence, a minute at a time."""
    left = int(seconds * rate)
    while left > 0:
        n = min(left, 60 * rate)
        yield np.zeros(n, np.float32)
        left -= n

"""Read and write whisper.cpp's ggml model files (`ggml-tiny.en.bin`, ...).

The layout is whisper.cpp's legacy one (its `models/convert-pt-to-ggml.py` writes it and
`whisper_model_load` reads it), little-endian, packed with no alignment:

    i32 magic 0x67676d6c ("ggml")
    i32 n_vocab, n_audio_ctx, n_audio_state, n_audio_head, n_audio_layer,
        n_text_ctx, n_text_state, n_text_head, n_text_layer, n_mels, ftype
    i32 n_mel, n_fft; f32 filters[n_mel * n_fft]            # the mel filterbank, (n_mel, 201)
    i32 n_tokens; n_tokens × (i32 len, u8 bytes[len])       # raw bytes of the text tokens
    until EOF, per tensor:
        i32 n_dims, name_len, ttype; i32 ne[n_dims]; u8 name[name_len]; data
        # ne is ggml's order, innermost first: the reverse of the numpy shape

Tensor names are openai-whisper's (`encoder.blocks.0.attn.query.weight`). ftype is 1 for f16
files: ≥2-D weights are f16, and 1-D tensors, conv biases (stored as (n, 1)) and both
positional embeddings are f32, because whisper.cpp creates them so and rejects other types.
The tokens are only the text tokens (ids below <|endoftext|>); whisper.cpp numbers the
specials itself from n_vocab. Quantized files (ftype 2 and up) are refused.

Reading maps the file: tensors are read-only, unaligned views into the mapping, and every
count is checked against the bytes left before anything is allocated. Problems are one-line
`ModelError`s that start with the path.
"""

from __future__ import annotations

import math
import mmap
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tensorplan.errors import ModelError
from tensorplan.files import atomic_write
from tensorplan.whisper.model_files.ct2_file import map_file
from tensorplan.whisper.model_files.ct2_weights import ModelDims

GGML_MAGIC = 0x67676D6C
QNT_VERSION_FACTOR = 1000  # ftype = quantization version × 1000 + type
FTYPE_F32, FTYPE_F16 = 0, 1
HPARAMS = (  # order of the header fields after the magic (ftype comes last)
    "n_vocab",
    "n_audio_ctx",
    "n_audio_state",
    "n_audio_head",
    "n_audio_layer",
    "n_text_ctx",
    "n_text_state",
    "n_text_head",
    "n_text_layer",
    "n_mels",
)
GGML_TYPE_F32, GGML_TYPE_F16 = 0, 1  # ggml_type ids, per tensor (the only ones read here)
TTYPES: dict[int, np.dtype[Any]] = {GGML_TYPE_F32: np.dtype("<f4"), GGML_TYPE_F16: np.dtype("<f2")}
MAX_DIMS = 4  # whisper.cpp reads ne into int32_t[4]
MAX_NAME = 1024
MAX_HPARAM = 1 << 24
CONV_BIASES = ("encoder.conv1.bias", "encoder.conv2.bias")
F32_NAMES = (*CONV_BIASES, "encoder.positional_embedding", "decoder.positional_embedding")


@dataclass(frozen=True, slots=True)
class GgmlFile:
    """A parsed ggml file. `tensors` holds openai names → arrays in numpy order and openai's
    shapes (the conv biases' trailing 1 dropped), read-only views of the mapping."""

    path: Path
    dims: ModelDims
    ftype: int
    mel_filters: np.ndarray  # (n_mel, n_fft) float32
    tokens: tuple[bytes, ...]  # raw bytes of the text tokens, by id
    tensors: dict[str, np.ndarray]
    buf: mmap.mmap


class _Reader:
    """Bounds-checked int32 reads from the mapped file."""

    def __init__(self, buf: mmap.mmap, path: Path) -> None:
        self.buf, self.path, self.pos = buf, path, 0

    def error(self, problem: str) -> ModelError:
        return ModelError(f"{self.path}: {problem}")

    @property
    def left(self) -> int:
        return len(self.buf) - self.pos

    def take(self, n: int, what: str) -> int:
        if n > self.left:
            raise self.error(f"truncated: {what} needs {n} bytes at offset {self.pos}, "
                             f"only {self.left} remain")
        start, self.pos = self.pos, self.pos + n
        return start

    def ints(self, n: int, what: str) -> tuple[int, ...]:
        return struct.unpack_from(f"<{n}i", self.buf, self.take(4 * n, what))

    def count(self, what: str, limit: int, min_bytes: int = 0) -> int:
        """An int32 that must lie in [0, limit] and leave room for n × min_bytes bytes."""
        (n,) = self.ints(1, what)
        if not 0 <= n <= limit or n * min_bytes > self.left:
            raise self.error(f"{what} {n} is impossible here ({self.left} bytes left)")
        return n


def read_ggml(path: str | Path) -> GgmlFile:
    """Parse a whisper.cpp ggml .bin file (f32 or f16 tensors)."""
    path = Path(path)
    r = _Reader(map_file(path, "a model file"), path)
    (magic,) = r.ints(1, "magic")
    if magic != GGML_MAGIC:
        raise r.error(f"not a ggml model (magic {magic & 0xFFFFFFFF:#010x}, "
                      f"expected {GGML_MAGIC:#010x})")
    values = r.ints(len(HPARAMS) + 1, "hparams")
    if min(values[:-1]) <= 0 or max(values[:-1]) > MAX_HPARAM:
        raise r.error(f"impossible hparams {values[:-1]}")
    dims = ModelDims(**dict(zip(HPARAMS, values, strict=False)))
    ftype = values[-1] % QNT_VERSION_FACTOR
    if ftype not in (FTYPE_F32, FTYPE_F16):
        raise r.error(f"ftype {values[-1]} is quantized; only f32 (0) and f16 (1) files load")
    n_mel = r.count("mel filter rows", MAX_HPARAM)
    n_fft = r.count("mel filter columns", MAX_HPARAM)
    if n_mel * n_fft * 4 > r.left:
        raise r.error(f"mel filters ({n_mel}, {n_fft}) do not fit in {r.left} bytes")
    filters = _view(r, np.dtype("<f4"), (n_mel, n_fft), "mel filters")
    tokens = tuple(_read_tokens(r))
    tensors: dict[str, np.ndarray] = {}
    while r.left:
        name, array = _read_tensor(r)
        if name in tensors:
            raise r.error(f"tensor {name!r} appears twice")
        tensors[name] = array
    return GgmlFile(path, dims, ftype, filters, tokens, tensors, r.buf)


def _view(r: _Reader, dtype: np.dtype[Any], shape: tuple[int, ...], what: str) -> np.ndarray:
    count = math.prod(shape)
    start = r.take(count * dtype.itemsize, what)
    return np.frombuffer(r.buf, dtype, count, start).reshape(shape)


def _read_tokens(r: _Reader) -> list[bytes]:
    n = r.count("token count", MAX_HPARAM, min_bytes=4)
    tokens = []
    for i in range(n):
        length = r.count(f"length of token {i}", MAX_NAME)
        start = r.take(length, f"token {i}")
        tokens.append(bytes(r.buf[start : start + length]))
    return tokens


def _read_tensor(r: _Reader) -> tuple[str, np.ndarray]:
    at = r.pos
    n_dims, name_len, ttype = r.ints(3, "tensor header")
    if not 1 <= n_dims <= MAX_DIMS:
        raise r.error(f"tensor at offset {at} has {n_dims} dims (1..{MAX_DIMS})")
    if not 0 < name_len <= MAX_NAME:
        raise r.error(f"tensor at offset {at} has a name of {name_len} bytes")
    ne = r.ints(n_dims, "tensor dims")
    start = r.take(name_len, "tensor name")
    try:
        name = bytes(r.buf[start : start + name_len]).decode("utf-8")
    except UnicodeDecodeError:
        raise r.error(f"tensor name at offset {start} is not UTF-8") from None
    if ttype not in TTYPES:
        raise r.error(f"tensor {name} has ggml type {ttype}; only f32 (0) and f16 (1) load")
    if min(ne) <= 0:
        raise r.error(f"tensor {name} has dims {ne}")
    dtype = TTYPES[ttype]
    if math.prod(ne) * dtype.itemsize > r.left:
        raise r.error(f"tensor {name} {ne} needs {math.prod(ne) * dtype.itemsize} bytes, "
                      f"{r.left} remain")
    shape = tuple(reversed(ne))
    array = _view(r, dtype, shape, f"data of {name}")
    if name in CONV_BIASES and len(shape) == 2 and shape[1] == 1:
        array = array.reshape(shape[0])
    return name, array


def write_ggml(
    path: str | Path,
    dims: ModelDims,
    mel_filters: np.ndarray,
    tokens: Sequence[bytes],
    tensors: Iterable[tuple[str, np.ndarray]],
) -> Path:
    """Write an f16 ggml file atomically. `tensors` are openai names → arrays in openai's
    shapes; the type rules of the module docstring are applied here."""
    path = Path(path)
    header = struct.pack("<i", GGML_MAGIC)
    header += struct.pack(f"<{len(HPARAMS) + 1}i", *(getattr(dims, f) for f in HPARAMS),
                          FTYPE_F16)
    filters = np.ascontiguousarray(mel_filters, "<f4")
    header += struct.pack("<2i", *filters.shape) + filters.tobytes()
    header += struct.pack("<i", len(tokens))
    header += b"".join(struct.pack("<i", len(t)) + t for t in tokens)
    with atomic_write(path, "model file", parents=True) as f:
        f.write(header)
        for name, array in tensors:
            f.write(_tensor_record(name, array))
    return path


def _tensor_record(name: str, array: np.ndarray) -> bytes:
    f32 = array.ndim < 2 or name in F32_NAMES
    data = np.ascontiguousarray(array, "<f4" if f32 else "<f2")
    if name in CONV_BIASES:
        data = data.reshape(-1, 1)
    raw = name.encode()
    ne = tuple(reversed(data.shape))
    ttype = GGML_TYPE_F32 if f32 else GGML_TYPE_F16
    head = struct.pack(f"<3i{len(ne)}i", len(ne), len(raw), ttype, *ne)
    return head + raw + data.tobytes()

"""Read CTranslate2 `model.bin` files: variables, dtypes and aliases (ct2_weights.py reads
the Whisper model inside).

The file is memory-mapped, never read whole: parsing touches only the variable headers, and
arrays are read-only views into the mapping, so the pages of a tensor are read when (and only
when) something touches it. Payloads are packed with no alignment, so a view is usually
unaligned: numpy reads it correctly, but ufuncs then copy through a small aligned buffer, so
hot loops should convert once (`get(name, dtype=np.float32)` returns a fresh aligned array).
The mapping stays open while the `ModelBin` or any view of it is alive.

Validation happens before anything is allocated: every count, length and shape is checked
against the bytes the file has left, so a corrupt or hostile file costs at most its own size.
Every problem is a `ModelError` whose one-line message starts with the file's path.
The format is CTranslate2's model.bin (little-endian, no padding; see read_model_bin).
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from tensorplan.errors import ModelError, UserError
from tensorplan.files import open_regular

MAX_BINARY_VERSION = 6
MAX_RANK = 8  # CT2 never writes more than 4; anything above 8 is corruption
WHISPER_SPEC = "WhisperSpec"
MAX_WHISPER_REVISION = 3
INT16_DEFAULT_SCALE = 1000.0  # CT2's global int16 scale, for old int16 files without a scale
# What the rest of the engine can run: the audio front end computes 80 or 128 mel bins and
# 3000 frames per window (1500 encoder positions after conv2's stride 2), and every Whisper
# decodes at most 448 tokens. Bounding n_text_ctx also bounds the KV cache to a small
# multiple of the file: otherwise a tiny file could declare a huge context.
SUPPORTED_N_MELS = (80, 128)
N_AUDIO_CTX = 1500
MAX_TEXT_CTX = 448

# CT2 `enum DataType` order (include/ctranslate2/types.h): id -> (name, numpy storage type).
# bfloat16 has no numpy type: it is stored as its raw 16 bits and widened on `get`.
DTYPES: dict[int, tuple[str, str]] = {
    0: ("float32", "<f4"),
    1: ("int8", "i1"),
    2: ("int16", "<i2"),
    3: ("int32", "<i4"),
    4: ("float16", "<f2"),
    5: ("bfloat16", "<u2"),
}
# Binary versions < 4 stored an item width instead of a dtype id (CT2's "flawed" old logic).
_DTYPE_BY_WIDTH = {4: 0, 2: 2, 1: 1}
_STORAGE = {name: np.dtype(storage) for name, storage in DTYPES.values()}
_MIN_VARIABLE_BYTES = 9  # name (u16 length + NUL) + rank + dtype/width + count/num_bytes
_MIN_ALIAS_BYTES = 6  # two empty strings


@dataclass(frozen=True, slots=True)
class Variable:
    """One variable's header: where its payload lies in the file and how to read it."""

    name: str
    shape: tuple[int, ...]  # C order, as stored
    dtype: str  # CT2 type name: float32, int8, int16, int32, float16 or bfloat16
    offset: int  # byte offset of the payload in the file
    nbytes: int

    @property
    def storage(self) -> np.dtype[Any]:
        """The numpy type of the stored bytes (bfloat16 is read as uint16)."""
        return _STORAGE[self.dtype]


class _Reader:
    """Bounds-checked little-endian reads from the mapped file; failures name the file."""

    __slots__ = ("buf", "path", "pos", "size")

    def __init__(self, buf: mmap.mmap | bytes, path: Path) -> None:
        self.buf, self.path, self.pos, self.size = buf, path, 0, len(buf)

    def error(self, problem: str) -> ModelError:
        return ModelError(f"{self.path}: {problem}")

    def take(self, n: int, what: str) -> int:
        """Advance over n bytes and return where they start."""
        if n > self.size - self.pos:
            raise self.error(
                f"truncated: {what} needs {n} bytes at offset {self.pos}, "
                f"only {self.size - self.pos} remain"
            )
        start, self.pos = self.pos, self.pos + n
        return start

    def uint(self, fmt: str, what: str) -> int:
        value: int = struct.unpack_from(fmt, self.buf, self.take(struct.calcsize(fmt), what))[0]
        return value

    def string(self, what: str) -> str:
        n = self.uint("<H", f"length of {what}")
        if n == 0:
            raise self.error(f"{what} at offset {self.pos - 2} has length 0 (must count its NUL)")
        start = self.take(n, what)
        raw = self.buf[start : start + n]
        if raw[-1] != 0 or 0 in raw[:-1]:
            raise self.error(f"{what} at offset {start} is not one NUL-terminated string")
        try:
            text: str = raw[:-1].decode("utf-8")
        except UnicodeDecodeError:
            raise self.error(f"{what} at offset {start} is not UTF-8") from None
        if not text.isprintable():  # a newline or escape code would break one-line errors
            raise self.error(f"{what} at offset {start} holds control characters")
        return text

    def count(self, what: str, min_bytes: int) -> int:
        """A u32 element count that must fit in what is left of the file."""
        n = self.uint("<I", what)
        if n * min_bytes > self.size - self.pos:
            raise self.error(f"{what} {n} cannot fit in the {self.size - self.pos} bytes left")
        return n


class ModelBin:
    """A parsed model.bin: header, variable index and aliases over a read-only memory map."""

    def __init__(
        self,
        path: Path,
        buf: mmap.mmap | bytes,
        version: int,
        spec: str | None,
        revision: int,
        variables: dict[str, Variable],
        aliases: dict[str, str],
    ) -> None:
        self.path = path
        self.binary_version = version
        self.spec = spec  # None before binary version 2
        self.spec_revision = revision
        self.variables = variables
        self.aliases = aliases  # alias name -> target variable name
        self._buf = buf

    def __contains__(self, name: object) -> bool:
        return name in self.variables or name in self.aliases

    def error(self, problem: str) -> ModelError:
        return ModelError(f"{self.path}: {problem}")

    def resolve(self, name: str) -> Variable:
        """The variable behind a name or an alias."""
        try:
            return self.variables[self.aliases.get(name, name)]
        except KeyError:
            raise self.error(f"no variable {name!r}") from None

    def raw(self, name: str) -> np.ndarray:
        """The stored values as a read-only, possibly unaligned view (bfloat16 as uint16)."""
        v = self.resolve(name)
        count = v.nbytes // v.storage.itemsize
        return np.frombuffer(self._buf, v.storage, count, v.offset).reshape(v.shape)

    def release(self, name: str) -> None:
        """Drop the resident file pages under a variable once its values were copied
        out, so a converted copy and the mapped original never both count in RSS."""
        if not isinstance(self._buf, mmap.mmap) or not hasattr(mmap, "MADV_DONTNEED"):
            return
        v = self.resolve(name)
        start = v.offset - v.offset % mmap.PAGESIZE
        end = v.offset + v.nbytes
        end -= end % mmap.PAGESIZE  # whole pages only: neighbours may still be needed
        if end > start:
            self._buf.madvise(mmap.MADV_DONTNEED, start, end - start)

    def get(self, name: str, dtype: DTypeLike | None = None, *,
            check_finite: bool = True) -> np.ndarray:
        """A variable's values: as stored (a view) unless it needs widening or `dtype` asks.
        Float values must be finite (ModelError), unless the caller checks them itself.

        bfloat16 becomes float32, quantized int8/int16 weights are dequantized to float32,
        and everything else (float16 included) stays as stored. With `dtype`, the result is
        a fresh aligned array of that type.
        """
        v = self.resolve(name)
        values, fresh = self.raw(name), True
        if v.dtype == "bfloat16":
            values = (values.astype(np.uint32) << 16).view(np.float32)
        elif v.dtype in ("int8", "int16") and v.name.endswith("weight") and v.shape:
            values = dequantize(values, self._scale(v))
        else:
            fresh = False
        if dtype is not None and (not fresh or values.dtype != np.dtype(dtype)):
            values = values.astype(dtype)
        if check_finite and values.dtype.kind == "f":
            self._check_finite(name, values)
        return values

    def _check_finite(self, name: str, values: np.ndarray) -> None:
        """NaN or inf in a weight makes every output NaN: silently wrong text. Checked in
        blocks, so the temporary is bounded whatever the tensor's size."""
        flat = values.reshape(-1)
        for start in range(0, flat.size, _FINITE_BLOCK):
            block = flat[start:start + _FINITE_BLOCK]
            if not np.isfinite(block).all():
                at = start + int(np.argmin(np.isfinite(block)))
                raise self.error(f"{name} holds a NaN or infinite value (element {at})")

    def scalar(self, name: str, default: int | float | None = None) -> int | float:
        """A rank-0 flag or hyper-parameter (num_heads, pre_norm, ...) as a Python number."""
        if name not in self and default is not None:
            return default
        v = self.resolve(name)
        if math.prod(v.shape) != 1:
            raise self.error(f"{name} should be a scalar but has shape {v.shape}")
        value: int | float = self.get(name, check_finite=False).reshape(()).item()
        return value

    def _scale(self, v: Variable) -> np.ndarray:
        # Aliases share their target's scale (CT2 registers `<alias>_scale` implicitly).
        scale_name = v.name + "_scale"
        if scale_name not in self:
            if v.dtype == "int16":
                return np.asarray(INT16_DEFAULT_SCALE, np.float32)
            raise self.error(f"int8 weight {v.name} has no {scale_name}")
        scale = self.get(scale_name, np.float32, check_finite=False)
        want = (v.shape[0],) if v.dtype == "int8" else ()
        if scale.size != math.prod(want):
            raise self.error(f"{scale_name} has shape {scale.shape}, expected {want}")
        if not (np.isfinite(scale).all() and scale.all()):  # else inf/NaN weights
            raise self.error(f"{scale_name} holds a zero, infinite or NaN scale")
        return scale.reshape(want)


_FINITE_BLOCK = 1 << 20  # elements per finiteness check


def dequantize(q: np.ndarray, scale: np.ndarray | float) -> np.ndarray:
    """Undo CT2 quantization: `q / scale` in float32.

    int8 weights carry one scale per output row (`scale` shape `(q.shape[0],)`, conv weights
    included); int16 weights carry one scalar scale for the whole tensor.
    """
    s = np.asarray(scale, np.float32)
    if s.ndim == 0:
        return q.astype(np.float32) / s
    # broadcast one scale per row; unlike reshape(rows, -1), this works for 0 rows too
    out: np.ndarray = q.astype(np.float32) / s.reshape(s.shape[0], *[1] * (q.ndim - 1))
    return out


def read_model_bin(path: str | Path, spec: str | None = WHISPER_SPEC) -> ModelBin:
    """Parse a model.bin (binary versions 1..6); `spec=None` accepts any model spec."""
    path = Path(path)
    buf = map_file(path)
    r = _Reader(buf, path)
    version = r.uint("<I", "binary version")
    if not 1 <= version <= MAX_BINARY_VERSION:
        raise r.error(f"binary version {version} is not supported (1..{MAX_BINARY_VERSION})")
    name, revision = None, 1
    if version >= 2:
        name = r.string("spec name")
        revision = r.uint("<I", "spec revision")
        if spec is not None and name != spec:
            raise r.error(f"spec {name!r} is not the expected {spec!r}")
        if name == WHISPER_SPEC and revision > MAX_WHISPER_REVISION:
            raise r.error(f"WhisperSpec revision {revision} is newer than {MAX_WHISPER_REVISION}")
    variables: dict[str, Variable] = {}
    for _ in range(r.count("num_variables", _MIN_VARIABLE_BYTES)):
        v = _read_variable(r, version)
        if v.name in variables:
            raise r.error(f"variable {v.name!r} appears twice")
        variables[v.name] = v
    aliases = _read_aliases(r, variables) if version >= 3 else {}
    return ModelBin(path, buf, version, name, revision, variables, aliases)


def map_file(path: Path, kind: str = "a model.bin") -> mmap.mmap:
    """A read-only memory map of a model file; every failure is a one-line ModelError.
    `kind` names what was expected, for the message about a directory."""
    if path.is_dir():
        raise ModelError(f"{path}: is a directory, not {kind}")
    if not path.exists():
        raise ModelError(f"{path}: no such file")
    try:
        with open_regular(path, "model file") as f:  # a FIFO or device: refused, not blocked on
            if os.fstat(f.fileno()).st_size == 0:
                raise ModelError(f"{path}: empty file")
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except ModelError:
        raise
    except UserError as e:
        raise ModelError(str(e)) from None
    except IsADirectoryError:
        raise ModelError(f"{path}: is a directory, not {kind}") from None
    except OSError as e:
        raise ModelError(f"{path}: cannot read: {e.strerror or e}") from None


def _read_variable(r: _Reader, version: int) -> Variable:
    name = r.string("variable name")
    rank = r.uint("<B", f"rank of {name}")
    if rank > MAX_RANK:
        raise r.error(f"variable {name} has rank {rank} (at most {MAX_RANK})")
    shape = struct.unpack_from(f"<{rank}I", r.buf, r.take(4 * rank, f"dims of {name}"))
    if version >= 4:
        dtype_id = r.uint("<B", f"dtype of {name}")
        if dtype_id not in DTYPES:
            raise r.error(f"variable {name} has unknown dtype id {dtype_id}")
        num_bytes = r.uint("<I", f"byte count of {name}")
    else:
        width = r.uint("<B", f"item size of {name}")
        if width not in _DTYPE_BY_WIDTH:
            raise r.error(f"variable {name} has unknown item size {width}")
        dtype_id = _DTYPE_BY_WIDTH[width]
        num_bytes = r.uint("<I", f"element count of {name}") * width
    dtype, storage = DTYPES[dtype_id]
    expected = math.prod(shape) * np.dtype(storage).itemsize
    if expected > r.size:
        raise r.error(f"variable {name} shape {shape} needs {expected} bytes, file has {r.size}")
    # an empty tensor's other dims still bounded, as if one element per index: a fuzzed
    # (3e9,) * 4 + (0,) passed the byte check and broke numpy's reshape
    if expected == 0 and math.prod(max(n, 1) for n in shape) > max(r.size, 1):
        raise r.error(f"variable {name} shape {shape} is empty but larger than the file "
                      f"({r.size} B)")
    if num_bytes != expected:
        raise r.error(
            f"variable {name} has {num_bytes} bytes, shape {shape} {dtype} needs {expected}"
        )
    offset = r.take(num_bytes, f"data of {name}")
    return Variable(name, tuple(shape), dtype, offset, num_bytes)


def _read_aliases(r: _Reader, variables: dict[str, Variable]) -> dict[str, str]:
    aliases: dict[str, str] = {}
    for _ in range(r.count("num_aliases", _MIN_ALIAS_BYTES)):
        alias, target = r.string("alias name"), r.string("alias target")
        if alias in variables or alias in aliases:
            raise r.error(f"alias {alias!r} redefines an existing name")
        if target not in variables:
            raise r.error(f"alias {alias!r} points to missing variable {target!r}")
        aliases[alias] = target
    return aliases

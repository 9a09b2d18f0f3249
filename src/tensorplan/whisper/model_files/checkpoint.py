"""Read and write openai-whisper's checkpoints (`tiny.en.pt`).

A checkpoint is `torch.save({"dims": {...}, "model_state_dict": {name: tensor}})`: a zip
archive holding `<root>/data.pkl` (a pickle of the dict, whose tensors refer to storages by
key) and `<root>/data/<key>` (each storage's raw bytes, stored uncompressed).

Reading needs no torch. A restricted unpickler allows exactly the globals a state dict uses
(`collections.OrderedDict`, `torch._utils._rebuild_tensor_v2`, `torch.<Type>Storage`) and
rebuilds every tensor as a read-only numpy view over the memory-mapped zip entry; anything
else in the pickle is refused, so a hostile file cannot run code. Problems are one-line
`ModelError`s starting with the path.

Writing uses `torch.save`, so PyTorch (its CPU build: backends.TORCH_INSTALL) is needed
only for that.
Besides openai's two keys we store `alignment_heads`, encoded as openai-whisper encodes its
`_ALIGNMENT_HEADS` (base85 of the gzipped (n_text_layer, n_text_head) bool mask), as a str;
openai-whisper's `load_model` ignores the extra key.
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import gzip
import io
import math
import mmap
import pickle
import struct
import zipfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tensorplan.errors import ModelError, UserError
from tensorplan.files import atomic_write
from tensorplan.whisper.model_files.ct2_file import map_file
from tensorplan.whisper.model_files.ct2_weights import ModelDims

ZIP_MAGIC = b"PK\x03\x04"
LEGACY_MAGIC = b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19."  # torch < 1.6 serialization
MAX_PICKLE_BYTES = 64 << 20  # data.pkl of a Whisper checkpoint is ~20 KB
_LOCAL_HEADER = struct.Struct("<4s5H3L2H")  # a zip local file header, 30 bytes
STORAGE_DTYPES = {  # torch.<name> → numpy storage type (bfloat16 is widened on load)
    "DoubleStorage": "<f8",
    "FloatStorage": "<f4",
    "HalfStorage": "<f2",
    "BFloat16Storage": "<u2",
    "LongStorage": "<i8",
    "IntStorage": "<i4",
    "ShortStorage": "<i2",
    "CharStorage": "i1",
    "ByteStorage": "u1",
    "BoolStorage": "?",
}
Heads = tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A parsed checkpoint: openai names → read-only arrays (views of the mapped file)."""

    path: Path
    dims: ModelDims
    tensors: dict[str, np.ndarray]
    alignment_heads: Heads | None  # only in files this module wrote
    buf: mmap.mmap


@dataclass(frozen=True, slots=True)
class _StorageType:
    name: str
    dtype: np.dtype


def read_checkpoint(path: str | Path) -> Checkpoint:
    """Parse an openai-whisper .pt checkpoint without torch."""
    path = Path(path)
    buf = map_file(path, "a checkpoint")
    if buf[:4] != ZIP_MAGIC:
        if buf[: len(LEGACY_MAGIC)] == LEGACY_MAGIC:
            raise ModelError(f"{path}: torch's legacy (< 1.6) format is not supported; "
                             "re-save it with a current torch")
        raise ModelError(f"{path}: not a torch checkpoint (no zip header)")
    try:
        with zipfile.ZipFile(path) as zf:
            root = _archive_root(zf, path)
            order = root + "byteorder"
            if order in zf.namelist() and (zf.getinfo(order).file_size > 64
                                           or zf.read(order).strip() != b"little"):
                raise ModelError(f"{path}: big-endian checkpoints are not supported")
            info = zf.getinfo(root + "data.pkl")
            if info.file_size > MAX_PICKLE_BYTES:
                raise ModelError(f"{path}: data.pkl is {info.file_size} bytes, too large")
            obj = _Unpickler(zf.read(info), zf, root, buf, path).load()
    except ModelError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, KeyError, EOFError, OSError,
            pickle.UnpicklingError, ValueError, TypeError, IndexError, AttributeError) as e:
        raise ModelError(f"{path}: not a readable checkpoint ({_reason(e)})") from None
    return _checkpoint(obj, path, buf)


def _reason(e: BaseException) -> str:
    text = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _archive_root(zf: zipfile.ZipFile, path: Path) -> str:
    roots = [n[: -len("data.pkl")] for n in zf.namelist() if n.endswith("data.pkl")]
    roots = [r for r in roots if r.count("/") == 1 and r.endswith("/")]
    if len(roots) != 1:
        raise ModelError(f"{path}: expected one <root>/data.pkl in the archive, found "
                         f"{len(roots)}")
    return roots[0]


class _Unpickler(pickle.Unpickler):
    """Unpickles a state dict and nothing else; storages become views of the mapped zip."""

    def __init__(self, data: bytes, zf: zipfile.ZipFile, root: str, buf: mmap.mmap,
                 path: Path) -> None:
        super().__init__(io.BytesIO(data))
        self.zf, self.root, self.buf, self.path = zf, root, buf, path
        self.storages: dict[str, np.ndarray] = {}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return self.rebuild_tensor
        if module == "torch" and name in STORAGE_DTYPES:
            return _StorageType(name, np.dtype(STORAGE_DTYPES[name]))
        raise ModelError(f"{self.path}: the pickle asks for {module}.{name}; only tensors, "
                         "dicts and numbers are loaded")

    def persistent_load(self, pid: Any) -> np.ndarray:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                and isinstance(pid[1], _StorageType) and isinstance(pid[2], str)):
            raise ModelError(f"{self.path}: unknown persistent id {str(pid)[:60]}")
        kind, key = pid[1], pid[2]
        if key not in self.storages:
            self.storages[key] = self._entry(f"{self.root}data/{key}").view(kind.dtype)
        return self.storages[key]

    def _entry(self, name: str) -> np.ndarray:
        """A stored (uncompressed) entry as a uint8 view of the mapping."""
        info = self.zf.getinfo(name)
        if info.compress_type != zipfile.ZIP_STORED:
            # torch stores entries uncompressed; a compressed one may be a bomb (a few KB
            # declaring gigabytes), so it may inflate to at most twice the whole file
            if info.file_size > 2 * len(self.buf):
                raise ModelError(f"{self.path}: zip entry {name} inflates to "
                                 f"{info.file_size} bytes, more than twice the file")
            return np.frombuffer(self.zf.read(info), np.uint8)
        fields = _LOCAL_HEADER.unpack_from(self.buf, info.header_offset)
        start = info.header_offset + _LOCAL_HEADER.size + fields[-2] + fields[-1]
        if fields[0] != ZIP_MAGIC or start + info.file_size > len(self.buf):
            raise ModelError(f"{self.path}: zip entry {name} lies outside the file")
        return np.frombuffer(self.buf, np.uint8, info.file_size, start)

    def rebuild_tensor(self, storage: Any, offset: Any, size: Any, stride: Any, *_: Any
                       ) -> np.ndarray:
        ok = (isinstance(storage, np.ndarray) and isinstance(offset, int)
              and isinstance(size, tuple) and isinstance(stride, tuple)
              and len(size) == len(stride) and all(isinstance(x, int) and x >= 0
                                                   for x in (offset, *size, *stride)))
        if not ok:
            raise ModelError(f"{self.path}: a tensor has malformed size or stride")
        if math.prod(size) == 0:
            return np.zeros(size, storage.dtype)
        last = offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True))
        if last >= storage.size:
            raise ModelError(f"{self.path}: a tensor {size} reaches element {last} of a "
                             f"storage of {storage.size}")
        item = storage.itemsize
        view = np.lib.stride_tricks.as_strided(
            storage[offset:], shape=size, strides=[s * item for s in stride], writeable=False)
        if storage.dtype == np.dtype("<u2"):  # only bfloat16 is stored as uint16: widen it
            return (view.astype(np.uint32) << 16).view(np.float32)
        return view


def _checkpoint(obj: Any, path: Path, buf: mmap.mmap) -> Checkpoint:
    if not isinstance(obj, dict) or not isinstance(obj.get("model_state_dict"), dict):
        raise ModelError(f"{path}: not a Whisper checkpoint (no model_state_dict)")
    raw_dims = obj.get("dims")
    fields = [f.name for f in dataclasses.fields(ModelDims)]
    if not isinstance(raw_dims, dict) or not all(
            isinstance(raw_dims.get(f), int) and raw_dims[f] > 0 for f in fields):
        raise ModelError(f"{path}: dims must hold positive integers {', '.join(fields)}")
    dims = ModelDims(**{f: raw_dims[f] for f in fields})
    tensors = obj["model_state_dict"]
    bad = next((k for k, v in tensors.items()
                if not isinstance(k, str) or not isinstance(v, np.ndarray)), None)
    if bad is not None:
        raise ModelError(f"{path}: model_state_dict entry {bad!r} is not a tensor")
    heads = obj.get("alignment_heads")
    return Checkpoint(path, dims, dict(tensors),
                      None if heads is None else decode_heads(heads, dims, path), buf)


def encode_heads(heads: Heads, dims: ModelDims) -> str:
    """openai-whisper's encoding: base85 of the gzipped (n_text_layer, n_text_head) mask."""
    mask = np.zeros((dims.n_text_layer, dims.n_text_head), bool)
    for layer, head in heads:
        mask[layer, head] = True
    return base64.b85encode(gzip.compress(mask.tobytes(), mtime=0)).decode("ascii")


def decode_heads(text: Any, dims: ModelDims, path: Path) -> Heads:
    try:
        want = dims.n_text_layer * dims.n_text_head
        inflate = zlib.decompressobj(wbits=31)  # gzip; never past the mask's size
        raw = inflate.decompress(base64.b85decode(text), want + 1)
        mask = np.frombuffer(raw, bool).reshape(dims.n_text_layer, dims.n_text_head)
    except (ValueError, TypeError, OSError, EOFError, zlib.error) as e:
        raise ModelError(f"{path}: alignment_heads is not a valid mask ({_reason(e)})") from None
    return tuple((int(layer), int(head)) for layer, head in np.argwhere(mask))


def write_checkpoint(path: str | Path, dims: ModelDims, tensors: Mapping[str, np.ndarray],
                     alignment_heads: Heads | None = None) -> Path:
    """torch.save openai's checkpoint dict atomically; tensors keep their dtype."""
    try:
        import torch
    except ImportError:
        from tensorplan.backends import TORCH_INSTALL

        raise UserError("exporting an openai-whisper checkpoint needs PyTorch's CPU build: "
                        f"{TORCH_INSTALL}") from None
    path = Path(path)
    state = collections.OrderedDict(
        (name, torch.from_numpy(np.array(array, order="C"))) for name, array in tensors.items())
    checkpoint: dict[str, Any] = {"dims": dataclasses.asdict(dims), "model_state_dict": state}
    if alignment_heads is not None:
        checkpoint["alignment_heads"] = encode_heads(alignment_heads, dims)
    with atomic_write(path, "model file", parents=True) as f:
        torch.save(checkpoint, f)
    return path

"""Weights in compute form, cached on disk and memory-mapped: a load is a map, not a copy.

Converting tiny.en's stored weights (float16 → float32 copies, the transposed token
embedding, int8 quantization) took 0.3 s of each load and held 151 MB of private memory.
The first load writes the converted arrays to one file under the cache directory; later
loads map it read-only, so the pages are the page cache's, shared by every process that
maps the same file, and only touched pages are read.

The file's name is a key over the source file (size, mtime, inode, ctime, a hash of its
first 64 KiB) and the conversion options, so an edited model or another option never meets
an old entry: any write to the source changes its ctime, which (unlike mtime) no one can
set back. Writes go to a temporary file renamed into place, so a reader never sees half a
file. A read checks the magic, the version, a CRC of the header, the key, the exact file
size, every array's bounds and a CRC32 of every array's every byte; anything wrong and the
cache is ignored (the weights are converted again and the entry rewritten). The full CRC
costs ~0.2 s per GB (zlib's crc32 at 1.3 GB/s; tiny.en's entry: ~0.1 s, against ~0.3 s of
conversion); a check of each array's ends only, as before, missed damage in the middle.

TENSORPLAN_CACHE_DIR moves the cache (default: $XDG_CACHE_HOME/tensorplan, else
~/.cache/tensorplan); TENSORPLAN_CACHE=0 turns it off.
"""

from __future__ import annotations

import hashlib
import json
import logging
import mmap
import os
import struct
import tempfile
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import IO

import numpy as np

log = logging.getLogger("tensorplan.whisper")

MAGIC = b"TPWCACHE"
VERSION = 2  # 2: a CRC of every byte of each array (1: of its first and last 4 KiB)
ALIGN = 64  # every array starts on a cache line, as the backends' own buffers do
_PREFIX = struct.Struct("<8sIII")  # magic, version, header length, header CRC


def cache_dir() -> Path | None:
    """Where entries live, or None when caching is off."""
    if os.environ.get("TENSORPLAN_CACHE", "1") == "0":  # models.cache_root reads it too
        return None
    if os.environ.get("TENSORPLAN_CACHE_DIR"):
        return Path(os.environ["TENSORPLAN_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "tensorplan"


def cache_key(source: Path, **options: str) -> str:
    """The entry's key: the source file's size, mtime, inode, ctime and first 64 KiB, and
    `options`. An edit anywhere changes the ctime, even when the mtime is set back."""
    st = source.stat()
    with open(source, "rb") as f:
        head = hashlib.sha256(f.read(1 << 16)).hexdigest()
    fields = {"v": VERSION, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "head": head,
              "ino": st.st_ino, "ctime_ns": st.st_ctime_ns,
              "order": np.dtype("=f4").byteorder, **options}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:32]


def entry_path(key: str) -> Path | None:
    root = cache_dir()
    return None if root is None else root / "weights" / f"{key}.tpw"


def read(key: str) -> dict[str, np.ndarray] | None:
    """The cached arrays (read-only views of one mapping), or None if absent or corrupt."""
    path = entry_path(key)
    if path is None or not path.is_file():
        return None
    try:
        return _read(path, key)
    except (OSError, ValueError, KeyError, TypeError, struct.error) as e:
        log.warning("ignoring the weight cache %s: %s", path, e)
        return None


def write(key: str, arrays: Mapping[str, np.ndarray]) -> Path | None:
    """Write `arrays` as the entry for `key`, atomically; None if it could not be written
    (a read-only home, a full disk: the cache is an optimisation, never a failure)."""
    path = entry_path(key)
    if path is None:
        return None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".tpw")
        try:
            with os.fdopen(fd, "wb") as f:
                _write(f, key, arrays)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as e:
        log.warning("cannot write the weight cache %s: %s", path, e)
        return None
    return path


def _layout(arrays: Mapping[str, np.ndarray]) -> tuple[list[list[object]], int]:
    entries: list[list[object]] = []
    offset = 0
    for name, arr in arrays.items():
        entries.append([name, arr.dtype.str, list(arr.shape), offset, _crc(arr)])
        offset = _aligned(offset + arr.nbytes)
    return entries, offset


def _write(out: IO[bytes], key: str, arrays: Mapping[str, np.ndarray]) -> None:
    contiguous = {n: np.array(a, order="C", copy=None) for n, a in arrays.items()}  # 0-d kept
    entries, payload = _layout(contiguous)
    header = json.dumps({"key": key, "tensors": entries, "payload": payload}).encode()
    out.write(_PREFIX.pack(MAGIC, VERSION, len(header), zlib.crc32(header)))
    out.write(header)
    start = pos = _PREFIX.size + len(header)
    start = _aligned(start)
    for entry, arr in zip(entries, contiguous.values(), strict=True):
        target = start + int(entry[3])  # type: ignore[call-overload]
        out.write(b"\0" * (target - pos))
        out.write(arr.reshape(-1).view(np.uint8).data)
        pos = target + arr.nbytes
    out.write(b"\0" * (start + payload - pos))


def _read(path: Path, key: str) -> dict[str, np.ndarray]:
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < _PREFIX.size:
            raise ValueError("shorter than its header")
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    magic, version, n_header, crc = _PREFIX.unpack_from(mm, 0)
    if magic != MAGIC or version != VERSION:
        raise ValueError("not a weight cache of this version")
    header_bytes = mm[_PREFIX.size:_PREFIX.size + n_header]
    if zlib.crc32(header_bytes) != crc:
        raise ValueError("its header is damaged")
    header = json.loads(header_bytes)
    start = _aligned(_PREFIX.size + n_header)
    if header["key"] != key or start + int(header["payload"]) != size:
        raise ValueError("the key or the size does not match")
    arrays: dict[str, np.ndarray] = {}
    for name, dtype, shape, offset, crc in header["tensors"]:
        dt = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        begin = start + int(offset)
        if begin % ALIGN or begin + count * dt.itemsize > size:
            raise ValueError(f"{name} lies outside the file")
        arr = np.frombuffer(mm, dt, count, begin).reshape(shape)
        if _crc(arr) != crc:
            raise ValueError(f"{name}'s bytes are damaged")
        arrays[str(name)] = arr
    return arrays


def _crc(arr: np.ndarray) -> int:
    """CRC32 of every byte (no copy: zlib reads the array's buffer)."""
    raw = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    return zlib.crc32(raw.data)


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN

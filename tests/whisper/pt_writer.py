"""Write torch's checkpoint format without torch, for tests of the torch-free reader.

Written from the format itself (a zip of `<root>/data.pkl` + `<root>/data/<key>`; tensors
pickled as `torch._utils._rebuild_tensor_v2(storage, offset, size, stride, False, {})` with
storages as persistent ids `("storage", torch.<Type>Storage, key, "cpu", numel)`), not from
the reader. `Global` lets a test pickle any module.name, e.g. a forbidden `os.system`.
"""

from __future__ import annotations

import collections
import io
import pickle
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

STORAGE_NAMES = {
    "float16": "HalfStorage",
    "float32": "FloatStorage",
    "float64": "DoubleStorage",
    "int64": "LongStorage",
}


@dataclass(frozen=True)
class Global:
    module: str
    name: str

    def __call__(self, *args: Any) -> Any:  # save_reduce wants a callable; never called
        raise NotImplementedError


@dataclass(frozen=True, eq=False)
class Storage:
    key: str
    array: np.ndarray


class _Pickler(pickle._Pickler):  # the pure-Python pickler: its dispatch table is a dict
    dispatch = pickle._Pickler.dispatch.copy()

    def __init__(self, file: io.BytesIO, storages: list[Storage]) -> None:
        super().__init__(file, protocol=2)
        self.storages = storages

    def save_marker(self, obj: Global) -> None:
        opcode = pickle.GLOBAL + f"{obj.module}\n{obj.name}\n".encode()
        self.write(opcode)  # type: ignore[attr-defined]

    dispatch[Global] = save_marker  # type: ignore[assignment]

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, Storage):
            storage_type = Global("torch", STORAGE_NAMES[obj.array.dtype.name])
            return ("storage", storage_type, obj.key, "cpu", obj.array.size)
        return None

    def reducer_override(self, obj: Any) -> Any:
        if not isinstance(obj, np.ndarray):
            return NotImplemented
        fortran = obj.flags.f_contiguous and not obj.flags.c_contiguous  # keep its strides
        obj = obj if fortran else np.ascontiguousarray(obj)
        storage = Storage(str(len(self.storages)), obj.ravel(order="F" if fortran else "C"))
        self.storages.append(storage)
        stride = tuple(s // obj.itemsize for s in obj.strides)
        args: tuple[Any, ...] = (storage, 0, obj.shape, stride, False, collections.OrderedDict())
        return Global("torch._utils", "_rebuild_tensor_v2"), args


def pickle_with_tensors(obj: Any) -> tuple[bytes, list[Storage]]:
    buf, storages = io.BytesIO(), list[Storage]()
    _Pickler(buf, storages).dump(obj)
    return buf.getvalue(), storages


def write_pt(path: Path, obj: Any, root: str = "archive", pkl: bytes | None = None) -> Path:
    """`obj` pickled the way torch.save does (arrays become tensors); or raw `pkl` bytes."""
    data, storages = pickle_with_tensors(obj)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr(f"{root}/data.pkl", data if pkl is None else pkl)
        zf.writestr(f"{root}/byteorder", "little")
        for s in storages:
            zf.writestr(f"{root}/data/{s.key}", s.array.astype(s.array.dtype.newbyteorder("<"))
                        .tobytes())
        zf.writestr(f"{root}/version", "3\n")
    return path

"""Weights as the graphs read them: PARAM leafs in their compute form, made once per model.

float32 by default; the encoder's matrices as stored (float16) with weights_dtype
"float16"; int8 with per-row scales (f"{name}_scale") under compute_type "int8"
(quantize.py). The token embedding is held transposed. Every PARAM lives in a buffer of
its own that all sessions of the model read and none writes.

`arrays` records every converted array by PARAM name, so a load can write them to the
weight cache (model_files/weight_cache.py); given `cached` arrays of a previous load, conversion is
skipped and the PARAMs alias those (memory-mapped, read-only) arrays.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from tensorplan import ops
from tensorplan.backends.base import Backend
from tensorplan.tensor import Tensor
from tensorplan.whisper.model_files.ct2_weights import ModelDims
from tensorplan.whisper.planned.quantize import COMPUTE_TYPES, is_quantized, quantize_rows

EMBEDDING = "decoder/embeddings/weight"  # the token embedding, tied to the logits
WEIGHT_DTYPES = ("float32", "float16")


class _Releasing(Protocol):
    def release(self, name: str) -> None:
        """Drop the stored copy of `name` once its compute form exists."""
        ...


class StoredWeights(Protocol):
    """Weights as a file holds them (weights.WhisperWeights; random_weights for benches)."""

    @property
    def dims(self) -> ModelDims: ...

    @property
    def model(self) -> _Releasing: ...

    def get(self, name: str, dtype: Any = None) -> np.ndarray: ...


class ComputeWeights:
    """`param(name)` -> the PARAM tensor for stored weight `name`, converted on first use
    (graphs are built once, at load, so this runs on one thread) and released from the
    stored model afterwards."""

    def __init__(self, stored: StoredWeights, backend: Backend, *, compute_type: str = "float32",
                 weights_dtype: str = "float32",
                 cached: Mapping[str, np.ndarray] | None = None) -> None:
        if compute_type not in COMPUTE_TYPES:
            raise ValueError(f"compute_type must be one of {', '.join(COMPUTE_TYPES)}")
        if weights_dtype not in WEIGHT_DTYPES:
            raise ValueError(f"weights_dtype must be one of {', '.join(WEIGHT_DTYPES)}")
        self.stored, self.backend = stored, backend
        self.compute_type, self.weights_dtype = compute_type, weights_dtype
        self.tensors: dict[str, Tensor] = {}
        self.cached: Mapping[str, np.ndarray] = cached or {}
        self.arrays: dict[str, np.ndarray] = {}  # PARAM name -> its compute-form array

    def __call__(self, name: str) -> Tensor:
        t = self.tensors.get(name)
        if t is not None:
            return t
        base = name.removesuffix("_scale")
        if self.compute_type == "int8" and is_quantized(base):
            self._quantized(base)
        elif name == EMBEDDING:
            self._transposed(name)
        else:
            self._plain(name)
        return self.tensors[name]

    def _quantized(self, name: str) -> None:
        q, scale = self.cached.get(name), self.cached.get(f"{name}_scale")
        if q is None or scale is None:
            q, scale = quantize_rows(self.stored.get(name))
            self._release(name)
        self.tensors[name] = self._param(q, name)
        self.tensors[f"{name}_scale"] = self._param(scale, f"{name}_scale")

    def _transposed(self, name: str) -> None:
        # Held (d, V) contiguous and handed out as its (V, d) view: the logits product
        # x @ E^T then reads a plain row-major matrix, which OpenBLAS runs without
        # repacking the 80 MB table (tiny.en: 1 row 3.2 -> 2.2 ms, 5 rows 11.7 -> 6.9 ms,
        # measured); token lookups gather one strided column.
        arr = self.cached.get(f"{name}^T")
        if arr is None:
            arr = np.ascontiguousarray(np.asarray(self.stored.get(name)).T, np.float32)
            self._release(name)
        root = self._param(arr, f"{name}^T")
        self.tensors[name] = ops.transpose(root, name)

    def _plain(self, name: str) -> None:
        arr = self.cached.get(name)
        if arr is None:
            arr = self.stored.get(name)
            keep = (self.weights_dtype == "float16" and name.startswith("encoder/")
                    and name.endswith("/weight") and arr.ndim >= 2)  # matrices only
            arr = np.array(arr, dtype=arr.dtype if keep else np.float32, order="C")
            self._release(name)
        self.tensors[name] = self._param(arr, name)

    def _param(self, arr: np.ndarray, name: str) -> Tensor:
        self.arrays[name] = arr
        return self.backend.param(arr, name)

    def _release(self, name: str) -> None:
        self.stored.model.release(name)

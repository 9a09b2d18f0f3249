"""Backends: buffer types that hand out buffers, and executors of planned graphs.

numpy_cpu is the reference CPU backend; torch_cpu runs the same plans through PyTorch's
CPU kernels (optional dependency); reference evaluates a graph without a plan (golden tests).
"""

from __future__ import annotations

import importlib.util

from tensorplan.backends.base import Backend, BufferType
from tensorplan.backends.kernels import KERNELS
from tensorplan.backends.numpy_cpu import NumpyBackend, NumpyBuffer, NumpyBufferType
from tensorplan.backends.reference import evaluate

BACKENDS = ("auto", "numpy", "torch")
# Every hint to install PyTorch says this: its CPU build, from PyTorch's own index (PyPI's
# default Linux wheel is a CUDA build of several GB that no backend here uses).
TORCH_INSTALL = "pip install torch --index-url https://download.pytorch.org/whl/cpu"


def torch_available() -> bool:
    """Whether PyTorch is installed, found without importing it: the import alone costs
    238 MB of RSS, which a numpy-backend run must not pay."""
    return importlib.util.find_spec("torch") is not None


def make_backend(name: str = "auto") -> NumpyBackend:
    """A CPU backend by name: "numpy", "torch", or "auto" (torch when it is installed)."""
    if name == "numpy" or (name == "auto" and not torch_available()):
        return NumpyBackend()
    if name in ("torch", "auto"):
        from tensorplan.backends import torch_cpu  # imports torch

        return torch_cpu.TorchBackend()
    raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")


__all__ = [
    "BACKENDS",
    "KERNELS",
    "Backend",
    "BufferType",
    "NumpyBackend",
    "NumpyBuffer",
    "NumpyBufferType",
    "TORCH_INSTALL",
    "evaluate",
    "make_backend",
    "torch_available",
]

"""Backends: buffer types that hand out buffers, and executors of planned graphs.

numpy_cpu is the reference CPU backend; torch_cpu runs the same plans through PyTorch's
CPU kernels (optional dependency); reference evaluates a graph without a plan (golden tests).
"""

from __future__ import annotations

from tensorplan.backends.base import Backend, BufferType
from tensorplan.backends.kernels import KERNELS
from tensorplan.backends.numpy_cpu import NumpyBackend, NumpyBuffer, NumpyBufferType
from tensorplan.backends.reference import evaluate

BACKENDS = ("auto", "numpy", "torch")


def make_backend(name: str = "auto") -> NumpyBackend:
    """A CPU backend by name: "numpy", "torch", or "auto" (torch when it is installed)."""
    from tensorplan.backends import torch_cpu

    if name == "numpy" or (name == "auto" and not torch_cpu.available()):
        return NumpyBackend()
    if name in ("torch", "auto"):
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
    "evaluate",
    "make_backend",
]

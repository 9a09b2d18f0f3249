"""Backends: buffer types that hand out buffers, and executors of planned graphs.

numpy_cpu is the CPU backend; reference evaluates a graph without a plan (golden tests).
"""

from __future__ import annotations

from tensorplan.backends.base import Backend, BufferType
from tensorplan.backends.kernels import KERNELS
from tensorplan.backends.numpy_cpu import NumpyBackend, NumpyBuffer, NumpyBufferType
from tensorplan.backends.reference import evaluate

__all__ = [
    "KERNELS",
    "Backend",
    "BufferType",
    "NumpyBackend",
    "NumpyBuffer",
    "NumpyBufferType",
    "evaluate",
]

"""Backends: buffer types that hand out buffers, and executors of planned graphs.

numpy_cpu is the reference CPU backend; torch_cpu runs the same plans through PyTorch's
CPU kernels (optional dependency); torch_device runs them over PyTorch tensors on any
device, replaying CUDA graphs on a GPU; reference evaluates a graph without a plan
(golden tests).
"""

from __future__ import annotations

import importlib.util

from tensorplan.backends.base import Backend, BufferType
from tensorplan.backends.kernels import KERNELS
from tensorplan.backends.numpy_cpu import NumpyBackend, NumpyBuffer, NumpyBufferType
from tensorplan.backends.reference import evaluate

BACKENDS = ("auto", "numpy", "torch", "device")
DEVICES = ("cpu", "cuda")
# Every hint to install PyTorch says this: its CPU build, from PyTorch's own index (PyPI's
# default Linux wheel is a CUDA build of several GB that no backend here uses).
TORCH_INSTALL = "pip install torch --index-url https://download.pytorch.org/whl/cpu"


def torch_available() -> bool:
    """Whether PyTorch is installed, found without importing it: the import alone costs
    238 MB of RSS, which a numpy-backend run must not pay."""
    return importlib.util.find_spec("torch") is not None


def make_backend(name: str = "auto", device: str = "cpu") -> Backend:
    """A backend by name: "numpy", "torch", "device" (PyTorch tensors on `device`), or
    "auto": on the CPU torch when it is installed, else numpy; on cuda, "device".
    Raises ValueError for an unknown name or a CPU-only backend on cuda, ImportError
    without PyTorch, and UserError when the device is missing."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r}; choose one of {', '.join(DEVICES)}")
    if device != "cpu" and name in ("numpy", "torch"):
        raise ValueError(f"{name} runs on the CPU only; --backend device (or auto) runs on "
                         f"{device}")
    if name == "numpy" or (name == "auto" and not torch_available()):
        if device != "cpu":
            # the same "--device NAME:" start as torch_device's own refusal
            raise ImportError(f"--device {device}: CUDA needs a CUDA build of PyTorch (see "
                              "PyTorch's install page for your CUDA version)")
        return NumpyBackend()
    if name == "device" or device != "cpu":
        if not torch_available():
            raise ImportError(f"the device backend needs PyTorch: {TORCH_INSTALL}")
        from tensorplan.backends import torch_device  # imports torch

        # a GPU holds weight matrices in float16 (tensor cores, half the memory)
        return torch_device.DeviceBackend(device, "float16" if device == "cuda" else None)
    from tensorplan.backends import torch_cpu  # imports torch

    return torch_cpu.TorchBackend()


__all__ = [
    "BACKENDS",
    "DEVICES",
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

"""Constants and helpers the whisper tests share. A module of its own, not conftest:
several test folders have a conftest.py, and `from conftest import` found whichever
was imported first."""

from __future__ import annotations

import re
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from tensorplan.backends import torch_available

ROOT = Path(__file__).resolve().parents[2]
JFK = ROOT / "samples" / "jfk.wav"
JFK_TEXT = (
    "And so my fellow Americans ask not what your country can do for you "
    "ask what you can do for your country"
)


def normalize(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s']", " ", text.lower()).split())


T = TypeVar("T")


def traced_peak(fn: Callable[[], T]) -> tuple[T, int]:
    """fn()'s result and the peak bytes tracemalloc traced while it ran."""
    tracemalloc.start()
    try:
        result = fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, peak


# every backend this machine has; "auto" (torch when installed) is what users get
# ("device" runs the CUDA backend's code path on the CPU)
BACKEND_NAMES = ["numpy", *(["torch", "device"] if torch_available() else [])]

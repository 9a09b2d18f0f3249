"""Shared fixtures: the bundled tiny.en model and the jfk sample, loaded once per session."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
JFK = ROOT / "samples" / "jfk.wav"
JFK_TEXT = (
    "And so my fellow Americans ask not what your country can do for you "
    "ask what you can do for your country"
)


def normalize(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s']", " ", text.lower()).split())


@pytest.fixture(scope="session")
def jfk_audio() -> np.ndarray:
    from tensorplan.whisper.audio import load_audio

    return load_audio(JFK)


@pytest.fixture(scope="session")
def tiny_weights():
    from tensorplan.whisper.models import resolve_model
    from tensorplan.whisper.weights import WhisperWeights

    return WhisperWeights.load(resolve_model("tiny.en"))


_MODELS: dict[str, object] = {}


def _has_torch() -> bool:
    from tensorplan.backends import torch_cpu

    return torch_cpu.available()


# every backend this machine has; "auto" (torch when installed) is what users get
BACKEND_NAMES = ["numpy", *(["torch"] if _has_torch() else [])]


@pytest.fixture(scope="session")
def tiny_model_factory():
    """load_model("tiny.en", plan=..., backend=..., compute_type=...) cached for the session."""
    from tensorplan.whisper.api import load_model

    def get(plan: str = "joint", backend: str = "auto", compute_type: str = "float32"):
        key = (plan, backend, compute_type)
        if key not in _MODELS:
            _MODELS[key] = load_model(
                "tiny.en", plan=plan, backend=backend, compute_type=compute_type
            )
        return _MODELS[key]

    return get

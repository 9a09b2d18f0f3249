"""Shared fixtures: the bundled tiny.en model and the jfk sample, loaded once per session."""

from __future__ import annotations

import numpy as np
import pytest
from whisper_helpers import JFK


@pytest.fixture(scope="session")
def jfk_audio() -> np.ndarray:
    from tensorplan.whisper.audio.decode import load_audio

    return load_audio(JFK)


@pytest.fixture(scope="session")
def tiny_weights():
    from tensorplan.whisper.model_files.ct2_weights import WhisperWeights
    from tensorplan.whisper.model_files.find import resolve_model

    return WhisperWeights.load(resolve_model("tiny.en"))


_MODELS: dict[str, object] = {}


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

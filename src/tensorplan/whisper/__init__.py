"""Whisper speech-to-text on the planned runtime."""

from __future__ import annotations

from typing import Any


def load_model(*args: Any, **kwargs: Any) -> Any:
    """See tensorplan.whisper.api.load_model (imported lazily: numpy-heavy)."""
    from tensorplan.whisper.api import load_model as _load

    return _load(*args, **kwargs)


__all__ = ["load_model"]

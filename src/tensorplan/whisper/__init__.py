"""Whisper speech-to-text on the planned runtime."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tensorplan.whisper.api import load_model


def __getattr__(name: str) -> Any:
    """`load_model` is tensorplan.whisper.api's own function, with its signature and
    docstring, imported on first use: the api pulls in numpy and the model code, which
    this package's light modules (options, limits) must not."""
    if name == "load_model":
        from tensorplan.whisper.api import load_model

        return load_model
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["load_model"]

"""`needs_vad`: skip, saying why, where Silero VAD cannot run (onnxruntime or silero-vad's
model missing: a fresh `pip install -e '.[test]'`; .ci/run installs both)."""

from __future__ import annotations

import importlib.util

import pytest

from tensorplan.errors import UserError
from tensorplan.whisper.audio import vad


def vad_missing() -> str | None:
    """Why the model cannot run here, or None."""
    if importlib.util.find_spec("onnxruntime") is None:
        return f"onnxruntime is not installed ({vad.INSTALL_HINT})"
    try:
        vad.model_path()
    except UserError as e:
        return str(e)
    return None


MISSING = vad_missing()
needs_vad = pytest.mark.skipif(MISSING is not None, reason=f"VAD model unavailable: {MISSING}")

"""The torch backend imports PyTorch (~1.2 s, 240 MB) when its first program is made, not
when load_model builds and plans the graphs: loading costs what a numpy load costs."""

from __future__ import annotations

import subprocess
import sys

import pytest
from whisper_helpers import JFK


def test_load_model_leaves_the_torch_import_to_the_first_transcription() -> None:
    pytest.importorskip("torch")
    code = ("import sys; from tensorplan.whisper import load_model; "
            "m = load_model('tiny.en', backend='torch'); print('torch' in sys.modules); "
            f"r = m.transcribe({str(JFK)!r}, beam_size=None); print('torch' in sys.modules); "
            "print(type(m.model.backend).__name__, r['text'].split()[-1])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=600).stdout.split()
    assert out[-4:] == ["False", "True", "TorchBackend", "country"]

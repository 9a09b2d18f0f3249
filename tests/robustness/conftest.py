"""tests/whisper's ct2_writer (the independent model.bin writer) is shared with these tests."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "whisper"))

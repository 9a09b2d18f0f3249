"""One real server for the module tests (tiny.en, greedy, an API key, two sessions), and the
Python API's results for the same options, which every transcript is compared with."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from serve_helpers import JFK, KEY, ServerProcess

# without tensorplan[serve] and the test clients, these tests cannot even be collected
_MISSING = [m for m in ("starlette", "uvicorn", "python_multipart", "httpx", "openai")
            if importlib.util.find_spec(m) is None]
if _MISSING:
    collect_ignore_glob = ["test_*.py"]
    print(f"tests/serve skipped: {', '.join(_MISSING)} not installed "
          "(pip install -e '.[test]')", file=sys.stderr)

GREEDY = ("--beam-size", "none")


@pytest.fixture(scope="session")
def server() -> Iterator[ServerProcess]:
    s = ServerProcess(*GREEDY, "--api-key", KEY, "--sessions", "2", "--max-queue", "64")
    yield s
    code = s.stop()
    assert code == 0, f"the server exited {code} on SIGTERM: {s.final_output[-4000:]}"
    # a job whose client left ends in Cancelled: dropped quietly, never a logged traceback
    assert "never retrieved" not in s.final_output, s.final_output[-4000:]


@pytest.fixture(scope="session")
def client(server: ServerProcess) -> Any:
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120)


_REFERENCE: dict[tuple[tuple[str, Any], ...], Any] = {}


@pytest.fixture(scope="session")
def reference() -> Any:
    """reference(**overrides): what `Whisper.transcribe` gives for jfk.wav, greedy (the
    server's defaults) with the overrides; this is what `tensorplan transcribe` prints."""
    from tensorplan.whisper import load_model
    from tensorplan.whisper.options import TranscribeOptions

    model = load_model("tiny.en")

    def get(**overrides: Any) -> Any:
        key = tuple(sorted(overrides.items()))
        if key not in _REFERENCE:
            options = TranscribeOptions(beam_size=None, **overrides)
            _REFERENCE[key] = model.transcribe(str(JFK), options)
        return _REFERENCE[key]

    return get

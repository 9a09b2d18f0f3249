"""Hardening, round three (issue #31) against a real server: an upload decodes only its own
bytes, per-request bounds, and slow clients. Each refusal is OpenAI-shaped JSON, and the
server stays healthy."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import httpx
from serve_helpers import KEY, ServerProcess, wait_idle

TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(TESTS / "robustness"), str(TESTS / "whisper")]
from referring_media import (  # noqa: E402
    ffconcat,
    hls_playlist,
    recording_http_server,
    transport_stream,
)

URL = "/v1/audio/transcriptions"
REFUSED = "refer to other files or URLs"


def _post(server: ServerProcess, name: str, content: bytes, **data: Any) -> httpx.Response:
    return httpx.post(server.url + URL, files={"file": (name, content)}, data=data,
                      headers={"Authorization": f"Bearer {KEY}"}, timeout=120)


def _error(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error  # type: ignore[no-any-return]


# --- 1. an upload decodes only its own bytes ---------------------------------------------


def test_a_playlist_naming_a_server_file_is_refused(server: ServerProcess,
                                                    tmp_path: Path) -> None:
    segment = transport_stream(tmp_path / "secret.ts")
    assert _post(server, "secret.ts", segment.read_bytes()).status_code == 200
    playlist = hls_playlist(tmp_path / "list.m3u8", str(segment)).read_bytes()
    error = _error(_post(server, "list.m3u8", playlist), 400)
    assert REFUSED in error["message"] and error["param"] == "file"
    script = ffconcat(tmp_path / "x.ffconcat", segment).read_bytes()
    assert REFUSED in _error(_post(server, "x.ffconcat", script), 400)["message"]
    assert wait_idle(server)["busy_sessions"] == 0


def test_a_playlist_naming_a_url_makes_no_request(server: ServerProcess,
                                                  tmp_path: Path) -> None:
    transport_stream(tmp_path / "remote.ts")
    with recording_http_server(tmp_path) as (url, requests):
        playlist = hls_playlist(tmp_path / "list.m3u8", f"{url}/remote.ts").read_bytes()
        assert REFUSED in _error(_post(server, "list.m3u8", playlist), 400)["message"]
        _error(_post(server, "upload.wav", playlist), 400)  # not probed as a playlist at all
        assert requests == []

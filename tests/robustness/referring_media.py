"""Media files that refer to other resources (an HLS playlist, an ffconcat script), and a
localhost HTTP server that records every request, for the tests that such files are refused
instead of followed (docs/robustness.md, "Uploads decode only their own bytes")."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from synth_audio import encoded


def transport_stream(path: Path) -> Path:
    """Two seconds of silence in an MPEG-TS (what HLS segments are), decodable on its own
    (a tone sends tiny.en into a "beep beep" loop: 25 s of decoding to prove nothing)."""
    path.write_bytes(encoded("mp2", "mpegts", silent=True))
    return path


def hls_playlist(path: Path, segment: str) -> Path:
    path.write_text("#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-TARGETDURATION:2\n"
                    f"#EXTINF:2.0,\n{segment}\n#EXT-X-ENDLIST\n")
    return path


def ffconcat(path: Path, target: Path) -> Path:
    path.write_text(f"ffconcat version 1.0\nfile '{target}'\n")
    return path


@contextmanager
def recording_http_server(root: Path) -> Iterator[tuple[str, list[str]]]:
    """(base URL, paths requested so far) of a server of `root` on a free localhost port."""
    requests: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
            super().__init__(*args, directory=str(root), **kwargs)

        def log_message(self, format: str, *args: object) -> None:
            requests.append(self.path)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", requests
    finally:
        server.shutdown()
        server.server_close()

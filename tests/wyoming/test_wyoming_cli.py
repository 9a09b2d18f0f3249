"""`tensorplan wyoming`'s flags and sockets: a bad --uri is one line and exit 2 before the
model loads, a unix:// path never replaces a user's file, a taken port is said before
anything claims to listen, and stdio:// keeps stdout for the protocol alone."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("wyoming")

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src")}


def _wyoming(*args: str, stdin: str | None = None, timeout: float = 120,
             ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tensorplan", "wyoming", *args],
                          env=ENV, input=stdin, capture_output=True, text=True,
                          timeout=timeout)


def _one_line_error(out: subprocess.CompletedProcess[str], *words: str) -> None:
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tensorplan: error: --"), out.stderr
    for w in words:
        assert w in lines[0], lines[0]
    assert "wyoming: listening" not in out.stdout + out.stderr


@pytest.mark.parametrize("args, words", [
    (["--uri", "tcp://127.0.0.1"], ["--uri", "port"]),
    (["--uri", "http://127.0.0.1:10300"], ["--uri", "tcp://"]),
    (["--uri", "tcp://127.0.0.1:99999"], ["--uri"]),
    (["--max-seconds", "inf"], ["--max-seconds"]),
    (["--sessions", "0"], ["--sessions"]),
    (["--sessions", "100000"], ["--sessions", "256"]),
    (["--max-connections", "0"], ["--max-connections"]),
])
def test_bad_flags_are_one_line_before_the_model_loads(args, words) -> None:
    _one_line_error(_wyoming(*args, timeout=30), *words)


def test_a_unix_path_holding_a_file_is_refused_and_the_file_kept(tmp_path: Path) -> None:
    precious = tmp_path / "notes.txt"
    precious.write_text("mine")
    _one_line_error(_wyoming("--uri", f"unix://{precious}", timeout=30), "not a socket")
    assert precious.read_text() == "mine"  # the wyoming package would have unlinked it


def test_a_unix_socket_another_server_listens_on_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "asr.sock"
    with socket.socket(socket.AF_UNIX) as other:
        other.bind(str(path))
        other.listen()
        _one_line_error(_wyoming("--uri", f"unix://{path}", timeout=30), "listening on")
        assert path.is_socket()  # still the other server's


def test_a_taken_port_is_said_before_anything_claims_to_listen() -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        out = _wyoming("--uri", f"tcp://127.0.0.1:{port}")
    _one_line_error(out, "--uri", "in use")


def test_stdio_answers_describe_on_a_stdout_that_holds_only_events() -> None:
    out = _wyoming("--uri", "stdio://", stdin='{"type": "describe"}\n')
    assert out.returncode == 0, out.stderr
    header = json.loads(out.stdout.splitlines()[0])  # a status line here broke the client
    assert header["type"] == "info"
    assert "listening on stdio://" in out.stderr

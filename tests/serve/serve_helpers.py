"""Start `python -m tensorplan serve` as a real process, wait for /ready, stop it with SIGTERM."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
JFK = ROOT / "samples" / "jfk.wav"
KEY = "test-key-3f9c"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    def __init__(self, *args: str, ready_s: float = 180.0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep
               + os.environ.get("PYTHONPATH", "")}
        env.pop("TENSORPLAN_API_KEY", None)
        # A temp directory of its own, so checks for left-over upload spools see this
        # server's files only, not those of a server another test run has going.
        self.tmp = Path(tempfile.mkdtemp(prefix="tensorplan-test-serve-"))
        env["TMPDIR"] = str(self.tmp)
        self.final_output = ""  # the whole log, kept by stop()
        self.log = open(  # noqa: SIM115 - kept open for the server's life
            f"/tmp/tensorplan-serve-{self.port}.log", "w+b")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tensorplan", "serve", "--port", str(self.port), *args],
            stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self._wait_ready(ready_s)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited {self.proc.returncode}: {self.output()}")
            try:
                with urllib.request.urlopen(self.url + "/ready", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"server not ready after {timeout:.0f} s: {self.output()}")

    def health(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.url + "/health", timeout=10) as r:
            return json.loads(r.read())  # type: ignore[no-any-return]

    def os_threads(self) -> int:
        text = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(next(line.split()[1] for line in text.splitlines()
                        if line.startswith("Threads:")))

    def spooled(self) -> list[Path]:
        """Upload spool files this server has left in its temp directory."""
        return list(self.tmp.glob("tensorplan-upload-*"))

    def output(self, whole: bool = False) -> str:
        """The server's log: its last 4000 characters, or all of it."""
        self.log.flush()
        self.log.seek(0)
        text = self.log.read().decode("utf-8", "replace")
        return text if whole else text[-4000:]

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM, then the exit status (it must stop by itself)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.final_output = self.output(whole=True)
        self.log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)
        return self.proc.returncode


def wait_idle(server: ServerProcess, timeout: float = 60.0) -> dict[str, Any]:
    """Poll /health until no session is busy and nothing is queued."""
    deadline = time.monotonic() + timeout
    while True:
        h = server.health()
        if (h["busy_sessions"] == 0 and h["queued"] == 0) or time.monotonic() > deadline:
            return h
        time.sleep(0.1)


def quiet(server: ServerProcess) -> int:
    """The server's memory trims once it has been idle long enough for any pending one."""
    from tensorplan.serve.idle_trim import IDLE_TRIM_S

    wait_idle(server)
    time.sleep(IDLE_TRIM_S + 1.5)
    return int(server.health()["memory_trims"])


def trimmed(server: ServerProcess, trims: int, timeout: float = 30.0) -> dict[str, Any]:
    """/health once the server has handed memory back more than `trims` times (it does
    so after a second without requests or live updates)."""
    deadline = time.monotonic() + timeout
    while True:
        h = wait_idle(server)
        if h["memory_trims"] > trims or time.monotonic() > deadline:
            return h
        time.sleep(0.1)

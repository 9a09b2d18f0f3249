"""Ctrl-C during a long transcription: exit 130 with one line, no temp or partial file left,
and outputs completed before the interrupt intact."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from synth_audio import wav

JFK = Path(__file__).resolve().parents[2] / "samples" / "jfk.wav"


def _speech(path: Path, repeats: int) -> Path:
    """jfk.wav repeated: real speech, so segments print as each window decodes."""
    data = JFK.read_bytes()
    pcm = np.frombuffer(data, "<i2", offset=data.index(b"data") + 8)
    path.write_bytes(wav(np.tile(pcm, repeats)))
    return path


def _interrupt_when(args: list[str], ready: Callable[[int], bool], tmp: Path,
                    delay: float = 0.0, limit: float = 300) -> tuple[int, str, float]:
    """Start `python -m tensorplan ARGS`, send SIGINT `delay` seconds after ready(pid)
    holds; return (exit code, stderr, seconds from start to the signal)."""
    out, err = tmp / "stdout.txt", tmp / "stderr.txt"
    env = {k: v for k, v in os.environ.items() if k != "TENSORPLAN_DEBUG"}
    with out.open("wb") as o, err.open("wb") as e:
        proc = subprocess.Popen([sys.executable, "-m", "tensorplan", *args], stdout=o,
                                stderr=e, env=env)
    t0 = time.monotonic()
    try:
        while not ready(proc.pid):
            assert proc.poll() is None, f"exited {proc.returncode} before the interrupt: " \
                                        f"{err.read_text()}"
            assert time.monotonic() - t0 < limit, "never got ready"
            time.sleep(0.05)
        time.sleep(delay)
        at = time.monotonic() - t0
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return rc, err.read_text(errors="replace"), at


def _model_mapped(pid: int) -> bool:
    """The model is loading: its model.bin is memory-mapped (so main() is running)."""
    try:
        return "model.bin" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigint_mid_transcription_leaves_no_files(tmp_path: Path) -> None:
    long = _speech(tmp_path / "long.wav", repeats=6)  # 66 s: three windows or more
    out = tmp_path / "out"
    rc, stderr, _ = _interrupt_when(
        ["transcribe", str(long), "--output-dir", str(out), "--beam-size", "1"],
        _model_mapped, tmp_path, delay=2.0)  # then planning, decoding, or the first window
    assert (rc, stderr) == (130, "tensorplan: interrupted\n")
    assert not out.exists() or list(out.iterdir()) == []


@pytest.mark.slow
def test_sigint_after_a_first_file_keeps_its_outputs(tmp_path: Path) -> None:
    """Several files to --output-dir (batch mode, which may reorder them, longest first):
    interrupt once one file's outputs all exist, while the other is still running."""
    stems = {"a": 3, "b": 2}  # jfk.wav repeats: 33 s and 22 s, both several seconds of work
    audio = [str(_speech(tmp_path / f"{stem}.wav", n)) for stem, n in stems.items()]
    out = tmp_path / "out"
    formats = ("txt", "vtt", "srt", "tsv", "json")

    def finished() -> list[str]:
        return [s for s in stems if all((out / f"{s}.{f}").exists() for f in formats)]

    rc, stderr, _ = _interrupt_when(
        ["transcribe", *audio, "--output-dir", str(out), "--beam-size", "1"],
        lambda pid: bool(finished()), tmp_path, delay=0.5, limit=900)
    assert rc == 130 and stderr.splitlines()[-1] == "tensorplan: interrupted", stderr
    assert "Traceback" not in stderr
    (done,) = finished()
    assert [p.name for p in out.iterdir() if p.name.endswith(".tmp")] == []
    assert not any(out.glob(f"{'b' if done == 'a' else 'a'}.*"))  # never half written
    assert "fellow Americans" in (out / f"{done}.txt").read_text()
    assert json.loads((out / f"{done}.json").read_text())["segments"]

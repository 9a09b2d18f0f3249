"""`tensorplan live` as a real process: a file, raw PCM through a pipe, the writers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soxr
from transcripts import normalize
from vad_available import needs_vad

from tensorplan.whisper.audio.decode import load_audio

pytestmark = needs_vad  # every test here runs live streams (Silero VAD)

ROOT = Path(__file__).resolve().parents[2]
JFK = ROOT / "samples" / "jfk.wav"
GOLDEN = ("And so my fellow Americans ask not what your country can do for you ask what you "
          "can do for your country")


def live(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, "-m", "tensorplan", "live", *args], input=stdin,
                          capture_output=True, env=env, timeout=600)


def test_a_file_prints_the_text_and_writes_the_outputs(tmp_path: Path) -> None:
    proc = live(str(JFK), "--beam-size", "none", "-o", str(tmp_path), "-f", "srt,json")
    assert proc.returncode == 0, proc.stderr.decode()
    lines = proc.stdout.decode().splitlines()
    assert len(lines) >= 2  # piped: one committed line per turn (OpenAI's 500 ms pauses)
    assert "\033[" not in proc.stdout.decode()  # no tail rewriting into a pipe
    assert normalize(" ".join(lines)) == normalize(GOLDEN)
    result = json.loads((tmp_path / "jfk.json").read_text())
    assert normalize(result["text"]) == normalize(GOLDEN)
    ends = [s["end"] for s in result["segments"]]
    assert ends == sorted(ends) and 9.0 < ends[-1] < 11.5  # stream times
    assert "-->" in (tmp_path / "jfk.srt").read_text()


def test_raw_pcm_from_a_pipe() -> None:
    # what `ffmpeg -f s16le -ac 2 -ar 24000 -` writes, made without the ffmpeg binary (a
    # fresh machine may lack it): stereo PCM16 at 24 kHz, interleaved
    mono = soxr.resample(load_audio(str(JFK)), 16000, 24000)
    pcm = (np.clip(np.repeat(mono, 2), -1, 1) * 32767).astype("<i2").tobytes()
    proc = live("-", "--rate", "24000", "--channels", "2", "--beam-size", "none",
                "--silence-duration-ms", "1200", stdin=pcm)
    assert proc.returncode == 0, proc.stderr.decode()
    assert normalize(proc.stdout.decode()) == normalize(GOLDEN)


@pytest.mark.parametrize("args, message", [
    ((), "no source"),
    (("no-such-file.wav",), "no-such-file.wav: no such file"),
    (("-", "--rate", "5"), "--rate"),
    (("--mic", "x.wav"), "not both"),
    ((str(ROOT / "samples"),), "is a directory"),
    # checked before the model loads: a session's text is not there to be had again later
    ((str(JFK), "-o", str(JFK), "-f", "txt"), "is not a directory"),
    ((str(JFK), "--suppress-tokens", "99999999"), "--suppress-tokens"),
    ((str(JFK), "--language", "xx"), "--language xx: unknown language"),
])
def test_bad_sources_are_one_line(args: tuple[str, ...], message: str) -> None:
    proc = live(*args)
    assert proc.returncode == 2
    err = proc.stderr.decode().strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_the_microphone_without_sounddevice_says_so() -> None:
    try:
        import sounddevice  # noqa: F401
        pytest.skip("sounddevice is installed (and a microphone may not be)")
    except (ImportError, OSError):
        pass
    proc = live("--mic")
    assert proc.returncode == 2
    assert "sounddevice" in proc.stderr.decode() and "Traceback" not in proc.stderr.decode()


def test_beams_past_the_default_plan_decode(tmp_path: Path) -> None:
    # the KV cache is planned for the flags' beams: it was planned for 5, and every turn
    # failed ("batch 8 exceeds the planned maximum 5") while the command exited 0
    proc = live(str(JFK), "--beam-size", "8", "--silence-duration-ms", "1200")
    assert proc.returncode == 0, proc.stderr.decode()
    assert normalize(proc.stdout.decode()) == normalize(GOLDEN)


def test_an_output_that_is_a_directory_is_refused_before_the_session(tmp_path: Path) -> None:
    # found at the end, after the whole session was heard: every turn lost
    (tmp_path / "jfk.srt").mkdir()
    proc = live(str(JFK), "-o", str(tmp_path), "-f", "txt,srt")
    assert proc.returncode == 2 and proc.stdout == b""
    err = proc.stderr.decode().strip()
    assert "jfk.srt: is a directory" in err and len(err.splitlines()) == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["jfk.srt"]


def _unwritable_dir(tmp_path: Path) -> Path:
    if os.geteuid() != 0:
        tmp_path.chmod(0o500)
        return tmp_path
    if not Path("/sys/kernel").is_dir():  # root writes anywhere a mode forbids
        pytest.skip("running as root without /sys, which refuses new files even to root")
    return Path("/sys/kernel")


def test_an_unwritable_output_directory_is_refused_before_the_session(tmp_path: Path) -> None:
    # found at the end before: the whole session heard, then every output lost
    out = _unwritable_dir(tmp_path)
    try:
        proc = live(str(JFK), "-o", str(out), "-f", "txt")
    finally:
        tmp_path.chmod(0o700)
    assert proc.returncode == 2 and proc.stdout == b""
    err = proc.stderr.decode().strip()
    assert "cannot write to output directory" in err and len(err.splitlines()) == 1, err


def test_empty_or_closed_stdin_is_one_line() -> None:
    proc = live("-", stdin=b"")
    assert proc.returncode == 2
    assert proc.stderr.decode().strip() == \
        "tensorplan: error: -: standard input ended before any audio (0 bytes)"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    closed = subprocess.run(["sh", "-c", 'exec "$0" -m tensorplan live - <&-', sys.executable],
                            capture_output=True, env=env, timeout=600)
    err = closed.stderr.decode().strip()
    assert closed.returncode == 2 and "standard input is closed" in err, err
    assert len(err.splitlines()) == 1


def test_a_language_by_name_is_english_on_an_english_only_model() -> None:
    # "English" was compared as a string with "en" and refused as not English
    proc = live(str(JFK), "--language", "English", "--beam-size", "none",
                "--silence-duration-ms", "1200")
    assert proc.returncode == 0, proc.stderr.decode()
    assert normalize(proc.stdout.decode()) == normalize(GOLDEN)


def test_a_reader_that_leaves_loses_no_turn_of_the_outputs(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run(
        f"{sys.executable} -m tensorplan live {JFK} --beam-size none -o {tmp_path} -f txt "
        "| head -1", shell=True, capture_output=True, env=env, timeout=600)
    assert "Traceback" not in proc.stderr.decode(), proc.stderr.decode()
    assert len(proc.stdout.decode().splitlines()) == 1
    written = (tmp_path / "jfk.txt").read_text()
    assert normalize(written) == normalize(GOLDEN), written


@pytest.mark.parametrize("signals, code", [(("SIGTERM",), 143), (("SIGINT", "SIGINT"), 130)])
def test_stopped_mid_stream_it_writes_what_it_heard(tmp_path: Path, signals: tuple[str, ...],
                                                    code: int) -> None:
    """A second Ctrl-C while the last turn decodes used to abort the process (SIGABRT, a
    worker torn down inside a kernel) and lose the outputs; SIGTERM exited 0."""
    import signal
    import time

    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tensorplan", "live", str(JFK), "--realtime", "--beam-size",
         "none", "-o", str(tmp_path), "-f", "txt"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.monotonic() + 120
        # stop once it has printed a turn: the model is loaded and a turn is done
        first = proc.stdout.readline() if proc.stdout else b""
        assert first and time.monotonic() < deadline
        for name in signals:
            proc.send_signal(getattr(signal, name))
            time.sleep(0.02)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == code, err.decode()
    assert "Traceback" not in err.decode() and "terminate called" not in err.decode()
    assert normalize(first.decode()) in normalize((tmp_path / "jfk.txt").read_text())

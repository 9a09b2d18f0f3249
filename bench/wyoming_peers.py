"""`tensorplan wyoming` against wyoming-faster-whisper, Home Assistant's usual STT server,
measured by `wyoming-bench stt` (PyPI): both tiny.en int8 on the CPU, beam 5, the same
threads, the same machine and run; plus each server's resident memory (RSS).

    pip install wyoming-bench wyoming-faster-whisper
    python bench/wyoming_peers.py [--threads 2] [--rounds 3]

The corpus is samples/jfk.wav and short voice commands spoken by espeak-ng, each with its
text. wyoming-faster-whisper loads tensorplan's bundled CTranslate2 tiny.en directory
(--model PATH --local-files-only): nothing is downloaded.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = ("Turn on the kitchen lights.", "Set a timer for ten minutes.",
            "What is the weather like tomorrow?", "Lock the front door and close the garage.")
GOLDEN_JFK = ("And so my fellow Americans ask not what your country can do for you ask what "
              "you can do for your country")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(port: int, proc: subprocess.Popen, seconds: float = 180) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if proc.poll() is not None:
                sys.exit(f"a server exited early: {proc.args}")
            time.sleep(0.5)
    sys.exit(f"no server on port {port} after {seconds:g} s")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def make_corpus(out: Path) -> None:
    shutil.copy(ROOT / "samples" / "jfk.wav", out / "jfk.wav")
    (out / "jfk.txt").write_text(GOLDEN_JFK)
    for i, text in enumerate(COMMANDS):
        wav = out / f"command_{i}.wav"
        subprocess.run(["espeak-ng", "-v", "en-us", "-s", "150", "-w", str(out / "raw.wav"),
                        text], check=True, capture_output=True)
        subprocess.run(["sox", str(out / "raw.wav"), "-r", "16000", "-c", "1", "-b", "16",
                        str(wav)], check=True)
        (out / f"command_{i}.txt").write_text(text)
    (out / "raw.wav").unlink()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mode", default="both", choices=("non_streaming", "streaming", "both"))
    args = parser.parse_args()
    missing = [tool for tool in ("wyoming-bench",) if shutil.which(tool) is None]
    if importlib.util.find_spec("wyoming_faster_whisper") is None:
        missing.append("wyoming-faster-whisper")
    if missing:
        print(f"bench/wyoming_peers.py: not installed: {', '.join(missing)} "
              "(pip install -e '.[bench]')", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT / "src"))
    from tensorplan.whisper.model_files.find import resolve_model

    model_dir = resolve_model("tiny.en")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    with tempfile.TemporaryDirectory() as tmp:
        corpus, data = Path(tmp) / "corpus", Path(tmp) / "data"
        corpus.mkdir()
        data.mkdir()
        make_corpus(corpus)
        tp_port, fw_port = free_port(), free_port()
        servers = {
            "tensorplan": subprocess.Popen(
                [sys.executable, "-m", "tensorplan", "wyoming", "--uri",
                 f"tcp://127.0.0.1:{tp_port}", "--compute-type", "int8", "--threads",
                 str(args.threads), "--sessions", "1", "--beam-size", "5"],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
            "wyoming-faster-whisper": subprocess.Popen(
                [sys.executable, "-m", "wyoming_faster_whisper", "--uri",
                 f"tcp://127.0.0.1:{fw_port}", "--model", str(model_dir), "--data-dir",
                 str(data), "--local-files-only", "--compute-type", "int8", "--cpu-threads",
                 str(args.threads), "--beam-size", "5", "--language", "en"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
        }
        try:
            for port, proc in zip((tp_port, fw_port), servers.values(), strict=True):
                wait_for(port, proc)
            idle = {name: rss_mb(p.pid) for name, p in servers.items()}
            subprocess.run(["wyoming-bench", "stt", "--corpus", str(corpus), "--mode",
                            args.mode, "--rounds", str(args.rounds), "--config",
                            '{"language":"en"}', f"127.0.0.1:{tp_port}",
                            f"127.0.0.1:{fw_port}"], check=False)
            print(f"\nports: tensorplan {tp_port}, wyoming-faster-whisper {fw_port}")
            print("RSS (MB)            idle   after the bench")
            for name, proc in servers.items():
                print(f"{name:24s} {idle[name]:6.0f} {rss_mb(proc.pid):8.0f}")
        finally:
            for proc in servers.values():
                proc.terminate()
                proc.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())

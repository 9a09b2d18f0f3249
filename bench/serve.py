"""`tensorplan serve` under load: throughput and latency for 1, 2, 4, 8, 16 concurrent clients.

For each compute type, one server process (`python -m tensorplan serve`) and, for jfk.wav
(11 s) and a 60 s file (jfk.wav padded with silence to 30 s, twice), each level of concurrency:
C clients each send R requests back to back. Reported per level: throughput (audio seconds
per wall second), median and p95 latency, and the server's peak RSS (the kernel's VmHWM).
The ceiling is one process transcribing the same file sequentially with the Python API (no
HTTP, no queue), measured before and after the levels: `ratio` is the server's throughput
over it. `--engines 8,0` runs each setting with the step engine (8 windows) and without it
(each request alone on a session), one server each. `--behind 600` adds the fairness
case: jfk.wav sent 2 s after 600 s of espeak-ng speech, its latency against its own solo
latency.

    python bench/serve.py [--compute-types float32,int8] [--levels 1,2,4,8,16] [--requests 2]
                          [--sessions N] [--server-args "..."] [--files jfk,long]
                          [--beam-size none,5] [--engines 8,0] [--behind 600] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import wave
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
JFK = ROOT / "samples" / "jfk.wav"
ENV = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def tiled_wav(seconds: float) -> bytes:
    """jfk.wav's samples padded with silence to 30 s (one window each), repeated, cut to
    `seconds`. Speech back to back would repeat the same words within a window, whose text
    then compresses so well that every window falls back through all six temperatures."""
    with wave.open(str(JFK)) as w:
        params, frames = w.getparams(), w.readframes(w.getnframes())
    window = params.sampwidth * params.nchannels * params.framerate * 30
    unit = frames + b"\0" * (window - len(frames))
    want = int(seconds * params.framerate) * params.sampwidth * params.nchannels
    data = (unit * (want // len(unit) + 1))[:want]
    buf = io.BytesIO()
    with wave.open(buf, "wb") as out:
        out.setparams(params)
        out.writeframes(data)
    return buf.getvalue()


def wav_seconds(data: bytes) -> float:
    with wave.open(io.BytesIO(data)) as w:
        return w.getnframes() / w.getframerate()


class Server:
    def __init__(self, args: list[str]) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "tensorplan", "serve", "--port",
                                      str(self.port), *args], env=ENV,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.proc.stderr.read().decode()[-2000:]}")
            try:
                with urllib.request.urlopen(self.url + "/ready", timeout=5):
                    return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("server not ready")

    def health(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.url + "/health", timeout=10) as r:
            return json.loads(r.read())  # type: ignore[no-any-return]

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)


def post(url: str, name: str, data: bytes) -> float:
    """One transcription request; its latency in seconds."""
    boundary = "tensorplanbench"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\n"
            f"whisper-1\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
            f"filename=\"{name}\"\r\nContent-Type: audio/wav\r\n\r\n").encode() + data \
        + f"\r\n--{boundary}--\r\n".encode()
    request = urllib.request.Request(url + "/v1/audio/transcriptions", data=body, headers={
        "Content-Type": f"multipart/form-data; boundary={boundary}"})
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=600) as r:
        json.loads(r.read())
    return time.perf_counter() - start


def level(server: Server, name: str, data: bytes, clients: int, requests: int) -> dict[str, Any]:
    # The peak RSS is the kernel's high-water mark, reset before the level: exact, and no
    # load on the server under test (polling /health 4 times a second, as before, took
    # the GIL from its decoding thread; measured at 0.37 against 0.39 s per jfk request,
    # medians of three runs of 8: within this machine's noise, but not nothing).
    # one request first, not timed, as the ceiling's process transcribes once before it
    # times: the level starts after seconds idle (the ceiling's own run), and this machine
    # ran a request after 2 s idle in 0.44 s against 0.36-0.39 s back to back, trimmed
    # memory or not
    post(server.url, name, data)
    _reset_peak_rss(server.proc.pid)
    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        latencies = list(pool.map(lambda _: post(server.url, name, data),
                                  range(clients * requests)))
    wall = time.perf_counter() - start
    latencies.sort()
    p95 = latencies[min(len(latencies) - 1, round(0.95 * (len(latencies) - 1)))]
    return {"clients": clients, "n": len(latencies), "wall_s": wall,
            "throughput": wav_seconds(data) * len(latencies) / wall,
            "p50_s": statistics.median(latencies), "p95_s": p95,
            "rss_mib": _peak_rss(server.proc.pid) / 2**20}


def _reset_peak_rss(pid: int) -> None:
    """Reset the process's VmHWM (Linux: 5 into clear_refs); where that is refused the
    peak counts from the server's start."""
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/clear_refs").write_text("5")


def _peak_rss(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    kib = next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:"))
    return int(kib) * 1024


SEQUENTIAL = """
import sys, time
from tensorplan.whisper import load_model
from tensorplan.whisper.options import TranscribeOptions
path, n, ctype, beam = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
model = load_model("tiny.en", compute_type=ctype)
options = TranscribeOptions(beam_size=None if beam == "none" else int(beam))
model.transcribe(path, options)
times = []
for _ in range(n):
    t = time.perf_counter(); model.transcribe(path, options); times.append(time.perf_counter() - t)
print(sorted(times)[len(times) // 2])
"""


def sequential(path: Path, n: int, compute_type: str, beam: str) -> float:
    """Median seconds per file in one process running the file n times back to back."""
    out = subprocess.run([sys.executable, "-c", SEQUENTIAL, str(path), str(n), compute_type,
                          beam], env=ENV, capture_output=True, text=True, check=True)
    return float(out.stdout.split()[-1])


def speech_wav(seconds: float) -> bytes:
    """`seconds` of espeak-ng speech with pauses (bench/batched.py's generator, cached in
    the system's temp directory): a long file whose every window has words to decode, as
    a real recording does (a file padded with silence decodes in about a second)."""
    sys.path.insert(0, str(ROOT / "bench"))
    from batched import synthesize  # noqa: PLC0415
    from memory import write_wav  # noqa: PLC0415

    work = Path(tempfile.gettempdir()) / "tensorplan-bench"
    work.mkdir(exist_ok=True)
    samples, _ = synthesize(seconds, seed=27, work=work)
    path = work / f"speech_{seconds:g}s_27.wav"
    write_wav(path, samples)
    return path.read_bytes()


def behind(server: Server, long_seconds: float) -> dict[str, float]:
    """jfk.wav alone, then sent 2 s after a long file of speech: both latencies, and the
    file's."""
    short = JFK.read_bytes()
    solo = post(server.url, "jfk.wav", short)
    long_file = speech_wav(long_seconds)
    out: dict[str, float] = {}
    worker = threading.Thread(target=lambda: out.update(
        long_s=post(server.url, "long.wav", long_file)))
    worker.start()
    time.sleep(2)
    out.update(short_solo_s=solo, short_behind_s=post(server.url, "jfk.wav", short))
    worker.join()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--compute-types", default="float32,int8")
    p.add_argument("--levels", default="1,2,4,8,16")
    p.add_argument("--requests", type=int, default=2, help="requests per client per level")
    p.add_argument("--sessions", default=None, help="the server's --sessions (its default)")
    p.add_argument("--server-args", default="", help="more `tensorplan serve` flags")
    p.add_argument("--files", default="jfk,long", help="jfk and/or long (the tiled file)")
    p.add_argument("--beam-size", default="none",
                   help="'none' (greedy) or beams; a comma list runs each")
    p.add_argument("--engines", default="8",
                   help="the server's --engine-windows, a comma list (0: no engine)")
    p.add_argument("--behind", type=float, default=0.0, metavar="SECONDS",
                   help="also: jfk.wav sent 2 s after a file this long (0: skip)")
    p.add_argument("--long-seconds", type=float, default=60.0)
    p.add_argument("--quick", action="store_true",
                   help="smoke run: int8, jfk only, 1 and 2 clients, 1 request each")
    p.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = p.parse_args()
    types = args.compute_types.split(",") if not args.quick else ["int8"]
    levels = [int(x) for x in args.levels.split(",")] if not args.quick else [1, 2]
    requests = 1 if args.quick else args.requests
    files = {"jfk.wav (11 s)": JFK.read_bytes()} if "jfk" in args.files else {}
    if not args.quick and "long" in args.files:
        files[f"tiled ({args.long_seconds:.0f} s)"] = tiled_wav(args.long_seconds)
    rows: list[dict[str, Any]] = []
    print(f"cores: {len(os.sched_getaffinity(0))}, load average: {os.getloadavg()[0]:.1f}",
          flush=True)
    print("| compute | beam | engine | file | clients | requests | throughput (audio s/s) | "
          "ratio | p50 s | p95 s | peak RSS MiB |")
    print("| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    settings = [(c, b, e) for c in types for b in args.beam_size.split(",")
                for e in args.engines.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        for ctype, beam, engine in settings:
            extra = (["--sessions", args.sessions] if args.sessions else []) \
                + ["--engine-windows", engine] + args.server_args.split()
            server = Server(["--compute-type", ctype, "--beam-size", beam, *extra])
            tag = f"| {ctype} | {beam} | {engine} |"
            try:
                for name, data in files.items():
                    path = Path(tmp) / "audio.wav"
                    path.write_bytes(data)
                    post(server.url, name, data)  # warm: every lazy import and plan made
                    # the ceiling before and after the levels, and their mean: on a machine
                    # shared with other work, one measurement taken minutes away from the
                    # server's misses the load the server ran under
                    before = sequential(path, 1 if args.quick else 3, ctype, beam)
                    level_rows = [level(server, name, data, clients, requests)
                                  for clients in levels]
                    after = sequential(path, 1 if args.quick else 3, ctype, beam)
                    ceiling = wav_seconds(data) / ((before + after) / 2)
                    print(f"{tag} {name} | sequential | - | {ceiling:.1f} | 1.00 | "
                          f"{wav_seconds(data) / ceiling:.2f} | - | - |", flush=True)
                    for row in level_rows:
                        row.update(compute=ctype, beam=beam, engine=engine, file=name,
                                   ratio=row["throughput"] / ceiling)
                        rows.append(row)
                        print(f"{tag} {name} | {row['clients']} | {row['n']} | "
                              f"{row['throughput']:.1f} | {row['ratio']:.2f} | "
                              f"{row['p50_s']:.2f} | {row['p95_s']:.2f} | "
                              f"{row['rss_mib']:.0f} |", flush=True)
                if args.behind:
                    b = behind(server, args.behind)
                    rows.append({"compute": ctype, "beam": beam, "engine": engine,
                                 "behind_s": args.behind, **b})
                    print(f"{tag} jfk.wav 2 s behind a {args.behind:.0f} s file: "
                          f"{b['short_behind_s']:.2f} s (alone {b['short_solo_s']:.2f} s; "
                          f"the file {b['long_s']:.1f} s)", flush=True)
            finally:
                server.stop()
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

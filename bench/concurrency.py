"""Several tensorplan processes at once on one machine: does each get its share of the cores?

k = 1, 2, 3 copies of `tensorplan transcribe FILE -f txt -o D` start together, on jfk.wav
and on a 60 s file (jfk.wav tiled with 2 s silences), once with the default thread count
(adaptive: threads.idle_cores) and once with --threads set to this machine's cores (the
old default, a thread per core whatever else runs). Each cell is the median wall time of
one process over --repeats rounds (rounds interleave every setting). "x share" is that
time over k times the lone (k = 1) default time: the machine's throughput split k ways;
1.0 means no loss to contention, the target is at most 1.3.

    python bench/concurrency.py [--repeats 3] [--long-seconds 60] [--limit 300]
    python bench/concurrency.py --smoke      # jfk.wav, k = 1 and 2, once (CI)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import wave
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
JFK = ROOT / "samples" / "jfk.wav"


def tiled_wav(path: Path, seconds: float, gap_s: float = 2.0) -> Path:
    """jfk.wav repeated with silences between, `seconds` long, as 16 kHz mono PCM."""
    with wave.open(str(JFK)) as w:
        speech = np.frombuffer(w.readframes(w.getnframes()), np.int16)
    out = np.zeros(int(seconds * 16000), np.int16)
    step = len(speech) + int(gap_s * 16000)
    for start in range(0, len(out) - len(speech) + 1, step):
        out[start:start + len(speech)] = speech
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(out.tobytes())
    return path


def run_together(audio: Path, k: int, threads: int | None, work: Path,
                 limit_s: float) -> list[float]:
    """Wall seconds of each of k processes started at once; a process still running after
    limit_s is killed and counts as limit_s (the table then shows ">")."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    procs = []
    for _ in range(k):
        out = tempfile.mkdtemp(dir=work)
        cmd = [sys.executable, "-m", "tensorplan", "transcribe", str(audio), "-f", "txt",
               "-o", out, "--no-verbose"]
        if threads is not None:
            cmd += ["--threads", str(threads)]
        procs.append((time.perf_counter(), subprocess.Popen(
            cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)))
    times = []
    for start, proc in procs:
        try:
            _, err = proc.communicate(timeout=max(1.0, start + limit_s - time.perf_counter()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            times.append(limit_s)
            continue
        if proc.returncode != 0:
            raise RuntimeError(f"tensorplan failed: {err[-2000:]}")
        times.append(time.perf_counter() - start)
    return times


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--long-seconds", type=float, default=60.0)
    p.add_argument("--limit", type=float, default=300.0,
                   help="seconds a process may run before it is killed (shown as >limit)")
    p.add_argument("--smoke", action="store_true", help="jfk.wav, k = 1 and 2, once")
    args = p.parse_args()
    ks = (1, 2) if args.smoke else (1, 2, 3)
    settings: dict[str, int | None] = {"default": None, f"--threads {cores()}": cores()}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        files = {"jfk": JFK}
        if not args.smoke and args.long_seconds > 0:
            files[f"{args.long_seconds:g}s"] = tiled_wav(work / "long.wav", args.long_seconds)
        cells: dict[tuple[str, str, int], list[float]] = {}
        for r in range(1 if args.smoke else args.repeats):
            for name, audio in files.items():
                for setting, threads in settings.items():
                    for k in ks:
                        times = run_together(audio, k, threads, work, args.limit)
                        cells.setdefault((name, setting, k), []).append(statistics.median(times))
                        print(f"round {r + 1} {name} {setting} k={k}: "
                              f"{', '.join(f'{t:.2f}' for t in times)}", file=sys.stderr)
            print(f"round {r + 1}\n{report(cells, files, settings, ks, args.limit)}",
                  file=sys.stderr)
    print(report(cells, files, settings, ks, args.limit))
    return 0


def report(cells: dict[tuple[str, str, int], list[float]], files: dict[str, Path],
           settings: dict[str, int | None], ks: tuple[int, ...], limit_s: float) -> str:
    rows = [f"{cores()} cores, load average at the end "
            f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}",
            "| audio | threads | " + " | ".join(f"k={k} s | x share" for k in ks) + " |",
            "|---|---|" + "---:|---:|" * len(ks)]
    for name in files:
        lone = cells.get((name, "default", 1))
        for setting in settings:
            row = [name, setting]
            for k in ks:
                vals = cells.get((name, setting, k))
                if not vals:
                    row += ["-", "-"]
                    continue
                t = statistics.median(vals)
                share = f"{t / (k * statistics.median(lone)):.2f}" if lone else "-"
                over = ">" if t >= limit_s else ""
                row += [f"{over}{t:.2f}", f"{over}{share}"]
            rows.append("| " + " | ".join(row) + " |")
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())

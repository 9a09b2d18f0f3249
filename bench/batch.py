"""How much faster do many files go with more workers, and what does Ray cost?

Synthesises N short files (3-5 s slices of samples/jfk.wav), then transcribes them with
tiny.en (greedy) through the batch driver: in one local worker process, in two, and in two
Ray actors on a local Ray instance. Throughput is audio seconds per wall second; "startup"
is the time until every worker has loaded its model (for Ray: after `ray.init`, timed on
its own), and "steady" leaves it out.

    python bench/batch.py [--files 8] [--no-ray] [--beam]
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
import wave
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from tensorplan.batch import LocalPool, ModelSpec, Pool, collect_inputs, run_batch
from tensorplan.batch.jobs import cpu_count
from tensorplan.whisper.audio.constants import SAMPLE_RATE
from tensorplan.whisper.audio.decode import load_audio
from tensorplan.whisper.options import TranscribeOptions

JFK = Path(__file__).resolve().parents[1] / "samples" / "jfk.wav"
SLICES = [(0, 3), (2, 6), (3, 8), (5, 9), (6, 11), (0, 5), (4, 8), (7, 11)]  # seconds


@dataclass
class Row:
    name: str
    audio_s: float
    wall_s: float
    startup_s: float

    def cells(self) -> list[str]:
        steady = self.audio_s / (self.wall_s - self.startup_s)
        return [self.name, f"{self.audio_s:.1f}", f"{self.wall_s:.1f}", f"{self.startup_s:.1f}",
                f"{self.audio_s / self.wall_s:.2f}", f"{steady:.2f}"]


def make_files(folder: Path, n: int) -> None:
    jfk = load_audio(JFK)
    for i in range(n):
        start, end = SLICES[i % len(SLICES)]
        pcm = (jfk[start * SAMPLE_RATE:end * SAMPLE_RATE] * 32767).astype("<i2")
        with wave.open(str(folder / f"clip{i:02d}.wav"), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(SAMPLE_RATE)
            w.writeframes(pcm.tobytes())


def measure(name: str, folder: Path, out: Path, options: TranscribeOptions,
            make_pool: Callable[[], Pool]) -> Row:
    startup = [0.0]

    def timed_pool(n_files: int) -> Pool:
        t = time.perf_counter()
        pool = make_pool()
        startup[0] = time.perf_counter() - t
        return pool

    report = run_batch(collect_inputs([folder]), out, ("txt",), spec=ModelSpec(),
                       options=options, make_pool=timed_pool, verbose=False)
    assert not report.failed, report.failed
    return Row(name, report.audio_seconds, report.wall_seconds, startup[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray row")
    parser.add_argument("--beam", action="store_true", help="beam search 5 (default: greedy)")
    args = parser.parse_args(argv)
    options = TranscribeOptions() if args.beam else TranscribeOptions(beam_size=None,
                                                                      best_of=None)
    spec = ModelSpec()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "in"
        folder.mkdir()
        make_files(folder, args.files)
        for n in (1, 2):
            rows.append(measure(f"local, {n} worker{'s' * (n > 1)}", folder, Path(tmp) / f"l{n}",
                                options, partial(LocalPool, spec, options, n)))
        ray_init = None
        if not args.no_ray:
            try:
                import ray
            except ImportError:
                print("Ray row skipped: Ray is not installed", file=sys.stderr)
            else:
                from tensorplan.batch.ray_pool import RayPool

                t = time.perf_counter()
                ray.init(num_cpus=cpu_count(), include_dashboard=False,
                         logging_level=logging.WARNING)
                ray_init = time.perf_counter() - t
                try:
                    rows.append(measure("Ray, 2 actors", folder, Path(tmp) / "ray", options,
                                        lambda: RayPool(spec, options, "auto", n_workers=2)))
                finally:
                    ray.shutdown()
    header = ["pool", "audio s", "wall s", "startup s", "audio s / wall s", "steady"]
    table = [header] + [r.cells() for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    print(f"{args.files} files, tiny.en {'beam 5' if args.beam else 'greedy'}, "
          f"{cpu_count()} cores")
    for row in table:
        print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in
                        enumerate(zip(row, widths, strict=True))))
    if len(rows) >= 2:
        print(f"2 workers vs 1: {rows[0].wall_s / rows[1].wall_s:.2f}x")
    if ray_init is not None:
        print(f"ray.init: {ray_init:.1f} s (not in the table); Ray vs local 2 workers: "
              f"{rows[1].wall_s / rows[2].wall_s:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

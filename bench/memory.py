"""How much memory does transcription take, per plan mode, next to whisper.cpp and peers?

Three parts, each with its targets and a verdict (MB = 1e6 B throughout). A configuration
is a plan mode (dedicated, output, joint), plus joint with float16 KV caches and weights:
  1. the memory report (tensorplan.whisper.planned.memory) for tiny.en, and base/small when their
     packages are installed, per configuration, beside whisper.cpp's buffers for the same
     dims; target: tiny.en non-weight <= 40 MB;
  2. peak RSS of transcribing samples/jfk.wav (default decoding: beam 5, as the anchors)
     in a fresh process per configuration (median of --repeats), beside whisper.cpp 193 MB,
     faster-whisper int8 246 MB and openai-whisper 537 MB; target: <= 180 MB;
  3. long audio: peak RSS for a 10-minute file (jfk.wav tiled with silence, synthesised
     here, never downloaded) against a 30 s file, greedy; target: within 10%. --hour adds
     a 1-hour file. --silences runs only a 1-hour FLAC of speech between 5-minute digital
     silences against a 30 s one (target: within 15%), the streamed-decoding figure.

  4. per session: what one more stream costs on a loaded model (planned bytes, and the RSS
     a second session added), tiny.en and base, greedy and beam 5; --sessions runs only it.

    python bench/memory.py [--quick] [--repeats 3] [--long-repeats 1] [--plan joint] [--hour]

--quick prints part 1 for tiny.en only (no subprocess runs, a few seconds).
Peak RSS is the child's ru_maxrss from os.wait4, so each run is measured alone. On 2 shared
cores a 10-minute file takes well over 10 minutes: --long-repeats defaults to 1.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import wave
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tensorplan.commands.plan import format_reference, format_report, table
from tensorplan.errors import ModelError
from tensorplan.pipeline import PLAN_MODES

ROOT = Path(__file__).resolve().parents[1]
JFK = ROOT / "samples" / "jfk.wav"
MB = 1_000_000
KIB = 1024  # ru_maxrss unit on Linux
SR = 16_000
TARGET_NON_WEIGHT = 40 * MB  # tiny.en
TARGET_RSS = 180 * MB
TARGET_LONG = 0.10  # long-audio peak RSS within 10% of the 30 s file's
TARGET_HOUR = 0.15  # the streamed 1-hour FLAC with long silences, within 15% of 30 s
ANCHORS_RSS = (("whisper.cpp", 193), ("faster-whisper int8", 246), ("openai-whisper", 537))
MODELS = ("tiny.en", "base", "small")
FP16 = {"kv_dtype": "float16", "weights_dtype": "float16"}
CONFIGS: dict[str, dict[str, Any]] = {  # label -> load_model keywords (max batch 5: beams)
    **{mode: {"plan": mode} for mode in PLAN_MODES},
    "joint, kv+weights fp16": {"plan": "joint", **FP16},
}
GREEDY = {"beam_size": None}  # long audio: decoding choices do not move RSS, time they do


def verdict(value: float, target: float, unit: str = "MB") -> str:
    """"ok" or "MISS by X" (how far above the target)."""
    return "ok" if value <= target else f"MISS by {value - target:.2f} {unit}"


# ---- 1. the memory report ------------------------------------------------------------------
def report_models(models: Sequence[str]) -> None:
    from tensorplan.whisper.api import load_model
    from tensorplan.whisper.planned.memory import memory_report, whisper_cpp_reference

    for name in models:
        print(f"\n## {name}: bytes held besides the weights, per plan mode")
        totals = {}
        dims = None
        for label, config in CONFIGS.items():
            try:
                model = load_model(name, **config)
            except ModelError:
                print(f"skipped: pip install 'tensorplan[{name}]'")
                break
            report = memory_report(model)
            dims = model.dims
            del model
            gc.collect()
            totals[label] = report.total_non_weight_bytes
            print(f"\n{label}:" if label not in PLAN_MODES else "")
            print(format_report(report))
        if dims is None:
            continue
        print()
        print(format_reference(whisper_cpp_reference(dims)))
        cpp = sum(r.bytes for r in whisper_cpp_reference(dims))
        target = TARGET_NON_WEIGHT if name == "tiny.en" else None
        rows = [(label, f"{t / MB:.2f}", f"{t / cpp:.2f}x",
                 verdict(t / MB, target / MB) if target else "")
                for label, t in totals.items()]
        print()
        print(table(("configuration", "non-weight MB", "vs whisper.cpp",
                     f"target <= {TARGET_NON_WEIGHT / MB:.0f} (tiny.en)"), rows))


# ---- 2 and 3. peak RSS in fresh processes ---------------------------------------------------
@dataclass(frozen=True, slots=True)
class Run:
    peak: int  # bytes: the child's ru_maxrss, from os.wait4
    loaded: int  # bytes: its high-water mark once the model was loaded and planned
    imported: int  # bytes: ... once tensorplan and numpy were imported
    wall: float  # seconds


def peak_rss(audio: Path, config: dict[str, Any], options: dict[str, Any] | None = None) -> Run:
    """One fresh process transcribing `audio` with tiny.en loaded with `config`, decoding
    with `options` (default: TranscribeOptions' defaults, beam 5 as the anchors)."""
    job = json.dumps({"load": config, "decode": options or {}})
    cmd = [sys.executable, __file__, "--child", job, str(audio)]
    with tempfile.TemporaryFile() as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's rusage alone
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        out.seek(0)
        text = out.read().decode(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{text[-2000:]}")
    marks = json.loads(text.strip().splitlines()[-1])
    return Run(usage.ru_maxrss * KIB, marks["loaded"], marks["imported"], wall)


def median_rss(audio: Path, config: dict[str, Any], repeats: int,
               options: dict[str, Any] | None = None) -> Run:
    runs = [peak_rss(audio, config, options) for _ in range(max(1, repeats))]
    return Run(*(statistics.median(getattr(r, f) for r in runs)
                 for f in ("peak", "loaded", "imported", "wall")))


def rss_by_config(repeats: int) -> None:
    print(f"\n## peak RSS transcribing {JFK.name} (tiny.en, default decoding: beam 5, "
          f"fresh process, median of {repeats})")
    rows = []
    for label, config in CONFIGS.items():
        run = median_rss(JFK, config, repeats)
        rows.append((f"tensorplan {label}", f"{run.peak / MB:.1f}", f"{run.imported / MB:.1f}",
                     f"{run.loaded / MB:.1f}", f"{run.wall:.1f}",
                     verdict(run.peak / MB, TARGET_RSS / MB)))
    rows += [(name, f"{mb:.1f}", "", "", "", "anchor") for name, mb in ANCHORS_RSS]
    print(table(("process", "peak RSS MB", "imported", "loaded", "wall s",
                 f"target <= {TARGET_RSS / MB:.0f}"), rows))
    print("imported / loaded: the process's high-water mark after importing, after loading "
          "and planning the model")


def long_audio(plan: str, hour: bool, repeats: int) -> None:
    """Peak RSS should not grow with the audio's length (the 30 s file is the baseline)."""
    lengths = [30, 600] + ([3600] if hour else [])
    print(f"\n## long audio: peak RSS by file length (tiny.en, plan {plan}, greedy, median "
          f"of {repeats})")
    with tempfile.TemporaryDirectory() as tmp:
        jfk = _samples(JFK)
        rows, base = [], 0
        for seconds in lengths:
            path = Path(tmp) / f"tiled_{seconds}s.wav"
            write_wav(path, tile(jfk, seconds))
            run = median_rss(path, {"plan": plan}, repeats, GREEDY)
            base = base or run.peak
            grow = run.peak / base - 1
            check = ("baseline" if seconds == lengths[0]
                     else verdict(grow * 100, TARGET_LONG * 100, "%"))
            rows.append((f"{seconds} s", f"{run.peak / MB:.1f}", f"{grow:+.1%}",
                         f"{run.wall:.1f}", check))
    print(table(("audio", "peak RSS MB", "vs 30 s", "wall s",
                 f"target within {TARGET_LONG:.0%}"), rows))


def long_silences(plan: str, repeats: int) -> None:
    """A 1-hour FLAC of speech between long digital silences (jfk.wav, then 5 minutes of
    zeros, over and over), synthesised here and never held whole: the file is streamed
    (audio.StreamedAudio), so its peak RSS should stay within 15% of a 30 s file's."""
    print(f"\n## 1 hour of speech and long silences, FLAC: peak RSS (tiny.en, plan {plan}, "
          f"greedy, median of {repeats})")
    with tempfile.TemporaryDirectory() as tmp:
        jfk = _samples(JFK)
        rows, base = [], 0
        for seconds in (30, 3600):
            path = Path(tmp) / f"silences_{seconds}s.flac"
            write_flac(path, _speech_and_silence(jfk, seconds, gap_s=300.0))
            run = median_rss(path, {"plan": plan}, repeats, GREEDY)
            base = base or run.peak
            grow = run.peak / base - 1
            check = "baseline" if seconds == 30 else verdict(grow * 100, TARGET_HOUR * 100, "%")
            rows.append((f"{seconds} s", f"{run.peak / MB:.1f}", f"{grow:+.1%}",
                         f"{run.wall:.1f}", check))
    print(table(("audio", "peak RSS MB", "vs 30 s", "wall s",
                 f"target within {TARGET_HOUR:.0%}"), rows))


def _speech_and_silence(speech: np.ndarray, seconds: int, gap_s: float
                        ) -> Iterator[np.ndarray]:
    """Pieces of `seconds` of audio: speech, gap_s of zeros, speech, ... (a minute at most
    per piece, so the whole is never in memory)."""
    left = seconds * SR
    while left > 0:
        for piece in (speech, *([np.zeros(60 * SR, np.float32)] * int(gap_s // 60))):
            n = min(left, piece.size)
            if n <= 0:
                return
            yield piece[:n]
            left -= n


def write_flac(path: Path, pieces: Any) -> None:
    import av

    sys.path.insert(0, str(ROOT / "tests" / "whisper"))
    from av_encode import encode_pcm16  # the tests' PyAV encode loop

    with av.open(str(path), "w", format="flac") as out:
        encode_pcm16(out, "flac", SR, ((np.clip(piece, -1, 1) * 32767).astype("<i2")
                                       for piece in pieces))


def tile(speech: np.ndarray, seconds: int, gap_s: float = 4.0) -> np.ndarray:
    """`seconds` of audio: speech, gap_s of silence, speech, ... cut to length."""
    unit = np.concatenate([speech, np.zeros(int(gap_s * SR), np.float32)])
    n = seconds * SR
    return np.resize(unit, n) if n > unit.size else unit[:n]


def write_wav(path: Path, samples: np.ndarray) -> None:
    pcm = (np.clip(samples, -1, 1) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SR)
        w.writeframes(pcm.tobytes())


def _samples(path: Path) -> np.ndarray:
    from tensorplan.whisper.audio.decode import load_audio

    return load_audio(path)


def child(job: str, audio: str) -> int:
    """The measured process: load tiny.en, transcribe, print one JSON line with its
    high-water marks (bytes) after the imports and after loading.
    job: JSON {"load": load_model keywords, "decode": TranscribeOptions overrides}."""
    from tensorplan.whisper.api import load_model
    from tensorplan.whisper.options import TranscribeOptions

    spec = json.loads(job)
    imported = _high_water()
    model = load_model("tiny.en", **spec["load"])
    loaded = _high_water()
    result = model.transcribe(audio, TranscribeOptions(**spec["decode"]))
    print(json.dumps({"imported": imported, "loaded": loaded, "chars": len(result.text)}))
    return 0


WHISPER_CPP_STATE_TINY_EN = 145.68  # MB of non-weight buffers per whisper_state, 1.8.5
SESSION_RUNS = (("greedy", {"beam_size": None, "temperature": (0.0,)}, 1),
                ("beam 5", {"beam_size": 5}, 5))


def session_child(model_name: str, run: str) -> int:
    """The measured process for one session: load, warm one session up on jfk.wav, then
    make a second and transcribe with it; print its planned bytes and the RSS it added."""
    from tensorplan.whisper.api import load_model

    decode, max_batch = next((d, b) for name, d, b in SESSION_RUNS if name == run)
    model = load_model(model_name, backend="numpy", max_batch=max_batch)
    model.session().transcribe(JFK, **decode)
    gc.collect()
    before = _rss()
    second = model.session()
    second.transcribe(JFK, **decode)
    gc.collect()
    print(json.dumps({"planned": model.session_bytes, "rss_delta": _rss() - before,
                      "weights": sum(t.nbytes for t in model.model.param.tensors.values())}))
    return 0


def _rss() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def per_session(models: Sequence[str]) -> None:
    """Part 4: what one more stream costs: a session's planned bytes and the RSS a second
    session added (each model and decoding in a fresh process), beside whisper.cpp's
    per-state buffers."""
    rows = []
    for name in models:
        for run, _, max_batch in SESSION_RUNS:
            proc = subprocess.run([sys.executable, __file__, "--session-child", name, run],
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                rows.append([name, run, "-", "-", "-", proc.stderr.strip().splitlines()[-1]])
                continue
            got = json.loads(proc.stdout.strip().splitlines()[-1])
            rows.append([name, run, str(max_batch), f"{got['planned'] / MB:.2f}",
                         f"{got['rss_delta'] / MB:.2f}", f"{got['weights'] / MB:.1f}"])
    print("\n## 4. per session (a second stream on a loaded model, numpy backend)")
    print(table(["model", "decoding", "KV sequences", "planned MB", "RSS added MB",
                 "weights MB (shared)"], rows))
    print(f"whisper.cpp 1.8.5, tiny.en: {WHISPER_CPP_STATE_TINY_EN} MB of non-weight buffers "
          "per whisper_state")


def _high_water() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * KIB


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="the memory report for tiny.en only; no subprocess runs")
    ap.add_argument("--repeats", type=int, default=3, help="runs per jfk.wav RSS figure (median)")
    ap.add_argument("--long-repeats", type=int, default=1,
                    help="runs per long-audio RSS figure (default 1: a 10-minute file takes "
                         "minutes)")
    ap.add_argument("--plan", choices=PLAN_MODES, default="joint",
                    help="plan mode for the long-audio runs (default joint)")
    ap.add_argument("--hour", action="store_true", help="also a 1-hour file (slow)")
    ap.add_argument("--silences", action="store_true",
                    help="only the streamed 1-hour FLAC of speech and long silences vs 30 s")
    ap.add_argument("--sessions", action="store_true",
                    help="only part 4: the bytes one more session costs (tiny.en, base)")
    ap.add_argument("--child", nargs=2, metavar=("JOB", "AUDIO"), help=argparse.SUPPRESS)
    ap.add_argument("--session-child", nargs=2, metavar=("MODEL", "RUN"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(*args.child)
    if args.session_child:
        return session_child(*args.session_child)
    if args.sessions:
        per_session(("tiny.en", "base"))
        return 0
    if args.silences:
        long_silences(args.plan, args.long_repeats)
        return 0
    print("# memory: tensorplan vs whisper.cpp (MB = 1e6 B)")
    report_models(("tiny.en",) if args.quick else MODELS)
    if args.quick:
        return 0
    rss_by_config(args.repeats)
    per_session(("tiny.en", "base"))
    long_audio(args.plan, args.hour, args.long_repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())

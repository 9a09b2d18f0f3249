"""tensorplan against its peers on one machine, in one run: speed, load time, peak RSS.

Peers, each optional (skipped with the reason when not importable):
  - faster-whisper, int8 and fp32, from the SAME CTranslate2 tiny.en directory as tensorplan;
  - openai-whisper (torch, CPU, fp32) from tiny.en exported to a .pt (`tensorplan export`);
  - whisper.cpp via pywhispercpp from tiny.en exported to a ggml .bin.

Every (implementation, beam) pair is its own worker process: it loads the model once (timed),
warms up on jfk.wav, then transcribes on request, and reports its peak RSS (VmHWM) at the
end, so peak RSS is per worker. Timed runs are interleaved (round r: every audio × every
worker, the worker order rotating), so all share the machine's noise; each cell is the
median of --repeats (--long-repeats for the long file), and the table so far is printed to
stderr after every round. Audio is decoded once here and handed over as float32 samples (decoding is
never timed). Settings are alike: English, 2 threads, temperature fallback, best_of 5,
greedy (beam 1) or beam 5, no VAD, no word timestamps. Ratios are tensorplan / peer at the
same beam and precision (tensorplan int8 against the int8 peer, tensorplan float32 against
the others), the median of the per-round ratios: above 1 means tensorplan is slower.
OMP_WAIT_POLICY defaults to PASSIVE: on a shared, oversubscribed machine spinning OpenMP
threads (whisper.cpp, CTranslate2, torch) otherwise lose most of their time (whisper.cpp's
jfk.wav: ~3.6 s passive, 11-19 s spinning, at load 8 on 2 cores); set it yourself to override.

    python bench/peers.py [--repeats 5] [--long-seconds 120] [--long-repeats N] [--json F]
                          [--model base] [--beams 1]
    python bench/peers.py --smoke      # tensorplan only, jfk.wav once (CI)

Run it with an interpreter that has the peers (see docs/performance.md, "Against the peers").
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np
import worker_io

ROOT = Path(__file__).resolve().parents[1]
JFK = ROOT / "samples" / "jfk.wav"
THREADS = 2
IMPLEMENTATIONS = {  # name → module that must be importable
    "tensorplan": "tensorplan",
    "tensorplan int8": "tensorplan",
    "faster-whisper int8": "faster_whisper",
    "faster-whisper fp32": "faster_whisper",
    "openai-whisper": "whisper",
    "whisper.cpp": "pywhispercpp",
}
GOLDEN = "and so my fellow americans ask not what your country can do for you ask what you " \
         "can do for your country"


# ---- workers (child processes) ---------------------------------------------------------------
def load(name: str, beam: int, files: dict[str, str]) -> Any:
    """Load `name`; returns transcribe(samples) -> text."""
    if name.startswith("tensorplan"):
        from tensorplan.whisper.api import load_model

        tp = load_model(files["ct2"], max_batch=5,
                        compute_type="int8" if name.endswith("int8") else "float32")
        return lambda a: tp.transcribe(a, beam_size=beam if beam > 1 else None).text
    if name.startswith("faster-whisper"):
        from faster_whisper import WhisperModel

        compute = "int8" if name.endswith("int8") else "float32"
        fw = WhisperModel(files["ct2"], device="cpu", compute_type=compute, cpu_threads=THREADS)
        return lambda a: "".join(s.text for s in fw.transcribe(a, beam_size=beam, best_of=5,
                                                               language="en")[0])
    if name == "openai-whisper":
        import torch
        import whisper

        torch.set_num_threads(THREADS)
        oa = whisper.load_model(files["openai"], device="cpu")
        opts = {"beam_size": beam if beam > 1 else None, "best_of": 5}
        return lambda a: oa.transcribe(a, language="en", fp16=False, **opts)["text"]
    from pywhispercpp.model import Model

    cpp = Model(files["ggml"], params_sampling_strategy=1 if beam > 1 else 0, n_threads=THREADS,
                language="en", suppress_nst=True, print_progress=False, print_realtime=False,
                beam_search={"beam_size": beam, "patience": -1.0}, greedy={"best_of": 5})
    return lambda a: " ".join(s.text for s in cpp.transcribe(a))


def worker(name: str, beam: int, files: dict[str, str]) -> None:
    """Serve requests "AUDIO.npy" → {"seconds", "text"} on stdin/stdout; "" ends."""
    reply = worker_io.protocol()
    try:
        start = time.perf_counter()
        transcribe = load(name, beam, files)
        load_s = time.perf_counter() - start
    except Exception as e:  # a peer that cannot load is reported, not fatal
        reply(error=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        return
    reply(load_s=load_s, rss_mb=worker_io.maxrss_mb())
    worker_io.serve(transcribe, reply)


# ---- the parent ------------------------------------------------------------------------------
@dataclass
class Worker:
    name: str
    beam: int
    proc: subprocess.Popen[str] | None  # None: skipped
    load_s: float = float("nan")
    rss_mb: float = float("nan")
    times: dict[str, list[float]] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)
    error: str | None = None

    def ask(self, request: str) -> dict[str, Any]:
        assert self.proc and self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(request + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.name} (beam {self.beam}) died; see its log")
        reply: dict[str, Any] = json.loads(line)
        return reply


def start(name: str, beam: int, files: dict[str, str], log: IO[str]) -> Worker:
    cmd = [sys.executable, __file__, "--worker", name, "--beam", str(beam),
           "--files", json.dumps(files)]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                            text=True, env=worker_io.child_env(THREADS))
    w = Worker(name, beam, proc)
    assert proc.stdout is not None
    first = json.loads(proc.stdout.readline() or '{"error": "exited while loading"}')
    w.error = first.get("error")
    w.load_s, w.rss_mb = first.get("load_s", w.load_s), first.get("rss_mb", w.rss_mb)
    return w


def stop(w: Worker) -> None:
    if w.proc is None or w.proc.poll() is not None:
        return
    if w.error is None:
        w.rss_mb = w.ask("")["rss_mb"]
    w.proc.wait(timeout=60)


def missing(name: str) -> str | None:
    module = IMPLEMENTATIONS[name]
    if importlib.util.find_spec(module) is None:
        return f"{module} is not installed"
    if name == "openai-whisper" and importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    return None


def prepare(work: Path, names: list[str], long_s: float, model: str = "tiny.en"
            ) -> tuple[dict[str, str], dict[str, str]]:  # fmt: skip
    """Model files for each implementation (all from the same CTranslate2 `model`) and the
    audio files (as .npy)."""
    from tensorplan.whisper.audio.decode import load_audio
    from tensorplan.whisper.model_files.export import export_model
    from tensorplan.whisper.model_files.find import resolve_model

    files = {"ct2": str(resolve_model(model))}
    if "openai-whisper" in names:
        files["openai"] = str(export_model(work / f"{model}.pt", "openai", files["ct2"]))
    if "whisper.cpp" in names:
        files["ggml"] = str(export_model(work / f"ggml-{model}.bin", "ggml", files["ct2"]))
    jfk = load_audio(JFK)
    audio = {"jfk": jfk}
    if long_s > 0:
        audio[f"long {long_s:.0f}s"] = tile(jfk, long_s)
    paths = {}
    for label, samples in audio.items():
        paths[label] = str(work / f"{label.split()[0]}.npy")
        np.save(paths[label], samples)
    return files, paths


def tile(speech: np.ndarray, seconds: float, gap_s: float = 1.0) -> np.ndarray:
    """`seconds` of audio: speech, gap_s of silence, speech, ... cut to length."""
    unit = np.concatenate([speech, np.zeros(int(gap_s * 16000), np.float32)])
    reps = int(np.ceil(seconds * 16000 / len(unit)))
    return np.tile(unit, reps)[: int(seconds * 16000)]


def measure(workers: list[Worker], audio: dict[str, str], repeats: int,
            long_repeats: int) -> None:
    """Warm every worker up on the first audio (jfk), then `repeats` interleaved rounds; the
    other audio only in the first `long_repeats`. Prints the table so far after each round."""
    live = [w for w in workers if w.error is None]
    first = next(iter(audio))
    for w in live:
        w.ask(audio[first])
    for r in range(repeats):
        for label, path in audio.items():
            if label != first and r >= long_repeats:
                continue
            for w in live[r % len(live):] + live[: r % len(live)]:
                reply = w.ask(path)
                w.times.setdefault(label, []).append(reply["seconds"])
                w.texts[label] = reply["text"]
        print(f"round {r + 1}/{repeats} done\n{report(workers, list(audio))}", file=sys.stderr,
              flush=True)


# ---- report ----------------------------------------------------------------------------------
def normalize(text: str) -> str:
    return " ".join("".join(c if c.isalnum() or c.isspace() else " " for c in text.lower())
                    .split())


def check(w: Worker, labels: list[str]) -> str:
    """Does the jfk text match the golden text; how many of the long file's tiles were heard."""
    notes = []
    for label in labels:
        text = normalize(w.texts.get(label, ""))
        if label == "jfk":
            notes.append("jfk ok" if text == GOLDEN else f"jfk: {text[:40]!r}")
        else:
            notes.append(f"{text.count('ask what you can do')} tiles")
    return ", ".join(notes)


def report(workers: list[Worker], labels: list[str]) -> str:
    from tensorplan.commands.plan import table

    # a peer is compared with tensorplan at its own precision: int8 with int8
    ours = {(w.name.endswith("int8"), w.beam): w for w in workers
            if w.name.startswith("tensorplan") and w.error is None}
    head = ["implementation", "beam", "load s", *[f"{x} s" for x in labels],
            *[f"tp/peer {x}" for x in labels], "peak RSS MB", "notes"]
    rows = []
    for w in workers:
        if w.error is not None:
            rows.append([w.name, str(w.beam), "-", *["-"] * 2 * len(labels), "-",
                         f"skipped: {w.error}"])
            continue
        med = [_median(w.times.get(x)) for x in labels]
        tp = ours.get((w.name.endswith("int8"), w.beam))
        ratios = [_paired_ratio(tp.times.get(x), w.times.get(x)) if tp else float("nan")
                  for x in labels]
        rows.append([w.name, str(w.beam), f"{w.load_s:.2f}", *[f"{m:.2f}" for m in med],
                     *[f"{r:.2f}" for r in ratios], f"{w.rss_mb:.0f}", check(w, labels)])
    return table(head, rows)


def _median(times: list[float] | None) -> float:
    return statistics.median(times) if times else float("nan")


def _paired_ratio(ours: list[float] | None, theirs: list[float] | None) -> float:
    """Median over rounds of tensorplan's time / the peer's in the same round: robust to the
    machine's load drifting between rounds, unlike a ratio of medians."""
    if not ours or not theirs:
        return float("nan")
    return statistics.median(a / b for a, b in zip(ours, theirs, strict=True))


def run(args: argparse.Namespace) -> int:
    names = ["tensorplan", "tensorplan int8"] if args.smoke else list(IMPLEMENTATIONS)
    skipped = {n: why for n in names if (why := missing(n)) is not None}
    beams = (1,) if args.smoke else tuple(int(b) for b in args.beams.split(","))
    with tempfile.TemporaryDirectory(prefix="peers-") as tmp:
        files, audio = prepare(Path(tmp), [n for n in names if n not in skipped],
                               0 if args.smoke else args.long_seconds, args.model)
        workers: list[Worker] = []
        with open(Path(tmp) / "workers.log", "w") as log:
            try:
                for name in names:
                    for beam in beams:
                        workers.append(Worker(name, beam, None, error=skipped[name])
                                       if name in skipped else start(name, beam, files, log))
                repeats = 1 if args.smoke else args.repeats
                measure(workers, audio, repeats, min(repeats, args.long_repeats or repeats))
            finally:
                for w in workers:
                    stop(w)
        print(f"{_machine()}, model {args.model}")
        print(report(workers, list(audio)))
    if args.json:
        rows = [{k: v for k, v in w.__dict__.items() if k != "proc"} for w in workers]
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


def _machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text()
                .splitlines() if line.startswith("model name")), "unknown CPU")
    return f"{time.strftime('%Y-%m-%d')}, {cpu}, {os.cpu_count()} cores, {THREADS} threads each"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tensorplan only, jfk.wav once")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per cell (median)")
    p.add_argument("--long-seconds", type=float, default=120.0,
                   help="length of the tiled jfk.wav long file (0: none)")
    p.add_argument("--long-repeats", type=int, default=0,
                   help="timed runs of the long file (default: --repeats)")
    p.add_argument("--json", help="also write the raw results here")
    p.add_argument("--model", default="tiny.en", help="tiny.en, base or small (installed)")
    p.add_argument("--beams", default="1,5", help="beam sizes to run (comma list)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--beam", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--files", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args.worker, args.beam, json.loads(args.files))
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())

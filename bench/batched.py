"""Batched transcription against faster-whisper's BatchedInferencePipeline, in one run.

The audio is a long file of varied synthetic speech made here with espeak-ng (several
voices and rates, pauses between sentences; never downloaded), with its reference text.
Each configuration (implementation, precision, beam, batch size: None = sequential) is a
worker process that loads the model, warms up on jfk.wav, then transcribes on request and
reports its peak RSS (VmHWM) at the end. Per (precision, beam) the workers of every batch
size run side by side and their timed runs interleave (round r: every worker in turn, the
order rotating), so they share the machine's noise; cells are medians of --repeats.
Sequential runs use both implementations' defaults (temperature fallback, previous-text
conditioning); batched runs decode each chunk alone at temperature 0. Timestamps on
everywhere (faster-whisper's batched default is off; it is turned on to match).

    python bench/batched.py [--seconds 400] [--repeats 3] [--model tiny.en]
        [--precisions int8,float32] [--beams 1,5] [--batches 0,4,8,16] [--json F]
        [--peer-python PYTHON]   # default: /work/venv-bench/bin/python, else this one
    python bench/batched.py --smoke    # tensorplan only, 40 s of speech, batch 4, once
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO, Any

import numpy as np
import worker_io

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
JFK = ROOT / "samples" / "jfk.wav"
THREADS = 2
# a venv of faster-whisper alone (docs/performance.md), so its packages cannot differ from
# what a user of faster-whisper gets; a fresh machine without it uses this interpreter
PEER_VENV = Path("/work/venv-bench/bin/python")
VOICES = ("en+f3", "en+m3", "en-us+f2", "en+m7", "en-gb+f4", "en-us+m2")
RATES = (140, 155, 170, 185)
SENTENCES = (
    "The committee will meet again on Thursday to review the budget for next year.",
    "She walked along the river until the lights of the town disappeared behind her.",
    "Please remember to close the windows before you leave the building tonight.",
    "Scientists have found a new species of frog in the forests of the south.",
    "The train was late again, so we waited in the small shop near the station.",
    "He opened the letter slowly and read it twice before he said anything.",
    "Our team finished the project ahead of schedule and under budget.",
    "The weather should stay dry for most of the week, with some wind on Sunday.",
    "Reading a good book is one of the simplest pleasures in life.",
    "The old bridge was closed for repairs after the heavy storms last winter.",
    "Children played in the park while their parents talked on the benches.",
    "The museum opens at nine in the morning and closes at six in the evening.",
    "A quiet voice can sometimes carry further than a loud one.",
    "They planted apple trees along the edge of the field behind the farm.",
    "The new software update fixes several problems with the network settings.",
    "Every morning she drinks a cup of tea and listens to the news on the radio.",
    "The pilot announced that we would land twenty minutes earlier than planned.",
    "Good teachers make difficult ideas feel simple and interesting.",
    "The market was full of fresh fruit, bread, cheese and flowers.",
    "We should leave early tomorrow if we want to avoid the traffic.",
    "The city council voted to build a new library in the center of town.",
    "His grandfather told stories about sailing across the ocean as a young man.",
    "The restaurant on the corner serves the best soup in the neighborhood.",
    "After the long meeting everyone was tired and wanted to go home.",
)


# ---- the audio ----------------------------------------------------------------------------
def synthesize(seconds: float, seed: int, work: Path) -> tuple[np.ndarray, str]:
    """(16 kHz samples, reference text): sentences in random voices and rates, with pauses
    of 0.3 to 1.5 s, until `seconds` are filled. Cached in `work` by (seconds, seed)."""
    from tensorplan.whisper.audio.decode import load_audio

    cache = work / f"speech_{seconds:g}s_{seed}"
    if (cache.with_suffix(".npy")).exists():
        return np.load(cache.with_suffix(".npy")), cache.with_suffix(".txt").read_text()
    rng = np.random.default_rng(seed)
    pieces, words, total = [], [], 0.0
    while total < seconds:
        text = SENTENCES[rng.integers(len(SENTENCES))]
        wav = work / "sentence.wav"
        subprocess.run(["espeak-ng", "-v", VOICES[rng.integers(len(VOICES))], "-s",
                        str(RATES[rng.integers(len(RATES))]), "-w", str(wav), text],
                       check=True, capture_output=True)
        speech = load_audio(wav)
        pause = np.zeros(int(16000 * rng.uniform(0.3, 1.5)), np.float32)
        pieces += [speech, pause]
        words.append(text)
        total += (len(speech) + len(pause)) / 16000
    audio = np.concatenate(pieces).astype(np.float32)
    reference = " ".join(words)
    np.save(cache.with_suffix(".npy"), audio)
    cache.with_suffix(".txt").write_text(reference)
    return audio, reference


# ---- WER ----------------------------------------------------------------------------------
def normalize(text: str) -> list[str]:
    return re.sub(r"[^a-z' ]+", " ", text.lower().replace("-", " ")).split()


def wer(reference: str, hypothesis: str) -> float:
    """Word error rate: Levenshtein distance over words / reference words."""
    ref, hyp = normalize(reference), normalize(hypothesis)
    if not ref:
        return float(len(hyp) > 0)
    vocab: dict[str, int] = {}
    r = np.array([vocab.setdefault(w, len(vocab)) for w in ref])
    h = np.array([vocab.setdefault(w, len(vocab)) for w in hyp])
    row = np.arange(len(h) + 1, dtype=np.int64)
    for i, word in enumerate(r, 1):
        sub = row[:-1] + (h != word)
        new = np.concatenate([[i], np.minimum(sub, row[1:] + 1)])
        # insertions run along the row: d[j] = min(d[j], d[j-1] + 1), a running minimum
        ramp = np.arange(len(new))
        row = np.minimum.accumulate(new - ramp) + ramp
    return float(row[-1]) / len(r)


# ---- workers ------------------------------------------------------------------------------
def load(impl: str, precision: str, beam: int, batch: int, ct2: str) -> Any:
    """transcribe(samples) -> text for one configuration (ct2: the model directory)."""
    if impl == "tensorplan":
        from tensorplan.whisper.api import load_model

        tp = load_model(ct2, compute_type=precision, threads=THREADS)
        opts: dict[str, Any] = {"beam_size": beam if beam > 1 else None, "language": "en"}
        if batch:
            opts["batch_size"] = batch
        return lambda a: tp.transcribe(a, **opts).text
    from faster_whisper import BatchedInferencePipeline, WhisperModel

    fw = WhisperModel(ct2, device="cpu", compute_type=precision, cpu_threads=THREADS)
    if not batch:
        return lambda a: "".join(s.text for s in fw.transcribe(a, beam_size=beam, best_of=5,
                                                               language="en")[0])
    pipe = BatchedInferencePipeline(fw)
    return lambda a: "".join(s.text for s in pipe.transcribe(
        a, beam_size=beam, language="en", batch_size=batch, without_timestamps=False)[0])


def worker(spec: dict[str, Any]) -> None:
    """Serve "AUDIO.npy" -> {"seconds", "text"} on stdin/stdout; "" ends with the RSS."""
    reply = worker_io.protocol()
    try:
        transcribe = load(spec["impl"], spec["precision"], spec["beam"], spec["batch"],
                          spec["ct2"])
        transcribe(np.load(spec["warmup"]))  # jfk.wav: plans the batch shapes
    except Exception as e:
        reply(error=f"{type(e).__name__}: {e}")
        return
    reply(ready=True)
    worker_io.serve(transcribe, reply)


class Worker:
    def __init__(self, spec: dict[str, Any], python: str, log: IO[str]) -> None:
        self.spec, self.times, self.text, self.rss_mb = spec, [], "", float("nan")
        env = worker_io.child_env(THREADS, PYTHONPATH=str(ROOT / "src"))
        self.proc = subprocess.Popen([python, __file__, "--worker", json.dumps(spec)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                     text=True, env=env)
        first = self._read()
        self.error: str | None = first.get("error")
        self.times: list[float] = []

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        return json.loads(line) if line else {"error": "the worker exited; see its log"}

    def ask(self, request: str) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(request + "\n")
        self.proc.stdin.flush()
        return self._read()

    def stop(self) -> None:
        if self.error is None and self.proc.poll() is None:
            self.rss_mb = self.ask("").get("rss_mb", float("nan"))
        self.proc.wait(timeout=60)

    @property
    def label(self) -> str:
        s = self.spec
        return f"{s['impl']} {s['precision']} beam {s['beam']} " + \
            (f"batch {s['batch']}" if s["batch"] else "sequential")


def run_group(specs: list[dict[str, Any]], pythons: dict[str, str], audio: Path,
              reference: str, repeats: int, log: IO[str]) -> list[dict[str, Any]]:
    workers = [Worker(s, pythons[s["impl"]], log) for s in specs]
    live = [w for w in workers if w.error is None]
    for r in range(repeats):
        for w in live[r % len(live):] + live[: r % len(live)] if live else []:
            reply = w.ask(str(audio))
            if "error" in reply:
                w.error = reply["error"]
                continue
            w.times.append(reply["seconds"])
            w.text = reply["text"]
            print(f"  {w.label}: {reply['seconds']:.2f} s", file=sys.stderr)
    rows = []
    for w in workers:
        w.stop()
        rows.append({**w.spec, "error": w.error, "times": w.times,
                     "median_s": statistics.median(w.times) if w.times else None,
                     "wer": wer(reference, w.text) if w.times else None, "rss_mb": w.rss_mb})
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    out = ["| precision | beam | batch | tensorplan s | WER | RSS MB | faster-whisper s | WER "
           "| RSS MB | tp / fw |", "|---|---|---|---|---|---|---|---|---|---|"]
    keys = sorted({(r["precision"], r["beam"], r["batch"]) for r in rows})
    for prec, beam, batch in keys:
        cell = {r["impl"]: r for r in rows
                if (r["precision"], r["beam"], r["batch"]) == (prec, beam, batch)}

        def fmt(impl: str, cell: dict[str, Any] = cell) -> list[str]:
            r = cell.get(impl)
            if r is None or r["median_s"] is None:
                return ["—", "—", (r or {}).get("error") or "—"]
            return [f"{r['median_s']:.2f}", f"{r['wer']:.3f}", f"{r['rss_mb']:.0f}"]

        tp, fw = fmt("tensorplan"), fmt("faster-whisper")
        ratio = "—"
        if tp[0] != "—" and fw[0] != "—":
            ratio = f"{float(tp[0]) / float(fw[0]):.2f}"
        out.append(f"| {prec} | {beam} | {batch or 'seq'} | " + " | ".join(tp + fw) +
                   f" | {ratio} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--seconds", type=float, default=400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model", default="tiny.en")
    ap.add_argument("--precisions", default="int8,float32")
    ap.add_argument("--beams", default="1,5")
    ap.add_argument("--batches", default="0,4,8,16")
    ap.add_argument("--peer-python", default=None,
                    help="the interpreter that has faster-whisper (default: "
                         f"{PEER_VENV} where it exists, else this one)")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return
    if args.smoke:
        args.seconds, args.repeats, args.precisions, args.beams = 40, 1, "int8", "1"
        args.batches = "4"
    impls = ["tensorplan"] if args.smoke else ["tensorplan", "faster-whisper"]
    peer = args.peer_python or (str(PEER_VENV) if PEER_VENV.exists() else sys.executable)
    pythons = {"tensorplan": sys.executable, "faster-whisper": peer}
    work = Path(tempfile.gettempdir()) / "tensorplan-bench"
    work.mkdir(exist_ok=True)
    samples, reference = synthesize(args.seconds, args.seed, work)
    audio = work / f"audio_{os.getpid()}.npy"
    np.save(audio, samples)
    print(f"audio: {len(samples) / 16000:.0f} s, {len(reference.split())} words",
          file=sys.stderr)
    from tensorplan.whisper.audio.decode import load_audio
    from tensorplan.whisper.model_files.find import resolve_model

    ct2 = str(resolve_model(args.model))  # the peer's interpreter may not have tensorplan
    warmup = work / "jfk.npy"
    np.save(warmup, load_audio(JFK))
    rows: list[dict[str, Any]] = []
    with open(work / "workers.log", "w") as log:
        for prec in args.precisions.split(","):
            for beam in map(int, args.beams.split(",")):
                specs = [{"impl": impl, "precision": prec, "beam": beam, "batch": batch,
                          "ct2": ct2, "warmup": str(warmup)}
                         for batch in map(int, args.batches.split(",")) for impl in impls]
                rows += run_group(specs, pythons, audio, reference, args.repeats, log)
                print(table(rows), file=sys.stderr)
    audio.unlink()
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

"""Live transcription over `GET /v1/realtime`: how soon each word arrives, and how right.

Clips: espeak-ng speech of --seconds (sentences in several voices and rates, 0.3-1.5 s
pauses between them; bench/batched.py makes it, never downloaded) and jfk.wav, each
followed by 2 s of silence so the last turn ends. An offline pass over each clip
(tensorplan, word_timestamps=True) gives every word's end time and the offline text.

Each stream sends its clip as 24 kHz PCM16 in 100 ms appends at real-time pace (the piece
covering [t, t + 0.1) leaves at start + t + 0.1), with OpenAI's default server VAD. A word's
latency is the arrival of the `.delta` that committed it minus the moment its audio ended
in the stream (its offline end time); streamed and offline words are paired by a diff of
the normalised word sequences. Per stream also: the delay from each `speech_started` to the
turn's first `.delta`, and the WER of the joined `.completed` transcripts against the
reference text and against the offline text. For each compute type, one server; for each
level of concurrency N, N streams of the espeak clip at once (start staggered by 0.25 s),
with the server's peak RSS (from /health); then jfk alone. The same clip in lockstep is
the worst case: every stream's turns end within 2 s of each other, so their last decodes
queue together. `--clips distinct` gives each stream its own espeak clip instead (other
sentences, voices and pauses: seed 26 + i), as independent speakers would. The p95 over
the first and the last third of the clip shows whether latency stays flat.

The anchor, in the same run: LocalAgreement-2 on faster-whisper over the same clips, as
whisper_streaming does it (every second re-transcribe the uncommitted buffer with the
committed text as prompt, commit the prefix two hypotheses agree on, trim the buffer at a
finished segment past 15 s), simulated at real-time pace in a child process per level
(N threads, one model with N workers), measured the same way; RSS is the child's peak.

    python bench/live.py [--seconds 180] [--streams 1,2,4,8,16] [--clips same|distinct]
                         [--compute-types int8,float32] [--engines tensorplan,anchor]
                         [--anchor-beam 5]
                         [--server-args "..."] [--json FILE]
    python bench/live.py --streams 1 --seconds 20 --compute-types int8   # smoke
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import difflib
import json
import multiprocessing
import os
import re
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from batched import synthesize, wer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
JFK = ROOT / "samples" / "jfk.wav"
JFK_TEXT = ("And so my fellow Americans ask not what your country can do for you "
            "ask what you can do for your country")
ENV = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
RATE = 16000  # the clips' rate (whisper's)
WIRE_RATE = 24000  # OpenAI's PCM16 rate on the wire
PIECE_S = 0.1  # one append
TAIL_SILENCE_S = 2.0  # after each clip: the server VAD's silence ends the last turn
STAGGER_S = 0.25  # stream i starts i * this later
SEED = 26  # the espeak clip's (distinct clips: SEED + i for stream i)
DRAIN_S = 60.0  # after the last append, how long a stream waits for its last .completed
LA_STEP_S = 1.0  # the anchor's min-chunk-size (whisper_streaming's default)
LA_TRIM_S = 15.0  # and its buffer-trimming length


# ---- clips and their offline words -----------------------------------------------------
@dataclass
class Clip:
    name: str
    audio: np.ndarray  # 16 kHz float32, the trailing silence included
    reference: str
    offline: str = ""  # tensorplan's offline transcript
    word_ends: list[tuple[str, float]] = field(default_factory=list)  # (normalised, end s)

    @property
    def seconds(self) -> float:
        return len(self.audio) / RATE


def words_of(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9' ]+", " ", text.lower().replace("-", " ")).split()


def make_clips(seconds: float, work: Path, distinct: int = 0) -> list[Clip]:
    """The espeak clip, jfk, then `distinct` - 1 more espeak clips of other seeds."""
    from tensorplan.whisper.audio.decode import load_audio

    silence = np.zeros(int(TAIL_SILENCE_S * RATE), np.float32)

    def espeak(seed: int) -> Clip:
        speech, reference = synthesize(seconds, seed=seed, work=work)
        return Clip(f"espeak {seconds:g} s", np.concatenate([speech, silence]), reference)

    clips = [espeak(SEED), Clip("jfk", np.concatenate([load_audio(str(JFK)), silence]),
                                JFK_TEXT)]
    clips += [espeak(SEED + i) for i in range(1, distinct)]
    from tensorplan.whisper import load_model

    model = load_model("tiny.en", compute_type="float32")
    for clip in clips:
        result = model.transcribe(clip.audio, language="en", word_timestamps=True)
        clip.offline = result.text
        clip.word_ends = [(w, word.end) for seg in result.segments for word in seg.words or ()
                          for w in words_of(word.word)]
    return clips


def latencies(clip: Clip, arrivals: list[tuple[str, float]]) -> list[tuple[float, float]]:
    """(word end s, latency s) per streamed word paired with an offline one. `arrivals`:
    (delivered text, seconds after the stream's start) in order of arrival."""
    streamed = [(w, t) for text, t in arrivals for w in words_of(text)]
    offline = [w for w, _ in clip.word_ends]
    matcher = difflib.SequenceMatcher(None, offline, [w for w, _ in streamed], autojunk=False)
    out = []
    for block in matcher.get_matching_blocks():
        for k in range(block.size):
            end = clip.word_ends[block.a + k][1]
            out.append((end, streamed[block.b + k][1] - end))
    return out


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


# ---- one stream through the server ----------------------------------------------------
@dataclass
class StreamResult:
    clip: Clip
    latencies: list[tuple[float, float]]
    first_delta: list[float]  # per turn: its first .delta after speech_started, seconds
    text: str
    errors: list[str]


def wire_pieces(audio: np.ndarray) -> list[str]:
    """The clip as base64 PCM16 at 24 kHz, one string per 100 ms."""
    import soxr

    pcm = np.clip(soxr.resample(audio, RATE, WIRE_RATE) * 32768, -32768, 32767)
    pcm = pcm.astype("<i2")
    step = int(WIRE_RATE * PIECE_S)
    return [base64.b64encode(pcm[i:i + step].tobytes()).decode()
            for i in range(0, len(pcm), step)]


async def stream(url: str, clip: Clip, pieces: list[str], delay: float) -> StreamResult:
    from websockets.asyncio.client import connect

    await asyncio.sleep(delay)
    arrivals: list[tuple[str, float]] = []
    started: dict[str, float] = {}
    first: dict[str, float] = {}
    completed: dict[str, str] = {}
    errors: list[str] = []
    ws_url = url.replace("http", "ws", 1) + "/v1/realtime?intent=transcription"
    async with connect(ws_url, max_size=2**24) as ws:
        await ws.send(json.dumps({"type": "session.update", "session": {
            "type": "transcription", "audio": {"input": {
                "format": {"type": "audio/pcm", "rate": WIRE_RATE},
                "transcription": {"model": "whisper-1", "language": "en"},
                "turn_detection": {"type": "server_vad"}}}}}))
        t0 = time.monotonic()
        done_sending = asyncio.Event()

        async def send() -> None:
            for k, piece in enumerate(pieces):
                await asyncio.sleep(max(0.0, t0 + (k + 1) * PIECE_S - time.monotonic()))
                await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": piece}))
            done_sending.set()

        async def receive() -> None:
            async for message in ws:
                now = time.monotonic() - t0
                event = json.loads(message)
                kind = event.get("type", "")
                if kind == "input_audio_buffer.speech_started":
                    started[event["item_id"]] = now
                elif kind == "conversation.item.input_audio_transcription.delta":
                    arrivals.append((event["delta"], now))
                    first.setdefault(event["item_id"], now)
                elif kind == "conversation.item.input_audio_transcription.completed":
                    completed[event["item_id"]] = event["transcript"]
                    if done_sending.is_set() and set(started) <= set(completed):
                        return
                elif kind in ("error", "conversation.item.input_audio_transcription.failed"):
                    errors.append(json.dumps(event)[:300])

        receiver = asyncio.create_task(receive())
        await send()
        try:
            if not (started and set(started) <= set(completed)):
                await asyncio.wait_for(receiver, DRAIN_S)
        except asyncio.TimeoutError:
            errors.append(f"no .completed for {sorted(set(started) - set(completed))}")
        receiver.cancel()
    delays = [first[i] - started[i] for i in started if i in first]
    text = " ".join(completed[i].strip() for i in completed)
    return StreamResult(clip, latencies(clip, arrivals), delays, text, errors)


# ---- the server ---------------------------------------------------------------------------
class Server:
    def __init__(self, args: list[str]) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, "-m", "tensorplan", "serve", "--port",
                                      str(port), *args], env=ENV, stdout=self.log,
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"server exited: {self.log.read().decode()[-2000:]}")
            try:
                with urllib.request.urlopen(self.url + "/ready", timeout=5):
                    return
            except OSError:
                time.sleep(0.3)
        raise RuntimeError("server not ready after 300 s")

    def rss(self) -> int:
        with urllib.request.urlopen(self.url + "/health", timeout=10) as r:
            return int(json.loads(r.read()).get("rss_bytes", 0))

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


def server_level(server: Server, clips: list[Clip]) -> tuple[list[StreamResult], int]:
    """A stream per clip, at once (staggered)."""
    peak = [server.rss()]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.5):
            peak[0] = max(peak[0], server.rss())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    pieces = [wire_pieces(clip.audio) for clip in clips]

    async def run() -> list[StreamResult]:
        return list(await asyncio.gather(*(
            stream(server.url, clip, p, i * STAGGER_S)
            for i, (clip, p) in enumerate(zip(clips, pieces, strict=True)))))

    try:
        return asyncio.run(run()), peak[0]
    finally:
        stop.set()
        sampler.join()


# ---- the anchor: LocalAgreement-2 on faster-whisper ------------------------------------
class LocalAgreement2:
    """whisper_streaming's OnlineASRProcessor and HypothesisBuffer, reduced to what the
    bench needs: words are (start s, end s, text) in stream time."""

    def __init__(self, model: Any, beam: int) -> None:
        self.model, self.beam = model, beam
        self.audio = np.zeros(0, np.float32)
        self.offset = 0.0  # stream time of self.audio[0]
        self.committed: list[tuple[float, float, str]] = []
        self.hypothesis: list[tuple[float, float, str]] = []  # the last, after the committed
        self.segment_ends: list[float] = []

    def _transcribe(self) -> list[tuple[float, float, str]]:
        before = [w for w in self.committed if w[1] <= self.offset]
        prompt = "".join(w[2] for w in before)[-200:]
        segments, _ = self.model.transcribe(self.audio, language="en", beam_size=self.beam,
                                            initial_prompt=prompt or None, word_timestamps=True,
                                            condition_on_previous_text=True)
        words, self.segment_ends = [], []
        for seg in segments:
            self.segment_ends.append(seg.end + self.offset)
            words += [(w.start + self.offset, w.end + self.offset, w.word) for w in seg.words]
        return words

    def step(self, audio: np.ndarray) -> list[tuple[float, float, str]]:
        """Append audio, re-transcribe, return the newly committed words."""
        self.audio = np.concatenate([self.audio, audio])
        last = self.committed[-1][1] if self.committed else 0.0
        new = [w for w in self._transcribe() if w[0] > last - 0.1]
        if new and self.committed and abs(new[0][0] - last) < 1:  # drop a repeated n-gram
            for n in range(min(len(self.committed), len(new), 5), 0, -1):
                tail = [w[2].strip() for w in self.committed[-n:]]
                if tail == [w[2].strip() for w in new[:n]]:
                    new = new[n:]
                    break
        agreed = []
        while new and self.hypothesis and new[0][2].strip() == self.hypothesis[0][2].strip():
            agreed.append(new.pop(0))
            self.hypothesis.pop(0)
        self.hypothesis = new
        self.committed += agreed
        if len(self.audio) / RATE > LA_TRIM_S and self.committed:
            self._trim()
        return agreed

    def _trim(self) -> None:
        """Cut the buffer at the end of the last finished segment before the committed end."""
        last = self.committed[-1][1]
        ends = self.segment_ends[:-1]
        cut = max((e for e in ends if e <= last), default=None)
        if cut is not None and cut > self.offset:
            self.audio = self.audio[int((cut - self.offset) * RATE):]
            self.offset = cut

    def finish(self) -> list[tuple[float, float, str]]:
        rest, self.hypothesis = self.hypothesis, []
        self.committed += rest
        return rest


def anchor_stream(model: Any, beam: int, audio: np.ndarray,
                  delay: float) -> tuple[list[tuple[str, float]], str]:
    """whisper_streaming's real-time simulation: wait for LA_STEP_S of new audio (or take all
    that arrived while the last step ran), step, note the time its commits came out."""
    time.sleep(delay)
    la, start, done = LocalAgreement2(model, beam), time.monotonic(), 0.0
    arrivals: list[tuple[str, float]] = []
    duration = len(audio) / RATE
    while done < duration:
        now = time.monotonic() - start
        if now < done + LA_STEP_S:
            time.sleep(done + LA_STEP_S - now)
        end = min(duration, time.monotonic() - start)
        words = la.step(audio[int(done * RATE):int(end * RATE)])
        done = end
        if words:
            arrivals.append(("".join(w[2] for w in words), time.monotonic() - start))
    rest = la.finish()
    if rest:
        arrivals.append(("".join(w[2] for w in rest), time.monotonic() - start))
    return arrivals, "".join(w[2] for w in la.committed)


def anchor_level(model_dir: str, compute_type: str, beam: int, audios: list[np.ndarray]
                 ) -> tuple[list[tuple[list[tuple[str, float]], str]], int]:
    """In a child process: a thread streaming each audio; their results and the peak RSS."""
    from concurrent.futures import ThreadPoolExecutor

    from faster_whisper import WhisperModel

    n = len(audios)
    threads = max(1, (os.cpu_count() or 2) // n)
    model = WhisperModel(model_dir, device="cpu", compute_type=compute_type,
                         cpu_threads=threads, num_workers=n)
    with ThreadPoolExecutor(n) as pool:
        results = list(pool.map(lambda i: anchor_stream(model, beam, audios[i],
                                                        i * STAGGER_S), range(n)))
    hwm = next(int(line.split()[1]) * 1024 for line in Path("/proc/self/status").read_text()
               .splitlines() if line.startswith("VmHWM"))
    return results, hwm


# ---- the report ---------------------------------------------------------------------------
def summarize(engine: str, compute_type: str, results: list[StreamResult],
              rss: int) -> dict[str, Any]:
    main = results
    lat = [x for r in main for _, x in r.latencies]
    clip = main[0].clip
    distinct = len({id(r.clip) for r in main}) > 1
    early = [x for r in main for e, x in r.latencies if e < r.clip.seconds / 3]
    late = [x for r in main for e, x in r.latencies if e >= 2 * r.clip.seconds / 3]
    firsts = [d for r in main for d in r.first_delta]
    row: dict[str, Any] = {
        "engine": engine, "compute_type": compute_type, "streams": len(main),
        "clip": clip.name + (" (distinct)" if distinct else ""),
        "words": len(lat), "median_s": statistics.median(lat) if lat else float("nan"),
        "p95_s": pct(lat, 0.95), "p95_first_third_s": pct(early, 0.95),
        "p95_last_third_s": pct(late, 0.95),
        "first_delta_median_s": statistics.median(firsts) if firsts else float("nan"),
        "first_delta_p95_s": pct(firsts, 0.95),
        "wer_ref": statistics.mean(wer(r.clip.reference, r.text) for r in main),
        "wer_offline": statistics.mean(wer(r.clip.offline, r.text) for r in main),
        "rss_mib": rss / 2**20, "errors": [e for r in results for e in r.errors][:5],
        "text": main[0].text}
    return row


def fmt(x: float) -> str:
    return "—" if x != x else f"{x:.2f}"


def print_table(rows: list[dict[str, Any]], clips: list[Clip]) -> None:
    for clip in clips[:2]:
        print(f"offline ({clip.name}): WER vs reference {wer(clip.reference, clip.offline):.3f}")
    print("\n| engine | compute | clip | streams | words | median s | p95 s "
          "| p95 first/last third s | first .delta median/p95 s | WER ref | WER vs offline "
          "| RSS MiB |")
    print("|---|---|---|---:|---:|---:|---:|---|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['engine']} | {r['compute_type']} | {r['clip']} | {r['streams']} "
              f"| {r['words']} "
              f"| {fmt(r['median_s'])} | {fmt(r['p95_s'])} "
              f"| {fmt(r['p95_first_third_s'])} / {fmt(r['p95_last_third_s'])} "
              f"| {fmt(r['first_delta_median_s'])} / {fmt(r['first_delta_p95_s'])} "
              f"| {r['wer_ref']:.3f} | {r['wer_offline']:.3f} | {r['rss_mib']:.0f} |")
    print()
    for r in rows:
        if r["clip"] == "jfk":
            print(f"jfk, {r['engine']} {r['compute_type']}: {r['text']!r}")
        for e in r["errors"]:
            print(f"error ({r['engine']} {r['compute_type']} x{r['streams']}): {e}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=180.0, help="espeak speech length")
    ap.add_argument("--streams", default="1,2,4,8,16", help="levels of concurrency")
    ap.add_argument("--compute-types", default="int8,float32")
    ap.add_argument("--engines", default="tensorplan,anchor",
                    help="tensorplan (the server), anchor (LocalAgreement-2 on faster-whisper)")
    ap.add_argument("--anchor-beam", type=int, default=5,
                    help="the anchor's beam (whisper_streaming's default: 5)")
    ap.add_argument("--server-args", default="", help="more `tensorplan serve` flags")
    ap.add_argument("--clips", choices=("same", "distinct"), default="same",
                    help="the N streams of a level: one espeak clip in lockstep (the worst "
                         "case), or a clip each")
    ap.add_argument("--json", type=Path, help="write the rows here too")
    args = ap.parse_args()
    levels = [int(x) for x in args.streams.split(",")]
    distinct = max(levels) if args.clips == "distinct" else 0
    with tempfile.TemporaryDirectory(prefix="tensorplan-live-bench-") as work:
        clips = make_clips(args.seconds, Path(work), distinct)
    espeak = [clips[0], *clips[2:]]

    def level(n: int) -> list[Clip]:
        return espeak[:n] if distinct else [clips[0]] * n

    runs = [level(n) for n in levels] + [[clips[1]]]  # jfk alone, last
    rows: list[dict[str, Any]] = []

    def done(row: dict[str, Any]) -> None:
        rows.append(row)
        print(f"{row['engine']} {row['compute_type']} {row['clip']} x{row['streams']}: "
              f"median {fmt(row['median_s'])} s, p95 {fmt(row['p95_s'])} s",
              file=sys.stderr, flush=True)

    engines = args.engines.split(",")
    for compute_type in args.compute_types.split(","):
        if "tensorplan" in engines:
            server_runs(compute_type, runs, shlex.split(args.server_args), done)
        if "anchor" in engines:
            anchor_runs(compute_type, runs, args.anchor_beam, done)
    print_table(rows, clips)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


def server_runs(compute_type: str, runs: list[list[Clip]], server_args: list[str],
                done: Any) -> None:
    server = Server(["--compute-type", compute_type, *server_args])
    try:
        for clips in runs:
            results, rss = server_level(server, clips)
            done(summarize("tensorplan", compute_type, results, rss))
    finally:
        server.stop()


def anchor_runs(compute_type: str, runs: list[list[Clip]], beam: int, done: Any) -> None:
    from tensorplan.whisper.model_files.find import resolve_model

    model_dir = str(resolve_model("tiny.en"))
    spawn = multiprocessing.get_context("spawn")  # a fresh process: its own peak RSS
    for clips in runs:
        with ProcessPoolExecutor(1, mp_context=spawn) as child:
            outs, rss = child.submit(anchor_level, model_dir, compute_type, beam,
                                     [c.audio for c in clips]).result()
        done(summarize("LocalAgreement-2 (faster-whisper)", compute_type,
                       [StreamResult(clip, latencies(clip, arrivals), [], text, [])
                        for clip, (arrivals, text) in zip(clips, outs, strict=True)], rss))


if __name__ == "__main__":
    main()

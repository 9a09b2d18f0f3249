"""How right a live stream's text is, apart from timing: bench/live.py's clips (espeak-ng
speech of --seconds, and jfk.wav) through one in-process `LiveStream` in fast mode (100 ms
appends, every update run as soon as it is due, so the result does not depend on the
machine's speed), with OpenAI's server VAD and without turn detection. Prints each run's
WER against the reference text and against the offline transcript, and the segments the
hallucination rule dropped.

`--slow F,...` also runs every clip as live audio (100 ms every 100 ms) on a simulated
machine where a decode of S seconds of audio takes F x (0.3 + S / 10) seconds times a
jitter between 0.5 and 1.5 (a shared machine's), on a clock of the bench's own: at F of a
few the stream falls behind live audio and catches up by decoding waiting turns together
(the engine's load shedding). Each is the mean of `--seeds` runs, each jitter seeded, and
gives the latency of its words on that clock too (bench/live.py's: a word's delta, sent
when the decode that committed it ends, against the moment its audio ended), so a policy's
latency can be compared without the noise of a shared machine; x3 is about what 8 streams
on these 2 cores give (a stream waits for about four others' decodes).

`--no-anomaly-filter` turns off the rule that drops a turn's last segments whose words
look hallucinated (tensorplan.live.stream.hallucinated), for the before/after in
docs/realtime.md.

    python bench/live_text.py [--seconds 30,45,60,90] [--compute-type int8]
                              [--slow 3,6,12] [--seeds 8]
                              [--no-anomaly-filter]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import live as clips_of  # noqa: E402 - bench/live.py: its clips and WER, one home

PIECE = 1600  # 100 ms at 16 kHz, as bench/live.py sends


def transcript(model: Any, audio: Any, detection: Any, options: Any) -> str:
    from tensorplan.live import Completed, LiveStream

    events: list[Any] = []
    stream = LiveStream(options, detection, events.extend)
    with model.session() as session:
        for i in range(0, len(audio), PIECE):
            stream.append(audio[i:i + PIECE])
            stream.update_all(session)
        stream.commit()
        stream.update_all(session)
    return " ".join(e.transcript for e in events if isinstance(e, Completed))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def transcript_on_slow_machine(model: Any, audio: Any, detection: Any, options: Any,
                               factor: float, seed: int,
                               arrivals: list[tuple[str, float]] | None = None) -> str:
    """Audio comes a piece every 100 ms of the clock; one worker decodes whenever the
    stream has work, each decode holding it for `factor` x (0.3 + seconds / 10), jittered.
    `arrivals` gets each delta's text and the clock when the decode that sent it ends."""
    import random

    from tensorplan.live import Completed, Delta, LiveStream

    jitter = random.Random(seed)
    events: list[Any] = []
    clock = Clock()
    stream = LiveStream(options, detection, events.extend, clock=clock)
    pieces = [audio[i:i + PIECE] for i in range(0, len(audio), PIECE)]
    free_at, sent = 0.0, 0
    with model.session() as session:
        while sent < len(pieces) or stream.has_work():
            arrives = sent * PIECE / 16000 if sent < len(pieces) else float("inf")
            if stream.has_work() and free_at <= arrives:
                clock.now = max(clock.now, free_at)
                before = len(events)
                seconds = stream.step(session)
                free_at = clock.now + factor * (0.3 + seconds / 10) * jitter.uniform(0.5, 1.5)
                if arrivals is not None:  # the decode's deltas, sent when it is done
                    arrivals += [(e.text, free_at) for e in events[before:]
                                 if isinstance(e, Delta)]
            elif sent < len(pieces):
                clock.now = arrives
                stream.append(pieces[sent])
                sent += 1
                if sent == len(pieces):
                    stream.commit()
            else:
                clock.now = free_at
    return " ".join(e.transcript for e in events if isinstance(e, Completed))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", default="30,45,60,90", help="espeak speech lengths")
    ap.add_argument("--compute-type", default="int8")
    ap.add_argument("--slow", default="",
                    help="decode-cost factors of simulated slow machines, e.g. 3,6,12")
    ap.add_argument("--seeds", type=int, default=8, help="runs per slow machine")
    ap.add_argument("--no-anomaly-filter", action="store_true",
                    help="keep segments whose words look hallucinated (the 'before')")
    ap.add_argument("--narrow-window", type=float, default=None,
                    help="LiveOptions.narrow_window_s (0: every decode on 30 s windows)")
    ap.add_argument("--no-narrow-finals", action="store_true",
                    help="a turn's last decode on 30 s windows (LiveOptions.narrow_finals)")
    args = ap.parse_args()

    import tensorplan.live.stream as live_stream
    from tensorplan.live import LiveOptions, TurnDetection
    from tensorplan.whisper import load_model

    options = LiveOptions(narrow_finals=not args.no_narrow_finals)
    if args.narrow_window is not None:
        options = dataclasses.replace(options, narrow_window_s=args.narrow_window or None)

    rule = live_stream.hallucinated
    dropped: list[str] = []

    def watched(words: list[Any]) -> bool:
        if args.no_anomaly_filter:
            return False
        if rule(words):
            dropped.append("".join(w.word for w in words).strip())
            return True
        return False

    live_stream.hallucinated = watched  # type: ignore[assignment]
    model = load_model("tiny.en", compute_type=args.compute_type)
    slow = [float(f) for f in args.slow.split(",") if f]
    print("| clip | turns | machine | WER ref | WER vs offline | latency median / p95 s |\n"
          "|---|---|---|---:|---:|---|")
    lengths = [float(s) for s in args.seconds.split(",")]
    for seconds in lengths:
        with tempfile.TemporaryDirectory() as work:
            clips = clips_of.make_clips(seconds, Path(work))
        for clip in clips if seconds == lengths[0] else clips[:1]:  # jfk once
            for name, detection in (("server VAD", TurnDetection()), ("commit", None)):
                runs = [("fast", [transcript(model, clip.audio, detection, options)], [])]
                for f in slow if detection else ():
                    waits: list[float] = []
                    texts = []
                    for seed in range(args.seeds):
                        arrivals: list[tuple[str, float]] = []
                        texts.append(transcript_on_slow_machine(
                            model, clip.audio, detection, options, f, seed, arrivals))
                        waits += [w for _, w in clips_of.latencies(clip, arrivals)]
                    runs.append((f"slow x{f:g}", texts, waits))
                for machine, texts, waits in runs:
                    ref, offline = (sum(clips_of.wer(truth, t) for t in texts) / len(texts)
                                    for truth in (clip.reference, clip.offline))
                    late = (f"{clips_of.pct(waits, 0.5):.2f} / {clips_of.pct(waits, 0.95):.2f}"
                            if waits else "-")
                    print(f"| {clip.name} | {name} | {machine} | {ref:.3f} | {offline:.3f} "
                          f"| {late} |", flush=True)
    thanks = sum(d.lower().startswith("thank you") for d in dropped)
    print(f"\ndropped {len(dropped)} segments, {thanks} of them 'Thank you': {dropped}")


if __name__ == "__main__":
    main()

"""How right a live stream's text is, apart from timing: bench/live.py's clips (espeak-ng
speech of --seconds, and jfk.wav) through one in-process `LiveStream` in fast mode (100 ms
appends, every update run as soon as it is due, so the result does not depend on the
machine's speed), with OpenAI's server VAD and without turn detection. Prints each run's
WER against the reference text and against the offline transcript, and the segments the
hallucination rule dropped.

`--no-anomaly-filter` turns off the rule that drops a turn's last segments whose words
look hallucinated (tensorplan.live.stream.hallucinated), for the before/after in
docs/realtime.md.

    python bench/live_text.py [--seconds 30,45,60,90] [--compute-type int8]
                              [--no-anomaly-filter]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import live as clips_of  # noqa: E402 - bench/live.py: its clips and WER, one home

PIECE = 1600  # 100 ms at 16 kHz, as bench/live.py sends


def transcript(model: Any, audio: Any, detection: Any) -> str:
    from tensorplan.live import Completed, LiveOptions, LiveStream

    events: list[Any] = []
    stream = LiveStream(LiveOptions(), detection, events.extend)
    with model.session() as session:
        for i in range(0, len(audio), PIECE):
            stream.append(audio[i:i + PIECE])
            stream.update_all(session)
        stream.commit()
        stream.update_all(session)
    return " ".join(e.transcript for e in events if isinstance(e, Completed))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", default="30,45,60,90", help="espeak speech lengths")
    ap.add_argument("--compute-type", default="int8")
    ap.add_argument("--no-anomaly-filter", action="store_true",
                    help="keep segments whose words look hallucinated (the 'before')")
    args = ap.parse_args()

    import tensorplan.live.stream as live_stream
    from tensorplan.live import TurnDetection
    from tensorplan.whisper import load_model

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
    print("| clip | turns | WER ref | WER vs offline |\n|---|---|---:|---:|")
    lengths = [float(s) for s in args.seconds.split(",")]
    for seconds in lengths:
        with tempfile.TemporaryDirectory() as work:
            clips = clips_of.make_clips(seconds, Path(work))
        for clip in clips if seconds == lengths[0] else clips[:1]:  # jfk once
            for name, detection in (("server VAD", TurnDetection()), ("commit", None)):
                text = transcript(model, clip.audio, detection)
                print(f"| {clip.name} | {name} | {clips_of.wer(clip.reference, text):.3f} | "
                      f"{clips_of.wer(clip.offline, text):.3f} |", flush=True)
    thanks = sum(d.lower().startswith("thank you") for d in dropped)
    print(f"\ndropped {len(dropped)} segments, {thanks} of them 'Thank you': {dropped}")


if __name__ == "__main__":
    main()

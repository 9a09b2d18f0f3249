"""Start-up as a CLI user sees it: tensorplan's whole process against a faster-whisper script.

Each run is a fresh process that transcribes samples/jfk.wav with default options and writes
a .txt, timed in phases from the moment this script spawned it (and its peak RSS):
  import  the interpreter started and the library imported (python, numpy, tensorplan / CT2);
  load    the model loaded (load_model / WhisperModel(dir));
  first   the first segment out;
  done    the transcription finished and the .txt written;
  exit    the process gone (what a shell user waits for).
Implementations:
  tensorplan      `python -m tensorplan transcribe jfk.wav -f txt -o D` phases via a wrapper
                  that records the same points inside the real CLI (cli.main);
  tensorplan-cli  the real CLI, exit time only (no wrapper);
  notorch         tensorplan with torch hidden (sys.modules["torch"] = None): a machine
                  without PyTorch installed;
  api             the Python API: `load_model("tiny.en")` (backend auto: torch where it
                  is installed) and `model.transcribe(jfk.wav)`, the text written;
  faster-whisper  load WhisperModel(ct2 dir, device="cpu", compute_type="default"),
                  transcribe, write txt; needs --fw-python (an interpreter with it);
  before, before notorch  the same from an older src tree (--before), to compare.
The source trees run are byte-compiled first (compileall, into their __pycache__), as an
installed package is at install: with PYTHONDONTWRITEBYTECODE set, a tree run through
PYTHONPATH would otherwise compile every module in every run (75 ms of tensorplan's
import, measured), while faster-whisper's installed modules load compiled; --no-compile
measures without that. Each runs once untimed first (the OS's file cache; tensorplan's
weight cache, whose first write is a new user's first run only: that one is timed
separately, "cold"). Runs are interleaved (round r runs every implementation once, the
order rotating) so all share the machine's noise; cells are medians of --repeats. Ratios
are tensorplan / faster-whisper per round, then the median.

    python bench/startup.py [--repeats 7] [--fw-python VENV/bin/python] [--before OLD/src]
    python bench/startup.py --smoke      # tensorplan and api, once (CI)
faster-whisper runs with --fw-python, or with this interpreter where it has faster-whisper.
"""

from __future__ import annotations

import argparse
import compileall
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JFK = ROOT / "samples" / "jfk.wav"
PHASES = ("import", "load", "first", "done", "exit")
COLUMNS = (*PHASES, "rss_mb")

# Child programs. Each prints one JSON line of absolute times (time.time()) to fd 3's file.
_TP = """
import json, os, sys, time
marks = {}
if os.environ.get("BENCH_NO_TORCH"):
    sys.modules["torch"] = None  # as if PyTorch were not installed
import tensorplan.cli, tensorplan.whisper.api as api
marks["import"] = time.time()
load = api.load
def timed_load(*a, **k):
    m = load(*a, **k); marks["load"] = time.time(); t = m.transcribe
    def transcribe(*a, on_segment=None, **k):
        def seg(s):
            marks.setdefault("first", time.time())
            if on_segment: on_segment(s)
        return t(*a, on_segment=seg, **k)
    m.transcribe = transcribe
    return m
api.load = timed_load
main = tensorplan.cli.main
def timed_main(argv=None, **kw):  # entry() passes program=True (older trees: nothing)
    rc = main(argv, **kw)
    marks["done"] = time.time()
    open(os.environ["BENCH_MARKS"], "w").write(json.dumps(marks))
    return rc
tensorplan.cli.main = timed_main
entry = getattr(tensorplan.cli, "entry", None)  # the program's own exit (older trees: none)
if entry is not None:
    entry()
sys.exit(timed_main())
"""

_API = """
import json, os, sys, time
marks = {}
from tensorplan.whisper import load_model
marks["import"] = time.time()
model = load_model("tiny.en")
marks["load"] = time.time()
def first(segment):
    marks.setdefault("first", time.time())
result = model.transcribe(sys.argv[1], on_segment=first)
open(os.path.join(sys.argv[2], "jfk.txt"), "w").write(result["text"].strip() + "\\n")
marks["done"] = time.time()
open(os.environ["BENCH_MARKS"], "w").write(json.dumps(marks))
"""

_FW = """
import json, os, sys, time
marks = {}
from faster_whisper import WhisperModel
marks["import"] = time.time()
model = WhisperModel(sys.argv[1], device="cpu", compute_type="default")
marks["load"] = time.time()
segments, info = model.transcribe(sys.argv[2])
lines = []
for s in segments:
    marks.setdefault("first", time.time())
    lines.append(s.text.strip())
out = os.path.join(sys.argv[3], "jfk.txt")
open(out, "w").write("\\n".join(lines) + "\\n")
marks["done"] = time.time()
open(os.environ["BENCH_MARKS"], "w").write(json.dumps(marks))
"""


def command(name: str, out: Path, fw_python: str | None,
            before: Path | None = None) -> tuple[list[str], dict[str, str]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    if name.startswith("before") and before is not None:
        env["PYTHONPATH"] = str(before)  # an older tensorplan's src, same wrapper
    if name == "faster-whisper":
        from tensorplan.whisper.model_files.find import resolve_model

        assert fw_python is not None
        return [fw_python, "-c", _FW, str(resolve_model("tiny.en")), str(JFK), str(out)], env
    if name == "api":
        return [sys.executable, "-c", _API, str(JFK), str(out)], env
    args = ["transcribe", str(JFK), "-f", "txt", "-o", str(out)]
    if name == "tensorplan-cli":
        return [sys.executable, "-m", "tensorplan", *args], env
    if name in ("notorch", "before notorch"):
        env["BENCH_NO_TORCH"] = "1"
    return [sys.executable, "-c", _TP, *args], env


def run_once(name: str, work: Path, fw_python: str | None, before: Path | None = None,
             cache: Path | None = None) -> dict[str, float]:
    """Seconds from spawn to each phase of one fresh process (`cache`: an empty weight
    cache directory instead of the user's)."""
    out = Path(tempfile.mkdtemp(dir=work))
    marks_file = out / "marks.json"
    cmd, env = command(name, out, fw_python, before)
    if cache is not None:
        env["TENSORPLAN_CACHE_DIR"] = str(cache)
    env["BENCH_MARKS"] = str(marks_file)
    log = out / "log.txt"
    with open(log, "w") as f:
        start = time.time()
        proc = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own peak RSS
        end = time.time()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed: {log.read_text()[-2000:]}")
    text = (out / "jfk.txt").read_text()
    if "ask not what your country can do for you" not in text:
        raise RuntimeError(f"{name} wrote {text!r}")
    marks = json.loads(marks_file.read_text()) if marks_file.exists() else {}
    return {**{k: v - start for k, v in marks.items()}, "exit": end - start,
            "rss_mb": usage.ru_maxrss / 1024}


def report(times: dict[str, list[dict[str, float]]]) -> str:
    rows = ["| run | " + " | ".join(f"{p} s" for p in PHASES)
            + " | peak RSS MB | exit / faster-whisper |", "|---" * (len(COLUMNS) + 2) + "|"]
    fw = times.get("faster-whisper")
    for name, runs in times.items():
        cells = []
        for p in COLUMNS:
            vals = [r[p] for r in runs if p in r]
            cells.append(f"{statistics.median(vals):.{0 if p == 'rss_mb' else 2}f}"
                         if vals else "-")
        ratio = "-"
        if fw and name != "faster-whisper":
            per_round = [r["exit"] / f["exit"] for r, f in zip(runs, fw, strict=True)]
            ratio = f"{statistics.median(per_round):.2f}"
        rows.append(f"| {name} | " + " | ".join(cells) + f" | {ratio} |")
    loads = {n: statistics.median(r["load"] - r["import"] for r in runs if "load" in r)
             for n, runs in times.items() if any("load" in r for r in runs)}
    rows.append("")
    rows.append("load alone (load - import), median s: "
                + ", ".join(f"{n} {v:.2f}" for n, v in loads.items()))
    if fw and "api" in times:
        per_round = [(a["load"] - a["import"]) / (f["load"] - f["import"])
                     for a, f in zip(times["api"], fw, strict=True)]
        rows.append(f"api load / faster-whisper load, median of rounds: "
                    f"{statistics.median(per_round):.2f}")
    return "\n".join(rows)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--fw-python", default=None,
                   help="an interpreter with faster-whisper installed (default: skip it)")
    p.add_argument("--before", type=Path, default=None,
                   help="an older tensorplan's src directory: adds its rows (before, before "
                        "notorch), e.g. from git archive REV src | tar -x -C DIR")
    p.add_argument("--smoke", action="store_true", help="tensorplan only, once")
    p.add_argument("--json", type=Path, default=None, help="also write the raw times here")
    p.add_argument("--no-compile", action="store_true",
                   help="do not byte-compile the source trees first (see above)")
    args = p.parse_args()
    if not (args.no_compile or args.smoke):
        for tree in (ROOT / "src", args.before):
            if tree is not None and not compileall.compile_dir(tree, quiet=1):
                print(f"could not byte-compile {tree}", file=sys.stderr)
    if args.fw_python is None and importlib.util.find_spec("faster_whisper") is not None:
        args.fw_python = sys.executable
    names = ["tensorplan", "notorch", "tensorplan-cli", "api"]
    if args.before and not args.smoke:
        names += ["before", "before notorch"]
    if args.fw_python and not args.smoke:
        names.append("faster-whisper")
    if args.smoke:
        names = ["tensorplan", "api"]
    repeats = 1 if args.smoke else args.repeats
    times: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory() as tmp:
        if not args.smoke:
            cold = run_once("tensorplan", Path(tmp), None, None, cache=Path(tmp) / "cold")
            print(f"cold weight cache: load {cold['load'] - cold['import']:.2f} s, "
                  f"exit {cold['exit']:.2f} s", file=sys.stderr)
            for name in names:
                run_once(name, Path(tmp), args.fw_python, args.before)
        for r in range(repeats):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                times[name].append(run_once(name, Path(tmp), args.fw_python, args.before))
            print(f"round {r + 1}/{repeats}\n{report(times)}", file=sys.stderr)
    print(report(times))
    if args.json:
        args.json.write_text(json.dumps(times, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

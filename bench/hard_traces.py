"""Hard lifetime traces whose optimum is the lower bound, packed four ways (issue #18).

A full capacity x time rectangle is cut into buffers, so every time step is exactly full
and the optimum equals the lower bound. Families (generators in plan_models.py, seeded):
guillotine (straight cuts: mixed sizes and lifetimes), guillotine-skewed (cuts near an
edge: long thin and short wide buffers mixed), pinwheel and grid-merge (partitions no
sequence of straight cuts makes). Rows are shuffled, or sorted adversarially (smallest
first, latest first) with --order.

    python bench/hard_traces.py [--counts 150 300 500] [--seeds 1 2] [--exact-budget 10]
    python bench/hard_traces.py --csv DIR/*.csv   # traces of your own, e.g. MiniMalloc's
    python bench/hard_traces.py --counts 300 500 800 1000 --methods pack greedy-size ggml

--csv packs trace files (`tensorplan pack`'s format, which MiniMalloc's benchmark CSVs
share: id, lower, upper, size) instead of the generated families; their optimum is not
known to be the bound, so the ratios there are to the bound, not to the optimum.

Every packing is checked independently (plan_models.check_packing) before it is reported.
Columns per method: ratio to the lower bound, seconds, and * where proven optimal.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import plan_models as pm  # noqa: E402

from tensorplan import alloc  # noqa: E402
from tensorplan.alloc.offline import solve  # noqa: E402
from tensorplan.alloc.trace import read_trace  # noqa: E402

HORIZON, CAPACITY = 2000, 1 << 20
Interval = tuple[int, int, int, int]
Method = Callable[[list[Interval]], tuple[dict[int, int] | list[int], int, bool]]


def greedy_by_size(intervals: list[Interval]) -> tuple[list[int], int, bool]:
    """One pass, largest first, each at the lowest offset that fits (the classic baseline)."""
    lo = [s for _, s, _, _ in intervals]
    hi = [e - 1 for _, _, e, _ in intervals]
    size = [z for *_, z in intervals]
    packed = solve(lo, hi, size, budget_s=0, orders=(("largest", False),), max_nodes=0)
    return packed.offsets, packed.total, False


def methods(exact_budget: float) -> dict[str, Method]:
    def run(strategy: str, budget: float) -> Method:
        def go(intervals: list[Interval]) -> tuple[dict[int, int], int, bool]:
            p = alloc.pack(intervals, strategy=strategy, budget_s=budget)
            return {k: v for k, v in p.offsets.items() if isinstance(k, int)}, p.size, p.proven

        return go

    return {
        "pack": run("offline", alloc.DEFAULT_BUDGET_S),
        "exact": run("exact", exact_budget),
        "greedy-size": greedy_by_size,
        "ggml": run("ggml", 0.0),
    }


def make_trace(family: str, n: int, seed: int, order: str) -> list[Interval]:
    rng = random.Random(seed * 1000 + n)
    rects = pm.GENERATORS[family](n, rng, HORIZON, CAPACITY)
    intervals = pm.to_intervals(rects, rng)
    if order == "small-first":
        intervals.sort(key=lambda iv: (iv[3], iv[1]))
    elif order == "late-first":
        intervals.sort(key=lambda iv: -iv[1])
    return [(i, s, e, z) for i, (_, s, e, z) in enumerate(intervals)]


def measure(intervals: list[Interval], method: Method) -> tuple[float, float, bool]:
    t0 = time.perf_counter()
    offsets, size, proven = method(intervals)
    sec = time.perf_counter() - t0
    pm.check_packing(intervals, offsets, size)
    return size / peak_live(intervals), sec, proven


def peak_live(intervals: list[Interval]) -> int:
    """The lower bound, computed here and not by the planner: the most bytes live at once
    (an interval is live over [start, end))."""
    events = sorted([(s, z) for _, s, _, z in intervals] + [(e, -z) for _, _, e, z in intervals])
    live = peak = 0
    for _, dz in events:  # at one time the ends (negative) sort before the starts
        live += dz
        peak = max(peak, live)
    return peak


def _read(path: Path) -> list[Interval]:
    """A trace file as rows numbered 0.. (the file's ids may be any strings)."""
    return [(i, s, e, z) for i, (_, s, e, z) in enumerate(read_trace(path))]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--counts", type=int, nargs="+", default=[150, 300, 500])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--families", nargs="+", default=list(pm.GENERATORS))
    ap.add_argument("--order", choices=("shuffled", "small-first", "late-first"),
                    default="shuffled")
    ap.add_argument("--exact-budget", type=float, default=10.0, help="seconds per trace")
    ap.add_argument("--methods", nargs="+", choices=list(methods(0.0)), metavar="NAME",
                    help="which methods to run (default: all; exact doubles the time)")
    ap.add_argument("--csv", nargs="+", type=Path, metavar="FILE",
                    help="pack these trace files instead of the generated families")
    args = ap.parse_args(argv)
    ms = methods(args.exact_budget)
    if args.methods:
        ms = {name: ms[name] for name in args.methods}
    rows: list[list[object]] = []
    results: dict[str, list[tuple[float, float, bool]]] = {m: [] for m in ms}
    if args.csv:
        traces = [(path.stem, 0, 0, _read(path)) for path in args.csv]
    else:
        traces = [(family, n, seed, make_trace(family, n, seed, args.order))
                  for family in args.families for n in args.counts for seed in args.seeds]
    by_count: dict[int, dict[str, list[tuple[float, float, bool]]]] = {}
    for label, count, seed, intervals in traces:
        row: list[object] = [label, len(intervals), seed]
        for name, method in ms.items():
            ratio, sec, proven = measure(intervals, method)
            results[name].append((ratio, sec, proven))
            by_count.setdefault(count, {}).setdefault(name, []).append((ratio, sec, proven))
            row += [f"{ratio:.3f}{'*' if proven else ''}", sec]
        rows.append(row)
        print(pm.table(_headers(ms), rows[-1:]).splitlines()[-1], flush=True)
    what = "trace files: ratio to the lower bound" if args.csv else \
        f"optimum = lower bound, rows {args.order}"
    print(f"\n## Hard traces ({what}); * = proven optimal\n")
    print(pm.table(_headers(ms), rows) + "\n")
    print(pm.table(["method", "traces", "median x", "mean x", "max x", "median s", "max s",
                    "proven"], [_summary(name, r) for name, r in results.items()]))
    if len(by_count) > 1:  # the size sweep: the same summary per requested buffer count
        print("\n### By buffer count\n")
        print(pm.table(["buffers", "method", "traces", "median x", "mean x", "max x",
                        "median s", "max s", "proven"],
                       [[str(count), *_summary(name, r)]
                        for count, per in sorted(by_count.items())
                        for name, r in per.items()]))
    return 0


def _headers(ms: dict[str, Method]) -> list[str]:
    return ["family", "buffers", "seed", *[f"{m} {c}" for m in ms for c in ("x", "s")]]


def _summary(name: str, r: list[tuple[float, float, bool]]) -> list[object]:
    ratios, secs = [x for x, _, _ in r], [s for _, s, _ in r]
    return [name, len(r), statistics.median(ratios), statistics.fmean(ratios), max(ratios),
            statistics.median(secs), max(secs), f"{sum(p for *_, p in r)}/{len(r)}"]


if __name__ == "__main__":
    sys.exit(main())

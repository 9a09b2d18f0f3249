"""How close does the planner get to the lower bound, and how fast?

Three parts, each printed as an aligned table with its targets:
  1. model graphs (bench/model_graphs.py): naive bytes, lower bound, arena and ratio for the
     `ggml` and `offline` strategies, planning time and µs per planned tensor;
  2. planning time on synthetic transformer-like chains and random DAGs of 1k, 10k and 100k
     planned tensors (is it linear?);
  3. hard interval traces with a known optimum: a full capacity x time rectangle cut into
     buffers, so the optimum equals the lower bound, packed with `alloc.pack`.

    python bench/plan_models.py [--quick] [--alignment 64] [--budget 2.0]

--quick runs a small subset in a few seconds (CI smoke). A "planned tensor" is one the
allocator gives memory to: not a view, not external (placed or PARAM).
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import model_graphs  # noqa: E402

from tensorplan import alloc  # noqa: E402
from tensorplan.graph import Graph  # noqa: E402
from tensorplan.tensor import Flag, Tensor  # noqa: E402

MiB = 2**20
QUICK_MODELS = ("mobilenet_v2", "bert_base_s128", "whisper_tiny_encoder",
                "whisper_tiny_decoder_step")
TARGET_RATIO = 1.02  # hard limit on model graphs; the goal is LB exactly
TARGET_US = 5.0  # µs per planned tensor
TARGET_TRACE = 1.05
TARGET_TRACE_S = 5.0  # "within a few seconds"
TARGET_LINEAR = 2.0  # µs per tensor may grow at most this much from 1k to 100k tensors
Interval = tuple[int, int, int, int]  # (id, start, end exclusive, size)


# ---- output ----------------------------------------------------------------------------------
def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A markdown table, padded: text columns (the first row's str cells) left-aligned,
    numbers right-aligned."""
    rows = list(rows)
    left = [isinstance(c, str) for c in rows[0]] if rows else [False] * len(headers)
    cells = [[str(h) for h in headers]] + [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["| " + " | ".join(c.ljust(w) if lf else c.rjust(w)
                               for c, w, lf in zip(r, widths, left, strict=True)) + " |"
             for r in cells]
    rule = ["-" * (w + 1) + ("-" if lf else ":") for w, lf in zip(widths, left, strict=True)]
    lines.insert(1, "|" + "|".join(rule) + "|")
    return "\n".join(lines)


def verdict(**checks: bool) -> str:
    """"ok", or "MISS" and the names of the failed checks."""
    failed = [name for name, ok in checks.items() if not ok]
    return "MISS " + "+".join(failed) if failed else "ok"


def _fmt(c: object) -> str:
    if isinstance(c, float):
        return f"{c:.3f}" if c < 100 else f"{c:.1f}"
    return str(c)


# ---- model graphs ----------------------------------------------------------------------------
def _align(n: int, a: int) -> int:
    return -(-n // a) * a


def planned_tensors(graph: Graph) -> list[Tensor]:
    """Tensors the allocator must give memory to: roots that are neither placed nor PARAM."""
    return [t for t in graph.tensors()
            if t.view_src is None and t.buffer is None and not t.has(Flag.PARAM) and t.nbytes]


def lower_bound_no_inplace(graph: Graph, alignment: int) -> int:
    """The published planners' lower bound, computed here independently: no in-place
    handoffs. A planned
    tensor lives from its producing step (INPUT and other leafs: step 0) through the last
    step reading it or a view of it; OUTPUT roots live to the end."""
    planned = {id(t): t for t in planned_tensors(graph)}
    life = {i: [0, 0] for i in planned}
    for step, t in enumerate(graph.nodes):
        if id(t) in planned:
            life[id(t)] = [step, step]
        for root in (s.root for s in (*t.srcs, t)):
            if id(root) in planned and root is not t:
                life[id(root)][1] = step
    for t in graph.tensors():
        if t.has(Flag.OUTPUT) and id(t.root) in planned:  # a view of it pins it too
            life[id(t.root)][1] = len(graph.nodes)
    delta = [0] * (len(graph.nodes) + 2)
    for key, (start, end) in life.items():
        delta[start] += _align(planned[key].nbytes, alignment)
        delta[end + 1] -= _align(planned[key].nbytes, alignment)
    running = peak = 0
    for d in delta:
        running += d
        peak = max(peak, running)
    return peak


def timed_plan(graph: Graph, strategy: str, alignment: int,
               repeats: int = 1) -> tuple[float, alloc.Plan]:
    """The fastest of `repeats` plans, in seconds, and the last plan."""
    best, plan = float("inf"), None
    for _ in range(max(1, repeats)):
        gc.collect()  # garbage from earlier work should not be collected on our clock
        t0 = time.perf_counter()
        plan = alloc.plan_graph(graph, alignment, strategy=strategy)
        best = min(best, time.perf_counter() - t0)
    assert plan is not None
    return best, plan


def arena_bytes(plan: alloc.Plan) -> int:
    return sum(plan.sizes)


@dataclass
class ModelRow:
    name: str
    nodes: int
    tensors: int
    inplace: int
    naive: int
    lb_plain: int
    lb: int
    arena: dict[str, int]
    seconds: dict[str, float]


def measure_model(name: str, graph: Graph, alignment: int, repeats: int) -> ModelRow:
    tensors = planned_tensors(graph)
    naive = sum(_align(t.nbytes, alignment) for t in tensors)
    lb = sum(alloc.lower_bound(graph, alignment))
    arena, seconds = {}, {}
    for strategy in ("ggml", "offline"):
        seconds[strategy], plan = timed_plan(graph, strategy, alignment, repeats)
        alloc.verify(plan, graph)
        arena[strategy] = arena_bytes(plan)
    return ModelRow(name, len(graph.nodes), len(tensors), len(plan.inplace), naive,
                    lower_bound_no_inplace(graph, alignment), lb, arena, seconds)


def model_table(rows: Sequence[ModelRow]) -> str:
    out = []
    for r in rows:
        ratio = r.arena["offline"] / r.lb
        us = r.seconds["offline"] * 1e6 / r.tensors
        out.append([r.name, r.nodes, r.tensors, r.inplace, r.naive / MiB, r.lb_plain / MiB,
                    r.lb / MiB, r.arena["ggml"] / MiB, r.arena["ggml"] / r.lb,
                    r.arena["offline"] / MiB, ratio, r.seconds["ggml"] * 1e3,
                    r.seconds["offline"] * 1e3, us,
                    verdict(ratio=ratio <= TARGET_RATIO, time=us <= TARGET_US)])
    return table(["graph", "nodes", "tensors", "in-place", "naive MiB", "LB0 MiB", "LB MiB",
                  "ggml MiB", "ggml x", "offline MiB", "offline x", "ggml ms", "offline ms",
                  "µs/tensor", "target"], out)


# ---- planning-time scaling -------------------------------------------------------------------
# graphs of about n planned tensors: transformer-like chains, and random DAGs (of which
# about 45% of the nodes reach the output and get planned)
SCALING_GRAPHS: dict[str, Callable[[int], Graph]] = {
    "chain": lambda n: model_graphs.synthetic_chain(max(1, n // 17), seed=n),
    "random DAG": lambda n: model_graphs.random_dag(int(n * 2.2), seed=n),
}


def scaling_rows(sizes: Sequence[int], alignment: int) -> list[list[object]]:
    """Per graph kind and size: target size, nodes, planned tensors, then ms and µs/tensor
    for ggml and offline, offline's ratio to LB, and offline µs/tensor relative to the
    kind's first size."""
    rows: list[list[object]] = []
    for kind, build in SCALING_GRAPHS.items():
        first_us = 0.0
        for n in sizes:
            graph = build(n)
            tensors = len(planned_tensors(graph))
            repeats = 3  # the fastest of three at every size: the machine is shared
            ggml_s, _ = timed_plan(graph, "ggml", alignment, repeats)
            offline_s, plan = timed_plan(graph, "offline", alignment, repeats)
            alloc.verify(plan, graph)
            us = offline_s * 1e6 / tensors
            first_us = first_us or us
            ratio = arena_bytes(plan) / sum(alloc.lower_bound(graph, alignment))
            rows.append([kind, n, len(graph.nodes), tensors, ggml_s * 1e3,
                         ggml_s * 1e6 / tensors, offline_s * 1e3, us, ratio, us / first_us,
                         verdict(time=us <= TARGET_US, linear=us / first_us <= TARGET_LINEAR)])
    return rows


def scaling_table(rows: Sequence[Sequence[object]]) -> str:
    return table(["graph", "target n", "nodes", "tensors", "ggml ms", "ggml µs/t", "offline ms",
                  "offline µs/t", "offline x", "µs/t vs first", "target"], rows)


# ---- hard traces with a known optimum ---------------------------------------------------------
Rect = tuple[int, int, int, int]  # (t0, t1, y0, y1): time [t0, t1) x bytes [y0, y1)


def _cut(piece: Rect, rng: random.Random, skew: bool = False) -> list[Rect]:
    """One straight cut, over time or over bytes; skew=True cuts near an edge."""
    t0, t1, y0, y1 = piece
    u = rng.betavariate(0.3, 0.3) if skew else rng.random()
    if t1 - t0 >= 2 and (y1 - y0 < 2 or rng.random() < 0.5):
        c = t0 + 1 + min(int(u * (t1 - t0 - 1)), t1 - t0 - 2)
        return [(t0, c, y0, y1), (c, t1, y0, y1)]
    if y1 - y0 >= 2:
        c = y0 + 1 + min(int(u * (y1 - y0 - 1)), y1 - y0 - 2)
        return [(t0, t1, y0, c), (t0, t1, c, y1)]
    return [piece]  # a unit cell


def guillotine(n: int, rng: random.Random, horizon: int, capacity: int,
               skew: bool = False) -> list[Rect]:
    """Cut a random piece in two until there are n pieces."""
    pieces = [(0, horizon, 0, capacity)]
    while len(pieces) < n:
        pieces += _cut(pieces.pop(rng.randrange(len(pieces))), rng, skew)
    return pieces


def pinwheel(n: int, rng: random.Random, horizon: int, capacity: int,
             deep: bool = False) -> list[Rect]:
    """Split a random piece into five in a pinwheel (which no sequence of straight cuts
    makes) or, a third of the time, in two, until there are about n pieces.

    deep=True nests: a quarter of the time the piece split is one of the last five made (so
    pinwheels sit inside pinwheels), and cut points are drawn near the edges as often as
    not (Beta(0.5, 0.5)), which spreads sizes and lifetimes over orders of magnitude."""
    pieces = [(0, horizon, 0, capacity)]
    while len(pieces) < n:
        near_end = deep and len(pieces) > 5 and rng.random() < 0.25
        at = len(pieces) - 1 - rng.randrange(5) if near_end else rng.randrange(len(pieces))
        piece = pieces.pop(at)
        t0, t1, y0, y1 = piece
        if t1 - t0 < 3 or y1 - y0 < 3 or rng.random() < 1 / 3:
            pieces += _cut(piece, rng)
            continue
        if deep:
            a1, a2 = sorted(_two_points(t0, t1, rng))
            b1, b2 = sorted(_two_points(y0, y1, rng))
        else:
            a1, a2 = sorted(rng.sample(range(t0 + 1, t1), 2))
            b1, b2 = sorted(rng.sample(range(y0 + 1, y1), 2))
        pieces += [(t0, a2, y0, b1), (a2, t1, y0, b2), (a1, t1, b2, y1), (t0, a1, b1, y1),
                   (a1, a2, b1, b2)]
    return pieces


def _two_points(a: int, b: int, rng: random.Random) -> tuple[int, int]:
    """Two distinct points strictly inside (a, b) (b - a >= 3), drawn from Beta(0.5, 0.5):
    near the edges as often as not."""
    inside = b - a - 1
    while True:
        p, q = (a + 1 + min(int(rng.betavariate(0.5, 0.5) * inside), inside - 1)
                for _ in range(2))
        if p != q:
            return p, q


def grid_merge(n: int, rng: random.Random, horizon: int, capacity: int) -> list[Rect]:
    """A random grid whose free cells are merged, in scan order, into random rectangles
    of up to 4 x 4 cells: general (mostly non-guillotine) partitions of about n pieces."""
    side = max(2, int((n * 4.0) ** 0.5))
    ts = [0, *sorted(rng.sample(range(1, horizon), side - 1)), horizon]
    ys = [0, *sorted(rng.sample(range(1, capacity), side - 1)), capacity]
    owner = [[False] * side for _ in range(side)]
    pieces = []
    for r in range(side):
        for c in range(side):
            if owner[r][c]:
                continue
            dc = 1
            while dc < rng.randint(1, 4) and c + dc < side and not owner[r][c + dc]:
                dc += 1
            dr = 1
            while (dr < rng.randint(1, 4) and r + dr < side
                   and not any(owner[r + dr][c:c + dc])):
                dr += 1
            for rr in range(r, r + dr):
                owner[rr][c:c + dc] = [True] * dc
            pieces.append((ts[r], ts[r + dr], ys[c], ys[c + dc]))
    return pieces


GENERATORS: dict[str, Callable[[int, random.Random, int, int], list[Rect]]] = {
    "guillotine": guillotine,
    "guillotine-skewed": lambda n, rng, h, c: guillotine(n, rng, h, c, skew=True),
    "pinwheel": pinwheel,
    "pinwheel-deep": lambda n, rng, h, c: pinwheel(n, rng, h, c, deep=True),
    "grid-merge": grid_merge,
}


def to_intervals(rects: Sequence[Rect], rng: random.Random) -> list[Interval]:
    """Shuffled (id, start, end, size) rows: ids carry no hint of the optimal placement."""
    order = list(range(len(rects)))
    rng.shuffle(order)
    return [(i, rects[j][0], rects[j][1], rects[j][3] - rects[j][2]) for i, j in enumerate(order)]


def check_packing(intervals: Sequence[Interval], offsets: Sequence[int] | Mapping[Any, int],
                  size: int) -> None:
    """Independently: every block fits in [0, size) and no two time-overlapping blocks share
    a byte. offsets are indexed by interval id (a list in interval order or a dict)."""
    off = offsets if isinstance(offsets, Mapping) else {
        iv[0]: o for iv, o in zip(intervals, offsets, strict=True)}
    active: list[tuple[int, int, int]] = []  # (end, lo, hi)
    for i, start, end, sz in sorted(intervals, key=lambda iv: iv[1]):
        lo, hi = off[i], off[i] + sz
        if lo < 0 or hi > size:
            raise AssertionError(f"interval {i} at [{lo}, {hi}) is outside the arena of {size}")
        active = [a for a in active if a[0] > start]
        for _, alo, ahi in active:
            if lo < ahi and alo < hi:
                raise AssertionError(f"interval {i} [{lo}, {hi}) overlaps [{alo}, {ahi})")
        active.append((end, lo, hi))


def trace_rows(counts: Sequence[int], budget_s: float, seed: int = 1) -> list[list[object]]:
    horizon, capacity = 2000, 1 << 20
    rows: list[list[object]] = []
    for gen_name, gen in GENERATORS.items():
        for n in counts:
            rng = random.Random(seed * 1000 + n)
            intervals = to_intervals(gen(n, rng, horizon, capacity), rng)
            row: list[object] = [gen_name, len(intervals)]
            for strategy, budget in (("ggml", 0.0), ("offline", budget_s)):
                t0 = time.perf_counter()
                packing = alloc.pack(intervals, alignment=1, strategy=strategy, budget_s=budget)
                sec = time.perf_counter() - t0
                check_packing(intervals, packing.offsets, packing.size)
                if packing.lower_bound != capacity:
                    raise AssertionError(f"{gen_name}: pack's lower bound {packing.lower_bound} "
                                         f"!= the rectangle's capacity {capacity}")
                row += [packing.size / capacity, sec]
            ratio, sec = float(row[-2]), float(row[-1])  # type: ignore[arg-type]
            row.append(verdict(ratio=ratio <= TARGET_TRACE, time=sec <= TARGET_TRACE_S))
            rows.append(row)
    return rows


def trace_table(rows: Sequence[Sequence[object]]) -> str:
    return table(["generator", "buffers", "ggml x", "ggml s", "offline x", "offline s",
                  "target"], rows)


# ---- main ------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a small subset, a few seconds (CI)")
    ap.add_argument("--alignment", type=int, default=64, help="buffer alignment in bytes")
    ap.add_argument("--budget", type=float, default=2.0,
                    help="offline improvement budget per trace, seconds")
    ap.add_argument("--models", nargs="*", choices=list(model_graphs.MODELS), metavar="NAME",
                    help="model graphs to run (default: all; --quick: a subset)")
    args = ap.parse_args(argv)
    names = args.models or (QUICK_MODELS if args.quick else tuple(model_graphs.MODELS))
    repeats = 3  # the fastest of three: the machine is shared

    print(f"## Model graphs (fp32, batch 1, alignment {args.alignment})")
    print(f"target: offline = LB (+alignment), never above {TARGET_RATIO}x; "
          f"<= {TARGET_US} µs per planned tensor\n")
    rows = [measure_model(n, model_graphs.MODELS[n](), args.alignment, repeats) for n in names]
    print(model_table(rows) + "\n")

    print("## Planning time on synthetic transformer-like chains and random DAGs")
    print(f"target: <= {TARGET_US} µs per tensor; linear: µs/tensor grows <= {TARGET_LINEAR}x "
          "from the first size up to 100k tensors\n")
    sizes = (1_000, 5_000) if args.quick else (1_000, 10_000, 100_000)
    print(scaling_table(scaling_rows(sizes, args.alignment)) + "\n")

    budget = min(args.budget, 0.25) if args.quick else args.budget
    print(f"## Hard traces with a known optimum (optimum = LB = capacity), budget {budget} s")
    print(f"target: offline <= {TARGET_TRACE}x in <= {TARGET_TRACE_S} s each\n")
    counts = (200,) if args.quick else (100, 1000, 5000)
    print(trace_table(trace_rows(counts, budget)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

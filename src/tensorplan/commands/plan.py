"""`tensorplan plan`: the memory each plan mode holds besides the weights, against its
lower bound and whisper.cpp's buffers; `--png` draws the arena.

The last line is for machines: `total_non_weight_bytes=<N> peak_plan=<mode>`, the best
(lowest total) of the modes printed.
"""

from __future__ import annotations

import argparse
import gc
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tensorplan.errors import UserError
from tensorplan.files import atomic_write
from tensorplan.pipeline import PLAN_MODES
from tensorplan.whisper.planned.load_options import (
    DEFAULT_MAX_BATCH,
    add_model_arguments,
    model_options_from_args,
)

if TYPE_CHECKING:  # the model stack is imported when the command runs, not at CLI start
    from tensorplan.whisper.model_files.ct2_weights import ModelDims as Dims
    from tensorplan.whisper.planned.memory import ArenaLayout, MemoryReport, ReferenceRow

MB = 1_000_000
COLORS = {"conv": "tab:blue", "encoder": "tab:orange", "cross": "tab:green",
          "decoder": "tab:red"}
KV_CROSS = "tab:purple"
OUTSIDE_COLORS = {"kv self": "tab:brown", "kv cross copies": KV_CROSS,
                  "handoff copies": "tab:gray"}


def register(sub: Any) -> None:
    p = sub.add_parser(
        "plan", help="memory per plan mode: planned vs lower bound vs whisper.cpp",
        description="Load a model in each plan mode and print, per compute buffer, the "
        "planned bytes, the lower bound and their ratio, then the KV caches, handoff "
        "copies and weights, and whisper.cpp's buffers for the same model (MB = 1e6 B).")
    p.add_argument("--plan", choices=(*PLAN_MODES, "all"), default="all",
                   help="plan mode to report (default: all, to compare them)")
    p.add_argument("--batch-size", type=int, default=None, metavar="N",
                   help="also say what batched transcription of N windows holds, greedy and "
                        "beam 5 (transcribe --batch-size)")
    p.add_argument("--png", type=Path, default=None, metavar="FILE",
                   help="draw every planned tensor (step x offset) to a PNG (needs matplotlib)")
    add_model_arguments(p.add_argument_group("model"), p.add_argument_group("memory planning"),
                        exclude=("plan",))
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tensorplan.files import writable_target
    from tensorplan.whisper.options import MAX_BATCH_SIZE
    from tensorplan.whisper.planned.memory import whisper_cpp_reference

    args.max_batch = args.max_batch or DEFAULT_MAX_BATCH
    # fail before the work, not after
    if args.batch_size is not None and not 1 <= args.batch_size <= MAX_BATCH_SIZE:
        raise UserError(f"--batch-size must be between 1 and {MAX_BATCH_SIZE}")
    if args.png is not None:
        _pyplot()
        if not args.png.resolve().parent.is_dir():
            raise UserError(f"{args.png}: cannot write: no directory {args.png.parent}")
        writable_target(args.png, "plot")  # not a directory, a device, a descriptor
    reports, layouts, dims = measure(args)
    print(f"{args.model}, strategy {args.strategy}, max batch {args.max_batch}, kv "
          f"{args.kv_dtype}, weights {args.weights_dtype}: bytes held besides the weights "
          "(MB = 1e6 B)")
    for report in reports:
        print()
        print(format_report(report))
    print()
    print(format_reference(whisper_cpp_reference(dims)))
    if args.batch_size is not None:
        print()
        print(format_batch_cost(args))
    if args.png is not None:
        write_png(args.png, layouts, f"{args.model}, strategy {args.strategy}")
        print(f"\nwrote {args.png}")
    print()
    best = min(reports, key=lambda r: r.total_non_weight_bytes)
    print(f"total_non_weight_bytes={best.total_non_weight_bytes} peak_plan={best.plan}")
    return 0


def measure(args: argparse.Namespace) -> tuple[list[MemoryReport], list[ArenaLayout], Dims]:
    """Load the model once per plan mode asked for (one at a time) and measure it; the
    layouts only when a chart was asked for."""
    from tensorplan.whisper.api import load
    from tensorplan.whisper.planned.memory import arena_layout, memory_report

    reports, layouts = [], []
    for mode in PLAN_MODES if args.plan == "all" else (args.plan,):
        model = load(model_options_from_args(args, plan=mode))
        reports.append(memory_report(model))
        if args.png is not None:
            layouts.append(arena_layout(model))
        dims = model.dims
        del model
        gc.collect()  # hold one model's weights at a time
    return reports, layouts, dims


# Peak RSS of faster-whisper 1.2.1 on tiny.en int8, 6.8 min of speech, 2 threads: its
# sequential WhisperModel, then BatchedInferencePipeline(batch_size=8), greedy (measured
# on the development machine; what the batch adds is the comparison that carries over).
FASTER_WHISPER_RSS_MB = {"sequential": 560, "batch 8": 824}


def format_batch_cost(args: argparse.Namespace) -> str:
    """The bytes a session adds for batched transcription of --batch-size windows: the
    windows' cross K/V, the sequences' self-attention cache and the decoder arena."""
    from tensorplan.whisper.api import load

    n = args.batch_size  # checked by run()
    model = load(model_options_from_args(args)).model
    rows = []
    for group, label in ((1, "greedy"), (5, "beam 5")):
        batch = model.window_batch(n, group)
        cross = sum(t.nbytes for pair in batch.kv_cross for t in pair)
        kv = sum(t.nbytes for pair in batch.kv_self for t in pair)
        rows.append((f"batch {n}, {label}", _mb(cross), _mb(kv), _mb(batch.nbytes - cross - kv),
                     _mb(batch.nbytes)))
    head = ("batched transcription", "cross K/V MB", "self KV MB", "decoder arena MB",
            "added per session MB")
    fw = FASTER_WHISPER_RSS_MB
    return "\n".join([
        f"batched transcription (a session binds these on first use; one session: "
        f"{model.session_bytes / MB:.1f} MB before)", table(head, rows),
        f"faster-whisper tiny.en int8 peak RSS, measured: {fw['sequential']} MB sequential, "
        f"{fw['batch 8']} MB with BatchedInferencePipeline(batch_size=8) "
        f"(+{fw['batch 8'] - fw['sequential']} MB)"])


# ---- tables ---------------------------------------------------------------------------------
def format_report(report: MemoryReport) -> str:
    """One plan mode's rows and total, then its weights and copy traffic."""
    rows = [(r.name, _mb(r.bytes), _mb(r.lower_bound), _ratio(r.ratio), r.note)
            for r in report.rows]
    total = report.total_non_weight_bytes
    bound = report.total_lower_bound
    rows.append(("total", _mb(total), _mb(bound), _ratio(total / bound if bound else None),
                 "non-weight: compute + kv + persistent"))
    head = ("buffer", "MB", "lower bound MB", "ratio", "note")
    return "\n".join([
        f"plan {report.plan}",
        table(head, rows),
        f"weights {report.weights_bytes / MB:.2f} MB ({report.n_weights} PARAM tensors); "
        f"copy traffic {report.copy_bytes_per_window / MB:.2f} MB per window",
    ])


def format_reference(rows: Sequence[ReferenceRow]) -> str:
    sources = list(dict.fromkeys(r.source for r in rows))
    body = [(r.name, _mb(r.bytes)) for r in rows]
    body.append(("total", _mb(sum(r.bytes for r in rows))))
    return "\n".join(["whisper.cpp, same model dims", table(("buffer", "MB"), body),
                      *(f"source: {s}" for s in sources)])


def table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A padded markdown table: the first and last columns left-aligned, numbers right."""
    cells = [list(head), *[list(r) for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(head))]
    left = [i == 0 or (i == len(head) - 1 and len(head) > 2) for i in range(len(head))]
    lines = ["| " + " | ".join(c.ljust(w) if lf else c.rjust(w)
                               for c, w, lf in zip(r, widths, left, strict=True)) + " |"
             for r in cells]
    rule = "|" + "|".join("-" * (w + 1) + ("-" if lf else ":")
                          for w, lf in zip(widths, left, strict=True)) + "|"
    return "\n".join([lines[0], rule, *lines[1:]])


def _mb(n: int | None) -> str:
    return "-" if n is None else f"{n / MB:.2f}"


def _ratio(r: float | None) -> str:
    return "-" if r is None else f"{r:.3f}"


# ---- the chart ------------------------------------------------------------------------------
def _pyplot() -> Any:
    try:
        import matplotlib
    except ModuleNotFoundError:
        raise UserError("--png needs matplotlib: pip install 'tensorplan[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_png(path: Path, layouts: Sequence[ArenaLayout], title: str) -> None:
    """One panel per plan mode: a rectangle per planned tensor, and above the buffers a band
    per allocation beside them (the KV self cache, copies), so each panel adds up to the
    table's total. Written atomically, mode 0666 less the umask like every other output."""
    plt = _pyplot()
    from matplotlib.artist import Artist
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    height = 3.8 * len(layouts) + 0.8  # inches: a panel per mode, a header for title and legend
    fig, axes = plt.subplots(len(layouts), 1, figsize=(13, height), sharey=True, squeeze=False)
    for ax, layout in zip(axes[:, 0], layouts, strict=True):
        _draw(ax, layout)
    top = max(_buffers_top(layout) + sum(n for _, n in layout.outside) for layout in layouts)
    axes[0, 0].set_ylim(0, top / MB * 1.04)  # shared: the same MB scale in every panel
    fig.suptitle(f"{title}: every planned tensor, from its first to its last step",
                 y=1 - 0.08 / height, va="top")
    handles: list[Artist] = [Patch(color=c, label=g) for g, c in COLORS.items()]
    handles += [Patch(color=KV_CROSS, label="kv cross (planned OUTPUT)"),
                Patch(facecolor="white", edgecolor="black", hatch="//",
                      label="held beside the buffers"),
                Line2D([], [], color="black", lw=1.5, label="lower bound"),
                Line2D([], [], color="black", lw=1, ls=":", label="buffer size")]
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 1 - 0.38 / height),
               ncol=len(handles), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.6 / height))
    try:
        _save_atomically(fig, Path(path))
    except OSError as e:
        raise UserError(f"{path}: cannot write: {e.strerror or e}") from None
    finally:
        plt.close(fig)


def _save_atomically(fig: Any, path: Path) -> None:
    """Never a half-written PNG, never over a device (files.atomic_write)."""
    with atomic_write(path, "plot") as f:
        fig.savefig(f, format="png", dpi=110)


def _buffers_top(layout: ArenaLayout) -> int:
    return max(s.buffer_bytes for s in layout.spans)


def _draw(ax: Any, layout: ArenaLayout) -> None:
    from matplotlib.collections import PatchCollection
    from matplotlib.patches import Rectangle

    rects = [Rectangle((b.first, b.offset / MB), b.last - b.first + 1, b.size / MB,
                       facecolor=KV_CROSS if b.kv_cross else COLORS.get(b.graph, "tab:gray"),
                       edgecolor="black", linewidth=0.2, alpha=0.85) for b in layout.boxes]
    ax.add_collection(PatchCollection(rects, match_original=True))
    joint = layout.plan == "joint"
    for s in layout.spans:
        x0, x1 = s.first, s.last + 1
        ax.hlines(s.lower_bound / MB, x0, x1, colors="black", linewidth=1.5)
        ax.hlines(s.buffer_bytes / MB, x0, x1, colors="black", linewidth=1, linestyles=":")
        if not joint:
            ax.axvline(x0, color="gray", linewidth=0.5)
    end = max(s.last + 1 for s in layout.spans)
    _draw_outside(ax, layout, end)
    names = ax.secondary_xaxis("top")  # graph names above the panel, centred: never overlap
    names.set_xticks([(s.first + s.last + 1) / 2 for s in layout.spans],
                     [s.graph for s in layout.spans], fontsize=8)
    names.tick_params(length=0)
    ax.set_title(_panel_title(layout), fontsize=10)
    ax.set_xlim(0, end)
    ax.set_xlabel("step (conv → encoder → cross → worst-case decoder)")
    ax.set_ylabel("MB")


def _draw_outside(ax: Any, layout: ArenaLayout, end: int) -> None:
    """The allocations beside the planned buffers, stacked above them over the whole run."""
    from matplotlib.patches import Rectangle

    base = _buffers_top(layout) / MB
    for name, n in layout.outside:
        color = OUTSIDE_COLORS.get(name, "tab:gray")
        ax.add_patch(Rectangle((0, base), end, n / MB, facecolor=color, alpha=0.3,
                               edgecolor="black", linewidth=0.5, hatch="//"))
        ax.text(end / 2, base + n / MB / 2, f"{name} {n / MB:.2f} MB: its own allocation",
                ha="center", va="center", fontsize=8,
                bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1.5})
        base += n / MB


def _panel_title(layout: ArenaLayout) -> str:
    """The total the table prints, and what adds up to it."""
    def buffer(s: Any) -> str:
        cross = s.kv_cross_bytes
        inside = f" ({(s.buffer_bytes - cross) / MB:.2f} + kv cross {cross / MB:.2f})"
        return f"{s.buffer_bytes / MB:.2f}" + (inside if cross else "")

    buffers = layout.buffers
    what = "one arena " if layout.plan == "joint" else "buffers "
    parts = [what + " + ".join(buffer(s) for s in buffers)]
    parts += [f"{name} {n / MB:.2f}" for name, n in layout.outside]
    return (f"plan {layout.plan} ({layout.strategy}): {layout.total_bytes / MB:.2f} MB besides "
            f"the weights = " + " + ".join(parts))

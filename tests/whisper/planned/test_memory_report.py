"""`tensorplan plan` and the memory report: every byte counted once, every row at or above
its lower bound, the modes ranked, whisper.cpp's anchors reproduced, the chart written."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tensorplan import alloc, ops
from tensorplan.graph import Graph
from tensorplan.pipeline import PLAN_MODES
from tensorplan.whisper import api
from tensorplan.whisper.planned.graphs import Dims
from tensorplan.whisper.planned.memory import (
    MB,
    ON_DEMAND,
    arena_layout,
    live_steps,
    memory_report,
    whisper_cpp_formula,
    whisper_cpp_reference,
)

Factory = Callable[[str], Any]  # tiny_model_factory: plan mode -> a loaded tiny.en Whisper
Cli = tuple[str, Path | None]
HAS_MPL = importlib.util.find_spec("matplotlib") is not None
LAST = re.compile(r"^total_non_weight_bytes=(\d+) peak_plan=(\w+)$")


@pytest.fixture(scope="module")
def cli(tiny_model_factory: Factory, tmp_path_factory: pytest.TempPathFactory) -> Cli:
    """One `tensorplan plan --plan all [--png]` run on the session's tiny.en models:
    (stdout, png path or None)."""
    from tensorplan.cli import main

    png = tmp_path_factory.mktemp("plan") / "arena.png" if HAS_MPL else None
    argv = ["plan", "--plan", "all", *(["--png", str(png)] if png else [])]
    out = io.StringIO()

    def cached(name: str, plan: str, **options: Any) -> Any:
        assert name == "tiny.en"
        assert options == {"strategy": "offline", "max_batch": 5, "kv_dtype": "float32",
                           "weights_dtype": "float32"}, "the factory's models use defaults"
        return tiny_model_factory(plan)

    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out):
        mp.setattr(api, "load_model", cached)
        assert main(argv) == 0
    return out.getvalue(), png


def _tables(text: str) -> dict[str, dict[str, tuple[float | None, float | None]]]:
    """section ("plan joint", "whisper.cpp, ...") -> row name -> (MB, lower bound MB)."""
    tables: dict[str, dict[str, tuple[float | None, float | None]]] = {}
    section = ""
    for line in text.splitlines():
        if line.startswith(("plan ", "whisper.cpp")):
            section = line
            tables[section] = {}
        elif line.startswith("| ") and section and not line.startswith("| buffer"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            values = [None if c == "-" else float(c) for c in cells[1:3]]
            tables[section][cells[0]] = (values[0], values[1] if len(values) > 1 else None)
    return tables


def test_every_plan_mode_prints_a_table_whose_total_is_the_sum_of_its_rows(cli: Cli) -> None:
    tables = _tables(cli[0])
    assert [s for s in tables if s.startswith("plan ")] == [f"plan {m}" for m in PLAN_MODES]
    for section, rows in tables.items():
        if not section.startswith("plan "):
            continue
        total, total_lb = rows.pop("total")
        assert total is not None and total_lb is not None
        # word alignment's buffers are bound on first use: shown, not in the total
        assert {"align", "align_head"} <= rows.keys()
        counted = [(mb, lb or 0.0) for name, (mb, lb) in rows.items()
                   if mb is not None and not name.startswith("align")]
        assert {"kv self", "kv cross", "persistent"} <= rows.keys()
        assert sum(mb for mb, _ in counted) == pytest.approx(total, abs=0.005 * len(counted))
        assert sum(lb for _, lb in counted) == pytest.approx(total_lb, abs=0.005 * len(counted))
        for name, (mb, lb) in rows.items():
            assert lb is not None and (mb is None or lb <= mb), (section, name)


def test_last_line_names_the_lowest_total(cli: Cli, tiny_model_factory: Factory) -> None:
    lines = cli[0].rstrip("\n").splitlines()
    m = LAST.match(lines[-1])
    assert m, lines[-1]
    reports = {mode: memory_report(tiny_model_factory(mode)) for mode in PLAN_MODES}
    best = min(reports.values(), key=lambda r: r.total_non_weight_bytes)
    assert (int(m.group(1)), m.group(2)) == (best.total_non_weight_bytes, best.plan)
    assert reports["joint"].total_non_weight_bytes <= reports["output"].total_non_weight_bytes
    tables = _tables(cli[0])
    joint, output = tables["plan joint"]["total"][0], tables["plan output"]["total"][0]
    assert joint is not None and output is not None and joint <= output


@pytest.mark.parametrize("plan", PLAN_MODES)
def test_report_counts_every_byte_once(tiny_model_factory: Factory, plan: str) -> None:
    r = memory_report(tiny_model_factory(plan))
    counted = [row for row in r.rows if row.bytes is not None and row.kind != ON_DEMAND]
    assert sum(row.bytes or 0 for row in counted) == r.total_non_weight_bytes
    assert sum(row.lower_bound for row in counted) == r.total_lower_bound
    assert all(row.bytes is None or 0 <= row.lower_bound <= row.bytes for row in r.rows)
    assert r.kv_cross_bytes > 0 and r.kv_self_bytes > 0 and r.weights_bytes > 10 * MB
    model = tiny_model_factory(plan).model
    buffers = sum(n for name, n in model.pipeline.compute_bytes().items()
                  if not name.startswith("align"))
    assert r.on_demand_bytes == model.align_bytes > 0  # word alignment, bound on first use
    assert r.total_non_weight_bytes == model.session_bytes
    if plan == "dedicated":  # the cross K/V are copies outside the compute buffers
        assert r.compute_bytes == buffers and r.persistent_bytes > 0
        assert r.copy_bytes_per_window > 0
    else:  # the cross K/V live in a compute buffer: counted there once, on their own row
        assert r.compute_bytes + r.kv_cross_bytes == buffers and r.persistent_bytes == 0
        assert r.copy_bytes_per_window == 0


def test_chart_is_a_png(cli: Cli) -> None:
    png = cli[1]
    if png is None:
        pytest.skip("matplotlib not installed (pip install -e '.[test]')")
    data = png.read_bytes()
    assert len(data) > 10_000 and data.startswith(b"\x89PNG\r\n\x1a\n")
    assert not list(png.parent.glob(".*.tmp")), "the temporary file was left behind"
    umask = os.umask(0)
    os.umask(umask)
    assert png.stat().st_mode & 0o777 == 0o666 & ~umask  # readable as other outputs are


@pytest.mark.parametrize("plan", PLAN_MODES)
def test_chart_adds_up_to_the_table(tiny_model_factory: Factory, plan: str) -> None:
    """The chart draws every byte the table counts: its buffers plus the bands beside them
    (the KV self cache always) make the table's total, and the cross K/V drawn as planned
    OUTPUT tensors are the kv cross row, unless they are copies beside the buffers."""
    model = tiny_model_factory(plan)
    report, layout = memory_report(model), arena_layout(model)
    assert layout.total_bytes == report.total_non_weight_bytes
    outside = dict(layout.outside)
    assert outside["kv self"] == report.kv_self_bytes
    drawn = sum(b.size for b in layout.boxes if b.kv_cross)
    assert drawn + outside.get("kv cross copies", 0) == report.kv_cross_bytes
    assert sum(s.kv_cross_bytes for s in layout.buffers) == drawn
    if plan == "joint":  # the table's arena row leaves out the cross K/V it holds
        arena = next(r for r in report.rows if r.name == "joint arena")
        assert layout.buffers[0].buffer_bytes - drawn == arena.bytes


def test_whisper_cpp_tiny_rows(cli: Cli, tiny_model_factory: Factory) -> None:
    rows = whisper_cpp_reference(tiny_model_factory("joint").dims)
    assert sum(r.bytes for r in rows) / MB == pytest.approx(145.7, abs=0.1)
    assert all(r.source.startswith("measured") for r in rows)
    printed = next(v for k, v in _tables(cli[0]).items() if k.startswith("whisper.cpp"))
    assert printed["total"][0] == pytest.approx(145.7, abs=0.1)


def test_whisper_cpp_formula_reproduces_the_measured_tiny_rows(
        tiny_model_factory: Factory) -> None:
    dims = tiny_model_factory("joint").dims
    measured = {r.name: r.bytes / MB for r in whisper_cpp_reference(dims)}
    formula = whisper_cpp_formula(dims, flash_attn=True)  # 1.8.5's default
    assert {k: round(v / MB, 2) for k, v in formula.items()} == measured
    assert round(whisper_cpp_formula(dims)["compute encode"] / MB, 2) == 64.81  # FA off


def test_whisper_cpp_base_rows_come_from_the_formula() -> None:
    base = Dims(n_mels=80, n_audio_ctx=1500, n_audio_state=512, n_audio_head=8,
                n_audio_layer=6, n_vocab=51865, n_text_ctx=448, n_text_state=512,
                n_text_head=8, n_text_layer=6)
    rows = {r.name: round(r.bytes / MB, 2) for r in whisper_cpp_reference(base)}
    assert all(r.source.startswith("formula") for r in whisper_cpp_reference(base))
    # whisper.cpp's allocator: base, HEAD-era CPU, flash attention off
    assert rows == {"kv self": 6.29, "kv cross": 18.87, "kv pad": 3.15, "compute conv": 16.28,
                    "compute encode": 85.88, "compute cross": 4.66, "compute decode": 96.37}


def test_one_token_decoder_graph_plans_small(tiny_model_factory: Factory) -> None:
    """Planned alone, the decoder graph for one new token of one sequence needs a logits
    row and a few activations, not a (tokens x vocab) logits matrix (93 MB for tiny.en)."""
    model = tiny_model_factory("joint").model
    dg = model.decoders[(1, 1, 1)]
    graph = next(s.graph for s in model.pipeline.stages.values() if dg.logits in s.graph.outputs)
    plan = alloc.plan_graph(graph, [model.backend.buffer_type], owner=dg.logits.placed_by)
    alloc.verify(plan, graph)
    assert plan.lower_bound[0] <= plan.total <= 2 * MB


def test_live_steps_follow_views_outputs_and_results() -> None:
    x = ops.input((4,))
    b = ops.gelu(x, name="b").set_output()  # an OUTPUT: pinned to the end
    a = ops.add(x, x, name="a")  # read only through its view v
    v = ops.reshape(a, (2, 2))
    c = ops.add(ops.reshape(b, (2, 2)), v, name="c")  # the result: unread, pinned
    g = Graph.build([c])
    step = {t: i + 1 for i, t in enumerate(g.nodes)}
    end = len(g.nodes)
    live = live_steps(g)
    assert live[x] == (0, max(step[a], step[b]))  # an INPUT is live from graph start
    assert live[a] == (step[a], step[c])  # kept alive by its view's reader
    assert live[b] == (step[b], end) and live[c] == (end, end)
    assert v not in live  # views have no bytes of their own

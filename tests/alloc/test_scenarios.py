"""Hand-built situations, each checked with the shared checkers and the plan verifier."""

from __future__ import annotations

import doctest
import logging

import pytest

import tensorplan.alloc.allocator as allocator_module
from tensorplan import dtype as dt
from tensorplan import ops
from tensorplan.alloc import GraphAllocator, PlanError, lower_bound, plan_graph, verify
from tensorplan.alloc import liveness as lv
from tensorplan.graph import Graph
from tensorplan.tensor import Tensor

from .checks import FakeBufferType, PresetBuffer, check_all

STRATEGIES = ("offline", "ggml")


def allocate(
    outputs: Tensor | list[Tensor],
    strategy: str = "offline",
    bufts: list[FakeBufferType] | None = None,
) -> tuple[Graph, GraphAllocator]:
    graph = Graph.build(outputs)
    galloc = GraphAllocator(bufts or [FakeBufferType()], strategy=strategy)
    assert galloc.alloc_graph(graph)
    assert galloc.plan is not None
    verify(galloc.plan, graph)
    check_all(graph, galloc)
    return graph, galloc


def vec(n: int = 4, name: str = "") -> Tensor:
    """A fresh 1-D float32 INPUT of n elements (4n bytes)."""
    return ops.input((n,), name=name)


def refusals(graph: Graph, node: Tensor, owner: object | None = None) -> list[str]:
    """Why the offline rule refused each of node's in-place candidates."""
    live = lv.analyze(graph, plan_graph(graph, [8, 8], owner=owner).specs, owner)
    return [reason for _, reason in live.refusals.get(node, ())]


# ---- basics ----------------------------------------------------------------------------------
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_node_allocated_and_outputs_apart(strategy: str) -> None:
    # a chain with a side branch: every node bound, the output never overlaps anything
    x = vec(8, "x")
    a = ops.cont(x, name="a")
    b = ops.matmul(ops.reshape(a, (2, 4)), ops.reshape(ops.cont(a), (4, 2)), name="b")
    out = ops.cont(b, name="out").set_output()
    graph, galloc = allocate(out, strategy)
    assert all(t.buffer is not None for t in graph.nodes)
    others = [t for t in graph.nodes if t.view_src is None and t is not out]
    assert all(
        t.offset + t.nbytes <= out.offset or t.offset >= out.offset + out.nbytes
        for t in others
        if t.buffer is out.buffer and birth_after(graph, out, t)
    )


def birth_after(graph: Graph, first: Tensor, later: Tensor) -> bool:
    return graph.nodes.index(later) > graph.nodes.index(first)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_inputs_do_not_clobber_each_other(strategy: str) -> None:
    # x2 is read only by the last node: nothing computed before may land on it
    x1, x2 = vec(16, "x1"), vec(16, "x2")
    h = ops.cont(ops.cont(ops.cont(x1)))
    out = ops.add(h, x2, name="out").set_output()
    graph, _ = allocate(out, strategy)
    for t in graph.nodes[:-1]:
        if t.view_src is None:
            assert t.offset >= x2.offset + x2.nbytes or t.offset + t.nbytes <= x2.offset, t


# ---- in place: taken ------------------------------------------------------------------------
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_inplace_taken(strategy: str) -> None:
    # exp is the last reader of a and has its layout: it writes over a
    a = ops.cont(vec(), name="a")
    b = ops.exp(a, name="b").set_output()
    graph, galloc = allocate(b, strategy)
    assert b.offset == a.offset and b.buffer is a.buffer
    assert galloc.plan is not None and galloc.plan.inplace[b] is a
    assert galloc.buffer_size(0) == 2 * 16  # x and a (b shares a)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_inplace_chain_shares_one_block(strategy: str) -> None:
    a = ops.cont(vec(), name="a")
    c = ops.neg(ops.exp(ops.scale(a, 2.0)), name="c").set_output()
    graph, galloc = allocate(c, strategy)
    assert {t.offset for t in graph.nodes} == {a.offset}
    assert galloc.buffer_size(0) == 32


def test_layer_norm_in_place_offline_only() -> None:
    # our op table lets layer_norm run in place; ggml's list does not (NORM is not in it)
    for strategy, shares in (("offline", True), ("ggml", False)):
        a = ops.cont(vec(), name="a")
        b = ops.layer_norm(a, name="b").set_output()
        allocate(b, strategy)
        assert (b.offset == a.offset) is shares, strategy


# ---- in place: refused, one test per documented reason ----------------------------------------
def _assert_refused(
    strategy: str, node: Tensor, parent: Tensor, reason: str, outputs: list[Tensor] | None = None
) -> None:
    """node does not write over parent, and the offline rule names `reason` for it."""
    graph, galloc = allocate(outputs or [node.set_output()], strategy)
    assert galloc.plan is not None and galloc.plan.inplace.get(node) is not parent
    if parent.buffer is node.buffer and parent.nbytes:
        assert node.offset != parent.offset
    assert reason in refusals(graph, node, galloc)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_refused_op_not_inplace(strategy: str) -> None:
    a = ops.cont(vec(), name="a")
    _assert_refused(strategy, ops.cont(a, name="b"), a, lv.OP_NOT_INPLACE)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_refused_parent_external(strategy: str) -> None:
    a = vec(name="a")
    a.place(PresetBuffer(64), 16)  # the caller's own buffer
    _assert_refused(strategy, ops.exp(a, name="b"), a, lv.PARENT_EXTERNAL)
    w = ops.param((4,), name="w")
    _assert_refused(strategy, ops.exp(w, name="c"), w, lv.PARENT_EXTERNAL)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_refused_parent_is_view(strategy: str) -> None:
    a = ops.cont(vec(), name="a")
    v = ops.reshape(a, (4,), name="v")
    _assert_refused(strategy, ops.exp(v, name="b"), a, lv.PARENT_VIEW)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_refused_parent_output(strategy: str) -> None:
    a = ops.cont(vec(), name="a").set_output()
    _assert_refused(strategy, ops.exp(a, name="b"), a, lv.PARENT_OUTPUT)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_refused_layout_differs(strategy: str) -> None:
    a = ops.cont(ops.input((4, 1)), name="a")
    b = ops.add(a, ops.input((4, 4)), name="b")  # broadcasts: b is (4, 4), a is (4, 1)
    _assert_refused(strategy, b, a, lv.LAYOUT_DIFFERS)
    # a planned root with its own (transposed) strides: exp's output is contiguous
    a2 = Tensor((4, 2), dt.float32, strides=(4, 16), op=ops.CONT, srcs=(vec(8),), name="a2")
    _assert_refused(strategy, ops.exp(a2, name="c"), a2, lv.LAYOUT_DIFFERS)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_refused_parent_has_another_reader(strategy: str) -> None:
    a = ops.cont(vec(), name="a")
    b = ops.exp(a, name="b")
    out = ops.add(b, a, name="out")  # a is read after b
    _assert_refused(strategy, b, a, lv.OTHER_READER, [out.set_output()])
    a2 = ops.cont(vec(), name="a2")
    _assert_refused(strategy, ops.mul(a2, a2, name="sq"), a2, lv.OTHER_READER)  # read twice


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_refused_parent_has_live_views(strategy: str) -> None:
    a = ops.cont(vec(), name="a")
    v = ops.reshape(a, (4,), name="v")  # computed before b, read after it
    b = ops.exp(a, name="b")
    out = ops.add(v, b, name="out")
    graph = Graph.build(out)
    assert graph.nodes.index(v) < graph.nodes.index(b)
    _assert_refused(strategy, out, a, lv.PARENT_VIEW)
    assert lv.LIVE_VIEWS in refusals(graph, b, galloc_of(out))
    assert b.offset != a.offset


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_refused_buffer_differs_and_input_node(strategy: str) -> None:
    a = ops.cont(vec(), name="a")
    a.buffer_id = 1
    b = ops.exp(a, name="b")
    _assert_refused_multi(strategy, b, lv.BUFFER_DIFFERS)
    c = ops.cont(vec(), name="c")
    d = ops.exp(c, name="d").set_input()
    _assert_refused(strategy, d, c, lv.NODE_IS_INPUT)


def galloc_of(t: Tensor) -> object:
    return t.placed_by


def _assert_refused_multi(strategy: str, node: Tensor, reason: str) -> None:
    graph = Graph.build(node.set_output())
    galloc = GraphAllocator([FakeBufferType("b0"), FakeBufferType("b1", 16)], strategy)
    galloc.alloc_graph(graph)
    assert galloc.plan is not None and not galloc.plan.inplace
    verify(galloc.plan, graph)
    check_all(graph, galloc)
    live = lv.analyze(graph, galloc.plan.specs, galloc)
    assert reason in [r for _, r in live.refusals[node]]


# ---- views --------------------------------------------------------------------------------------
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_view_keeps_root_alive(strategy: str) -> None:
    # a is read only through its view v, by the last node; everything between must avoid a
    a = ops.cont(vec(8), name="a")
    v = ops.view(a, (4,), offset=16, name="v")
    h = ops.cont(vec(8, "y"))
    for _ in range(4):
        h = ops.cont(h)
    out = ops.add(v, ops.view(h, (4,)), name="out").set_output()
    graph, _ = allocate(out, strategy)
    assert graph.nodes.index(a) < graph.nodes.index(h)
    for t in graph.nodes:
        if t.view_src is None and t is not a and t.buffer is a.buffer and t is not out:
            assert t.offset >= a.offset + a.nbytes or t.offset + t.nbytes <= a.offset, t
    assert v.buffer is a.buffer and v.offset == a.offset + 16


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_output_view_pins_root(strategy: str) -> None:
    a = ops.cont(vec(8), name="a")
    v = ops.reshape(a, (2, 4), name="v").set_output()  # read later, but still an output
    h = ops.cont(ops.reshape(v, (8,)))
    for _ in range(3):
        h = ops.cont(h)
    graph, galloc = allocate([v, h.set_output()], strategy)
    for t in graph.nodes:
        if t.view_src is None and t is not a:
            assert t.offset >= a.offset + a.nbytes or t.offset + t.nbytes <= a.offset, t


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_view_chain_costs_nothing(strategy: str) -> None:
    # reshape / permute / view of an input cost no memory (llama.cpp test_view_inplace)
    x = ops.input((2, 4), name="x")
    v = ops.view(ops.permute(ops.reshape(x, (4, 2)), (1, 0)), (2,), offset=0)
    out = ops.add(ops.cont(v), ops.cont(v), name="out").set_output()
    _, galloc = allocate(out, strategy)
    assert galloc.buffer_size(0) == 32 + 8 + 8  # x, two conts; out in place over one


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_copy_into_fresh_destination(strategy: str) -> None:
    # a fresh new_tensor as copy destination is planned from graph start (ggml's #731 effect)
    dst = ops.new_tensor((4,), name="dst")
    written = ops.copy_into(ops.exp(ops.cont(vec())), dst, name="written")
    out = ops.add(written, ops.cont(vec()), name="out").set_output()
    graph, galloc = allocate(out, strategy)
    assert written.buffer is dst.buffer and written.offset == dst.offset
    assert galloc.plan is not None and dst in galloc.plan.placements


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_copy_into_external_cache(strategy: str) -> None:
    cache = ops.new_tensor((4, 4), name="kv")
    cache.place(PresetBuffer(64), 0)
    slot = ops.view(cache, (4,), offset=32, name="slot")
    written = ops.copy_into(ops.exp(ops.cont(vec())), slot, name="written")
    graph, galloc = allocate(ops.cont(written, name="out").set_output(), strategy)
    assert galloc.plan is not None
    assert cache not in galloc.plan.placements and slot not in galloc.plan.placements
    assert written.buffer is cache.buffer and written.offset == 32
    assert cache.placed_by is None  # untouched


# ---- buffers: chunks, several types, growth -------------------------------------------------
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_max_size_splits_into_chunks(strategy: str) -> None:
    # five 16-byte inputs live together; 32-byte chunks hold two each
    xs = [vec(4, f"x{i}") for i in range(5)]
    out = ops.concat(xs, name="out")  # 80 B: bigger than a chunk, gets its own
    buft = FakeBufferType(max_size=32)
    graph, galloc = allocate(out.set_output(), strategy, [buft])
    assert galloc.plan is not None
    assert len(galloc.plan.chunk_sizes[0]) >= 4
    assert all(size <= 32 for size in buft.allocated if size != 80)
    assert galloc.buffer_size(0) == sum(buft.allocated)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_multiple_buffer_types(strategy: str) -> None:
    b0, b1, b2 = FakeBufferType("b0", 8), FakeBufferType("b1", 64), FakeBufferType("b2", 32)
    x = vec(3, "x")  # 12 B
    a = ops.exp(x, name="a")
    a.buffer_id = 1
    b = ops.cont(a, name="b")
    out = ops.add(b, x, name="out").set_output()
    graph, galloc = allocate(out, strategy, [b0, b1, b2])
    assert a.buffer is not None and a.buffer.buft is b1  # type: ignore[attr-defined]
    assert x.buffer.buft is b0 and out.buffer.buft is b0  # type: ignore[union-attr]
    assert galloc.buffer_size(1) == 64 and a.offset % 64 == 0
    assert galloc.buffer_size(2) == 0  # nothing planned there: an empty buffer
    assert galloc.buffer_size(0) == 2 * 16  # x and b (12 B each, aligned); out takes b


def test_bad_buffer_id_is_refused() -> None:
    a = ops.exp(vec())
    a.buffer_id = 3
    with pytest.raises(PlanError, match="buffer id 3"):
        plan_graph(Graph.build(a), [8, 8])


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_replans_when_graph_grows_and_never_shrinks(strategy: str) -> None:
    buft = FakeBufferType()
    galloc = GraphAllocator([buft], strategy)
    small = Graph.build(ops.exp(ops.cont(vec(4))).set_output())
    big = Graph.build(ops.exp(ops.cont(vec(64))).set_output())
    galloc.alloc_graph(small)
    assert buft.allocated == [32]
    assert galloc.needs_realloc(big)
    galloc.alloc_graph(big)
    assert buft.allocated == [32, 512] and galloc.buffer_size(0) == 512
    check_all(big, galloc)
    galloc.alloc_graph(small)  # re-planned (other tensors), but the buffer stays
    assert buft.allocated == [32, 512] and galloc.buffer_size(0) == 512
    check_all(small, galloc)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_stale_plan_never_reused(strategy: str) -> None:
    def build() -> Graph:
        return Graph.build(ops.add(ops.cont(vec(name="x")), vec(name="y")).set_output())

    galloc = GraphAllocator([FakeBufferType()], strategy)
    g1, g2 = build(), build()  # same counts, ops and sizes; different tensors
    galloc.alloc_graph(g1)
    assert not galloc.needs_realloc(g1)
    assert galloc.needs_realloc(g2)
    plan1 = galloc.plan
    galloc.alloc_graph(g2)
    assert galloc.plan is not plan1
    assert all(t.buffer is not None for t in g2.nodes)
    check_all(g2, galloc)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_plan_invalidated_by_flags_and_placements(strategy: str) -> None:
    x = vec(name="x")
    a = ops.cont(x, name="a")
    out = ops.exp(a, name="out")
    graph = Graph.build(out.set_output())
    galloc = GraphAllocator([FakeBufferType()], strategy)
    galloc.alloc_graph(graph)
    assert out.offset == a.offset
    a.set_output()  # now a must survive: the old in-place plan is stale
    assert galloc.needs_realloc(graph)
    galloc.alloc_graph(graph)
    assert out.offset != a.offset
    x.place(PresetBuffer(16), 0)  # the caller takes over x
    assert galloc.needs_realloc(graph)
    galloc.alloc_graph(graph)
    assert galloc.plan is not None and x not in galloc.plan.placements
    assert x.placed_by is None and isinstance(x.buffer, PresetBuffer)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_reserve_binds_nothing(strategy: str) -> None:
    buft = FakeBufferType()
    out = ops.exp(ops.cont(vec(name="x")), name="out").set_output()
    graph = Graph.build(out)
    galloc = GraphAllocator([buft], strategy)
    sizes = galloc.reserve(graph)
    assert sizes == [32] and buft.allocated == []
    assert all(t.buffer is None for t in graph.tensors())
    assert galloc.buffer_size(0) == 32 and not galloc.needs_realloc(graph)
    plan = galloc.plan
    galloc.alloc_graph(graph)
    assert galloc.plan is plan and buft.allocated == [32]


# ---- the seed regression: a leaf view of a tensor placed elsewhere ----------------------------
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_seed_leaf_views_tensor_of_another_allocator(strategy: str) -> None:
    # graph A computes t (OUTPUT) with its own allocator; graph B reads it through ops.ref
    t = ops.exp(ops.cont(vec(8, "mel")), name="embd_conv").set_output()
    _, galloc_a = allocate(t, strategy)
    leaf = ops.ref(t, name="embd_conv(view)")
    part = ops.ref(ops.view(t, (4,), offset=16), name="part")
    out = ops.add(ops.cont(leaf), ops.cont(ops.concat([part, part])), name="enc").set_output()
    graph_b = Graph.build(out)
    galloc_b = GraphAllocator([FakeBufferType()], strategy)
    sizes = galloc_b.reserve(graph_b)
    galloc_b.alloc_graph(graph_b)
    assert galloc_b.plan is not None
    assert leaf not in galloc_b.plan.placements and t not in galloc_b.plan.placements
    assert leaf.buffer is t.buffer and leaf.offset == t.offset
    assert part.buffer is t.buffer and part.offset == t.offset + 16
    assert t.placed_by is galloc_a  # untouched by B
    assert sizes == [3 * 32]  # cont(leaf), concat, out: t adds nothing
    assert lower_bound(graph_b, 8, galloc_b) == [3 * 32]
    check_all(graph_b, galloc_b)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_seed_leaf_views_tensor_in_dedicated_buffer(strategy: str) -> None:
    # whisper.cpp PR #1964: the result lives in a pre-allocated buffer of its own
    t = ops.new_tensor((8,), name="embd_conv")
    dedicated = PresetBuffer(256)
    t.place(dedicated, 64)
    leaf = ops.ref(t)
    out = ops.exp(ops.cont(leaf), name="enc").set_output()
    graph = Graph.build(out)
    galloc = GraphAllocator([FakeBufferType()], strategy)
    assert galloc.reserve(graph) == [32]
    galloc.alloc_graph(graph)
    assert leaf.buffer is dedicated and leaf.offset == 64
    assert t.buffer is dedicated and t.offset == 64 and t.placed_by is None
    assert galloc.plan is not None and leaf not in galloc.plan.placements
    check_all(graph, galloc)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_view_of_unplaced_weight_stays_unbound(strategy: str) -> None:
    w = ops.param((2, 4), name="w")
    out = ops.add(ops.reshape(w, (8,)), vec(8), name="out").set_output()
    graph, galloc = allocate(out, strategy)
    assert w.buffer is None and graph.nodes[0].buffer is None
    assert galloc.plan is not None and len(galloc.plan.placements) == 2  # x and out


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_external_node_untouched(strategy: str) -> None:
    a = ops.cont(vec(), name="a")
    preset = PresetBuffer(128)
    a.place(preset, 32)  # the caller wants a in its own buffer
    out = ops.exp(a, name="out").set_output()
    graph, galloc = allocate(out, strategy)
    assert a.buffer is preset and a.offset == 32 and a.placed_by is None
    assert galloc.plan is not None and a not in galloc.plan.placements


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_own_placements_are_planned_again(strategy: str) -> None:
    out = ops.exp(ops.cont(vec()), name="out").set_output()
    graph = Graph.build(out)
    galloc = GraphAllocator([FakeBufferType()], strategy)
    galloc.alloc_graph(graph)
    first = galloc.plan
    plan = plan_graph(graph, [8], strategy, owner=galloc)
    assert first is not None and plan.placements == first.placements


# ---- zero sizes, determinism, logging -----------------------------------------------------------
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_zero_size_tensors(strategy: str) -> None:
    e = ops.cont(ops.input((0, 4), name="e"), name="e2")
    out = ops.concat([ops.exp(e), ops.input((2, 4))], name="out").set_output()
    graph, galloc = allocate(out, strategy)
    assert galloc.plan is not None
    assert all(
        galloc.plan.placements[t].size == 0
        for t in graph.tensors()
        if t.nbytes == 0 and t in galloc.plan.placements
    )
    assert galloc.buffer_size(0) == 32 + 32
    empty = Graph.build(ops.exp(ops.input((0,))).set_output())
    _, galloc0 = allocate(empty.outputs[0], strategy)
    assert galloc0.buffer_size(0) == 0


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_plan_is_deterministic_and_pure(strategy: str) -> None:
    from .models import whisper_encoder

    graph = whisper_encoder(2, 32, 2, 20, 8)
    p1 = plan_graph(graph, [64], strategy)
    p2 = plan_graph(graph, [64], strategy)
    assert p1.placements == p2.placements and p1.chunk_sizes == p2.chunk_sizes
    assert all(t.buffer is None for t in graph.tensors())


def test_summary_logged_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="tensorplan.alloc"):
        plan_graph(Graph.build(ops.exp(ops.cont(vec()))), [8])
    line = next(r.getMessage() for r in caplog.records if r.name == "tensorplan.alloc")
    assert "offline: 3 tensors -> 0.0 MiB, lower bound 0.0 MiB (1.0000x)" in line


def test_inplace_trace_logged(caplog: pytest.LogCaptureFixture) -> None:
    a = ops.cont(vec(), name="a")
    with caplog.at_level(logging.DEBUG, logger="tensorplan.alloc.trace"):
        plan_graph(Graph.build(ops.add(ops.exp(a, name="b"), a, name="c")), [8])
    text = caplog.text
    assert "b: not in place over a: parent has another reader" in text


def test_allocator_doctest() -> None:
    result = doctest.testmod(allocator_module)
    assert result.attempted > 0 and result.failed == 0


def test_dtype_itemsize_drives_sizes() -> None:
    h = ops.cont(ops.input((3,), dt.float16))  # 6 B -> 8 with alignment 8
    assert plan_graph(Graph.build(h), [8]).sizes == [16]

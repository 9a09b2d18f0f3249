"""The `ggml` strategy reproduces ggml-alloc's choices, checked step by step by hand."""

from __future__ import annotations

import pytest

from tensorplan import dtype as dt
from tensorplan import ops
from tensorplan.alloc import GraphAllocator, lower_bound, plan_graph, verify
from tensorplan.alloc.freelist import DynAllocator
from tensorplan.alloc.ggml import INPLACE_OPS
from tensorplan.graph import Graph
from tensorplan.tensor import Tensor

from .checks import FakeBufferType, check_all


def blocks(dyn: DynAllocator, chunk: int = 0) -> list[tuple[int, int]]:
    ch = dyn.chunks[chunk]
    return list(zip(ch.offsets, ch.sizes, strict=True))


# ---- the free list -----------------------------------------------------------------------------
def test_sizes_round_up_to_alignment() -> None:
    dyn = DynAllocator(8, 1 << 40)
    assert dyn.alloc(5) == (0, 0)
    assert dyn.alloc(1) == (0, 8)
    assert dyn.chunk_sizes() == [16]


def test_best_fit_tie_goes_to_highest_offset() -> None:
    # four 16-byte blocks; freeing the 1st and 3rd leaves two equal holes below the tail
    dyn = DynAllocator(8, 1 << 40)
    offs = [dyn.alloc(16)[1] for _ in range(4)]
    assert offs == [0, 16, 32, 48]
    dyn.free(0, 0, 16)
    dyn.free(0, 32, 16)
    assert blocks(dyn)[:2] == [(0, 16), (32, 16)]
    assert dyn.alloc(16) == (0, 32)  # "<=": the later (higher) of equal fits wins
    assert dyn.alloc(16) == (0, 0)


def test_best_fit_prefers_smallest_then_tail() -> None:
    dyn = DynAllocator(8, 1 << 40)
    a, b, c, d, e = (dyn.alloc(n)[1] for n in (32, 8, 16, 8, 8))
    dyn.free(0, a, 32)
    dyn.free(0, c, 16)
    assert dyn.alloc(16) == (0, c)  # the 16-byte hole beats the 32-byte one
    assert dyn.alloc(40) == (0, 72)  # no hole fits: the tail, at the high-water mark
    assert dyn.alloc(24) == (0, 0)  # carved from the front of the 32-byte hole
    assert blocks(dyn)[0] == (24, 8)
    assert (b, d, e) == (32, 56, 64)


def test_free_merges_with_both_neighbours_and_tail() -> None:
    dyn = DynAllocator(8, 1 << 40)
    offs = [dyn.alloc(16)[1] for _ in range(4)]
    dyn.free(0, offs[0], 16)
    dyn.free(0, offs[2], 16)
    dyn.free(0, offs[1], 16)  # bridges the two holes
    assert blocks(dyn)[0] == (0, 48)
    dyn.free(0, offs[3], 16)  # touches the tail: one block is left
    assert len(blocks(dyn)) == 1 and blocks(dyn)[0][0] == 0
    assert dyn.chunk_sizes() == [64]  # the high-water mark stays


def test_chunks_respect_max_size() -> None:
    dyn = DynAllocator(8, 32)
    assert [dyn.alloc(16) for _ in range(3)] == [(0, 0), (0, 16), (1, 0)]
    assert dyn.alloc(64) == (2, 0)  # too big for any chunk: a chunk of its own
    assert dyn.chunk_sizes() == [32, 16, 64]
    dyn.free(1, 0, 16)
    # chunk 1's tail now starts at 0 below its 16-byte high-water mark: reused, no growth
    assert dyn.alloc(8) == (1, 0)


# ---- graphs --------------------------------------------------------------------------------------
def vec(name: str) -> Tensor:
    return ops.input((4,), name=name)  # 16 bytes


def test_graph_tie_break_step_by_step() -> None:
    # x at 0; t1..t5 at 16..80; x freed -> hole [0,16); u (32 B) goes to the tail at 96;
    # t2, t4 freed -> holes [32,48), [64,80); v (16 B) has three equal fits: the highest wins
    x = vec("x")
    ts = [ops.cont(x, name=f"t{i}") for i in range(1, 6)]
    u = ops.concat([ts[1], ts[3]], name="u")
    v = ops.cont(ts[0], name="v")
    w = ops.concat([v, ts[2], ts[4], u], name="w").set_output()
    graph = Graph.build([*ts, u, v, w])
    assert graph.nodes == [*ts, u, v, w]
    plan = plan_graph(graph, [8], "ggml")
    got = {t.name: plan.placements[t].offset for t in plan.placements}
    want = dict(x=0, t1=16, t2=32, t3=48, t4=64, t5=80, u=96, v=64, w=128)
    assert got == want
    assert plan.sizes == [208]
    verify(plan, graph)
    offline = plan_graph(graph, [8], "offline")
    verify(offline, graph)
    assert offline.sizes == list(plan.lower_bound) == lower_bound(graph, 8) == [160]


def test_unread_node_is_never_freed() -> None:
    # a is a graph result nobody reads and is not flagged OUTPUT: ggml never frees it
    x = vec("x")
    a = ops.cont(x, name="a")
    b = ops.cont(ops.cont(x), name="b")
    c = ops.cont(ops.cont(b), name="c")
    graph = Graph.build([a, c])
    for strategy in ("ggml", "offline"):
        plan = plan_graph(graph, [8], strategy)
        verify(plan, graph)
        pa = plan.placements[a]
        for t in graph.nodes[graph.nodes.index(a) + 1 :]:
            pt = plan.placements[t]
            assert pt.offset >= pa.offset + 16 or pt.offset + 16 <= pa.offset, (strategy, t)


def test_inplace_ops_are_ggmls() -> None:
    ggml_list = "add sub mul div scale sqrt gelu silu relu tanh neg exp rms_norm softmax"
    assert set(ggml_list.split()) == INPLACE_OPS
    for name in ("layer_norm", "matmul", "cont", "concat", "im2col", "cast", "copy_into"):
        assert name not in INPLACE_OPS


def test_multi_buffer_plans_each_type_alone() -> None:
    b0, b1 = FakeBufferType("b0", 8), FakeBufferType("b1", 32)
    x = vec("x")
    h = ops.cont(x, name="h")
    h.buffer_id = 1
    out = ops.exp(ops.cont(h), name="out").set_output()
    graph = Graph.build(out)
    galloc = GraphAllocator([b0, b1], strategy="ggml")
    assert galloc.alloc_graph(graph)
    check_all(graph, galloc)
    # b1: h, 16 B aligned to 32; b0: x, then cont(h) where x was (out in place over it)
    assert galloc.buffer_size(1) == 32 and galloc.buffer_size(0) == 16
    assert graph.nodes[1].offset == x.offset == out.offset


# ---- whisper.cpp's conv graph (as whisper.cpp builds it) --------------------------------
def conv_block(x: Tensor, c_in: int, stride: int, name: str) -> Tensor:
    """ggml_conv_1d + bias + gelu as whisper.cpp builds it: im2col (F16), reshape views
    around the matmul, then add (its parent is a view, so not in place) and gelu."""
    d = 384
    l_out = (x.shape[1] + 2 - 3) // stride + 1
    cols = Tensor(
        (l_out, c_in * 3),
        dt.float16,
        op=ops.IM2COL,
        srcs=(x,),
        name=f"{name}.im2col",
        params={"kernel": 3, "stride": stride, "padding": 1},
    )
    w = ops.reshape(ops.param((d, c_in, 3)), (d, c_in * 3))
    mm = ops.matmul(w, ops.reshape(cols, cols.shape), transpose_b=True, name=f"{name}.mm")
    added = ops.add(ops.reshape(mm, mm.shape), ops.param((d, 1)), name=f"{name}.add")
    return ops.gelu(added, name=f"{name}.gelu")


@pytest.fixture
def conv_graph() -> Graph:
    mel = ops.input((80, 3000), name="mel")  # tiny: 80 mels, 2 * 1500 frames
    out = conv_block(conv_block(mel, 80, 1, "c1"), 384, 2, "c2").set_output()
    return Graph.build(out)


def test_whisper_conv_trace(conv_graph: Graph) -> None:
    plan = plan_graph(conv_graph, [32], "ggml")  # CPU: 32-byte TENSOR_ALIGNMENT
    verify(plan, conv_graph)
    mb = {t.name: (p.offset / 1e6, (p.offset + p.size) / 1e6) for t, p in plan.placements.items()}
    assert mb == {
        "mel": (0, 0.96),
        "c1.im2col": (0.96, 2.4),
        "c1.mm": (2.4, 7.008),  # mel freed; too big for [0, 0.96): the tail
        "c1.add": (7.008, 11.616),  # parent is a reshape view: no in place
        "c1.gelu": (7.008, 11.616),  # in place over add
        "c2.im2col": (0, 3.456),  # best fit in the merged [0, 7.008)
        "c2.mm": (3.456, 5.76),  # gelu freed into the tail
        "c2.add": (0, 2.304),
        "c2.gelu": (0, 2.304),
    }
    assert plan.sizes == [11_616_000]  # + META 1,573,520 B = whisper.cpp's "13.19 MB"


def test_whisper_conv_offline_reaches_lower_bound(conv_graph: Graph) -> None:
    ggml = plan_graph(conv_graph, [32], "ggml")
    plan = plan_graph(conv_graph, [32], "offline")
    verify(plan, conv_graph)
    assert plan.sizes == lower_bound(conv_graph, 32) == [9_216_000]  # mm1 + add1
    assert plan.sizes[0] < ggml.sizes[0]

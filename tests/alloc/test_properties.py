"""Property tests: random DAGs (views, in-place chains, flags, external tensors, several
buffer types, small max sizes) planned by both strategies satisfy the whole contract."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensorplan import dtype as dt
from tensorplan import ops
from tensorplan.alloc import UNLIMITED, GraphAllocator, lower_bound, plan_graph, violations
from tensorplan.alloc import liveness as lv
from tensorplan.alloc.plan import buffer_specs
from tensorplan.graph import Graph
from tensorplan.tensor import Flag, Tensor

from .checks import FakeBufferType, PresetBuffer, check_all

SHAPES = [(4,), (8,), (2, 4), (4, 2), (3,), (0, 4), (2, 2, 2)]
UNARY = [
    ops.exp,
    ops.neg,
    ops.gelu,
    ops.relu,
    ops.tanh,
    ops.sqrt,
    ops.silu,
    ops.softmax,
    ops.rms_norm,
    ops.layer_norm,
    ops.cont,
    lambda a: ops.scale(a, 0.5),
]
BINARY = [ops.add, ops.sub, ops.mul, ops.div]


@dataclass
class Case:
    graph: Graph
    bufts: list[FakeBufferType]
    external: list[Tensor] = field(default_factory=list)  # placed before planning


class Builder:
    """Draws a random graph op by op from hypothesis data."""

    def __init__(self, data: st.DataObject, n_buffers: int) -> None:
        self.data, self.n_buffers = data, n_buffers
        self.pool: list[Tensor] = []
        self.external: list[Tensor] = []

    def draw(self, strategy: st.SearchStrategy[object]) -> object:
        return self.data.draw(strategy)

    def pick(self, ok: Callable[[Tensor], bool] = lambda t: True) -> Tensor | None:
        candidates = [t for t in self.pool if ok(t)]
        if not candidates:
            return None
        return candidates[int(self.draw(st.integers(0, len(candidates) - 1)))]  # type: ignore[call-overload]

    def leaf(self) -> Tensor:
        shape = SHAPES[int(self.draw(st.integers(0, len(SHAPES) - 1)))]  # type: ignore[call-overload]
        kind = self.draw(st.sampled_from(["input", "param", "fresh", "preset", "foreign"]))
        if kind == "input":
            t = ops.input(shape)
        elif kind == "param":
            t = ops.param(shape)
            if self.draw(st.booleans()):
                t.place(PresetBuffer(t.nbytes + 64), 64)
        elif kind == "fresh":
            t = ops.new_tensor(shape)  # a leaf that needs memory (ggml's cpy destination)
        elif kind == "preset":
            t = ops.new_tensor(shape)
            t.place(PresetBuffer(t.nbytes + 32), 32)
        else:  # a result of another graph, planned by another allocator, read through ref
            src = ops.exp(ops.cont(ops.input(shape))).set_output()
            GraphAllocator([FakeBufferType("other")]).alloc_graph(Graph.build(src))
            self.external.append(src)
            t = ops.ref(src)
        if kind in ("param", "preset") and t.buffer is not None:
            self.external.append(t)
        t.buffer_id = int(self.draw(st.integers(0, self.n_buffers - 1)))  # type: ignore[call-overload]
        return t

    def node(self) -> Tensor | None:
        kinds = "unary unary binary binary view matmul concat cast copy mean".split()
        kind = self.draw(st.sampled_from(kinds))
        a = self.pick()
        if a is None:
            return None
        if kind == "unary":
            return UNARY[int(self.draw(st.integers(0, len(UNARY) - 1)))](a)  # type: ignore[call-overload]
        if kind == "binary":
            b = self.pick(lambda t: t.shape == a.shape and t.dtype == a.dtype) or a
            return BINARY[int(self.draw(st.integers(0, 3)))](a, b)  # type: ignore[call-overload]
        if kind == "view":
            return self.view(a)
        if kind == "matmul":
            b = self.pick(
                lambda t: (
                    t.ndim == 2 and a.ndim == 2 and t.shape[0] == a.shape[1] and t.dtype == a.dtype
                )
            )
            return ops.matmul(a, b) if b is not None else None
        if kind == "concat":
            b = self.pick(lambda t: t.shape[1:] == a.shape[1:] and t.dtype == a.dtype)
            return ops.concat([a, b or a])
        if kind == "cast":
            return ops.cast(a, dt.float16 if a.dtype == dt.float32 else dt.float32)
        if kind == "copy":
            return self.copy(a)
        return ops.mean(a) if a.ndim else None

    def view(self, a: Tensor) -> Tensor | None:
        how = self.draw(st.sampled_from(["reshape", "permute", "view"]))
        if how == "permute" and a.ndim >= 2:
            return ops.transpose(a)
        if not a.is_contiguous:
            return None
        if how == "reshape":
            return ops.reshape(a, (-1,))
        n = a.size // 2
        return ops.view(a, (n,), offset=(a.size - n) * a.dtype.itemsize) if n else None

    def copy(self, a: Tensor) -> Tensor:
        dst = self.pick(
            lambda t: (
                t.shape == a.shape
                and t.dtype == a.dtype
                and t.op is None
                and t.view_src is None
                and not t.flags & Flag.PARAM
            )
        )
        if dst is None:
            dst = ops.new_tensor(a.shape, a.dtype)
            dst.buffer_id = int(self.draw(st.integers(0, self.n_buffers - 1)))  # type: ignore[call-overload]
        return ops.copy_into(a, dst)

    def flags(self, t: Tensor) -> None:
        if t.view_src is None and t.op is not None:
            t.buffer_id = int(self.draw(st.integers(0, self.n_buffers - 1)))  # type: ignore[call-overload]
        roll = int(self.draw(st.integers(0, 19)))  # type: ignore[call-overload]
        if roll < 2:
            t.set_output()
        elif roll == 2 and t.op is not None and t.view_src is None:
            t.set_input()  # an INPUT node: odd, but allowed


@st.composite
def cases(draw: st.DrawFn) -> Case:
    n_buffers = draw(st.integers(1, 3))
    bufts = [
        FakeBufferType(
            f"b{i}",
            draw(st.sampled_from([1, 4, 8, 16, 64])),
            draw(st.sampled_from([UNLIMITED, UNLIMITED, 32, 64, 128])),
        )
        for i in range(n_buffers)
    ]
    b = Builder(draw(st.data()), n_buffers)
    for _ in range(draw(st.integers(1, 4))):
        b.pool.append(b.leaf())
    for _ in range(draw(st.integers(1, 18))):
        t = b.node()
        if t is not None:
            b.flags(t)
            b.pool.append(t)
    k = draw(st.integers(1, 3))
    outputs = b.pool[-k:]
    return Case(Graph.build(outputs), bufts, b.external)


def check_case(case: Case, strategy: str) -> None:
    graph, bufts = case.graph, case.bufts
    plan = plan_graph(graph, bufts, strategy, budget_s=60, max_nodes=300)
    assert violations(plan, graph) == []
    lb = lower_bound(graph, bufts)
    assert list(plan.lower_bound) == lb  # two independent lower bounds agree
    assert all(size >= bound for size, bound in zip(plan.sizes, lb, strict=True))
    again = plan_graph(graph, bufts, strategy, budget_s=60, max_nodes=300)
    assert again.placements == plan.placements and again.chunk_sizes == plan.chunk_sizes
    before = {t: (t.buffer, t.offset, t.placed_by) for t in case.external}
    galloc = GraphAllocator(bufts, strategy, budget_s=60, max_nodes=300)
    assert galloc.reserve(graph) == plan.sizes
    assert all(
        t.buffer is None or t in before or t.view_src is not None for t in graph.tensors()
    )  # reserve bound nothing
    assert galloc.alloc_graph(graph)
    assert {t: (t.buffer, t.offset, t.placed_by) for t in case.external} == before
    check_all(graph, galloc)
    assert galloc.plan is not None and violations(galloc.plan, graph) == []


SETTINGS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.mark.parametrize("strategy", ["offline", "exact", "ggml"])
@SETTINGS
@given(case=cases())
def test_random_graphs_keep_the_contract(strategy: str, case: Case) -> None:
    check_case(case, strategy)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["offline", "ggml"])
@settings(
    max_examples=1_500,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(case=cases())
def test_random_graphs_keep_the_contract_long(strategy: str, case: Case) -> None:
    check_case(case, strategy)


@SETTINGS
@given(case=cases())
def test_offline_never_worse_than_ggml_in_one_buffer(case: Case) -> None:
    # not a law of packing in general, but with in-place a superset of ggml's and several
    # orders tried it should hold on small graphs; a counterexample is worth a look
    for t in case.graph.tensors():
        t.buffer_id = 0
    off = plan_graph(case.graph, [64], "offline", budget_s=0.01)
    gg = plan_graph(case.graph, [64], "ggml")
    assert off.sizes[0] <= gg.sizes[0]


def _columns(live: lv.Liveness) -> tuple[object, ...]:
    return (live.members, live.block_of, live.buffer_id, live.start, live.end, live.size,
            dict(live.inplace), dict(live.refusals))


@SETTINGS
@given(case=cases(), data=st.data())
def test_in_order_analysis_equals_the_general_one(case: Case, data: st.DataObject) -> None:
    # the fast analysis (pos filled as the scan goes) and the general one (pos built
    # first, tensors listed twice read at each listing) agree on every graph Graph.build
    # makes; a graph listing a node twice, or a node before its src, falls back to the
    # general one (the planner reads a node's place in the list as its step, so the
    # rotated graph is another graph, which the planner has never promised to plan right)
    graph, specs = case.graph, buffer_specs(case.bufts)
    fast = lv.analyze(graph, specs)
    general = lv._Analysis(graph, None, lv.op_allows_inplace, True).run(specs, in_order=False)
    assert _columns(fast) == _columns(general)
    nodes = list(graph.nodes)
    if not nodes:
        return  # no node to list twice or rotate: the first comparison is the whole check
    i = data.draw(st.integers(0, len(nodes) - 1))
    for odd in (Graph(nodes + [nodes[i]], graph.leafs, graph.outputs),
                Graph(nodes[i:] + nodes[:i], graph.leafs, graph.outputs)):
        assert _columns(lv.analyze(odd, specs)) == _columns(
            lv._Analysis(odd, None, lv.op_allows_inplace, True).run(specs, in_order=False))

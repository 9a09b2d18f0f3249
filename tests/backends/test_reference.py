"""reference.evaluate: an unplanned run that agrees bit for bit with a planned numpy run,
and in float64 mode matches the formulas to float64 precision."""

from __future__ import annotations

import numpy as np
import pytest
from backend_cases import CASES, Case, assert_close, place_all

from tensorplan import ops
from tensorplan.backends import NumpyBackend, evaluate
from tensorplan.graph import Graph
from tensorplan.tensor import Tensor

CASES64 = [c for c in CASES if c.tol64 is not None]


def _graph(case: Case) -> tuple[Graph, list[Tensor], Tensor]:
    leafs = case.leafs()
    node = case.build(*leafs)
    return Graph.build(node), leafs, node


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_planned_numpy_run_is_bit_exact(case: Case) -> None:
    graph, leafs, node = _graph(case)
    values = case.sample(np.random.default_rng(1))
    want = evaluate(graph, dict(zip(leafs, values, strict=True)))[node]
    backend = NumpyBackend()
    place_all(graph, backend)
    for t, v in zip(leafs, values, strict=True):
        backend.set(t, v)
    backend.compute(graph)
    got = backend.get(node)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("case", CASES64, ids=[c.id for c in CASES64])
def test_float64_mode_matches_the_formula(case: Case) -> None:
    graph, leafs, node = _graph(case)
    values = case.sample(np.random.default_rng(2))
    got = evaluate(graph, dict(zip(leafs, values, strict=True)), float64=True)[node]
    if got.dtype.kind == "f":
        assert got.dtype == np.float64
    assert case.tol64 is not None
    assert_close(got, case.want(values), case.tol64)


def test_inputs_are_copied_never_written() -> None:
    src, dst = ops.input((2, 3)), ops.input((4, 3))
    node = ops.copy_into(src, ops.view(dst, (2, 3), offset=12))
    dst_value = np.zeros((4, 3), np.float32)
    out = evaluate(Graph.build(node), {src: np.ones((2, 3)), dst: dst_value})
    assert not dst_value.any()
    np.testing.assert_array_equal(out[node], 1)
    # the view leaf and the root's untouched rows live in the same private bytes
    np.testing.assert_array_equal(out[dst], [[0, 0, 0], [1, 1, 1], [1, 1, 1], [0, 0, 0]])


def test_view_leafs_look_through_their_root() -> None:
    cache = ops.new_tensor((4, 3), name="cache")  # an earlier graph's tensor, not in this one
    y = ops.scale(ops.ref(cache), 2.0)
    value = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.testing.assert_array_equal(evaluate(Graph.build(y), {cache: value})[y], value * 2)


def test_params_and_read_fallback() -> None:
    backend = NumpyBackend()
    w = backend.param(np.full((3,), 2.0, np.float32), "w")
    b = ops.param((3,), name="b")
    x = ops.input((2, 3))
    y = ops.add(ops.mul(x, w), b)
    out = evaluate(Graph.build(y), {x: np.ones((2, 3))}, {b: np.ones(3)}, read=backend.get)
    np.testing.assert_array_equal(out[y], 3)


def test_missing_and_misshapen_values() -> None:
    x = ops.input((2, 3), name="x")
    y = ops.neg(x)
    with pytest.raises(KeyError, match="x"):
        evaluate(Graph.build(y), {})
    with pytest.raises(ValueError, match="shape"):
        evaluate(Graph.build(y), {x: np.ones((3, 2))})

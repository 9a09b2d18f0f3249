"""Which kernel the torch backend gives a product of few rows: numpy's OpenBLAS, except
attention against one contiguous block, which PyTorch multiplies without copying it."""

from __future__ import annotations

import numpy as np
import pytest
from backend_cases import place_all, rel_rms

from tensorplan import dtype as dt
from tensorplan import ops
from tensorplan.backends import torch_available
from tensorplan.graph import Graph

pytestmark = pytest.mark.skipif(not torch_available(), reason="PyTorch not installed")


def test_attention_against_a_contiguous_block_goes_to_pytorch_and_a_strided_one_does_not():
    from tensorplan.backends.torch_cpu import _attends_contiguously

    q = ops.input((8, 6, 1, 64), dt.float32, "q")
    keys = ops.input((8, 6, 1500, 64), dt.float32, "k")  # head-major, as the cross K/V
    assert _attends_contiguously(ops.matmul(q, keys, transpose_b=True))
    rows = ops.input((1500, 384), dt.float32, "rows")  # heads split out of one (T, d) cache
    heads = ops.view(rows, (1, 6, 1500, 64), (0, 64 * 4, 384 * 4, 4))
    one = ops.input((1, 6, 1, 64), dt.float32, "q1")
    assert not _attends_contiguously(ops.matmul(one, heads, transpose_b=True))
    weight = ops.input((51864, 384), dt.float32, "w")  # a 2-D weight: OpenBLAS's gemv
    assert not _attends_contiguously(ops.matmul(ops.input((1, 384), dt.float32, "x"),
                                                weight, transpose_b=True))


@pytest.mark.parametrize("n_query", [1, 5])
def test_both_routes_give_the_float64_product(n_query):
    from tensorplan.backends.torch_cpu import TorchBackend

    rng = np.random.default_rng(n_query)
    q = rng.standard_normal((4, 6, n_query, 64)).astype(np.float32)
    k = rng.standard_normal((4, 6, 300, 64)).astype(np.float32)
    want = q.astype(np.float64) @ np.swapaxes(k, -1, -2).astype(np.float64)
    leafs = [ops.input(q.shape, dt.float32, "q"), ops.input(k.shape, dt.float32, "k")]
    node = ops.matmul(*leafs, transpose_b=True)
    backend = TorchBackend()
    graph = Graph.build(node)
    place_all(graph, backend)
    backend.set(leafs[0], q)
    backend.set(leafs[1], k)
    backend.compute(graph)
    assert rel_rms(np.asarray(backend.get(node)), want) <= 1e-6

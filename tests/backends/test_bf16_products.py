"""bfloat16 products on the torch backend: products whose precision allows it (int8
weights' and float32 operands' alike) run in bfloat16 where the backend chooses to (CPUs
with AMX, or forced here); everything else keeps its float32 or int8 kernel."""

from __future__ import annotations

import numpy as np
import pytest
from backend_cases import place_all, rel_rms

from tensorplan import dtype as dt
from tensorplan import ops
from tensorplan.backends import torch_available
from tensorplan.graph import Graph
from tensorplan.tensor import Tensor

pytestmark = pytest.mark.skipif(not torch_available(), reason="PyTorch not installed")


def _backend(bf16: bool | None):
    from tensorplan.backends.torch_cpu import TorchBackend

    return TorchBackend(bf16=bf16)


def _run(backend, node: Tensor, leafs: list[Tensor], values: list[np.ndarray]) -> np.ndarray:
    graph = Graph.build(node)
    place_all(graph, backend)
    for t, v in zip(leafs, values, strict=True):
        backend.set(t, v)
    backend.compute(graph)
    return np.asarray(backend.get(node))


def _qmatmul_case(hint: str, rng: np.random.Generator):
    a = rng.standard_normal((300, 64)).astype(np.float32) * rng.uniform(0.1, 4, (300, 1))
    q = rng.integers(-127, 128, (48, 64)).astype(np.int8)
    scale = rng.uniform(1e-3, 2e-2, 48).astype(np.float32)
    leafs = [ops.input(a.shape, dt.float32, "a"), ops.input(q.shape, dt.int8, "q"),
             ops.input(scale.shape, dt.float32, "s")]
    want = a.astype(np.float64) @ (q * scale[:, None].astype(np.float64)).T
    return ops.qmatmul(*leafs, precision=hint), leafs, [a, q, scale], want


@pytest.mark.parametrize("hint", ["bfloat16", "float32"])
def test_an_int8_product_runs_on_a_bfloat16_copy_of_its_weight_only_where_allowed(hint):
    """Where its precision allows (the encoder's products), on a bfloat16 copy of the
    weight; elsewhere (a decoder step, however many rows a batch gives it) on FBGEMM."""
    backend = _backend(True)
    node, leafs, values, want = _qmatmul_case(hint, np.random.default_rng(3))
    got = _run(backend, node, leafs, values)
    # bfloat16 operands: ~3e-3; FBGEMM's 7-bit activations: ~1.5e-2 (measured)
    assert rel_rms(got, want) <= (1e-2 if hint == "bfloat16" else 3e-2)
    assert backend.bf16_nbytes == (48 * 64 * 2 if hint == "bfloat16" else 0)


def test_a_matmul_rounds_to_bfloat16_only_where_its_precision_allows():
    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal((300, 64)).astype(np.float32) for _ in range(2))
    want = a.astype(np.float64) @ b.astype(np.float64).T
    errors = {}
    for hint in ("float32", "bfloat16"):
        for bf16 in (False, True):
            leafs = [ops.input(a.shape, dt.float32, "a"), ops.input(b.shape, dt.float32, "b")]
            node = ops.matmul(*leafs, transpose_b=True, precision=hint)
            errors[hint, bf16] = rel_rms(_run(_backend(bf16), node, leafs, [a, b]), want)
    assert errors["float32", False] <= 1e-6 and errors["float32", True] <= 1e-6
    assert errors["bfloat16", False] <= 1e-6  # the backend chose float32
    assert 1e-4 <= errors["bfloat16", True] <= 1e-2  # rounded, and only that much


def test_a_matmul_refuses_an_unknown_precision():
    a = ops.input((4, 4), dt.float32, "a")
    with pytest.raises(ValueError, match="precision"):
        ops.matmul(a, a, precision="float16")
    q = ops.input((4, 4), dt.int8, "q")
    with pytest.raises(ValueError, match="precision"):
        ops.qmatmul(a, q, ops.input((4,), dt.float32, "s"), precision="int4")


@pytest.mark.parametrize(("value", "expected"), [("0", False), ("1", True)])
def test_the_environment_turns_bfloat16_products_off_or_on(monkeypatch, value, expected):
    from tensorplan.backends.torch_kernels import BF16_ENV

    monkeypatch.setenv(BF16_ENV, value)
    assert _backend(None).bf16_products is expected

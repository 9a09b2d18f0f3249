"""Unplanned evaluation, the golden path for planned runs.

Every root tensor gets fresh bytes of its own and every view is a numpy view of its
root's bytes, so nothing is shared and nothing is reused. The kernels and the layouts are
the planned run's, so for one graph the results agree bit for bit; only where tensors
live differs. With float64=True every float tensor is widened to float64 (its strides and
view offsets scaled alike) for golden tests against formulas.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from tensorplan.backends.kernels import KERNELS, executes
from tensorplan.backends.numpy_cpu import aligned_bytes
from tensorplan.graph import Graph
from tensorplan.tensor import Tensor

Reader = Callable[[Tensor], Any]


class _Memory:
    """Fresh bytes per root, filled from the given values for roots no node computes."""

    def __init__(self, values: Mapping[Tensor, Any], read: Reader | None, wide: bool) -> None:
        self.values, self.read, self.wide = values, read, wide
        self.roots: dict[Tensor, np.ndarray] = {}

    def dtype(self, t: Tensor) -> np.dtype[Any]:
        d = np.dtype(t.dtype.name)
        return np.dtype(np.float64) if self.wide and d.kind == "f" else d

    def array(self, t: Tensor) -> np.ndarray:
        root = t.root
        if root not in self.roots:
            self._make_root(root)
        d = self.dtype(t)
        widen = d.itemsize // t.dtype.itemsize  # 1, or 2/4 for float32/float16 in float64 mode
        return np.ndarray(
            t.shape,
            d,
            buffer=self.roots[root],
            offset=t.view_offset * widen,
            strides=tuple(s * widen for s in t.strides),
        )

    def _make_root(self, root: Tensor) -> None:
        widen = self.dtype(root).itemsize // root.dtype.itemsize
        self.roots[root] = aligned_bytes(root.nbytes * widen, 64)
        if root.op is not None:
            return  # a node: computed by the graph
        if root in self.values:
            value = np.asarray(self.values[root])
        elif self.read is not None:
            value = np.asarray(self.read(root))
        else:
            raise KeyError(f"no value for leaf {root!r}: pass it in inputs/params or give read=")
        if value.shape != root.shape:
            raise ValueError(f"value for {root!r} has shape {value.shape}")
        np.copyto(self.array(root), value, casting="same_kind")


def evaluate(
    graph: Graph,
    inputs: Mapping[Tensor, Any],
    params: Mapping[Tensor, Any] | None = None,
    *,
    read: Reader | None = None,
    float64: bool = False,
) -> dict[Tensor, np.ndarray]:
    """Run `graph` without a plan and return an array for each of its tensors.

    inputs, params: values by tensor for the leafs, or for the roots that view leafs
        (ops.ref) look through; each is copied, never written.
    read: where roots missing from both come from, e.g. NumpyBackend.get for weights and
        external tensors that already hold their values.
    float64: widen every float tensor to float64.
    Raises KeyError for a leaf with no value, ValueError for a value of the wrong shape.
    """
    mem = _Memory({**(params or {}), **inputs}, read, float64)
    out = {t: mem.array(t) for t in graph.leafs}
    for node in graph.nodes:
        out[node] = mem.array(node)
        if executes(node):
            assert node.op is not None
            srcs = [out[s] if s in out else mem.array(s) for s in node.srcs]
            KERNELS[node.op.name](out[node], srcs, node.params)
    return out

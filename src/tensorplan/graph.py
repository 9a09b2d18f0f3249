"""A compute graph: nodes in execution order plus the leafs they read.

Built deterministically from its outputs by a depth-first walk over `srcs` (srcs in
index order, each tensor once), like ggml_build_forward_expand. Tensors with no op are
leafs; every tensor with an op is a node, including view nodes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tensorplan.tensor import Tensor


@dataclass(eq=False)
class Graph:
    nodes: list[Tensor]
    leafs: list[Tensor]
    outputs: list[Tensor]

    @classmethod
    def build(cls, outputs: Sequence[Tensor] | Tensor) -> Graph:
        outs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
        nodes: list[Tensor] = []
        leafs: list[Tensor] = []
        seen: set[int] = set()
        for out in outs:
            # iterative post-order DFS: deep graphs (100k nodes) must not hit the recursion limit
            stack: list[tuple[Tensor, int]] = [(out, 0)]
            while stack:
                t, i = stack.pop()
                if i == 0:
                    if id(t) in seen:
                        continue
                    seen.add(id(t))
                if t.op is not None and i < len(t.srcs):
                    stack.append((t, i + 1))
                    src = t.srcs[i]
                    if id(src) not in seen:
                        stack.append((src, 0))
                    continue
                (nodes if t.op is not None else leafs).append(t)
        return cls(nodes, leafs, outs)

    def tensors(self) -> Iterable[Tensor]:
        yield from self.leafs
        yield from self.nodes

    def __len__(self) -> int:
        return len(self.nodes)

    def summary(self) -> str:
        return f"Graph({len(self.nodes)} nodes, {len(self.leafs)} leafs)"

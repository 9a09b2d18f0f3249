"""`plan_graph`: a pure function from a graph to a Plan, with either strategy.

Both strategies share the liveness analysis for the lower bound; `offline` also places its
blocks (one packing per buffer id), `ggml` replays ggml-alloc's online rules instead.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from types import MappingProxyType

from tensorplan.alloc import ggml
from tensorplan.alloc.liveness import Liveness, analyze
from tensorplan.alloc.offline import DEFAULT_BUDGET_S, MAX_PASSES, node_limit, solve
from tensorplan.alloc.plan import (
    STRATEGIES,
    BufferSpec,
    Placement,
    Plan,
    SizedBufferType,
    buffer_specs,
)
from tensorplan.graph import Graph
from tensorplan.tensor import Tensor

# The search's default node limit for graphs: none. Models are planned at load, where
# milliseconds count, and their greedy plans reach the lower bound in the first pass; a
# search node costs 50-100 µs, so even a few hundred would break the 5 µs-per-tensor
# budget of a small graph that misses the bound (a 130-block random DAG 1.3% above it
# took 50 µs per tensor with 2,000 nodes). Pass max_nodes to search all the same.
GRAPH_MAX_NODES = 0
GRAPH_SEARCH_ABOVE = 0.01  # with max_nodes given: search only a plan >1% above the bound
# Greedy passes after the first, for graphs: largest first reaches the bound on every
# model graph, so more passes only help graphs no model resembles, and without a cap a
# small graph that misses the bound spends the whole heuristic budget (50 ms) on them.
GRAPH_MAX_PASSES = 2

log = logging.getLogger("tensorplan.alloc")
trace = logging.getLogger("tensorplan.alloc.trace")  # one line per in-place decision


def plan_graph(
    graph: Graph,
    buffer_types: Sequence[SizedBufferType | int] | int,
    strategy: str = "offline",
    budget_s: float = DEFAULT_BUDGET_S,
    owner: object | None = None,
    max_nodes: int | None = None,
) -> Plan:
    """Plan `graph` for buffer types (or bare alignments). Reads tensors, changes none.

    `owner` is the allocator on whose behalf to plan: tensors it placed earlier are planned
    again; tensors placed by anyone else are external. Raises PlanError for a tensor whose
    buffer id has no buffer type or a node reading a tensor outside the graph."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose from {STRATEGIES}")
    specs = buffer_specs(buffer_types)
    t0 = time.perf_counter()
    with _no_cyclic_gc():  # _place returns first, so its lists are freed, not scanned, then
        placed, chunk_sizes, lower, inplace = _place(
            graph, specs, strategy, budget_s, owner, max_nodes
        )
    plan = Plan(
        strategy=strategy,
        specs=specs,
        placements=MappingProxyType(placed),
        chunk_sizes=chunk_sizes,
        lower_bound=lower,
        inplace=MappingProxyType(inplace),
        owner=owner,
    )
    if log.isEnabledFor(logging.DEBUG):
        log.debug("%s in %.1f ms", plan.summary(), (time.perf_counter() - t0) * 1e3)
    return plan


def _place(
    graph: Graph,
    specs: Sequence[BufferSpec],
    strategy: str,
    budget_s: float,
    owner: object | None,
    max_nodes: int | None,
) -> tuple[
    dict[Tensor, Placement], tuple[tuple[int, ...], ...], tuple[int, ...], Mapping[Tensor, Tensor]
]:
    """plan_graph's work: placements, chunk sizes, lower bound and in-place map."""
    tracing = trace.isEnabledFor(logging.DEBUG)
    live = analyze(graph, specs, owner, explain=tracing)
    lower = tuple(live.lower_bound(len(specs)))
    inplace: Mapping[Tensor, Tensor]
    if strategy == "ggml":
        placed, chunk_sizes, inplace = ggml.simulate(graph, specs, owner)
    else:
        if max_nodes is None and strategy == "offline":
            max_nodes = GRAPH_MAX_NODES
        nodes = node_limit(strategy, max_nodes)
        placed, chunk_sizes = _pack_blocks(live, specs, budget_s, nodes)
        inplace = live.inplace  # made for this plan alone: no copy
    if tracing:
        _trace_inplace(live, strategy, inplace)
    return placed, chunk_sizes, lower, inplace


@contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """Planning makes a few small objects per tensor and no cycles; with the cyclic GC on,
    each collection rescans every live object of the process (all tensors of all graphs),
    which cost a third of the planning time at 100k tensors."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _pack_blocks(
    live: Liveness, specs: Sequence[BufferSpec], budget_s: float, max_nodes: int | None
) -> tuple[dict[Tensor, Placement], tuple[tuple[int, ...], ...]]:
    """Offline packing of each buffer id's blocks; every tensor of a block shares its spot."""
    n = len(live)
    offsets, chunks = [0] * n, [0] * n
    chunk_sizes: list[tuple[int, ...]] = []
    used = set(live.buffer_id)
    for bid, spec in enumerate(specs):
        if used == {bid}:  # the common case: one buffer id, every block
            blocks: Sequence[int] = range(n)
            lo, hi, size = live.start, live.end, live.size
        else:
            blocks = [i for i, b in enumerate(live.buffer_id) if b == bid]
            lo = [live.start[i] for i in blocks]
            hi = [live.end[i] for i in blocks]
            size = [live.size[i] for i in blocks]
        packed = solve(
            lo,
            hi,
            size,
            capacity=spec.max_size,
            budget_s=budget_s / max(len(used), 1),
            max_nodes=max_nodes,
            search_above=GRAPH_SEARCH_ABOVE if max_nodes is not None else 0.0,
            max_passes=GRAPH_MAX_PASSES if max_nodes is not None else MAX_PASSES,
        )
        chunk_sizes.append(tuple(packed.chunk_sizes))
        if isinstance(blocks, range):
            offsets, chunks = packed.offsets, packed.chunks
        else:
            for i, off, chunk in zip(blocks, packed.offsets, packed.chunks, strict=True):
                offsets[i], chunks[i] = off, chunk
    spots = _spots(live.buffer_id, chunks, offsets, live.size)
    tensors = map(live.tensors.__getitem__, live.planned)  # not live.members: one pass less
    return dict(zip(tensors, map(spots.__getitem__, live.block_of), strict=True)), tuple(
        chunk_sizes
    )


def _spots(
    buffer_ids: list[int], chunks: list[int], offsets: list[int], sizes: list[int]
) -> list[Placement]:
    """One Placement per block, blocks at the same spot sharing one: they are values, and
    each object that outlives the plan is scanned again by the next garbage collection
    (at 100k tensors that scan cost more than building them)."""
    made: dict[tuple[int, int, int, int], Placement] = {}
    new = tuple.__new__
    out = []
    for key in zip(buffer_ids, chunks, offsets, sizes, strict=True):
        p = made.get(key)
        if p is None:
            p = made[key] = new(Placement, key)
        out.append(p)
    return out


def _trace_inplace(live: Liveness, strategy: str, inplace: Mapping[Tensor, Tensor]) -> None:
    for node, parent in inplace.items():
        trace.debug("%s: in place over %s", node.name or node, parent.name or parent)
    if strategy == "ggml":
        return  # the refusals below are the offline rule's, not ggml's
    for node, refused in live.refusals.items():
        for candidate, reason in refused:
            over = "" if candidate is None else f" over {candidate.name or candidate}"
            trace.debug("%s: not in place%s: %s", node.name or node, over, reason)

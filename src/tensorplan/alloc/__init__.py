"""The graph memory planner: tensors in, (buffer, chunk, offset) out.

Knows nothing of tensor data, devices or Whisper (numpy appears only as the repair's
arithmetic over offsets); reads a tensor only through its size, layout, view root, flags,
inputs, op and buffer id (docs/allocator.md, the allocator contract). Three
strategies: `offline` (default: all lifetimes known up front, packed to the lower bound
where it can, with a bounded search), `exact` (searches until the optimum is proven or the
budget ends) and `ggml` (ggml-alloc's online rules, the faithful baseline).

How to read it, top down along the graph path (as ggml-alloc.c reads: graph allocator,
dynamic allocator, tensor allocator):
- allocator.py: `GraphAllocator`, the object a backend holds: plans, owns buffers, binds;
- planner.py: `plan_graph`, a graph to a `Plan` (plan.py: the values handed back);
- liveness.py: live intervals and in-place decisions, grouped into blocks of bytes;
- offline.py (default) or ggml.py (ggml-alloc's rules): blocks to offsets;
- freelist.py: ggml-alloc's dynamic allocator on plain ints, which ggml.py drives.
Beside the path: verify.py (an independent checker and the lower bound), pack.py and
trace.py (plain lifetimes with no graph, and their CSV files), and search/ (the hard-trace
search, entered only from offline.py).
"""

from __future__ import annotations

from tensorplan.alloc.allocator import GraphAllocator
from tensorplan.alloc.offline import DEFAULT_BUDGET_S, DEFAULT_MAX_NODES
from tensorplan.alloc.pack import Packing, pack
from tensorplan.alloc.plan import STRATEGIES, UNLIMITED, BufferSpec, Placement, Plan, PlanError
from tensorplan.alloc.planner import plan_graph
from tensorplan.alloc.verify import lower_bound, verify, violations
from tensorplan.tensor import BufferType

__all__ = [
    "DEFAULT_BUDGET_S",
    "DEFAULT_MAX_NODES",
    "STRATEGIES",
    "UNLIMITED",
    "BufferSpec",
    "BufferType",
    "GraphAllocator",
    "Packing",
    "Placement",
    "Plan",
    "PlanError",
    "lower_bound",
    "pack",
    "plan_graph",
    "verify",
    "violations",
]

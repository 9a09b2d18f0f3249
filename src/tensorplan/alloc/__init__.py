"""The graph memory planner: tensors in, (buffer, chunk, offset) out.

Knows nothing of numpy, devices or Whisper; reads a tensor only through its size, layout,
view root, flags, inputs, op and buffer id (docs/allocator.md, the allocator contract). Three
strategies: `offline` (default: all lifetimes known up front, packed to the lower bound
where it can, with a bounded search), `exact` (searches until the optimum is proven or the
budget ends) and `ggml` (ggml-alloc's online rules, the faithful baseline).
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

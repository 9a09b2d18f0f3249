"""The graph memory planner: tensors in, (buffer, chunk, offset) out.

Knows nothing of numpy, devices or Whisper; reads a tensor only through its size, layout,
view root, flags, inputs, op and buffer id (DESIGN.md, the allocator contract). Two
strategies: `offline` (default: all lifetimes known up front, packed to the lower bound
where it can) and `ggml` (ggml-alloc's online rules, the faithful baseline).
"""

from __future__ import annotations

from tensorplan.alloc.allocator import GraphAllocator
from tensorplan.alloc.offline import DEFAULT_BUDGET_S
from tensorplan.alloc.pack import Packing, pack
from tensorplan.alloc.plan import STRATEGIES, UNLIMITED, BufferSpec, Placement, Plan, PlanError
from tensorplan.alloc.planner import plan_graph
from tensorplan.alloc.verify import lower_bound, verify, violations
from tensorplan.tensor import BufferType

__all__ = [
    "DEFAULT_BUDGET_S",
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

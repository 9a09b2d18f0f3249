"""tensorplan: a tensor-graph runtime built around a static graph memory planner."""

__version__ = "0.1.0"

"""tensorplan: a tensor-graph runtime built around a static graph memory planner."""

import os as _os

# OpenBLAS's idle worker threads spin for ~2^28 cycles after each parallel product. On a
# small shared machine they then steal the core the next one-thread product needs: one
# decoder token went from 14 ms to 75 ms (threads.py switches small products to one
# thread). Spinning only briefly fixes it; this must be set before OpenBLAS loads, i.e.
# before numpy is first imported, and a value the user chose is kept.
_os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

__version__ = "0.1.0"

"""tensorplan: a tensor-graph runtime built around a static graph memory planner."""

import os as _os

# OpenBLAS's idle worker threads spin for ~2^28 cycles after each parallel product. On a
# small shared machine they then steal the core the next one-thread product needs: one
# decoder token went from 14 ms to 75 ms (threads.py switches small products to one
# thread). Spinning only briefly fixes it; this must be set before OpenBLAS loads, i.e.
# before numpy is first imported, and a value the user chose is kept.
_os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
# The same for PyTorch's OpenMP threads (the torch backend): spinning after each parallel
# kernel, they fought OpenBLAS's for the 2 cores and a decoder token took 26 ms instead
# of 10.6 (measured, jfk, tiny.en). Read when libgomp loads, i.e. at the first torch import.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"

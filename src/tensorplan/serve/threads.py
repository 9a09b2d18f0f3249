"""CPU threads per session, so concurrent sessions never fight over the same cores.

The cores are divided once, at start-up: each of N sessions gets cores // N threads (at
least one). Dividing them again as sessions become busy or idle would need the kernels to
read a per-session count: the torch backend sets its thread count itself, per kernel, from
the count it found when it was imported, so a count changed later would be overwritten.
The knobs: PyTorch's intra-op count (OpenMP's is per OS thread, so each worker thread sets
its own as it starts) and the BLAS pools (process-wide, through threadpoolctl).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any


def cores() -> int:
    """The cores this process may run on (its affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@dataclass(frozen=True, slots=True)
class ThreadBudget:
    per_session: int

    @classmethod
    def divide(cls, n_sessions: int, n_cores: int | None = None) -> ThreadBudget:
        return cls(max(1, (n_cores or cores()) // max(1, n_sessions)))

    def configure_process(self) -> None:
        """Before the model loads: the counts its backends read when they start."""
        from threadpoolctl import threadpool_limits

        threadpool_limits(self.per_session)
        for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[name] = str(self.per_session)  # for libraries not loaded yet
        self.enter_worker()

    def enter_worker(self) -> None:
        """In each session's worker thread, as it starts."""
        torch: Any = sys.modules.get("torch")  # loaded by the torch backend, if it is used
        if torch is not None:
            torch.set_num_threads(self.per_session)

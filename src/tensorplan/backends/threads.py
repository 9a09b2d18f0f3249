"""CPU thread pools in one place: how many threads, and one thread for small products.

`configure(n)` sets the count every pool uses (OpenBLAS through threadpoolctl, PyTorch's
intra-op pool, onnxruntime's sessions read `count()`); None means this process's cores.

OpenBLAS wakes every worker thread for each call. For the decoder's one-row products
that costs far more than the arithmetic, and when another process shares the cores the
spinning threads make a 0.1 ms product take 16 ms (measured on this project's 2-core
machine). So `for_product` runs small products on one thread and big ones (the
encoder's) on all of them.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

SMALL_PRODUCT = 2_000_000  # multiply-adds below which one thread is faster

_state: dict[str, Any] = {}


def cores() -> int:
    """The CPUs this process may run on (its affinity mask, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def count() -> int:
    """Threads a pool should use: the configured count, else this process's cores."""
    n = _state.get("threads")
    return int(n) if n else cores()


def configure(n: int | None) -> int:
    """Use `n` threads (None: the cores) in every pool from now on; returns the count."""
    _state["threads"] = n
    want = count()
    lib = _blas()
    if lib is not None:
        _state["default"] = want
        if _state["current"] != want:
            lib.set_num_threads(want)
            _state["current"] = want
    torch = sys.modules.get("torch")  # only if already imported: never pay its import here
    if torch is not None:
        torch.set_num_threads(want)
    return want


def _blas() -> Any:
    if "lib" not in _state:
        _state["lib"] = None
        if os.environ.get("TENSORPLAN_BLAS_AUTO", "1") == "0":  # leave BLAS as configured
            return None
        try:
            from threadpoolctl import ThreadpoolController

            libs = ThreadpoolController().select(user_api="blas").lib_controllers
            if libs:
                _state["lib"] = libs[0]
                _state["default"] = min(libs[0].num_threads, count())
                _state["current"] = libs[0].num_threads
        except Exception:  # noqa: BLE001 - thread control is an optimisation only
            _state["lib"] = None
    return _state["lib"]


class _BlasGate:
    """OpenBLAS has one thread count for the whole process, and a product's rounding
    depends on it (tiny.en's jfk avg_logprob -0.37751068 on 1 thread, -0.37751064 on 2).
    Products wanting the count in force run together; one wanting another waits until they
    finish (new ones queue behind it), then switches. So a product's result never depends
    on what another session runs at the same time, and two sessions' big products never
    oversubscribe the cores."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._users = 0  # products running with the current count
        self._pending = 0  # products waiting for another count

    @contextmanager
    def use(self, lib: Any, want: int) -> Iterator[None]:
        with self._cond:
            if _state["current"] != want or self._pending:
                self._pending += 1
                while self._users:
                    self._cond.wait()
                self._pending -= 1
                if _state["current"] != want:
                    lib.set_num_threads(want)
                    _state["current"] = want
            self._users += 1
        try:
            yield
        finally:
            with self._cond:
                self._users -= 1
                if not self._users:
                    self._cond.notify_all()


_gate = _BlasGate()


@contextmanager
def for_product(macs: int) -> Iterator[None]:
    """Run a product of `macs` multiply-adds inside this: on one BLAS thread when it is
    small, on all of them when it is big, whatever other threads run meanwhile."""
    lib = _blas()
    if lib is None:
        yield
        return
    with _gate.use(lib, 1 if macs < SMALL_PRODUCT else _state["default"]):
        yield

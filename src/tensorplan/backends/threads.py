"""CPU thread pools in one place: how many threads, and one thread for small products.

`configure(n)` sets the count every pool uses (OpenBLAS through threadpoolctl, PyTorch's
intra-op pool, onnxruntime's sessions through `for_pool`). None adapts to the machine: this
process's cores less the other processes running at that moment (`idle_cores`). Two
tensorplan processes on 2 cores each took 2-15x their lone time with a thread per core
(every product's workers waiting on a core the other process held), 1.7 s each with one.

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
LOADAVG = "/proc/loadavg"  # Linux: its 4th field is "runnable/all" tasks

_state: dict[str, Any] = {}


def cores() -> int:
    """The CPUs this process may run on (its affinity mask, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def idle_cores() -> int:
    """This process's cores less the other processes running right now, at least 1.

    Read from /proc/loadavg's runnable count (this process is one of them), an instant
    sample rather than the 1-minute load average: that one lags a minute behind, so it
    missed a process that started alongside and kept counting one that had just ended.
    """
    try:
        with open(LOADAVG, encoding="ascii") as f:
            running = int(f.read().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):  # not Linux: assume the cores are ours
        return cores()
    return max(1, min(cores(), cores() - (running - 1)))


def count() -> int:
    """Threads a pool should use: the configured count, else the adaptive one."""
    n = _state.get("threads")
    if n:
        return int(n)
    if "idle" not in _state:
        _state["idle"] = idle_cores()
    return int(_state["idle"])


def for_pool(default: int) -> int:
    """Threads for a pool whose own measured best is `default` (onnxruntime's VAD: 1): the
    configured count when one was set, else `default`, never more than `count()`."""
    n = _state.get("threads")
    return int(n) if n else min(default, count())


def configure(n: int | None) -> int:
    """Use `n` threads (None: adapt to the machine now) in every pool from now on; returns
    the count."""
    _state["threads"] = n
    _state.pop("idle", None)  # sampled afresh: each load sees the machine as it is then
    want = count()
    lib = _blas()
    if lib is not None:
        _state["default"] = want
        if _state["current"] != want:
            lib.set_num_threads(want)
            _state["current"] = want
        for other in _blas_libraries():  # scipy's own OpenBLAS too, if loaded by now
            if other.filepath != lib.filepath:
                other.set_num_threads(want)
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
            libs = _blas_libraries()
            if libs:  # numpy's runs our products; scipy's copy may be listed first
                _state["lib"] = next((lib for lib in libs if "numpy" in lib.filepath), libs[0])
                _state["default"] = min(libs[0].num_threads, count())
                _state["current"] = libs[0].num_threads
        except Exception:  # noqa: BLE001 - thread control is an optimisation only
            _state["lib"] = None
    return _state["lib"]


def _blas_libraries() -> list[Any]:
    from threadpoolctl import ThreadpoolController

    return list(ThreadpoolController().select(user_api="blas").lib_controllers)


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
            if self._users and (_state["current"] != want or self._pending):
                self._pending += 1
                while self._users:
                    self._cond.wait()
                self._pending -= 1
            if not self._users and lib.num_threads != want:  # asked, not our record
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

"""CPU thread pools in one place: how many threads each pool uses.

`configure(n)` sets the count the compute pools use (OpenBLAS through threadpoolctl,
PyTorch's intra-op pool). None adapts to the machine: this
process's cores less the other processes running at that moment (`idle_cores`). Two
tensorplan processes on 2 cores each took 2-15x their lone time with a thread per core
(every product's workers waiting on a core the other process held), 1.7 s each with one.

Every BLAS product runs on the configured count (`for_product`): a product's rounding
depends on OpenBLAS's count, which is one setting per process, so changing it per product
made sessions on several threads differ from a lone run. (onnxruntime's Silero VAD keeps
one thread whatever the count: whisper/audio/vad.py says why.)

PyTorch's count is per OS thread, so work running side by side may split the cores
between them (machine.computing): each of k such threads computes on count() // k of
them (`share`).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tensorplan.machine import cores, running_beside

LOADAVG = "/proc/loadavg"  # Linux: its 4th field is "runnable/all" tasks

_state: dict[str, Any] = {}


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


def share(threads: int) -> int:
    """`threads`, less than that inside machine.computing: this thread's part of count().
    Read at each PyTorch kernel. OpenBLAS's count is one per process (for_product), so
    it does not follow."""
    running = running_beside()
    if running <= 1 or threads <= 1:
        return threads
    return max(1, min(threads, count() // running))


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


@contextmanager
def for_product(macs: int) -> Iterator[None]:
    """Run a BLAS product of `macs` multiply-adds inside this: on the configured count.

    Products used to run on one thread when small. But OpenBLAS's count is one setting
    for the process and a product's rounding depends on it (tiny.en's jfk avg_logprob
    -0.37751068 on 1 thread, -0.37751064 on 2), and with sessions on several threads the
    toggling made beam search differ in the 7th digit from a lone run, even with every
    product serialized under a lock. A fixed count is deterministic and, measured on a
    quiet machine, as fast (jfk beam 5: 0.818 s toggling, 0.819 s on a fixed 2 threads,
    1.059 s on 1); OPENBLAS_THREAD_TIMEOUT (set at import) and the adaptive default keep
    idle workers from spinning on a busy one."""
    lib = _blas()
    if lib is not None and _state.get("current") != _state["default"]:
        with _blas_lock:
            lib.set_num_threads(_state["default"])
            _state["current"] = _state["default"]
    yield


_blas_lock = threading.Lock()

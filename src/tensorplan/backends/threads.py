"""BLAS thread count per product: small products run on one thread.

OpenBLAS wakes every worker thread for each call. For the decoder's one-row products
that costs far more than the arithmetic, and when another process shares the cores the
spinning threads make a 0.1 ms product take 16 ms (measured on this project's 2-core
machine). Big products (the encoder's) still use every thread.
"""

from __future__ import annotations

import os
from typing import Any

SMALL_PRODUCT = 2_000_000  # multiply-adds below which one thread is faster

_state: dict[str, Any] = {}


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
                _state["default"] = libs[0].num_threads
                _state["current"] = libs[0].num_threads
        except Exception:  # noqa: BLE001 - thread control is an optimisation only
            _state["lib"] = None
    return _state["lib"]


def for_product(macs: int) -> None:
    """Set the BLAS thread count for a product of `macs` multiply-adds (cheap: 1 µs)."""
    lib = _blas()
    if lib is None:
        return
    want = 1 if macs < SMALL_PRODUCT else _state["default"]
    if want != _state["current"]:
        lib.set_num_threads(want)
        _state["current"] = want

"""The `backend` fixture: every test that takes it runs once per backend in BACKENDS."""

from __future__ import annotations

import pytest
from backend_cases import BACKENDS

from tensorplan.backends.base import Backend


@pytest.fixture(params=sorted(BACKENDS))
def backend(request: pytest.FixtureRequest) -> Backend:
    return BACKENDS[request.param]()

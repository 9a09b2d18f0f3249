"""Hypothesis profiles for the two test sets (pyproject's addopts deselect `slow`).

"fast" (the default) keeps property tests without examples of their own short, so the
default run stays a few minutes; "ci" (HYPOTHESIS_PROFILE=ci, which .ci/run sets for the
slow set) runs hypothesis' full default. Tests that name max_examples keep their own.
"""

from __future__ import annotations

import os

from hypothesis import settings

from tensorplan.machine import cores

# `-n auto` (the README's command): one worker per core this process may use, at most
# this many; each worker loads its own models and starts its own servers (1-2 GB each)
MAX_WORKERS = 4


def pytest_xdist_auto_num_workers(config: object) -> int:
    return min(cores(), MAX_WORKERS)


settings.register_profile("fast", max_examples=50, deadline=None)
settings.register_profile("ci", max_examples=100, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fast"))

"""Hypothesis profiles for the two test sets (pyproject's addopts deselect `slow`).

"fast" (the default) keeps property tests without examples of their own short, so the
default run stays a few minutes; "ci" (HYPOTHESIS_PROFILE=ci, which .ci/run sets for the
slow set) runs hypothesis' full default. Tests that name max_examples keep their own.
"""

from __future__ import annotations

import os

import pytest
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


# The longest modules (20-50 s of test time each, measured with --durations on 2 cores),
# longest first. `--dist loadscope` deals modules out to the workers in collection order
# (its reordering by number of tests is turned off below); dealt last, one of these kept
# a worker busy while the other sat idle. Dealt first, the short modules fill in around
# them and the workers end together (longest processing time first).
LONGEST_MODULES = (
    "tests/serve/test_realtime.py",
    "tests/whisper/planned/test_step_engine.py",
    "tests/robustness/test_bad_inputs_cli.py",
    "tests/whisper/planned/test_sessions.py",
    "tests/serve/test_serve_slow_clients_and_bounds.py",
    "tests/compat/test_faster_whisper.py",
    "tests/whisper/decoding/test_batched.py",
    "tests/live/test_engine.py",
    "tests/serve/test_serve_api.py",
    "tests/whisper/test_end_to_end.py",
)


def pytest_configure(config: pytest.Config) -> None:
    # pytest-xdist (3.6+) deals loadscope's modules out by their number of tests unless
    # told not to; a count of tests says little of their time, so keep the order above
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(LONGEST_MODULES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))

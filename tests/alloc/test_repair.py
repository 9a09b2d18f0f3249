"""The repair after the search (search/repair.py): every packing it returns is valid (no two
items live together share a byte, every item within the height it reports), never higher
than the one it started from, and the same for the same input."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorplan.alloc.offline import load, solve
from tensorplan.alloc.search.repair import repair

from .test_pack import cut_rectangle
from .test_search import Items, items, valid


def _stacked(size: list[int]) -> tuple[list[int], int]:
    """Every item on top of the one before: valid whatever the lifetimes, and high."""
    offsets, top = [], 0
    for z in size:
        offsets.append(top)
        top += z
    return offsets, top


def _check(lo: list[int], hi: list[int], size: list[int], start: tuple[list[int], int],
           moves: int) -> tuple[list[int], int, int]:
    out = repair(lo, hi, size, *start, load(lo, hi, size), time.perf_counter() + 60, moves)
    offsets, height, spent = out
    assert len(offsets) == len(size)
    assert valid(lo, hi, size, offsets, height)
    assert height == max((o + z for o, z in zip(offsets, size, strict=True)), default=0) or \
        height == start[1]  # unchanged: the start is handed back as it was
    assert load(lo, hi, size) <= height <= start[1]
    assert spent <= moves
    return out


@settings(max_examples=150, deadline=None)
@given(items(max_n=40, max_t=20), st.integers(0, 3000), st.booleans())
def test_valid_and_never_higher(case: Items, moves: int, from_greedy: bool) -> None:
    lo, hi, size = case
    if from_greedy:
        greedy = solve(lo, hi, size, budget_s=0)
        start = (greedy.offsets, greedy.total)
    else:
        start = _stacked(size)
    assert _check(lo, hi, size, start, moves) == _check(lo, hi, size, start, moves)


@pytest.mark.parametrize("seed", range(4))
def test_lowers_a_stacked_cut_rectangle(seed: int) -> None:
    # the pieces of a full rectangle, stacked: far above the bound (the rectangle's width),
    # which the repair gets much nearer
    intervals = cut_rectangle(seed, depth=6)
    lo = [s for _, s, _, _ in intervals]
    hi = [e - 1 for _, _, e, _ in intervals]
    size = [z for *_, z in intervals]
    start = _stacked(size)
    _, height, _ = _check(lo, hi, size, start, 20_000)
    assert height < 1.3 * 1000 < start[1]


def test_packs_through_pack_stay_valid_on_a_trace_the_search_leaves() -> None:
    # a node limit too small for the search to finish: the repair goes on from its packing
    intervals = cut_rectangle(11, depth=7)
    lo = [s for _, s, _, _ in intervals]
    hi = [e - 1 for _, _, e, _ in intervals]
    size = [z for *_, z in intervals]
    greedy = solve(lo, hi, size, budget_s=0)
    packed = solve(lo, hi, size, budget_s=60, max_nodes=1)
    assert valid(lo, hi, size, packed.offsets, packed.total)
    assert packed.total <= greedy.total
    assert solve(lo, hi, size, budget_s=60, max_nodes=1) == packed


def test_too_many_meetings_keep_the_start(monkeypatch: pytest.MonkeyPatch) -> None:
    from tensorplan.alloc.search import repair as module

    intervals = cut_rectangle(3, depth=6)
    lo = [s for _, s, _, _ in intervals]
    hi = [e - 1 for _, _, e, _ in intervals]
    size = [z for *_, z in intervals]
    start = _stacked(size)
    monkeypatch.setattr(module, "MAX_MEETINGS", 0)
    assert _check(lo, hi, size, start, 20_000) == (start[0], start[1], 0)


@settings(max_examples=60, deadline=None)
@given(items(max_n=30, max_t=15), st.integers(0, 1500))
def test_sums_in_python_ints_give_the_same_packing(case: Items, moves: int) -> None:
    # where a move's sums could pass int64 they are taken in Python ints: the same moves
    from tensorplan.alloc.search.repair import _Local

    lo, hi, size = case
    start = _stacked(size)
    fast = _check(lo, hi, size, start, moves)
    saved = _Local.SAFE
    try:
        _Local.SAFE = 0
        assert _check(lo, hi, size, start, moves) == fast
    finally:
        _Local.SAFE = saved


def test_offsets_past_int64s_reach_keep_the_start() -> None:
    # an item's overlap in bytes could pass int64 (height x neighbours): no repair
    lo, hi, size = [0, 2], [1, 3], [1 << 61] * 2
    start = _stacked(size)
    assert start[1] > load(lo, hi, size)
    assert _check(lo, hi, size, start, 1000) == (start[0], start[1], 0)

"""Merged problems (guessed structure): every packing of one is a packing of the originals,
a wrong guess costs nodes but never a packing or a false proof, and on cut rectangles the
guesses rebuild the rectangle."""

from __future__ import annotations

import random
import sys
import time
from itertools import accumulate
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorplan.alloc import pack
from tensorplan.alloc.offline import load
from tensorplan.alloc.search.dfs import Outcome, Problem, Status, decide
from tensorplan.alloc.search.improve import _attempt, _Budget, _Guess, improve
from tensorplan.alloc.search.merge import GUESSES, Merged, guesses, merge

from .test_pack import cut_rectangle
from .test_search import Items, items, valid

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import hard_traces  # noqa: E402
import plan_models  # noqa: E402


def _trace(intervals: list[tuple[str, int, int, int]]) -> Items:
    return [s for _, s, _, _ in intervals], [e - 1 for _, _, e, _ in intervals], [
        z for *_, z in intervals
    ]


@settings(max_examples=150, deadline=None)
@given(items(max_n=30, max_t=12), st.sampled_from(GUESSES))
def test_a_packing_of_the_blocks_is_one_of_the_items(case: Items, guess: tuple) -> None:
    lo, hi, size = case
    _, max_stack, patient = guess
    m = merge(lo, hi, size, max_stack, patient)
    listed = sorted(k for block in m.members for k, _ in block)
    assert listed == [k for k in range(len(size)) if size[k] > 0]  # each item once
    for a, e, z, block in zip(m.lo, m.hi, m.size, m.members, strict=True):
        for k, rel in block:  # inside its block's rectangle
            assert a <= lo[k] and hi[k] <= e and 0 <= rel and rel + size[k] <= z
    # the blocks stacked one on another, and packed by the search: both hold for the items
    stacked = [0, *accumulate(m.size)][:-1]
    assert valid(lo, hi, size, m.expand(stacked), sum(m.size))
    q = Problem(m.lo, m.hi, m.size)
    out = decide(q, sum(m.size), 10**5, time.perf_counter() + 60)
    assert out.status is Status.FOUND and out.offsets is not None
    assert valid(lo, hi, size, m.expand(out.offsets), out.height)
    assert merge(lo, hi, size, max_stack, patient) == m  # deterministic


def test_same_times_stack_and_same_sizes_continue() -> None:
    # a and b live over the same steps; c (the size of a + b) takes over where they end
    lo, hi, size = [0, 0, 3], [2, 2, 5], [3, 4, 7]
    m = merge(lo, hi, size, 0)
    assert (m.lo, m.hi, m.size) == ([0], [5], [7])
    assert sorted(m.expand([10])) == [10, 10, 14]  # b (4 bytes) under a, c at the bottom
    # stacking nothing, only continuing: c's size matches neither a nor b
    assert len(merge(lo, hi, size, 1).size) == 3


def _pinwheel(bottom_long: bool) -> Items:
    """Five items tiling [0, 10) x 10 bytes as a pinwheel (no straight cut splits it):
    P over [0, 3) and Q over [0, 6) start together, R from 3 and S from 6 end together at
    10, the centre E over [3, 6); `bottom_long`: Q is at the bottom (else P is)."""
    if bottom_long:  # Q 4, S 7 at 0; E 3 on Q; P 6 on Q; R 3 on S
        sizes = [6, 4, 3, 7, 3]
    else:  # P 7, R 4 at 0; E 3 on R; Q 3 on P; S 6 on E
        sizes = [7, 3, 4, 6, 3]
    return [0, 0, 3, 6, 3], [2, 5, 9, 9, 5], sizes


@pytest.mark.parametrize("bottom_long", [True, False])
def test_a_pinwheel_merges_into_its_rectangle(bottom_long: bool) -> None:
    lo, hi, size = _pinwheel(bottom_long)
    for max_stack in (0, 1):  # stacking cannot rebuild it; the pinwheel rule does
        m = merge(lo, hi, size, max_stack)
        assert (m.lo, m.hi, m.size) == ([0], [9], [10])
        assert valid(lo, hi, size, m.expand([0]), 10)
    # a centre of the wrong size, or a second candidate centre: left to the search
    assert len(merge(lo, hi, size[:4] + [2], 1).size) == 5
    two = merge([*lo, 3], [*hi, 5], [*size, size[4]], 1)
    assert len(two.size) == 6


def test_patient_merging_continues_before_it_stacks() -> None:
    # a and b over the same two steps; b continues into c (same size, next step). Stacking
    # at once makes a + b, which nothing continues; patiently, b + c first, then nothing
    # shares times with a
    lo, hi, size = [0, 0, 2], [1, 1, 3], [3, 5, 5]
    assert sorted(len(b) for b in merge(lo, hi, size, 0).members) == [1, 2]  # a + b, c
    patient = merge(lo, hi, size, 0, patient=True)
    assert sorted(sorted(k for k, _ in b) for b in patient.members) == [[0], [1, 2]]


def test_an_ambiguous_continuation_is_left_to_the_search() -> None:
    # two items of a's size start the step after it ends: which one continues it is a
    # real choice, so neither is merged
    lo, hi, size = [0, 3, 3], [2, 5, 4], [5, 5, 5]
    assert len(merge(lo, hi, size, 1).size) == 3
    assert len(merge(lo, hi, size[:2] + [6], 1).size) == 2


def test_guesses_that_merge_nothing_or_repeat_one_are_left_out() -> None:
    assert guesses([0, 5], [1, 6], [3, 4]) == []  # nothing shares times or continues
    # stacking pairs and stacking all merge alike where every group is a pair; continuing
    # alone merges nothing here (c matches neither a nor b)
    assert [g.size for g in guesses([0, 0, 3], [2, 2, 5], [3, 4, 7])] == [[7]]
    # here continuing alone merges a into c, and stacking a with b instead
    found = guesses([0, 0, 3], [2, 2, 5], [3, 4, 3])
    assert [sorted(len(b) for b in g.members) for g in found] == [[1, 2], [1, 2]]
    assert found[0].members != found[1].members


def test_cut_rectangles_are_rebuilt_at_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    from tensorplan.alloc.search import improve as imp

    found_on: list[Problem] = []
    search = imp._search

    def spy(q: Problem, *args: object) -> Outcome:
        out = search(q, *args)  # type: ignore[arg-type]
        if out.status is Status.FOUND:
            found_on.append(q)
        return out

    monkeypatch.setattr(imp, "_search", spy)
    for seed in range(6):
        lo, hi, size = _trace(cut_rectangle(seed, depth=7))
        bound = load(lo, hi, size)
        merged = [_Guess(m, Problem(m.lo, m.hi, m.size)) for m in guesses(lo, hi, size)]
        assert len(merged[0].merged.size) < len(size) // 2
        p = Problem(lo, hi, size)
        out = _attempt(p, merged, bound, 10_000, _Budget(10_000), time.perf_counter() + 60)
        assert out.status is Status.FOUND and out.offsets is not None
        assert valid(lo, hi, size, out.offsets, bound)
        assert found_on[-1] in [g.problem for g in merged]  # a merged problem's packing


def test_a_wrong_guess_costs_nodes_not_the_answer() -> None:
    # a guess that cannot fit anywhere near the bound (one block as tall as all items): its
    # "none" must neither stop the search of the items nor count as a proof
    lo, hi, size = _trace(cut_rectangle(3, depth=5))
    bound = load(lo, hi, size)
    p = Problem(lo, hi, size)
    n = len(size)
    wrong = Merged([min(lo)], [max(hi)], [sum(size)], [[(k, 0) for k in range(n)]], n)
    guess = _Guess(wrong, Problem(wrong.lo, wrong.hi, wrong.size))
    out = _attempt(p, [guess], bound, 4000, _Budget(4000), time.perf_counter() + 60)
    assert out.status is Status.FOUND and out.offsets is not None
    assert valid(lo, hi, size, out.offsets, bound) and guess.failed == bound
    fresh = _Guess(wrong, guess.problem)  # not skipped: its own "none" must not count
    out = _attempt(p, [fresh], bound - 1, 4000, _Budget(4000), time.perf_counter() + 60)
    assert out.status is Status.INFEASIBLE and fresh.failed == bound - 1  # the items' proof
    # improve with the wrong guess (and the real ones) still proves the bound
    start = ([0, *accumulate(size)][:-1], sum(size))
    found = improve(lo, hi, size, start, bound, 4000, time.perf_counter() + 60)
    assert found.height == bound and found.proven
    assert valid(lo, hi, size, found.offsets, found.height)


@pytest.mark.parametrize(("family", "n", "seed"), [("pinwheel-deep", 500, 1),
                                                   ("guillotine", 1000, 1)])
def test_large_cut_rectangles_pack_at_the_bound(family: str, n: int, seed: int) -> None:
    # bench's cut rectangles (optimum = bound), packed at the bound through the pinwheel
    # and patient guesses within a node limit (so the same on every machine); before
    # them, 1.145x and 1.111x with the same 20k nodes
    intervals = hard_traces.make_trace(family, n, seed, "shuffled")
    packing = pack(intervals, max_nodes=20_000, budget_s=60)
    assert packing.proven and packing.size == packing.lower_bound == hard_traces.CAPACITY
    assert pack(intervals, max_nodes=20_000, budget_s=60) == packing  # deterministic
    lo, hi, size = _trace([(str(i), s, e, z) for i, s, e, z in intervals])
    assert valid(lo, hi, size, [packing.offsets[i] for i, *_ in intervals], packing.size)


def test_greedy_passes_on_the_merged_problems_start_the_search() -> None:
    # bench's 800-buffer guillotine trace (seed 1): the greedy passes on the buffers pack
    # it 1.46x, on the patient stacks (32 blocks) 3 bytes above the bound (of 1 MiB),
    # before the search's first node
    intervals = hard_traces.make_trace("guillotine", 800, 1, "shuffled")
    packing = pack(intervals, max_nodes=1, budget_s=60)
    assert packing.ratio < 1.0001
    lo, hi, size = _trace([(str(i), s, e, z) for i, s, e, z in intervals])
    assert valid(lo, hi, size, [packing.offsets[i] for i, *_ in intervals], packing.size)


@pytest.mark.parametrize("family", ["pinwheel", "pinwheel-deep", "guillotine"])
def test_every_guess_on_small_cut_rectangles_is_a_valid_packing(family: str) -> None:
    # bench's generators at 20-60 pieces, where pinwheels nest in pinwheels and pieces are
    # 1-2 steps or bytes wide: every block, stacked on the others, packs its items validly
    for seed in range(40):
        rng = random.Random(seed)
        rects = plan_models.GENERATORS[family](20 + seed, rng, 40, 64)
        lo, hi = [r[0] for r in rects], [r[1] - 1 for r in rects]
        size = [r[3] - r[2] for r in rects]
        for _, max_stack, patient in GUESSES:
            m = merge(lo, hi, size, max_stack, patient)
            for a, e, z, block in zip(m.lo, m.hi, m.size, m.members, strict=True):
                for k, rel in block:
                    assert a <= lo[k] and hi[k] <= e and 0 <= rel and rel + size[k] <= z
            stacked = [0, *accumulate(m.size)][:-1]
            assert valid(lo, hi, size, m.expand(stacked), sum(m.size))

"""One op table, every backend: each op against a float64 formula, and in place."""

from __future__ import annotations

import pytest
from backend_cases import CASES, Case, assert_close, run_case

from tensorplan.backends.base import Backend
from tensorplan.graph import Graph
from tensorplan.ops import ALL_OPS

INPLACE = [(c, i) for c in CASES for i in c.inplace_srcs()]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_op(backend: Backend, case: Case) -> None:
    got, want = run_case(backend, case)
    assert_close(got, want, case.tol)


@pytest.mark.parametrize(("case", "src"), INPLACE, ids=[f"{c.id}-over-in{i}" for c, i in INPLACE])
def test_op_in_place(backend: Backend, case: Case, src: int) -> None:
    """dst is src: the node is placed over its source's exact bytes (docs/allocator.md rule 5)."""
    got, want = run_case(backend, case, inplace=src)
    assert_close(got, want, case.tol)


def _op_names(case: Case) -> set[str]:
    return {t.op.name for t in Graph.build(case.build(*case.leafs())).nodes if t.op is not None}


def test_the_table_covers_every_op() -> None:
    assert set().union(*(_op_names(c) for c in CASES)) == {op.name for op in ALL_OPS}


def test_every_in_place_op_is_run_in_place() -> None:
    in_place = {c.build(*c.leafs()).op.name for c, _ in INPLACE}  # type: ignore[union-attr]
    assert in_place == {op.name for op in ALL_OPS if op.inplace}

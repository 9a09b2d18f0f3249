"""`tensorplan pack TRACE.csv --out OFFSETS.csv`: plan plain lifetimes, no graph needed."""

from __future__ import annotations

import argparse
import math
import time

from tensorplan.alloc import DEFAULT_BUDGET_S, DEFAULT_MAX_NODES, STRATEGIES, pack
from tensorplan.alloc.trace import read_trace, write_offsets
from tensorplan.errors import UserError
from tensorplan.files import check_not_input, open_regular

MAX_ALIGNMENT = 1 << 30  # larger alignments pad every offset beyond any memory
MAX_BUDGET_S = 24 * 3600.0  # a day of improvement search; inf would never stop


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "pack",
        help="pack a lifetime trace into one arena",
        description="Read CSV rows id,lower,upper,size (upper exclusive), give every "
        "interval a byte offset so that intervals live at the same time never overlap, "
        "and write id,offset rows. Prints the arena size and the lower bound.",
    )
    p.add_argument("trace", metavar="TRACE.csv", help="header id,lower,upper,size, then rows")
    p.add_argument("--out", required=True, metavar="OFFSETS.csv", help="where to write id,offset")
    p.add_argument(
        "--strategy",
        choices=STRATEGIES,
        default="offline",
        help="offline packing with a bounded search (default), exact (search until the "
        "optimum is proven or the budget ends; with OR-Tools installed, CP-SAT after the "
        "own search: pip install 'tensorplan[exact]') or ggml-alloc's online best fit",
    )
    p.add_argument(
        "--budget",
        type=float,
        default=DEFAULT_BUDGET_S,
        metavar="SECONDS",
        help=f"wall-clock limit on the search (default {DEFAULT_BUDGET_S})",
    )
    p.add_argument(
        "--max-nodes",
        type=int,
        default=None,
        metavar="N",
        help=f"search nodes at most, for results that do not depend on the clock "
        f"(default {DEFAULT_MAX_NODES} for offline, no limit for exact)",
    )
    p.add_argument(
        "--alignment",
        type=int,
        default=1,
        metavar="N",
        help="round sizes and offsets up to multiples of N bytes (default 1)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not 1 <= args.alignment <= MAX_ALIGNMENT:
        raise UserError(f"--alignment must be an integer from 1 to {MAX_ALIGNMENT} (1 GiB), "
                        f"got {args.alignment}")
    if not (math.isfinite(args.budget) and 0 <= args.budget <= MAX_BUDGET_S):
        raise UserError(f"--budget must be between 0 and {MAX_BUDGET_S} seconds, "
                        f"got {args.budget}")
    if args.max_nodes is not None and args.max_nodes < 0:
        raise UserError(f"--max-nodes must be >= 0, got {args.max_nodes}")
    t0 = time.perf_counter()
    open_regular(args.trace, "trace").close()  # a trace that is no file is said first
    check_not_input(args.out, [args.trace])  # the trace is read whole before writing
    packing = pack(
        read_trace(args.trace, args.alignment), args.alignment, args.strategy, args.budget,
        args.max_nodes,
    )
    write_offsets(args.out, packing.offsets)  # errors are one-line UserErrors (files.py)
    print(
        f"{len(packing.offsets)} intervals packed ({args.strategy}) in "
        f"{time.perf_counter() - t0:.2f} s -> {args.out}"
    )
    proof = "optimal (proven)" if packing.proven else "best found, not proven"
    print(
        f"arena={packing.size} lower_bound={packing.lower_bound} ratio={packing.ratio:.4f} "
        f"{proof}"
    )
    return 0

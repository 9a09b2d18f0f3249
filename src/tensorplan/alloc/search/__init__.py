"""The hard-trace search: from a heuristic packing to a better one, and where it can, a proven
optimum. Model graphs never reach it (their packings meet the bound without a search); it
serves traces whose greedy packing misses the lower bound.

Entered only through `offline`: `improve.improve` (the bounded search after the greedy
passes) and `cpsat.improve` (the `exact` strategy's CP-SAT stage). Inside: `improve` takes
turns between `dfs` (depth-first over canonical solutions), `valleys` (fill the most
constrained valley first) and `merge` (guessed structure: items merged and searched as one).
Imports nothing of tensorplan but itself and `machine`; plain ints in, offsets out."""

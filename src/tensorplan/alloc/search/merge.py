"""Guessed structure: items merged into larger rectangles, searched as one.

Two items that live over the same times can be stacked into one item of their summed size;
an item that starts the step after another of the same size ends can continue it at the
same offset (the way a buffer is reused in place). A packing of the merged items is a
packing of the originals (each original sits at its block's offset plus its place inside
the block), so whatever the search finds for a merged problem is valid; its "none" proves
nothing, as the guess may be wrong.

The guesses pay where a trace was built from such rectangles: on cut rectangles of 500
buffers the search found packings at the bound, or 2% above it, on merged problems of
40-400 items where it found none above 5% on the 500 originals (docs/planner.md has the
table). Merging is repeated until nothing merges, as blocks merge into larger blocks.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

# (name, how many items one stack may take at once: 0 any, 1 none); every guess continues
GUESSES = (("stack-all", 0), ("stack-pairs", 2), ("continue", 1))

Member = tuple[int, int]  # (original item, offset inside the block)
# Each round merges what the last one made; a cut rectangle of 500 pieces took 10 rounds.
# The cap keeps a trace built to merge one pair a round from costing rounds x items.
MAX_ROUNDS = 64


@dataclass(frozen=True, slots=True)
class Merged:
    """Blocks live over inclusive [lo, hi] with sizes, each made of original items."""

    lo: list[int]
    hi: list[int]
    size: list[int]
    members: list[list[Member]]
    n: int  # the original item count

    def expand(self, offsets: Sequence[int]) -> list[int]:
        """Offsets of the original items from the blocks' offsets (zero-size items: 0)."""
        out = [0] * self.n
        for o, block in zip(offsets, self.members, strict=True):
            for k, rel in block:
                out[k] = o + rel
        return out


def merge(
    lo: Sequence[int], hi: Sequence[int], size: Sequence[int], max_stack: int
) -> Merged:
    """Merge until nothing merges: items over the same times into stacks (groups of at most
    `max_stack` items, 0 for any; 1 stacks nothing), and an item into the one of the same
    size that starts the step after it ends, where each is the other's only such match
    (random sizes rarely match by chance; equal ones often do); at most MAX_ROUNDS rounds.
    Deterministic: the result depends only on the input."""
    blocks: dict[int, tuple[int, int, int, list[Member]]] = {
        k: (lo[k], hi[k], size[k], [(k, 0)]) for k in range(len(size)) if size[k] > 0
    }
    fresh = len(size)
    changed, rounds = True, 0
    while changed and rounds < MAX_ROUNDS:
        changed, rounds = False, rounds + 1
        same_times: dict[tuple[int, int], list[int]] = defaultdict(list)
        for b, (a, e, _, _) in blocks.items():
            same_times[(a, e)].append(b)
        for (a, e), group in same_times.items():
            if len(group) < 2 or 0 < max_stack < len(group):
                continue
            group.sort(key=lambda b: (-blocks[b][2], b))
            stacked: list[Member] = []
            height = 0
            for b in group:
                z, inner = blocks.pop(b)[2:]
                stacked += [(k, rel + height) for k, rel in inner]
                height += z
            blocks[fresh] = (a, e, height, stacked)
            fresh, changed = fresh + 1, True
        starting: dict[tuple[int, int], list[int]] = defaultdict(list)
        ending: dict[tuple[int, int], list[int]] = defaultdict(list)
        for b, (a, e, z, _) in blocks.items():
            starting[(a, z)].append(b)
            ending[(e + 1, z)].append(b)
        used: set[int] = set()  # a block merges once a round: the next sees the new one
        for key, before in ending.items():
            after = starting.get(key, [])
            if len(before) != 1 or len(after) != 1 or {*before, *after} & used:
                continue  # no match, or an ambiguous one: left to the search
            used |= {before[0], after[0]}
            x, y = blocks.pop(before[0]), blocks.pop(after[0])
            blocks[fresh] = (x[0], y[1], x[2], x[3] + y[3])
            fresh, changed = fresh + 1, True
    order = sorted(blocks)
    return Merged(
        [blocks[b][0] for b in order],
        [blocks[b][1] for b in order],
        [blocks[b][2] for b in order],
        [blocks[b][3] for b in order],
        len(size),
    )


def guesses(lo: Sequence[int], hi: Sequence[int], size: Sequence[int]) -> list[Merged]:
    """The merged problems worth a search: each of GUESSES, less any that merged nothing
    or came out the same as one before it."""
    items = sum(1 for z in size if z > 0)
    out: list[Merged] = []
    for _, max_stack in GUESSES:
        m = merge(lo, hi, size, max_stack)
        if len(m.size) < items and all(m.members != g.members for g in out):
            out.append(m)
    return out

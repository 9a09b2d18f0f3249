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
Five blocks that tile a rectangle as a pinwheel merge too (`_pinwheels`): no straight cut
splits a pinwheel, so stacking and continuing alone never rebuild one.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import count

# (name, how many items one stack may take at once: 0 any, 1 none, patient: stack only
# when nothing else merges or the stack's size continues a block); every guess continues
# and merges pinwheels. The patient ones rebuilt the 800-1,000-buffer cut rectangles that
# stacking at once got wrong (two short-lived buffers over the same steps are often
# unrelated): docs/planner.md, 2026-12-03
GUESSES = (("stack-all", 0, False), ("stack-pairs", 2, False), ("continue", 1, False),
           ("stack-all-patient", 0, True), ("stack-pairs-patient", 2, True))

Member = tuple[int, int]  # (original item, offset inside the block)
# Each round merges what the last one made; a cut rectangle of 500 pieces took 10 rounds.
# The cap keeps a trace built to merge one pair a round from costing rounds x items.
MAX_ROUNDS = 128
Block = tuple[int, int, int, list[Member]]  # lo, hi (inclusive), size, members
# Pinwheels are looked for from each block's partners starting with it; past this many
# blocks starting at one step (a grid's lines) the lookups cost more than they find
PINWHEEL_GROUP = 48


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
    lo: Sequence[int], hi: Sequence[int], size: Sequence[int], max_stack: int,
    patient: bool = False,
) -> Merged:
    """Merge until nothing merges: items over the same times into stacks (groups of at most
    `max_stack` items, 0 for any; 1 stacks nothing), an item into the one of the same
    size that starts the step after it ends, where each is the other's only such match
    (random sizes rarely match by chance; equal ones often do), and five items that tile
    a rectangle as a pinwheel (`_pinwheels`); at most MAX_ROUNDS rounds. `patient`:
    after a round that merged anything, stack only groups whose stack a block of its
    size continues (or is continued by); any group only after a round that merged
    nothing (two short-lived items over the same steps are often unrelated; continuing
    first makes them longer, and chance matches rarer).
    Deterministic: the result depends only on the input."""
    blocks: dict[int, Block] = {
        k: (lo[k], hi[k], size[k], [(k, 0)]) for k in range(len(size)) if size[k] > 0
    }
    fresh = count(len(size))
    stack_now = not patient
    for _ in range(MAX_ROUNDS):
        stacked = _stack(blocks, fresh, max_stack, matched=not stack_now)
        other = _pinwheels(blocks, fresh)
        other = _continue(blocks, fresh) or other
        if other or stacked:
            stack_now = not patient
        elif not stack_now:
            stack_now = True  # only stacks are left to try
        else:
            break
    order = sorted(blocks)
    return Merged(
        [blocks[b][0] for b in order],
        [blocks[b][1] for b in order],
        [blocks[b][2] for b in order],
        [blocks[b][3] for b in order],
        len(size),
    )


def _stack(
    blocks: dict[int, Block], fresh: Iterator[int], max_stack: int, matched: bool = False
) -> bool:
    """Blocks over the same times, in groups of at most `max_stack` (0: any), stacked
    largest first; `matched`: only a group whose stack would continue, or be continued
    by, a block of its summed size. Whether anything merged."""
    same_times: dict[tuple[int, int], list[int]] = defaultdict(list)
    sizes_at: set[tuple[int, int]] = set()  # (a block's first step, size), (last + 1, size)
    for b, (a, e, z, _) in blocks.items():
        same_times[(a, e)].append(b)
        if matched:
            sizes_at |= {(a, z), (-1 - e, z)}
    merged = False
    for (a, e), group in same_times.items():
        if len(group) < 2 or 0 < max_stack < len(group):
            continue
        if matched:
            total = sum(blocks[b][2] for b in group)
            if (e + 1, total) not in sizes_at and (-a, total) not in sizes_at:
                continue
        group.sort(key=lambda b: (-blocks[b][2], b))
        stacked: list[Member] = []
        height = 0
        for b in group:
            z, inner = blocks.pop(b)[2:]
            stacked += [(k, rel + height) for k, rel in inner]
            height += z
        blocks[next(fresh)] = (a, e, height, stacked)
        merged = True
    return merged


def _continue(blocks: dict[int, Block], fresh: Iterator[int]) -> bool:
    """A block into the one of its size starting the step after it ends, where each is
    the other's only such match. Whether anything merged."""
    starting: dict[tuple[int, int], list[int]] = defaultdict(list)
    ending: dict[tuple[int, int], list[int]] = defaultdict(list)
    for b, (a, e, z, _) in blocks.items():
        starting[(a, z)].append(b)
        ending[(e + 1, z)].append(b)
    used: set[int] = set()  # a block merges once a round: the next sees the new one
    merged = False
    for key, before in ending.items():
        after = starting.get(key, [])
        if len(before) != 1 or len(after) != 1 or {*before, *after} & used:
            continue  # no match, or an ambiguous one: left to the search
        used |= {before[0], after[0]}
        x, y = blocks.pop(before[0]), blocks.pop(after[0])
        blocks[next(fresh)] = (x[0], y[1], x[2], x[3] + y[3])
        merged = True
    return merged


def _pinwheels(blocks: dict[int, Block], fresh: Iterator[int]) -> bool:
    """Merge five blocks that tile a rectangle as a pinwheel (which no straight cut
    splits, so stacking and continuing never rebuild it): two starting together (P ends
    before Q), two ending together (R starting where P ends, S where Q does) and a centre
    E between those ends, with P + Q = R + S. Either the longer one Q is at the bottom
    (Q, S at 0; E on Q and P on E's left neighbour; R on S: E = S - Q = P - R), or P is
    (P, R at 0; E on R, Q on P, S on E: E = P - R = S - Q). Only where the match is the
    only one for that P and Q; each block merges once a round. Whether anything
    merged."""
    span: dict[tuple[int, int], list[int]] = defaultdict(list)
    starting: dict[int, list[int]] = defaultdict(list)
    start_size: dict[tuple[int, int], list[int]] = defaultdict(list)
    for b, (a, e, z, _) in blocks.items():
        span[(a, e)].append(b)
        starting[a].append(b)
        start_size[(a, z)].append(b)
    used: set[int] = set()
    merged = False
    for t0, group in sorted(starting.items()):
        group = [b for b in group if b not in used]  # (used: merged, gone, this round)
        if not 2 <= len(group) <= PINWHEEL_GROUP:
            continue
        by_end: dict[int, list[int]] = defaultdict(list)
        for q in group:
            by_end[blocks[q][1] + 1].append(q)
        # (P, Q) -> the (R, S, E) that complete them; found from the centre E, which
        # starts where P ends and ends where Q does (far fewer than the pairs)
        found: dict[tuple[int, int], list[tuple[int, int, int]]] = defaultdict(list)
        for p in group:
            _, p_hi, zp, _ = blocks[p]
            a1 = p_hi + 1
            for e in starting.get(a1, []):
                if e in used:
                    continue
                a2, ze = blocks[e][1] + 1, blocks[e][2]
                for q in by_end.get(a2, []):
                    # E = S - Q = P - R either way round: S and R follow from the sizes
                    zq = blocks[q][2]
                    for s in start_size.get((a2, zq + ze), []):
                        if s in used:
                            continue
                        for r in span.get((a1, blocks[s][1]), []):
                            if r != e and r not in used and blocks[r][2] == zp - ze:
                                found[(p, q)].append((r, s, e))
        for (p, q), matches in found.items():
            if len(matches) != 1:
                continue  # a real choice: left to the search
            r, s, e = matches[0]
            if {p, q, r, s, e} & used:
                continue  # merged this round already
            zp, zq, zr, zs = (blocks[b][2] for b in (p, q, r, s))
            if zs > zq:  # Q at the bottom
                place = {q: 0, s: 0, e: zq, p: zq, r: zs}
            else:  # P at the bottom
                place = {p: 0, r: 0, e: zr, q: zp, s: zp}
            inner = [(k, rel + place[b]) for b in (p, q, r, s, e) for k, rel in blocks[b][3]]
            t1 = blocks[r][1]
            for b in (p, q, r, s, e):
                del blocks[b]
            blocks[next(fresh)] = (t0, t1, zp + zq, inner)
            used |= {p, q, r, s, e}
            merged = True
    return merged


def guesses(lo: Sequence[int], hi: Sequence[int], size: Sequence[int]) -> list[Merged]:
    """The merged problems worth a search: each of GUESSES, less any that merged nothing
    or came out the same as one before it."""
    items = sum(1 for z in size if z > 0)
    out: list[Merged] = []
    for _, max_stack, patient in GUESSES:
        m = merge(lo, hi, size, max_stack, patient)
        if len(m.size) < items and all(m.members != g.members for g in out):
            out.append(m)
    return out

"""Comparing transcripts in tests: normalised words, word edits, word error rate."""

from __future__ import annotations

import re


def normalize(text: str) -> str:
    """Lower case, punctuation gone, one space between words."""
    return " ".join(re.sub(r"[^\w' ]", " ", text.lower()).split())


def word_edits(reference: str, hypothesis: str) -> int:
    """Words inserted, deleted or replaced between the two texts, once normalized."""
    ref, hyp = normalize(reference).split(), normalize(hypothesis).split()
    d = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, d[0] = d[0], i
        for j, h in enumerate(hyp, 1):
            prev, d[j] = d[j], min(d[j] + 1, d[j - 1] + 1, prev + (r != h))
    return d[len(hyp)]


def wer(reference: str, hypothesis: str) -> float:
    """Word error rate: word edits per reference word."""
    return word_edits(reference, hypothesis) / max(1, len(normalize(reference).split()))

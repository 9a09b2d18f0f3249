"""LocalAgreement-2: commit the words two consecutive hypotheses agree on.

Each update re-transcribes the turn's uncommitted audio (with some committed audio before
it); the words of that hypothesis which start after the committed ones are compared with
the previous hypothesis's, and their common prefix is committed, never to change, up to
the first word that neither hypothesis heard with a probability of at least
`commit_probability` (two decodes of the same short audio agree on the same guess) that
ends within UNSURE_HOLD_S of the audio decoded. The rest is the tail: shown as uncertain,
replaced by the next update. At the end of a turn every word of the last hypothesis is
committed. (Macháček et al., "Turning Whisper into
Real-Time Transcription System", 2023; whisper_streaming's HypothesisBuffer.)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tensorplan.live.options import COMMIT_PROBABILITY, UNSURE_HOLD_S

# the committed words a hypothesis may repeat at its start (audio kept before the commit)
MAX_OVERLAP_WORDS = 5
# the last committed words found again in a hypothesis must end within this of where
# they ended, to anchor it
OVERLAP_WINDOW_S = 1.0
# and every word before them must have been said by then, give or take this: "you" in
# jfk's "ask what you" ends within a second of the committed "for you" but is new
ANCHOR_SLACK_S = 0.3


@dataclass(frozen=True, slots=True)
class TimedWord:
    start: float  # seconds of the stream
    end: float
    text: str  # as decoded, with its leading space
    probability: float = 1.0  # the decode's, for the word (its tokens' mean)


def normalized(text: str) -> str:
    """A word as agreement compares it: case and punctuation do not count."""
    return re.sub(r"[^\w']", "", text.lower())


class LocalAgreement:
    def __init__(self, commit_probability: float = COMMIT_PROBABILITY) -> None:
        self.commit_probability = commit_probability
        self.committed: list[TimedWord] = []  # of this turn
        self.pending: list[TimedWord] = []  # the last hypothesis after the committed words

    @property
    def committed_end(self) -> float:
        return self.committed[-1].end if self.committed else 0.0

    @property
    def tail(self) -> str:
        return "".join(w.text for w in self.pending)

    def insert(self, hypothesis: list[TimedWord], final: bool = False,
               heard_until: float | None = None) -> list[TimedWord]:
        """Take the next hypothesis, of audio up to `heard_until` (stream seconds; None:
        its last word's end); the words it commits (all of them when `final`)."""
        new = self._after_committed(hypothesis)
        if heard_until is None:
            heard_until = max((w.end for w in hypothesis), default=0.0)
        if final:
            agreed = len(new)
        else:
            agreed = 0
            for old, word in zip(self.pending, new, strict=False):
                if normalized(old.text) != normalized(word.text):
                    break
                unsure = max(old.probability, word.probability) < self.commit_probability
                if unsure and word.end > heard_until - UNSURE_HOLD_S:
                    break
                agreed += 1
        commit, self.pending = new[:agreed], new[agreed:]
        self.committed += commit
        return commit

    def force(self, before: float) -> list[TimedWord]:
        """Commit the pending words that end by `before` (the buffer must move on)."""
        n = next((i for i, w in enumerate(self.pending) if w.end > before), len(self.pending))
        commit, self.pending = self.pending[:n], self.pending[n:]
        self.committed += commit
        return commit

    def _after_committed(self, words: list[TimedWord]) -> list[TimedWord]:
        """The words of `words` after what is committed: after the last committed words
        where the hypothesis repeats them near where they were said, else the words said
        mostly after the committed end (a pause's silence wanders from one word's edge to
        the next between decodes, so a start alone would drop or repeat words)."""
        if not self.committed:
            return list(words)
        end = self.committed_end
        said = [normalized(w.text) for w in words]
        for n in range(min(MAX_OVERLAP_WORDS, len(self.committed)), 0, -1):
            tail = [normalized(w.text) for w in self.committed[-n:]]
            near = [i for i in range(len(words) - n + 1) if said[i:i + n] == tail
                    and abs(words[i + n - 1].end - end) < OVERLAP_WINDOW_S
                    and all((w.start + w.end) / 2 <= end + ANCHOR_SLACK_S for w in words[:i])]
            if near:
                i = min(near, key=lambda i: abs(words[i + n - 1].end - end))
                return words[i + n:]
        return [w for w in words if (w.start + w.end) / 2 > end]

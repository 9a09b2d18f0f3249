"""What a live stream reports, in stream order: turns of speech and their text.

Times are of the whole stream (every sample appended since it opened), so they keep
counting across turns and clears. `turn` numbers a stream's turns from 1.
"""

from __future__ import annotations

from dataclasses import dataclass

from tensorplan.live.agreement import TimedWord


@dataclass(frozen=True, slots=True)
class SpeechStarted:
    turn: int
    audio_start_ms: int  # includes the prefix padding


@dataclass(frozen=True, slots=True)
class SpeechStopped:
    turn: int
    audio_end_ms: int  # includes the silence that ended the turn


@dataclass(frozen=True, slots=True)
class Committed:
    """The turn's audio is final (the detector or the client ended it); its text follows."""

    turn: int


@dataclass(frozen=True, slots=True)
class Delta:
    """Newly committed words of the turn: the deltas of a turn join to its transcript."""

    turn: int
    text: str
    words: tuple[TimedWord, ...]


@dataclass(frozen=True, slots=True)
class Tail:
    """The turn's uncertain words after its committed ones; replaces the previous tail."""

    turn: int
    text: str


@dataclass(frozen=True, slots=True)
class Completed:
    turn: int
    transcript: str
    audio_s: float  # the turn's audio, in seconds
    words: tuple[TimedWord, ...]


@dataclass(frozen=True, slots=True)
class Failed:
    turn: int
    message: str


Event = SpeechStarted | SpeechStopped | Committed | Delta | Tail | Completed | Failed

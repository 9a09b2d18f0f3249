"""Live transcription, protocol-free: audio arrives in pieces, text leaves as it firms up.

A `LiveStream` holds one stream's state (its audio since the last commit, turns, committed
words, the uncertain tail, the speech detector); a `LiveEngine` runs the streams' decoding
updates on a few worker threads, round robin, each update borrowing a whisper `Session`
from a lender (the server's pool, or a command's single session). The WebSocket server and
`tensorplan live` are two protocols over this package; docs/realtime.md has the policy.
"""

from tensorplan.live.engine import LiveEngine, SessionLender
from tensorplan.live.events import (
    Committed,
    Completed,
    Delta,
    Event,
    Failed,
    SpeechStarted,
    SpeechStopped,
    Tail,
)
from tensorplan.live.options import LiveOptions, TurnDetection
from tensorplan.live.stream import LiveStream

__all__ = ["Committed", "Completed", "Delta", "Event", "Failed", "LiveEngine", "LiveOptions",
           "LiveStream", "SessionLender", "SpeechStarted", "SpeechStopped", "Tail",
           "TurnDetection"]

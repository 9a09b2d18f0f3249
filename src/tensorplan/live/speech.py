"""Speech probabilities as audio arrives: Silero VAD run window by window with its state
carried across appends (whisper/vad.py runs it over whole files), and the server VAD's
turn boundaries from them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tensorplan.live.options import SAMPLE_RATE, TurnDetection
from tensorplan.whisper.audio.vad import (
    CONTEXT_SAMPLES,
    WINDOW_SAMPLES,
    context_frames,
    load_vad_model,
)

# inside speech, a window is silence only below threshold - this (Silero's hysteresis),
# and never below EXIT_FLOOR: at a threshold of 0.15 or less a turn would never end
EXIT_MARGIN = 0.15
EXIT_FLOOR = 0.01


class SpeechProbability:
    """One probability per 512 samples (32 ms), whatever sizes the audio arrives in."""

    def __init__(self) -> None:
        self._model = load_vad_model()  # onnxruntime: safe to share across threads
        self._state = self._model.initial_state()
        self._pending = np.zeros(CONTEXT_SAMPLES, np.float32)  # the first window's context

    def feed(self, samples: np.ndarray) -> np.ndarray:
        """The probabilities of the windows `samples` completes."""
        audio = np.concatenate([self._pending, np.asarray(samples, np.float32)])
        n = (len(audio) - CONTEXT_SAMPLES) // WINDOW_SAMPLES
        if n == 0:  # not one whole window yet
            self._pending = audio
            return np.zeros(0, np.float32)
        probs, self._state = self._model.windows(context_frames(audio, n), self._state)
        # what is kept: the last window's context and the samples of no whole window yet
        self._pending = audio[n * WINDOW_SAMPLES:].copy()
        return probs


@dataclass(slots=True)
class Boundary:
    kind: str  # "start" or "stop"
    sample: int  # of the stream: where the turn's audio starts, or where it ends
    window: int  # the index, among the probabilities given, of the window that decided it


class TurnDetector:
    """Speech starts at a window at `threshold` or above; it stops once the windows have
    stayed below the exit threshold (threshold - EXIT_MARGIN, at least EXIT_FLOOR) for
    `silence_duration_ms`."""

    def __init__(self, detection: TurnDetection) -> None:
        self.detection = detection
        self.in_speech = False
        self._silent_since: int | None = None  # the first sample of the current pause

    def windows(self, probs: np.ndarray, first_sample: int) -> list[Boundary]:
        """The boundaries in these windows (`first_sample`: the first window's start)."""
        d = self.detection
        pad = d.prefix_padding_ms * SAMPLE_RATE // 1000
        silence = d.silence_duration_ms * SAMPLE_RATE // 1000
        exit_below = max(d.threshold - EXIT_MARGIN, EXIT_FLOOR)
        found: list[Boundary] = []
        for i, p in enumerate(probs):
            start = first_sample + i * WINDOW_SAMPLES
            end = start + WINDOW_SAMPLES
            if not self.in_speech:
                if p >= d.threshold:
                    self.in_speech, self._silent_since = True, None
                    found.append(Boundary("start", max(0, start - pad), i))
                continue
            if p >= d.threshold:
                self._silent_since = None
            elif p < exit_below and self._silent_since is None:
                self._silent_since = start
            if self._silent_since is not None and end - self._silent_since >= silence:
                self.in_speech, self._silent_since = False, None
                found.append(Boundary("stop", end, i))
        return found

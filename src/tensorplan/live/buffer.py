"""A growing float32 buffer that can drop its front: a turn's audio, a pre-roll."""

from __future__ import annotations

import numpy as np


class SampleBuffer:
    def __init__(self, samples: np.ndarray | None = None) -> None:
        self._data = np.zeros(max(16000, 0 if samples is None else len(samples)), np.float32)
        self._n = 0
        if samples is not None:
            self.append(samples)

    def __len__(self) -> int:
        return self._n

    def append(self, samples: np.ndarray) -> None:
        need = self._n + len(samples)
        if need > len(self._data):  # doubling: appends stay linear in total
            grown = np.zeros(max(need, 2 * len(self._data)), np.float32)
            grown[:self._n] = self._data[:self._n]
            self._data = grown
        self._data[self._n:need] = samples
        self._n = need

    def view(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        stop = self._n if stop is None else min(stop, self._n)
        return self._data[start:stop]

    def drop_front(self, n: int) -> None:
        n = max(0, min(n, self._n))
        rest = self._data[n:self._n].copy()
        if len(self._data) > 4 * max(len(rest), 16000):  # give memory back after a long turn
            self._data = np.zeros(max(2 * len(rest), 16000), np.float32)
        self._data[:len(rest)] = rest
        self._n = len(rest)

    def truncate(self, n: int) -> None:
        self._n = max(0, min(n, self._n))

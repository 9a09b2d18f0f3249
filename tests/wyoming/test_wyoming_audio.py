"""Utterance's conversion to 16 kHz mono, against numpy's own mixing."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("wyoming")

from wyoming.audio import AudioChunk  # noqa: E402

from tensorplan.wyoming.audio import Utterance  # noqa: E402


def _converted(pcm: bytes, rate: int, width: int, channels: int) -> np.ndarray:
    u = Utterance(max_seconds=60)
    u.add(AudioChunk(rate=rate, width=width, channels=channels, audio=pcm))
    return u.samples()


@pytest.mark.parametrize("channels", [2, 3, 4, 8])
def test_every_channel_count_mixes_to_the_channels_mean(channels: int) -> None:
    rng = np.random.default_rng(channels)
    mono = (rng.standard_normal(16000) * 3000).astype("<i2")
    # the same signal in every channel: the mix is the signal, sample for sample
    same = np.repeat(mono[:, None], channels, axis=1)
    out = _converted(same.tobytes(), 16000, 2, channels)
    assert len(out) == len(mono)  # 3 to 8 channels came out time-stretched before
    np.testing.assert_array_equal(out, mono)
    # different channels: their mean
    frames = (rng.standard_normal((16000, channels)) * 3000).astype("<i2")
    out = _converted(frames.tobytes(), 16000, 2, channels)
    np.testing.assert_allclose(out, frames.mean(axis=1), atol=1)

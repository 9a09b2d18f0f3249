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


def test_8_bit_audio_is_unsigned_and_mixes_around_128() -> None:
    """8-bit PCM (WAV's) is unsigned, 128 the silence: a tone in one channel beside a
    silent one mixes to half the tone, centred on zero."""
    t = np.arange(16000) / 16000
    tone = np.round(100 * np.sin(2 * np.pi * 440 * t)).astype(np.int16)
    frames = np.stack([tone + 128, np.full_like(tone, 128)], axis=1).astype(np.uint8)
    out = _converted(frames.tobytes(), 16000, 1, 2).astype(np.float64)
    # 8 bits widened to 16: one 8-bit step is 256
    np.testing.assert_allclose(out, tone / 2 * 256, atol=256)
    assert abs(out.mean()) < 256  # no offset: it was +16,000 read as signed


def test_8_bit_mono_is_widened_around_128() -> None:
    pcm = np.array([128, 255, 0, 129], np.uint8)
    out = _converted(pcm.tobytes(), 16000, 1, 1)
    np.testing.assert_array_equal(out, [0, 127 << 8, -128 << 8, 1 << 8])

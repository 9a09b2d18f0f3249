"""Encode int16 mono samples with PyAV (bundled ffmpeg): the one encode loop of the audio
tests (test_audio), the robustness files (tests/robustness/synth_audio) and bench/memory."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import av
import numpy as np


def encode_pcm16(out: Any, codec: str, rate: int, chunks: Iterable[np.ndarray]) -> None:
    """Add a mono `codec` stream to the open output container `out`, encode each int16 chunk
    as one frame, and flush the encoder."""
    stream = out.add_stream(codec, rate=rate, layout="mono")
    assert isinstance(stream, av.audio.stream.AudioStream)
    for pcm in chunks:
        frame = av.AudioFrame.from_ndarray(pcm[None, :], format="s16", layout="mono")
        frame.sample_rate = rate
        for packet in stream.encode(frame):
            out.mux(packet)
    for packet in stream.encode(None):
        out.mux(packet)

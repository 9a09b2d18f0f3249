"""Whisper on the device backend with graph capture, on the CPU: the recording stand-in
for CUDA graphs captures the encoder and decoder steps and replays them, and the jfk
transcript stays the golden one."""

from __future__ import annotations

import pytest
from whisper_helpers import BACKEND_NAMES, JFK_TEXT, normalize

pytestmark = pytest.mark.skipif("device" not in BACKEND_NAMES, reason="PyTorch not installed")


def test_captured_graphs_replay_the_jfk_golden(jfk_audio):
    from tensorplan.backends.capture import RecordingCapturer
    from tensorplan.whisper.api import load_model

    whisper = load_model("tiny.en", backend="device")
    cap = RecordingCapturer()
    whisper.model.backend.capturer = cap  # what CudaGraphCapturer is on a GPU
    first = whisper.transcribe(jfk_audio, beam_size=None)
    decoder_steps = cap.replays
    assert cap.captured >= 1 and decoder_steps > 10  # the b1 step: captured, then replayed
    second = whisper.transcribe(jfk_audio, beam_size=None)  # conv, encoder, cross replay too
    assert normalize(first.text) == normalize(second.text) == normalize(JFK_TEXT)
    assert [s.tokens for s in first.segments] == [s.tokens for s in second.segments]
    assert cap.replays > 2 * decoder_steps

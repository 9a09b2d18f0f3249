"""Narrowed windows (WhisperModel.narrowed, Session.transcribe(window_s=...)): the encoder
over fewer than 1500 positions, as whisper.cpp's audio_ctx, on the same weights."""

from __future__ import annotations

import numpy as np
import pytest
from reference_forward import Reference
from whisper_helpers import normalize

from tensorplan.backends.base import templates_of
from tensorplan.errors import UserError
from tensorplan.whisper.audio.mel import log_mel_spectrogram

WINDOW_S = 10.0
POSITIONS = 500  # 10 s at 0.02 s a position


def _rel_err(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_a_narrowed_window_matches_the_float64_reference(tiny_model_factory, tiny_weights,
                                                         jfk_audio, backend):
    """The encoder's positions are the first 500 of the table, the decoder reads 500
    positions of cross K/V: the reference's forward pass over the same 1000 frames."""
    pytest.importorskip("torch") if backend == "torch" else None
    session = tiny_model_factory("joint", backend=backend).session().state.narrowed(POSITIONS)
    mel = log_mel_spectrogram(jfk_audio[:8 * 16000], n_mels=80, padding=480_000)
    window = np.zeros((80, 2 * POSITIONS), np.float32)
    window[:, :800] = mel[:, :800]
    session.encode(window)
    dims = tiny_weights.dims
    ref = Reference(tiny_weights, dims.n_audio_head, dims.n_text_head)
    enc = ref.encode(window)
    assert enc.shape == (POSITIONS, dims.n_audio_state)
    d = dims.n_text_state
    w = ref.p("decoder/layer_0/attention/linear_1/weight")
    b = ref.p("decoder/layer_0/attention/linear_1/bias")
    k, v = session.cross_kv(0)
    assert k.shape == (POSITIONS, d)
    assert _rel_err(k, enc @ w[:d].T + b[:d]) <= 1e-4
    assert _rel_err(v, enc @ w[d:].T + b[d:]) <= 1e-4
    tok = session.tokenizer
    prompt = [tok.sot, tok.no_timestamps, *tok.encode(" And so my fellow")]
    logits = session.inference(1).logits(np.array([prompt]), positions=[len(prompt) - 1])
    assert _rel_err(logits[0, 0], ref.logits(enc, prompt)[-1]) <= 1e-4


def test_a_narrowed_session_shares_the_caches_and_weights(tiny_model_factory, jfk_audio):
    """A session pays only the narrowed arena: the self-attention caches are the wide
    session's very buffers, the weights the model's very PARAM tensors."""
    model = tiny_model_factory("joint", backend="numpy")
    wide = model.session()
    before = wide.nbytes
    narrow = wide.state.narrowed(POSITIONS)
    assert narrow is wide.state.narrowed(POSITIONS)  # bound once
    shared = set(templates_of([t for pair in model.model.kv_self for t in pair]))
    assert shared
    assert all(narrow.buffers[t] is wide.state.buffers[t] for t in shared)
    grown = wide.nbytes - before
    caches = sum(t.size for t in shared)
    assert 0 < grown < model.model.session_bytes - caches
    assert grown == sum(b.size for t, b in narrow.buffers.items() if t not in shared)
    assert narrow.model.param is model.model.param
    assert narrow.model is model.model.narrowed(POSITIONS)
    assert model.model.narrowed(model.dims.n_audio_ctx) is model.model
    with pytest.raises(ValueError, match="1 to 1499"):
        model.model.narrowed(1500 + 1)


def test_jfk_on_a_ten_second_window(tiny_model_factory, jfk_audio):
    """jfk's first sentence (7.9 s) on a 10 s window: the same text and times as on the
    30 s window, from one 10 s window."""
    model = tiny_model_factory("joint", backend="numpy")
    audio = jfk_audio[:8 * 16000]
    with model.session() as session:
        wide = session.transcribe(audio, beam_size=None, word_timestamps=True)
        narrow = session.transcribe(audio, beam_size=None, word_timestamps=True,
                                    window_s=WINDOW_S)
    assert normalize(narrow.text) == normalize(wide.text) == normalize(
        "And so my fellow Americans ask not what your country can do for you")
    starts = [w.start for s in narrow.segments for w in s.words]
    assert starts == pytest.approx([w.start for s in wide.segments for w in s.words], abs=0.1)
    assert narrow.segments[-1].end <= 8.0


def test_window_s_is_checked(tiny_model_factory, jfk_audio):
    model = tiny_model_factory("joint", backend="numpy")
    with model.session() as session:
        for bad in (0.0, 10.01, 31.0):
            with pytest.raises(ValueError, match="window_s must be a multiple of 0.02"):
                session.transcribe(jfk_audio[:16000], window_s=bad)
        with pytest.raises(UserError, match="window_s.*batch_size"):
            session.transcribe(jfk_audio[:16000], window_s=10.0, batch_size=2)
        for bad in (-1.0, float("nan"), float("inf"), "1"):
            with pytest.raises(ValueError, match="speech_until_s must be a number"):
                session.transcribe(jfk_audio[:16000], speech_until_s=bad)
        for other in ({"batch_size": 2}, {"vad_filter": True}):  # their windows differ
            with pytest.raises(UserError, match="speech_until_s"):
                session.transcribe(jfk_audio[:16000], speech_until_s=0.5, **other)
        # a failed run leaves the session usable, narrowed or not
        assert session.transcribe(jfk_audio[:3 * 16000], beam_size=None,
                                  window_s=WINDOW_S).text.strip()

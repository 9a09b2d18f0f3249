"""Whisper tiny.en on the planned runtime, end to end, against the reference's output and
an independent float64 forward pass."""

from __future__ import annotations

import numpy as np
import pytest
from reference_forward import Reference
from whisper_helpers import BACKEND_NAMES, JFK_TEXT, normalize

from tensorplan.pipeline import PLAN_MODES


@pytest.mark.parametrize("plan", PLAN_MODES)
def test_jfk_greedy_golden_under_every_plan_mode(tiny_model_factory, jfk_audio, plan):
    model = tiny_model_factory(plan)
    result = model.transcribe(jfk_audio, beam_size=None)
    assert normalize(result.text) == normalize(JFK_TEXT)
    ends = [s.end for s in result.segments]
    assert len(ends) == 2, [(s.start, s.end, s.text) for s in result.segments]
    assert ends == pytest.approx([7.74, 10.74], abs=0.1)  # openai-whisper's ends
    assert result.language == "en"


def test_plan_modes_give_identical_tokens(tiny_model_factory, jfk_audio):
    tokens = {
        plan: [
            s.tokens
            for s in tiny_model_factory(plan).transcribe(jfk_audio, beam_size=None).segments
        ]
        for plan in PLAN_MODES
    }
    first = tokens[PLAN_MODES[0]]
    assert all(t == first for t in tokens.values())


@pytest.fixture(scope="module", params=BACKEND_NAMES)
def first_window(request, tiny_model_factory, jfk_audio):
    """The jfk window encoded, once per backend: the float64 checks below hold for each."""
    from tensorplan.whisper.audio.mel import log_mel_spectrogram

    model = tiny_model_factory("joint", backend=request.param).session().state
    mel = log_mel_spectrogram(jfk_audio, n_mels=80, padding=480_000)[:, :3000]
    model.encode(np.ascontiguousarray(mel))
    return model, mel


def _rel_err(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def test_encoder_and_first_logits_match_float64_reference(first_window, tiny_weights):
    model, mel = first_window
    dims = tiny_weights.dims
    ref = Reference(tiny_weights, dims.n_audio_head, dims.n_text_head)
    enc_ref = ref.encode(mel)
    d = dims.n_text_state
    for layer in (0, dims.n_text_layer - 1):  # the encoder as the decoder reads it
        w = ref.p(f"decoder/layer_{layer}/attention/linear_1/weight")
        b = ref.p(f"decoder/layer_{layer}/attention/linear_1/bias")
        k, v = model.cross_kv(layer)
        assert _rel_err(k, enc_ref @ w[:d].T + b[:d]) <= 1e-4
        assert _rel_err(v, enc_ref @ w[d:].T + b[d:]) <= 1e-4

    tok = model.tokenizer
    prompt = [tok.sot, tok.no_timestamps, *tok.encode(" And so my fellow")]
    logits = model.inference(1).logits(np.array([prompt]), positions=[0, len(prompt) - 1])
    want = ref.logits(enc_ref, prompt)[[0, len(prompt) - 1]]
    assert logits.shape == (1, 2, dims.n_vocab)
    assert _rel_err(logits[0], want) <= 1e-4


def test_incremental_decoding_matches_full_prompt(first_window):
    """Feeding tokens one at a time through the KV cache gives the logits of one pass."""
    model, _ = first_window
    tok = model.tokenizer
    seq = np.array([[tok.sot, tok.no_timestamps, *tok.encode(" ask not what your")]])
    whole = model.inference(1).logits(seq)[0, -1]
    inf = model.inference(1)
    inf.logits(seq[:, :2])
    for n in range(3, seq.shape[1] + 1):
        step = inf.logits(seq[:, :n])[0, -1]
    assert _rel_err(step, whole) <= 1e-5


def test_beams_share_one_prompt_then_diverge(first_window):
    """Batch rows decode independently: each row's logits equal a batch-of-one run."""
    model, _ = first_window
    tok = model.tokenizer
    base = [tok.sot, tok.no_timestamps]
    rows = [tok.encode(" And"), tok.encode(" So"), tok.encode(" Ask")]
    batch = model.inference(3)
    batch.logits(np.array([base] * 3))
    got = batch.logits(np.array([base + r for r in rows]))
    for i, r in enumerate(rows):
        want = model.inference(1).logits(np.array([base + r]))
        assert _rel_err(got[i], want[0]) <= 1e-5


def test_decoding_never_replans(tiny_model_factory, jfk_audio, monkeypatch):
    """Graphs are planned at load; transcription plans nothing and re-binds nothing."""
    import tensorplan.alloc.allocator as allocator

    model = tiny_model_factory("joint")
    calls = []
    real = allocator.GraphAllocator.alloc_graph
    monkeypatch.setattr(
        allocator.GraphAllocator, "alloc_graph", lambda self, g: calls.append(g) or real(self, g)
    )
    model.transcribe(jfk_audio, beam_size=None)
    assert calls == []


def test_memory_savings_keep_the_transcript(tiny_model_factory, jfk_audio):
    """float16 KV caches and encoder weights, one sequence's cache: the same tokens."""
    from tensorplan.whisper.api import load_model

    lean = load_model("tiny.en", kv_dtype="float16", weights_dtype="float16", max_batch=1)
    want = tiny_model_factory("joint").transcribe(jfk_audio, beam_size=None, temperature=(0.0,))
    got = lean.transcribe(jfk_audio, beam_size=None, temperature=(0.0,))
    assert [s.tokens for s in got.segments] == [s.tokens for s in want.segments]
    assert lean.model.pipeline.compute_bytes()["joint"] < \
        tiny_model_factory("joint").model.pipeline.compute_bytes()["joint"]

"""The fast paths against the reference: the torch backend (same plan, PyTorch's kernels)
must give the numpy backend's tokens and logits; compute_type="int8" must keep the text
and stay near the float32 logits, and its numpy kernel (the exact dequantized product)
bounds the torch one's extra activation rounding."""

from __future__ import annotations

import re

import numpy as np
import pytest
import scipy.special
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from whisper_helpers import BACKEND_NAMES, JFK_TEXT, normalize

from tensorplan.whisper.planned.quantize import quantize_rows

needs_torch = pytest.mark.skipif("torch" not in BACKEND_NAMES, reason="PyTorch not installed")


def _rel_err(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def _first_logits(model, jfk_audio) -> tuple[np.ndarray, np.ndarray]:
    """(first decoder layer's cross K and V, logits of the first and last prompt
    positions), jfk window."""
    from tensorplan.whisper.audio.mel import log_mel_spectrogram

    m = model.session().state
    mel = log_mel_spectrogram(jfk_audio, n_mels=80, padding=480_000)[:, :3000]
    m.encode(np.ascontiguousarray(mel))
    tok = m.tokenizer
    prompt = [tok.sot, tok.no_timestamps, *tok.encode(" And so my fellow Americans ask")]
    logits = m.inference(1).logits(np.array([prompt]), positions=[0, len(prompt) - 1])
    return np.stack(m.cross_kv(0)), logits[0]


@needs_torch
def test_torch_backend_gives_the_reference_tokens_and_logits(tiny_model_factory, jfk_audio):
    ref = tiny_model_factory("joint", backend="numpy")
    fast = tiny_model_factory("joint", backend="torch")
    for beam in (None, 5):
        want = ref.transcribe(jfk_audio, beam_size=beam)
        got = fast.transcribe(jfk_audio, beam_size=beam)
        assert [s.tokens for s in got.segments] == [s.tokens for s in want.segments]
    enc_want, logits_want = _first_logits(ref, jfk_audio)
    enc_got, logits_got = _first_logits(fast, jfk_audio)
    assert _rel_err(enc_got, enc_want) <= 1e-4
    assert _rel_err(logits_got, logits_want) <= 1e-4


@settings(max_examples=60, deadline=None)
@example(np.array([[9.7e-44]], np.float32))  # subnormal: found by hypothesis
@example(np.array([[1e-37, -3e-38]], np.float32))  # normal, but peak / 127 is not
@given(
    hnp.arrays(
        np.float32,
        st.tuples(st.integers(1, 6), st.integers(1, 40)),
        elements=st.floats(-1e4, 1e4, width=32),
    )
)
def test_quantize_rows_rounds_each_row_to_half_a_step(w):
    q, scale = quantize_rows(w)
    assert q.dtype == np.int8 and scale.dtype == np.float32 and scale.shape == (w.shape[0],)
    assert np.all(np.abs(q.astype(np.int32)) <= 127)
    err = np.abs(q * scale[:, None].astype(np.float64) - w)
    assert np.all(err <= scale[:, None] * (0.5 + 1e-3) + 1e-30)
    # the largest entry of a row uses all 8 bits, wherever its scale (peak / 127) is a
    # normal float32: below that no float32 scale can map the peak to 127 and back
    peaked = np.abs(w).max(axis=1) >= 127 * np.finfo(np.float32).tiny
    assert np.all(np.abs(q[peaked]).max(axis=1) == 127)


def _step_logits(model, jfk_audio) -> np.ndarray:
    """Next-token logits (steps, V) decoding a jfk prompt one token at a time, as greedy
    decoding runs."""
    from tensorplan.whisper.audio.mel import log_mel_spectrogram

    m = model.session().state
    m.encode(np.ascontiguousarray(log_mel_spectrogram(jfk_audio, 80, 480_000)[:, :3000]))
    tok = m.tokenizer
    prompt = [tok.sot, tok.no_timestamps, *tok.encode(" And so my fellow Americans ask not")]
    inf = m.inference(1)
    inf.logits(np.array([prompt[:2]]))
    return np.stack([inf.logits(np.array([prompt[:n]]))[0, -1] for n in range(3, len(prompt))])


def _kl(want: np.ndarray, got: np.ndarray) -> np.ndarray:
    """KL(want || got) per row of logits: what the rounding costs the next-token choice
    (a logit shift common to a row costs nothing, unlike in a relative error)."""
    lw, lg = scipy.special.log_softmax(want, -1), scipy.special.log_softmax(got, -1)
    return (np.exp(lw) * (lw - lg)).sum(-1)


@pytest.mark.parametrize("backend", BACKEND_NAMES)
def test_int8_keeps_the_text_and_the_next_token_choice(tiny_model_factory, jfk_audio, backend):
    model = tiny_model_factory("joint", backend=backend, compute_type="int8")
    result = model.transcribe(jfk_audio, beam_size=None)
    assert normalize(result.text) == normalize(JFK_TEXT)
    assert result.segments[-1].end == pytest.approx(11.0, abs=0.5)
    want = _step_logits(tiny_model_factory("joint", backend=backend), jfk_audio)
    got = _step_logits(model, jfk_audio)
    # measured: KL 0.000-0.005 nats per step (numpy and torch alike); float32 vs torch 0
    assert _kl(want, got).max() <= 0.02
    assert (got.argmax(axis=-1) == want.argmax(axis=-1)).all()


@needs_torch
def test_int8_torch_kernel_stays_near_the_exact_dequantized_product(
    tiny_model_factory, jfk_audio
):
    """numpy's qmatmul is exact for the int8 weights; FBGEMM adds 7-bit activations."""
    exact = _step_logits(tiny_model_factory("joint", "numpy", "int8"), jfk_audio)
    fast = _step_logits(tiny_model_factory("joint", "torch", "int8"), jfk_audio)
    assert _kl(exact, fast).max() <= 0.02
    assert (fast.argmax(axis=-1) == exact.argmax(axis=-1)).all()


def test_int8_holds_every_projection_as_int8(tiny_model_factory):
    """A quarter of the bytes for the token embedding (tied to the logits) and every
    layer's projections, the cross K/V's fused one included; the convolutions, norms and
    biases stay float32."""
    model = tiny_model_factory("joint", backend="numpy", compute_type="int8").model
    dtypes = {name: t.dtype.name for name, t in model.param.tensors.items()}
    for name in ("decoder/embeddings/weight", "decoder/layer_0/ffn/linear_1/weight",
                 "decoder/layer_0/attention/linear_1/weight",
                 "encoder/layer_0/self_attention/linear_0/weight"):
        assert dtypes[name] == "int8", name
        assert dtypes[f"{name}_scale"] == "float32", name
    assert dtypes["encoder/conv1/weight"] == "float32"
    assert dtypes["decoder/layer_0/ffn/linear_1/bias"] == "float32"


def test_a_missing_backend_or_compute_type_is_a_clear_error(monkeypatch):
    import tensorplan.backends as backends
    from tensorplan.backends import torch_cpu
    from tensorplan.errors import UserError
    from tensorplan.whisper.api import load_model

    monkeypatch.setattr(torch_cpu, "torch", None)  # as on a machine without PyTorch
    monkeypatch.setattr(backends, "torch_available", lambda: False)
    with pytest.raises(UserError, match=re.escape(backends.TORCH_INSTALL)):
        load_model("tiny.en", backend="torch")
    assert type(load_model("tiny.en", backend="auto").model.backend).__name__ == "NumpyBackend"
    with pytest.raises(UserError, match="unknown backend 'cuda'"):
        load_model("tiny.en", backend="cuda")
    with pytest.raises(ValueError, match="compute_type"):
        load_model("tiny.en", backend="numpy", compute_type="int4")


def test_the_numpy_backend_never_imports_torch():
    """Importing PyTorch costs 238 MB of RSS: a numpy run must not pay it."""
    import subprocess
    import sys

    code = ("import sys; from tensorplan.whisper.api import load_model; "
            "load_model('tiny.en', backend='numpy'); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=300).stdout.split()
    assert out[-1] == "False"


def test_only_an_int8_models_window_products_allow_bfloat16(tiny_model_factory):
    """The hint the torch backend honours on AMX CPUs: the int8 encoder's products (its
    attention's too) and the cross K/V's, never a decoder's, whose kernel must not depend
    on how many windows share its batch; float32 keeps every product float32."""
    for compute in ("float32", "int8"):
        model = tiny_model_factory("joint", backend="numpy", compute_type=compute).model
        for name, stage in model.pipeline.stages.items():
            products = [n for n in stage.graph.nodes if n.op is not None
                        and n.op.name in ("matmul", "qmatmul", "attention")]
            hinted = {n.name for n in products if n.params.get("precision") == "bfloat16"}
            if compute == "float32" or name not in ("encoder", "cross"):
                assert not hinted, (compute, name, sorted(hinted)[:3])
                continue
            assert hinted == {n.name for n in products}, (name, products)
        # the encoder attends in one fused node per layer: no (A, A) scores are planned
        nodes = model.pipeline.stages["encoder"].graph.nodes
        attention = [n for n in nodes if n.op is not None and n.op.name == "attention"]
        assert len(attention) == model.dims.n_audio_layer
        assert not [n for n in nodes if n.op is not None and n.op.name == "softmax"]
        a = model.dims.n_audio_ctx
        assert not [n for n in nodes if n.shape[-2:] == (a, a)]

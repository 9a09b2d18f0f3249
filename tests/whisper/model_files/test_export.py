"""Export to openai-whisper's .pt and whisper.cpp's ggml .bin, and reading both back.

Round trips must be bit-exact against the CTranslate2 source; the ggml file must follow
whisper.cpp's type and layout rules; a tiny.en re-loaded from ggml must still transcribe
jfk.wav; and every corrupt file must be a one-line ModelError that names it.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ct2_writer
import numpy as np
import pt_writer
import pytest
from whisper_helpers import JFK_TEXT, normalize

from tensorplan.backends import TORCH_INSTALL
from tensorplan.cli import main
from tensorplan.errors import ModelError
from tensorplan.whisper.audio.mel import mel_filters
from tensorplan.whisper.model_files.checkpoint import encode_heads, read_checkpoint
from tensorplan.whisper.model_files.ct2_weights import WhisperWeights, expected_shapes
from tensorplan.whisper.model_files.export import export_model, ggml_tokens
from tensorplan.whisper.model_files.formats import (
    OPENAI_ALIGNMENT_HEADS,
    default_alignment_heads,
    detect_format,
    load_model_files,
    openai_pieces,
    openai_state_dict,
    weights_from_openai,
)
from tensorplan.whisper.model_files.ggml_file import GGML_MAGIC, read_ggml, write_ggml

HAS_TORCH = importlib.util.find_spec("torch") is not None


def assert_same_weights(got: WhisperWeights, want: WhisperWeights) -> None:
    """Every CT2 variable equal, float16 sources bit for bit (float32 copies of float16
    values convert back exactly)."""
    assert got.dims == want.dims
    for name in expected_shapes(want.dims):
        a, b = want.get(name), got.get(name)
        assert b.shape == a.shape, name
        if a.dtype == np.float16:
            assert b.dtype in (np.float16, np.float32), name
            np.testing.assert_array_equal(b.astype(np.float16).view(np.uint16),
                                          a.view(np.uint16), err_msg=name)
        else:
            np.testing.assert_array_equal(b, a, err_msg=name)


# --- the real tiny.en ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def ggml_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_model(tmp_path_factory.mktemp("ggml") / "ggml-tiny.en.bin", "ggml")


def test_ggml_round_trip_is_bit_exact(ggml_path: Path, tiny_weights: WhisperWeights) -> None:
    weights, tokenizer = load_model_files(ggml_path)
    assert_same_weights(weights, tiny_weights)
    assert weights.config == dataclasses.replace(tiny_weights.config, lang_ids=())
    assert tokenizer.n_vocab == tiny_weights.dims.n_vocab


def test_ggml_file_follows_whisper_cpp(ggml_path: Path, tiny_weights: WhisperWeights) -> None:
    g = read_ggml(ggml_path)
    assert g.dims == tiny_weights.dims and g.ftype == 1
    np.testing.assert_array_equal(g.mel_filters, mel_filters(80))
    assert len(g.tokens) == 50256 and g.tokens[220] == b" " and g.tokens[0] == b"!"
    names = [p.openai for p in openai_pieces(g.dims) if p.openai]
    assert list(g.tensors) == names and len(names) == 167  # whisper.cpp requires all, no more
    for name, array in g.tensors.items():
        f32 = array.ndim < 2 or "positional_embedding" in name
        assert array.dtype == (np.float32 if f32 else np.float16), name
    assert "encoder.blocks.0.attn.key.bias" not in g.tensors
    # conv biases are (n, 1) in the file: whisper.cpp's ne = [1, n]
    raw = ggml_path.read_bytes()
    at = raw.index(b"encoder.conv1.bias")
    assert struct.unpack_from("<5i", raw, at - 20) == (2, 18, 0, 1, 384)


def test_jfk_from_the_reloaded_ggml_file(ggml_path: Path, jfk_audio: np.ndarray) -> None:
    from tensorplan.backends import NumpyBackend
    from tensorplan.whisper.api import Whisper
    from tensorplan.whisper.planned.model import WhisperModel

    # = load_model(ggml_path) once api.load_model goes through formats.load_model_files
    weights, tokenizer = load_model_files(ggml_path)
    model = Whisper(WhisperModel(weights, tokenizer, weights.config, backend=NumpyBackend()),
                    str(ggml_path))
    result = model.transcribe(jfk_audio, beam_size=None)
    assert normalize(result.text) == normalize(JFK_TEXT)
    assert [s.end for s in result.segments] == pytest.approx([7.74, 10.74], abs=0.1)


@pytest.fixture(scope="module")
def pt_path(tmp_path_factory: pytest.TempPathFactory, tiny_weights: WhisperWeights) -> Path:
    """tiny.en as an openai checkpoint: by torch.save when torch is here, else by hand."""
    out = tmp_path_factory.mktemp("pt") / "tiny.en.pt"
    if HAS_TORCH:
        return export_model(out, "openai")
    dims = dataclasses.asdict(tiny_weights.dims)
    heads = encode_heads(tiny_weights.config.alignment_heads, tiny_weights.dims)
    state = {k: np.array(v) for k, v in openai_state_dict(tiny_weights).items()}
    return pt_writer.write_pt(out, {"dims": dims, "model_state_dict": state,
                                    "alignment_heads": heads})


def test_openai_round_trip_is_bit_exact(pt_path: Path, tiny_weights: WhisperWeights) -> None:
    weights, _ = load_model_files(pt_path)
    assert_same_weights(weights, tiny_weights)
    assert weights.config.alignment_heads == tiny_weights.config.alignment_heads
    state = read_checkpoint(pt_path).tensors
    assert all(a.dtype == np.float16 for a in state.values())  # as stored, as openai's own
    assert "decoder.blocks.0.cross_attn.key.bias" not in state


@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_openai_checkpoint_loads_in_torch(pt_path: Path, tiny_weights: WhisperWeights) -> None:
    import torch

    checkpoint = torch.load(pt_path, weights_only=True)
    assert checkpoint["dims"] == dataclasses.asdict(tiny_weights.dims)
    ours = openai_state_dict(tiny_weights)
    assert list(checkpoint["model_state_dict"]) == list(ours)
    for name, tensor in checkpoint["model_state_dict"].items():
        assert tensor.dtype == torch.float16
        np.testing.assert_array_equal(tensor.numpy().view(np.uint16), ours[name].view(np.uint16))


@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_handwritten_checkpoints_match_torch(tmp_path: Path) -> None:
    import torch

    obj = {"dims": {"n": 1}, "model_state_dict": {"a": np.arange(6, dtype=np.float16)}}
    loaded = torch.load(pt_writer.write_pt(tmp_path / "x.pt", obj), weights_only=True)
    np.testing.assert_array_equal(loaded["model_state_dict"]["a"].numpy(), np.arange(6))


def test_derived_config_equals_tiny_en_config_json(ggml_path: Path,
                                                   tiny_weights: WhisperWeights) -> None:
    weights, _ = load_model_files(ggml_path)
    assert weights.config.suppress_ids == tiny_weights.config.suppress_ids
    assert weights.config.suppress_ids_begin == tiny_weights.config.suppress_ids_begin
    assert weights.config.alignment_heads == tiny_weights.config.alignment_heads
    assert len(OPENAI_ALIGNMENT_HEADS) == 11


def test_export_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "m.bin"
    assert main(["export", "--format", "ggml", "--out", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out and detect_format(out) == "ggml"
    monkeypatch.setitem(__import__("sys").modules, "torch", None)  # as if not installed
    assert main(["export", "--format", "openai", "--out", str(tmp_path / "m.pt")]) == 2
    assert TORCH_INSTALL in capsys.readouterr().err
    assert not (tmp_path / "m.pt").exists()


# --- small synthetic models: layout details and corruption ----------------------------------


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> WhisperWeights:
    arrays = ct2_writer.whisper_arrays(n_mels=80, audio_ctx=1500, vocab=11, text_ctx=5)
    for name, bias in arrays.items():  # zero key biases, as CT2's converter writes them
        if name.endswith("self_attention/linear_0/bias"):
            bias[8:16] = 0
        elif name.endswith("attention/linear_1/bias"):
            bias[:8] = 0
    return WhisperWeights.load(ct2_writer.write_whisper(tmp_path_factory.mktemp("ct2"), arrays))


def _small_ggml(path: Path, weights: WhisperWeights, **replace: object) -> Path:
    state = openai_state_dict(weights)
    state.update(replace)  # type: ignore[arg-type]
    items = [(k, v) for k, v in state.items() if v is not None]
    return write_ggml(path, weights.dims, mel_filters(80), [b"a", b"b"], items)


def test_small_ggml_round_trip(tmp_path: Path, small: WhisperWeights) -> None:
    g = read_ggml(_small_ggml(tmp_path / "s.bin", small))
    weights = weights_from_openai(g.path, g.buf, g.dims, g.tensors)
    assert_same_weights(weights, small)
    assert weights.config.alignment_heads == default_alignment_heads(small.dims) == ((0, 0),
                                                                                     (0, 1))
    assert weights.config.suppress_ids == ()  # no tokenizer, nothing suppressed
    assert g.tokens == (b"a", b"b")


def test_small_checkpoint_round_trip(tmp_path: Path, small: WhisperWeights) -> None:
    state = {k: np.array(v) for k, v in openai_state_dict(small).items()}
    state["encoder.conv1.weight"] = np.asfortranarray(state["encoder.conv1.weight"])
    path = pt_writer.write_pt(tmp_path / "s.pt", {"dims": dataclasses.asdict(small.dims),
                                                  "model_state_dict": state})
    c = read_checkpoint(path)
    assert c.alignment_heads is None and not c.tensors["encoder.conv1.weight"].flags.writeable
    assert_same_weights(weights_from_openai(c.path, c.buf, c.dims, c.tensors), small)


def _one_line(error: pytest.ExceptionInfo[ModelError], path: Path, match: str) -> None:
    message = str(error.value)
    assert "\n" not in message and message.startswith(str(path)), message
    assert match in message, message


def _patched(data: bytes, at: int, fmt: str, *values: int) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, at, *values)
    return bytes(out)


HEADER = 4 + 11 * 4  # magic + hparams
FILTERS_END = HEADER + 8 + 80 * 201 * 4
TOKENS_END = FILTERS_END + 4 + 2 * 5  # two one-byte tokens
GGML_CASES: dict[str, tuple[Callable[[bytes], bytes], str]] = {
    "bad magic": (lambda d: _patched(d, 0, "<i", 0x1234), "not a ggml model"),
    "empty": (lambda d: b"", "empty file"),
    "truncated hparams": (lambda d: d[:20], "truncated: hparams"),
    "quantized": (lambda d: _patched(d, 4 + 40, "<i", 1002), "is quantized"),
    "zero heads": (lambda d: _patched(d, 4 + 12, "<i", 0), "impossible hparams"),
    "huge filters": (lambda d: _patched(d, HEADER, "<2i", 1 << 20, 1 << 20), "do not fit"),
    "huge token count": (lambda d: _patched(d, FILTERS_END, "<i", 1 << 24), "token count"),
    "negative token length": (lambda d: _patched(d, FILTERS_END + 4, "<i", -1), "length of token"),
    "n_dims 64": (lambda d: _patched(d, TOKENS_END, "<i", 64), "has 64 dims"),
    "long name": (lambda d: _patched(d, TOKENS_END + 4, "<i", 1 << 30), "a name of"),
    "q4_0 tensor": (lambda d: _patched(d, TOKENS_END + 8, "<i", 2), "ggml type 2"),
    "huge tensor": (lambda d: _patched(d, TOKENS_END + 12, "<i", 1 << 30), "needs"),
    "zero dim": (lambda d: _patched(d, TOKENS_END + 12, "<i", 0), "has dims"),
    "truncated data": (lambda d: d[:-3], "decoder.ln.bias (8,) needs 32 bytes"),
    "trailing bytes": (lambda d: d + b"\0" * 5, "truncated: tensor header"),
}


@pytest.mark.parametrize("case", GGML_CASES)
def test_corrupt_ggml(tmp_path: Path, small: WhisperWeights, case: str) -> None:
    corrupt, match = GGML_CASES[case]
    path = tmp_path / "bad.bin"
    path.write_bytes(corrupt(_small_ggml(tmp_path / "good.bin", small).read_bytes()))
    with pytest.raises(ModelError) as error:
        read_ggml(path)
    _one_line(error, path, match)


@pytest.mark.parametrize(
    ("replace", "match"),
    [
        ({"decoder.ln.bias": None}, "missing tensor decoder.ln.bias"),
        ({"encoder.blocks.0.attn.key.weight": np.zeros((8, 7), np.float16)},
         "parts of encoder/layer_0/self_attention/linear_0/weight differ"),
        ({"decoder.token_embedding.weight": np.zeros((12, 8), np.float16)}, "the header says"),
        ({"encoder.ln_post.weight": np.zeros(9, np.float32)}, "encoder/layer_norm/gamma has"),
    ],
)
def test_inconsistent_ggml(tmp_path: Path, small: WhisperWeights, replace: dict[str, Any],
                          match: str) -> None:
    path = _small_ggml(tmp_path / "bad.bin", small, **replace)
    g = read_ggml(path)
    with pytest.raises(ModelError) as error:
        weights_from_openai(g.path, g.buf, g.dims, g.tensors)
    _one_line(error, path, match)


def test_ggml_vocabulary_must_match_the_tokenizer(ggml_path: Path, tmp_path: Path) -> None:
    raw = bytearray(ggml_path.read_bytes())
    at = raw.index(struct.pack("<i", 1) + b"!")  # token 0: length 1, "!"
    raw[at + 4 : at + 5] = b"?"
    (tmp_path / "t.bin").write_bytes(bytes(raw))
    with pytest.raises(ModelError) as error:
        load_model_files(tmp_path / "t.bin")
    _one_line(error, tmp_path / "t.bin", "token 0 is b'?'")


def _pt(path: Path, small: WhisperWeights, **fields: object) -> Path:
    obj: dict[str, object] = {"dims": dataclasses.asdict(small.dims),
                              "model_state_dict": {"decoder.ln.bias": np.zeros(8, np.float16)}}
    obj.update(fields)
    return pt_writer.write_pt(path, obj)


def _zip(path: Path, entries: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in entries.items():
            zf.writestr(name, data)


PT_CASES: dict[str, tuple[Callable[[Path, WhisperWeights], object], str]] = {
    "not a zip": (lambda p, s: p.write_bytes(b"hello world"), "not a model"),
    "legacy": (lambda p, s: p.write_bytes(b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19.xx"),
               "legacy"),
    "no data.pkl": (lambda p, s: _zip(p, {"a/b": b"x"}), "data.pkl"),
    "os.system": (lambda p, s: _pt(p, s, evil=pt_writer.Global("os", "system")), "os.system"),
    "truncated pickle": (lambda p, s: pt_writer.write_pt(p, {}, pkl=b"\x80\x02}q\x00(X"),
                         "not a readable checkpoint"),
    "no dims": (lambda p, s: _pt(p, s, dims=None), "dims must hold"),
    "no state": (lambda p, s: _pt(p, s, model_state_dict=[1]), "no model_state_dict"),
    "not a tensor": (lambda p, s: _pt(p, s, model_state_dict={"a": 1}), "'a' is not a tensor"),
    "bad heads": (lambda p, s: _pt(p, s, alignment_heads="!!"), "alignment_heads"),
    "missing tensors": (lambda p, s: _pt(p, s), "layers cannot fit"),
}


@pytest.mark.parametrize("case", PT_CASES)
def test_corrupt_checkpoint(tmp_path: Path, small: WhisperWeights, case: str) -> None:
    write, match = PT_CASES[case]
    path = tmp_path / "bad.pt"
    write(path, small)
    with pytest.raises(ModelError) as error:
        load_model_files(path)
    _one_line(error, path, match)


def test_checkpoint_storage_bounds(tmp_path: Path) -> None:
    data, _ = pt_writer.pickle_with_tensors({"model_state_dict": {"a": np.zeros(4)}})
    _zip(tmp_path / "x.pt", {"archive/data.pkl": data,
                             "archive/data/0": b"\0" * 8})  # 4 float64 declared, 1 stored
    with pytest.raises(ModelError) as error:
        read_checkpoint(tmp_path / "x.pt")
    _one_line(error, tmp_path / "x.pt", "reaches element 3 of a storage of 1")


def test_detect_format(tmp_path: Path, ggml_path: Path) -> None:
    assert detect_format("tiny.en") == "ct2" and detect_format(tmp_path) == "ct2"
    assert detect_format(ggml_path) == "ggml"
    (tmp_path / "x.pt").write_bytes(b"PK\x03\x04rest")
    assert detect_format(tmp_path / "x.pt") == "openai"
    assert int.from_bytes(ggml_path.read_bytes()[:4], "little") == GGML_MAGIC
    assert ggml_tokens(load_model_files("tiny.en")[1])[:2] == [b"!", b'"']

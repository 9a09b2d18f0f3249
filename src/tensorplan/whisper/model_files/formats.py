"""Whisper weights from any of three files, all seen through CTranslate2's variable names.

- a CTranslate2 directory (or a model name): `WhisperWeights.load`;
- openai-whisper's `.pt` checkpoint: `checkpoint.read_checkpoint` (no torch needed);
- whisper.cpp's ggml `.bin`: `ggml_file.read_ggml`.

The last two use openai's tensor names. `openai_pieces(dims)` is the one table between the
two naming schemes: a CT2 tensor is one openai tensor, or the
row-wise concatenation of several (the fused Q/K/V and cross-attention K/V projections). The
key bias openai lacks is zeros on the way in and dropped on the way out (a key bias adds the
same q·b to every score of a query, so softmax ignores it). `ComposedModelBin` serves
`get(ct2_name)` from openai-named arrays, so the result is a plain `WhisperWeights`.

Those two formats carry no config.json and no tokenizer, so:
- tokenizer: a tokenizer.json beside the file wins; otherwise the bundled tiny.en tokenizer
  for English-only vocabularies (n_vocab 51864), or the installed `base`/`small` package's
  for multilingual ones (51865). large-v3's 51866 needs a tokenizer.json beside the file.
- suppress ids: openai's "-1" set (non-speech tokens + the task/control specials), and
  [" ", eot] at the first step, computed from the tokenizer (config.json holds the same).
- alignment heads: the checkpoint's own (files `tensorplan export` wrote), else openai's
  table for known dims (large-v1 and -v2 share dims; v2's heads are used), else CT2's
  fallback: every head of the last half of the decoder layers.
"""

from __future__ import annotations

import dataclasses
import math
import mmap
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tensorplan.errors import ModelError
from tensorplan.whisper.model_files.checkpoint import ZIP_MAGIC, read_checkpoint
from tensorplan.whisper.model_files.ct2_file import ModelBin, Variable
from tensorplan.whisper.model_files.ct2_weights import (
    ModelDims,
    WhisperConfig,
    WhisperWeights,
    expected_shapes,
    infer_dims,
)
from tensorplan.whisper.model_files.find import (
    _MAX_PACKAGES,
    _SPLIT_MODELS,
    DEFAULT_MODEL,
    _data_dir,
    resolve_model,
)
from tensorplan.whisper.model_files.ggml_file import GGML_MAGIC, GgmlFile, read_ggml
from tensorplan.whisper.tokenizer import Tokenizer, load_tokenizer

Heads = tuple[tuple[int, int], ...]
FORMATS = ("ct2", "openai", "ggml")
ENGLISH_VOCAB, MULTILINGUAL_VOCAB = 51864, 51865
_CT2_DTYPES = {np.dtype("<f2"): "float16", np.dtype("<f4"): "float32", np.dtype("<i2"): "int16"}

# openai-whisper's _ALIGNMENT_HEADS (v20250625), decoded to (decoder layer, head) pairs, keyed
# by (n_audio_layer, n_text_layer, n_text_state, n_vocab)
OPENAI_ALIGNMENT_HEADS: dict[tuple[int, int, int, int], Heads] = {
    (4, 4, 384, 51864): ((1, 0), (2, 0), (2, 5), (3, 0), (3, 1), (3, 2), (3, 3), (3, 4)),
    (4, 4, 384, 51865): ((2, 2), (3, 0), (3, 2), (3, 3), (3, 4), (3, 5)),
    (6, 6, 512, 51864): ((3, 3), (4, 7), (5, 1), (5, 5), (5, 7)),
    (6, 6, 512, 51865): ((3, 1), (4, 2), (4, 3), (4, 7), (5, 1), (5, 2), (5, 4), (5, 6)),
    (12, 12, 768, 51864): ((6, 6), (7, 0), (7, 3), (7, 8), (8, 2), (8, 5), (8, 7), (9, 0),
                           (9, 4), (9, 8), (9, 10), (10, 0), (10, 1), (10, 2), (10, 3),
                           (10, 6), (10, 11), (11, 2), (11, 4)),
    (12, 12, 768, 51865): ((5, 3), (5, 9), (8, 0), (8, 4), (8, 7), (8, 8), (9, 0), (9, 7),
                           (9, 9), (10, 5)),
    (24, 24, 1024, 51864): ((11, 4), (14, 1), (14, 12), (14, 14), (15, 4), (16, 0), (16, 4),
                            (16, 9), (17, 12), (17, 14), (18, 7), (18, 10), (18, 15), (20, 0),
                            (20, 3), (20, 9), (20, 14), (21, 12)),
    (24, 24, 1024, 51865): ((13, 15), (15, 4), (15, 15), (16, 1), (20, 0), (23, 4)),
    (32, 32, 1280, 51865): ((10, 12), (13, 17), (16, 11), (16, 12), (16, 13), (17, 15),
                            (17, 16), (18, 4), (18, 11), (18, 19), (19, 11), (21, 2), (21, 3),
                            (22, 3), (22, 9), (22, 12), (23, 5), (23, 7), (23, 13), (25, 5),
                            (26, 1), (26, 12), (27, 15)),  # large-v2
    (32, 32, 1280, 51866): ((7, 0), (10, 17), (12, 18), (13, 12), (16, 1), (17, 14), (19, 11),
                            (21, 4), (24, 1), (25, 6)),  # large-v3
    (32, 4, 1280, 51866): ((2, 4), (2, 11), (3, 3), (3, 6), (3, 11), (3, 14)),  # turbo
}


# --- the name table ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Piece:
    """Row block `index` of `parts` equal blocks of CT2 tensor `ct2` is openai tensor `openai`
    (None: a block openai does not have, the zero key bias)."""

    openai: str | None
    ct2: str
    index: int = 0
    parts: int = 1


def openai_pieces(dims: ModelDims) -> list[Piece]:
    """Every openai tensor (and zero block), in openai's state_dict order."""
    pieces = [Piece("encoder.positional_embedding", "encoder/position_encodings/encodings")]
    for i in (1, 2):
        for kind in ("weight", "bias"):
            pieces.append(Piece(f"encoder.conv{i}.{kind}", f"encoder/conv{i}/{kind}"))
    for i in range(dims.n_audio_layer):
        o, c = f"encoder.blocks.{i}", f"encoder/layer_{i}"
        pieces += _attention(f"{o}.attn", f"{c}/self_attention")
        pieces += _layer_norm(f"{o}.attn_ln", f"{c}/self_attention/layer_norm")
        pieces += _mlp(o, c)
    pieces += _layer_norm("encoder.ln_post", "encoder/layer_norm")
    pieces += [Piece("decoder.positional_embedding", "decoder/position_encodings/encodings"),
               Piece("decoder.token_embedding.weight", "decoder/embeddings/weight")]
    for i in range(dims.n_text_layer):
        o, c = f"decoder.blocks.{i}", f"decoder/layer_{i}"
        pieces += _attention(f"{o}.attn", f"{c}/self_attention")
        pieces += _layer_norm(f"{o}.attn_ln", f"{c}/self_attention/layer_norm")
        pieces += _cross_attention(f"{o}.cross_attn", f"{c}/attention")
        pieces += _layer_norm(f"{o}.cross_attn_ln", f"{c}/attention/layer_norm")
        pieces += _mlp(o, c)
    pieces += _layer_norm("decoder.ln", "decoder/layer_norm")
    return pieces


def _layer_norm(o: str, c: str) -> list[Piece]:
    return [Piece(f"{o}.weight", f"{c}/gamma"), Piece(f"{o}.bias", f"{c}/beta")]


def _linear(o: str, c: str, index: int = 0, parts: int = 1, bias: bool = True) -> list[Piece]:
    return [Piece(f"{o}.weight", f"{c}/weight", index, parts),
            Piece(f"{o}.bias" if bias else None, f"{c}/bias", index, parts)]


def _attention(o: str, c: str) -> list[Piece]:
    return [*_linear(f"{o}.query", f"{c}/linear_0", 0, 3),
            *_linear(f"{o}.key", f"{c}/linear_0", 1, 3, bias=False),
            *_linear(f"{o}.value", f"{c}/linear_0", 2, 3),
            *_linear(f"{o}.out", f"{c}/linear_1")]


def _cross_attention(o: str, c: str) -> list[Piece]:
    return [*_linear(f"{o}.query", f"{c}/linear_0"),
            *_linear(f"{o}.key", f"{c}/linear_1", 0, 2, bias=False),
            *_linear(f"{o}.value", f"{c}/linear_1", 1, 2),
            *_linear(f"{o}.out", f"{c}/linear_2")]


def _mlp(o: str, c: str) -> list[Piece]:
    return [*_linear(f"{o}.mlp.0", f"{c}/ffn/linear_0"),
            *_linear(f"{o}.mlp.2", f"{c}/ffn/linear_1"),
            *_layer_norm(f"{o}.mlp_ln", f"{c}/ffn/layer_norm")]


def openai_state_dict(weights: WhisperWeights) -> dict[str, np.ndarray]:
    """openai name → tensor, split from the CT2 tensors as stored (views where possible)."""
    state: dict[str, np.ndarray] = {}
    for p in openai_pieces(weights.dims):
        if p.openai is not None:
            fused = weights.get(p.ct2)
            rows = fused.shape[0] // p.parts
            state[p.openai] = fused[p.index * rows : (p.index + 1) * rows]
    return state


# --- CT2 names over openai-named arrays -------------------------------------------------------


class ComposedModelBin(ModelBin):
    """A `ModelBin` whose variables are assembled from openai-named arrays on each `raw`.

    Single-piece variables are the source arrays themselves (views of the mapped file);
    fused ones are concatenated, a fresh array per call. `Variable.offset` is -1: there is
    no CT2 payload behind them.
    """

    def __init__(self, path: Path, buf: Any, tensors: Mapping[str, np.ndarray],
                 dims: ModelDims) -> None:
        self._tensors = dict(tensors)
        self._tensors["encoder/num_heads"] = np.array(dims.n_audio_head, np.int16)
        self._tensors["decoder/num_heads"] = np.array(dims.n_text_head, np.int16)
        self._recipes: dict[str, list[Piece]] = {
            name: [Piece(name, name)] for name in ("encoder/num_heads", "decoder/num_heads")}
        for p in openai_pieces(dims):
            self._recipes.setdefault(p.ct2, []).append(p)
        variables = {name: self._variable(path, name, pieces)
                     for name, pieces in self._recipes.items()}
        aliases = {"decoder/projection/weight": "decoder/embeddings/weight"}
        super().__init__(path, buf, 6, "WhisperSpec", 3, variables, aliases)

    def raw(self, name: str) -> np.ndarray:
        pieces = self._recipes[self.resolve(name).name]
        arrays = [self._tensors[p.openai] for p in pieces if p.openai is not None]
        if len(pieces) == 1:
            return arrays[0]
        dtype = np.result_type(*arrays)
        return np.concatenate([self._tensors[p.openai] if p.openai is not None
                               else np.zeros(arrays[0].shape, dtype) for p in pieces])

    def release(self, name: str) -> None:
        """Drop the mapped pages under a variable's source arrays (see `ModelBin.release`)."""
        if not isinstance(self._buf, mmap.mmap) or not hasattr(mmap, "MADV_DONTNEED"):
            return
        base = np.frombuffer(self._buf, np.uint8).ctypes.data
        for p in self._recipes[self.resolve(name).name]:
            a = self._tensors[p.openai] if p.openai is not None else None
            if a is None or not (base <= a.ctypes.data < base + len(self._buf)):
                continue  # not a view of the file (a scalar, a widened copy)
            start = a.ctypes.data - base
            end = start + a.nbytes
            start += -start % mmap.PAGESIZE  # whole pages only: neighbours may be needed
            end -= end % mmap.PAGESIZE
            if end > start:
                self._buf.madvise(mmap.MADV_DONTNEED, start, end - start)

    def _variable(self, path: Path, name: str, pieces: list[Piece]) -> Variable:
        for p in pieces:
            if p.openai is not None and p.openai not in self._tensors:
                raise ModelError(f"{path}: missing tensor {p.openai}")
        arrays = [self._tensors[p.openai] for p in pieces if p.openai is not None]
        if len({a.shape for a in arrays}) != 1:
            raise ModelError(f"{path}: the parts of {name} differ in shape: "
                             f"{[a.shape for a in arrays]}")
        dtype = np.result_type(*arrays)
        if dtype not in _CT2_DTYPES:
            raise ModelError(f"{path}: {pieces[0].openai} has unsupported type {dtype}")
        part = arrays[0].shape
        shape = (part[0] * len(pieces), *part[1:]) if part else ()
        return Variable(name, shape, _CT2_DTYPES[dtype], -1, math.prod(shape) * dtype.itemsize)


def weights_from_openai(path: Path, buf: Any, dims: ModelDims,
                        tensors: Mapping[str, np.ndarray], tokenizer: Tokenizer | None = None,
                        alignment_heads: Heads | None = None) -> WhisperWeights:
    """Validated `WhisperWeights` over openai-named arrays (without a tokenizer, nothing is
    suppressed, as for a CT2 directory without config.json)."""
    if dims.n_audio_layer + dims.n_text_layer > len(tensors):  # before sizing anything
        raise ModelError(f"{path}: {dims.n_audio_layer} + {dims.n_text_layer} layers cannot "
                         f"fit in {len(tensors)} tensors")
    model = ComposedModelBin(path, buf, tensors, dims)
    if (found := infer_dims(model)) != dims:  # also checks dims the engine can run
        raise ModelError(f"{path}: the header says {dims}, the tensors {found}")
    for name, shape in expected_shapes(dims).items():
        if model.resolve(name).shape != shape:
            raise model.error(f"{name} has shape {model.resolve(name).shape}, not {shape}")
    return WhisperWeights(model, dims, derived_config(dims, tokenizer, alignment_heads))


def derived_config(dims: ModelDims, tokenizer: Tokenizer | None,
                   alignment_heads: Heads | None = None) -> WhisperConfig:
    """What config.json would say, computed (see the module docstring)."""
    heads = alignment_heads or default_alignment_heads(dims)
    if tokenizer is None:
        return WhisperConfig(heads, (), (), ())
    t = tokenizer
    specials = {t.transcribe, t.translate, t.sot, t.sot_prev, t.sot_lm, t.no_speech}
    return WhisperConfig(
        alignment_heads=heads,
        lang_ids=t.all_language_tokens if t.is_multilingual else (),
        suppress_ids=tuple(sorted(set(t.non_speech_tokens) | specials)),
        suppress_ids_begin=(*t.encode(" "), t.eot),
    )


def default_alignment_heads(dims: ModelDims) -> Heads:
    key = (dims.n_audio_layer, dims.n_text_layer, dims.n_text_state, dims.n_vocab)
    if key in OPENAI_ALIGNMENT_HEADS:
        return OPENAI_ALIGNMENT_HEADS[key]
    half = dims.n_text_layer // 2  # CT2's converter fallback
    return tuple((i, h) for i in range(half, dims.n_text_layer) for h in range(dims.n_text_head))


# --- loading any format -----------------------------------------------------------------------


def detect_format(name_or_path: str | os.PathLike[str]) -> str:
    """"ct2" for model names and CT2 directories (or their model.bin), else by magic bytes:
    "ggml" or "openai". ModelError for a file that is none of them."""
    name = os.fspath(name_or_path)
    path = Path(name).expanduser()
    if name in (DEFAULT_MODEL, *_SPLIT_MODELS) or not path.is_file() or path.name == "model.bin":
        return "ct2"
    try:
        with path.open("rb") as f:
            head = f.read(4)
    except OSError as e:
        raise ModelError(f"{path}: cannot read: {e.strerror or e}") from None
    if head == ZIP_MAGIC or head.startswith(b"\x80"):
        return "openai"  # the reader explains legacy (pickle-only) files
    if len(head) == 4 and int.from_bytes(head, "little") == GGML_MAGIC:
        return "ggml"
    raise ModelError(f"{path}: not a model: expected a CTranslate2 directory, an openai-whisper "
                     f".pt checkpoint or a whisper.cpp ggml .bin (file starts {head!r})")


def load_model_files(name_or_path: str | os.PathLike[str] = DEFAULT_MODEL
                     ) -> tuple[WhisperWeights, Tokenizer]:
    """Weights and tokenizer for a model name, a CT2 directory, a .pt or a ggml .bin."""
    fmt = detect_format(name_or_path)
    if fmt == "ct2":
        model_dir = resolve_model(name_or_path)
        return WhisperWeights.load(model_dir), load_tokenizer(model_dir)
    path = Path(name_or_path).expanduser()
    heads: Heads | None = None
    if fmt == "ggml":
        g = read_ggml(path)
        dims, buf, tensors = g.dims, g.buf, g.tensors
    else:
        c = read_checkpoint(path)
        dims, buf, tensors, heads = c.dims, c.buf, c.tensors, c.alignment_heads
    weights = weights_from_openai(path, buf, dims, tensors)  # the file is sound: now the rest
    tokenizer = tokenizer_for(dims, path)
    if fmt == "ggml":
        _check_tokens(g, tokenizer)
    config = derived_config(dims, tokenizer, heads)
    return dataclasses.replace(weights, config=config), tokenizer


def source_file(name_or_path: str | os.PathLike[str]) -> Path:
    """The one file a model's weights are read from (a CT2 directory's model.bin)."""
    if detect_format(name_or_path) == "ct2":
        return resolve_model(name_or_path) / "model.bin"
    return Path(name_or_path).expanduser()


def tokenizer_for(dims: ModelDims, path: Path) -> Tokenizer:
    """The tokenizer for a .pt or ggml file (see the module docstring for the order)."""
    if (path.parent / "tokenizer.json").is_file():
        model_dir = path.parent
    elif dims.n_vocab == ENGLISH_VOCAB:
        model_dir = resolve_model(DEFAULT_MODEL)
    elif dims.n_vocab == MULTILINGUAL_VOCAB and (found := _multilingual_dir()) is not None:
        model_dir = found
    else:
        raise ModelError(f"{path}: no tokenizer for a vocabulary of {dims.n_vocab}: put its "
                         "tokenizer.json beside the file (or pip install 'tensorplan[base]')")
    tokenizer = load_tokenizer(model_dir)
    if tokenizer.n_vocab != dims.n_vocab:
        raise ModelError(f"{path}: the tokenizer in {model_dir} has {tokenizer.n_vocab} tokens, "
                         f"the model {dims.n_vocab}")
    return tokenizer


def _multilingual_dir() -> Path | None:
    for name in _SPLIT_MODELS:
        for index in range(1, _MAX_PACKAGES + 1):
            d = _data_dir(name, index)
            if d is not None and (d / "tokenizer.json").is_file():
                return d
    return None


def _check_tokens(g: GgmlFile, tokenizer: Tokenizer) -> None:
    """The file's text tokens must be the tokenizer's, byte for byte."""
    ours = tokenizer._token_bytes  # noqa: SLF001 (the validated id → bytes table)
    if len(g.tokens) > len(ours):
        raise ModelError(f"{g.path}: {len(g.tokens)} tokens, the tokenizer has {len(ours)}")
    bad = next((i for i, t in enumerate(g.tokens) if t != ours[i]), None)
    if bad is not None:
        raise ModelError(f"{g.path}: token {bad} is {g.tokens[bad]!r}, the tokenizer's is "
                         f"{ours[bad]!r}: the vocabularies differ")


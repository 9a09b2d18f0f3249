"""A small CTranslate2 model.bin writer for tests, written from the format description
(CTranslate2's model.bin layout) independently of the reader. Every field can be overridden so
tests can build corrupt files byte by byte."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DTYPE_IDS = {"float32": 0, "int8": 1, "int16": 2, "int32": 3, "float16": 4}


@dataclass
class Var:
    name: str | bytes
    array: np.ndarray
    dtype_id: int | None = None  # default: from array.dtype (pass uint16 + 5 for bfloat16)
    dims: tuple[int, ...] | None = None  # stored dims; default array.shape
    count: int | None = None  # stored num_bytes (v>=4) or element count (v<4)
    item_size: int | None = None  # stored width for v<4; default array.itemsize


def string(s: str | bytes, nul: bool = True) -> bytes:
    raw = (s.encode() if isinstance(s, str) else s) + (b"\0" if nul else b"")
    return struct.pack("<H", len(raw)) + raw


def variable(v: Var, version: int) -> bytes:
    a = np.asarray(v.array, order="C")
    dims = a.shape if v.dims is None else v.dims
    out = string(v.name) + struct.pack("<B", len(dims)) + struct.pack(f"<{len(dims)}I", *dims)
    if version >= 4:
        dtype_id = DTYPE_IDS[a.dtype.name] if v.dtype_id is None else v.dtype_id
        count = a.nbytes if v.count is None else v.count
        out += struct.pack("<BI", dtype_id, count)
    else:
        width = a.itemsize if v.item_size is None else v.item_size
        count = a.size if v.count is None else v.count
        out += struct.pack("<BI", width, count)
    return out + a.astype(a.dtype.newbyteorder("<")).tobytes()


def model_bin(
    variables: list[Var],
    aliases: list[tuple[str, str]] = (),  # type: ignore[assignment]
    version: int = 6,
    spec: str | bytes = "WhisperSpec",
    revision: int = 3,
    num_variables: int | None = None,
    num_aliases: int | None = None,
) -> bytes:
    out = struct.pack("<I", version)
    if version >= 2:
        out += string(spec) + struct.pack("<I", revision)
    out += struct.pack("<I", len(variables) if num_variables is None else num_variables)
    out += b"".join(variable(v, version) for v in sorted(variables, key=lambda v: str(v.name)))
    if version >= 3:
        out += struct.pack("<I", len(aliases) if num_aliases is None else num_aliases)
        out += b"".join(string(a) + string(t) for a, t in aliases)
    return out


def whisper_arrays(
    d: int = 8,
    n_mels: int = 80,  # the audio front end's: the reader rejects other counts
    heads: int = 2,
    audio_layers: int = 2,
    text_layers: int = 1,
    vocab: int = 11,
    audio_ctx: int = 1500,  # a 30 s window: the reader rejects other contexts
    text_ctx: int = 5,
    dtype: str = "float16",
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """A tiny random Whisper with the real CT2 names, float tensors in `dtype`."""
    rng = np.random.default_rng(seed)
    shapes: dict[str, tuple[int, ...]] = {
        "encoder/conv1/weight": (d, n_mels, 3),
        "encoder/conv1/bias": (d,),
        "encoder/conv2/weight": (d, d, 3),
        "encoder/conv2/bias": (d,),
        "encoder/position_encodings/encodings": (audio_ctx, d),
        "encoder/layer_norm/gamma": (d,),
        "encoder/layer_norm/beta": (d,),
        "decoder/embeddings/weight": (vocab, d),
        "decoder/position_encodings/encodings": (text_ctx, d),
        "decoder/layer_norm/gamma": (d,),
        "decoder/layer_norm/beta": (d,),
    }
    blocks = {"self_attention": [(3 * d, d), (d, d)], "ffn": [(4 * d, d), (d, 4 * d)]}
    cross = {"attention": [(d, d), (2 * d, d), (d, d)]}
    for side, n, kinds in (("encoder", audio_layers, blocks), ("decoder", text_layers, blocks)):
        for i in range(n):
            for kind, linears in (kinds | cross if side == "decoder" else kinds).items():
                p = f"{side}/layer_{i}/{kind}"
                shapes[p + "/layer_norm/gamma"] = (d,)
                shapes[p + "/layer_norm/beta"] = (d,)
                for j, (n_out, n_in) in enumerate(linears):
                    shapes[f"{p}/linear_{j}/weight"] = (n_out, n_in)
                    shapes[f"{p}/linear_{j}/bias"] = (n_out,)
    arrays = {k: rng.standard_normal(s).astype(dtype) for k, s in shapes.items()}
    arrays["encoder/num_heads"] = np.array(heads, np.int16)
    arrays["decoder/num_heads"] = np.array(heads, np.int16)
    arrays["decoder/activation"] = np.array(3, np.int8)
    arrays["decoder/pre_norm"] = np.array(1, np.int8)
    return arrays


def write_whisper(
    model_dir: Path,
    arrays: dict[str, np.ndarray] | None = None,
    version: int = 6,
    config: object | None = None,
    **kwargs: object,
) -> Path:
    """Write model.bin (projection tied by an alias from version 3) and config.json."""
    arrays = whisper_arrays() if arrays is None else arrays
    variables = [Var(name, a) for name, a in arrays.items()]
    aliases: list[tuple[str, str]] = []
    if version >= 3:
        aliases = [("decoder/projection/weight", "decoder/embeddings/weight")]
    else:
        variables.append(Var("decoder/projection/weight", arrays["decoder/embeddings/weight"]))
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "model.bin").write_bytes(model_bin(variables, aliases, version, **kwargs))  # type: ignore[arg-type]
    if config is None:
        config = {
            "alignment_heads": [[0, 1]],
            "lang_ids": [7, 8],
            "suppress_ids": [1, 2, 3],
            "suppress_ids_begin": [4],
        }
    (model_dir / "config.json").write_text(json.dumps(config))
    return model_dir

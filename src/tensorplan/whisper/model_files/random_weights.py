"""Random Whisper weights of real dimensions, from a seed: benchmarks without weight files.

`RandomWeights(DIMS["large-v3"])` answers what WhisperModel reads of a loaded model
(`dims`, `get(name)`, `model.release(name)`, `config.alignment_heads`) with arrays under
the CTranslate2 names the graphs use. Each array is drawn when first asked for, from a
generator seeded by (seed, name), so a name's values do not depend on the order of reads
and a 1.5 B-parameter model is never held twice. Matrices are N(0, 0.02^2) (GPT-2's
initialisation: activations stay finite through 32 layers), norms are identity.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

from tensorplan.whisper.model_files.ct2_weights import ModelDims, WhisperConfig

# openai/whisper's ModelDimensions of the released checkpoints (n_mels, audio ctx, state,
# heads, layers, vocab, text ctx, state, heads, layers)
DIMS = {
    "tiny": ModelDims(80, 1500, 384, 6, 4, 51865, 448, 384, 6, 4),
    "base": ModelDims(80, 1500, 512, 8, 6, 51865, 448, 512, 8, 6),
    "small": ModelDims(80, 1500, 768, 12, 12, 51865, 448, 768, 12, 12),
    "medium": ModelDims(80, 1500, 1024, 16, 24, 51865, 448, 1024, 16, 24),
    "large-v3": ModelDims(128, 1500, 1280, 20, 32, 51866, 448, 1280, 20, 32),
}


def weight_shapes(d: ModelDims) -> dict[str, tuple[int, ...]]:
    """Every stored weight's CTranslate2 name and shape."""
    a, t = d.n_audio_state, d.n_text_state
    shapes: dict[str, tuple[int, ...]] = {
        "encoder/conv1/weight": (a, d.n_mels, 3), "encoder/conv1/bias": (a,),
        "encoder/conv2/weight": (a, a, 3), "encoder/conv2/bias": (a,),
        "encoder/position_encodings/encodings": (d.n_audio_ctx, a),
        "encoder/layer_norm/gamma": (a,), "encoder/layer_norm/beta": (a,),
        "decoder/embeddings/weight": (d.n_vocab, t),
        "decoder/position_encodings/encodings": (d.n_text_ctx, t),
        "decoder/layer_norm/gamma": (t,), "decoder/layer_norm/beta": (t,),
    }  # fmt: skip

    def block(prefix: str, n: int, linears: list[tuple[int, int]]) -> None:
        shapes[f"{prefix}/layer_norm/gamma"] = shapes[f"{prefix}/layer_norm/beta"] = (n,)
        for j, (n_out, n_in) in enumerate(linears):
            shapes[f"{prefix}/linear_{j}/weight"] = (n_out, n_in)
            shapes[f"{prefix}/linear_{j}/bias"] = (n_out,)

    for i in range(d.n_audio_layer):
        block(f"encoder/layer_{i}/self_attention", a, [(3 * a, a), (a, a)])
        block(f"encoder/layer_{i}/ffn", a, [(4 * a, a), (a, 4 * a)])
    for i in range(d.n_text_layer):
        block(f"decoder/layer_{i}/self_attention", t, [(3 * t, t), (t, t)])
        block(f"decoder/layer_{i}/attention", t, [(t, t), (2 * t, a), (t, t)])
        block(f"decoder/layer_{i}/ffn", t, [(4 * t, t), (t, 4 * t)])
    return shapes


class _Released:
    """The stored-model face WhisperModel releases weights through (nothing is kept)."""

    def release(self, name: str) -> None:
        pass


@dataclass(frozen=True)
class RandomTokenizer:
    """All WhisperModel reads of a tokenizer."""

    is_multilingual: bool = True


class RandomWeights:
    def __init__(self, dims: ModelDims, seed: int = 0) -> None:
        self.dims, self.seed = dims, seed
        self.shapes = weight_shapes(dims)
        self.model = _Released()
        last = dims.n_text_layer - 1  # cross-attention heads of the last layer align words
        self.config = WhisperConfig(alignment_heads=((last, 0), (last, 1)), lang_ids=(),
                                    suppress_ids=(), suppress_ids_begin=())

    def get(self, name: str, dtype: object = None) -> np.ndarray:
        shape = self.shapes[name]  # KeyError: a name the graphs do not use
        rng = np.random.default_rng([self.seed, zlib.crc32(name.encode())])
        if name.endswith("/gamma"):
            return np.ones(shape, np.float32)
        if name.endswith(("/beta", "/bias")):
            return np.zeros(shape, np.float32)
        return (rng.standard_normal(shape, np.float32) * np.float32(0.02)).astype(np.float32)

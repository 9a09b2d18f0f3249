"""Write a Whisper model as openai-whisper's `.pt` checkpoint or whisper.cpp's ggml `.bin`.

The source is anything `formats.load_model_files` reads (a model name, a CTranslate2
directory, a .pt or a ggml .bin); tensors are renamed and split by `formats.openai_pieces`.

- openai: every tensor keeps its stored dtype (tiny.en's are all float16, like openai's own
  files), plus the alignment heads (see `checkpoint`). Needs PyTorch (its CPU build is enough).
- ggml: ftype f16, the mel filterbank (computed, as audio.mel_filters) and the text tokens'
  bytes; float32 sources are rounded to float16 for the ≥2-D weights.

Both files are written to a temporary name and renamed into place.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

from tensorplan.errors import ModelError, UserError
from tensorplan.files import check_not_input
from tensorplan.whisper.audio.mel import mel_filters
from tensorplan.whisper.model_files.checkpoint import write_checkpoint
from tensorplan.whisper.model_files.ct2_weights import WhisperWeights
from tensorplan.whisper.model_files.find import DEFAULT_MODEL
from tensorplan.whisper.model_files.formats import (
    load_model_files,
    openai_pieces,
    openai_state_dict,
    source_file,
)
from tensorplan.whisper.model_files.ggml_file import write_ggml
from tensorplan.whisper.tokenizer import Tokenizer

log = logging.getLogger("tensorplan.whisper.model_files.export")

EXPORT_FORMATS = ("openai", "ggml")


def export_model(out: str | os.PathLike[str], fmt: str,
                 source: str | os.PathLike[str] = DEFAULT_MODEL) -> Path:
    """Write `source` to `out` in `fmt` ("openai" or "ggml"); returns the path written."""
    if fmt not in EXPORT_FORMATS:
        raise UserError(f"unknown export format {fmt!r} (choose {' or '.join(EXPORT_FORMATS)})")
    weights, tokenizer = load_model_files(source)
    check_not_input(out, model_inputs(source))  # the model replaced by its export, before
    _warn_dropped_key_biases(weights)
    if fmt == "openai":
        return export_openai(weights, out)
    return export_ggml(weights, tokenizer, out)


def export_openai(weights: WhisperWeights, out: str | os.PathLike[str]) -> Path:
    return write_checkpoint(Path(out), weights.dims, openai_state_dict(weights),
                            weights.config.alignment_heads)


def export_ggml(weights: WhisperWeights, tokenizer: Tokenizer,
                out: str | os.PathLike[str]) -> Path:
    try:
        filters = mel_filters(weights.dims.n_mels)
    except ValueError as e:
        raise ModelError(f"cannot export to ggml: {e}") from None
    state = openai_state_dict(weights)
    return write_ggml(Path(out), weights.dims, filters, ggml_tokens(tokenizer), state.items())


def ggml_tokens(tokenizer: Tokenizer) -> list[bytes]:
    """The raw bytes of every text token (ids below <|endoftext|>), as whisper.cpp stores."""
    return list(tokenizer._token_bytes[: tokenizer.eot])  # noqa: SLF001


def _warn_dropped_key_biases(weights: WhisperWeights) -> None:
    """openai's key projections have no bias; CT2's converter stores zeros there. Dropping a
    nonzero one changes no output (softmax ignores a per-query constant) but is worth a word."""
    for p in openai_pieces(weights.dims):
        if p.openai is None:
            fused = weights.get(p.ct2)
            rows = fused.shape[0] // p.parts
            if np.any(fused[p.index * rows : (p.index + 1) * rows]):
                log.warning("%s: dropping a nonzero key bias (it cannot change any output)",
                            p.ct2)


def model_inputs(source: str | os.PathLike[str]) -> list[Path]:
    """What loading `source` reads: a CT2 directory, or a .pt/ggml file and the tokenizer
    and config files beside it."""
    path = source_file(source)
    if path.name == "model.bin" and (path.parent / "config.json").is_file():
        return [path.parent]
    return [path, *(path.parent / name for name in ("tokenizer.json", "config.json",
                                                     "vocabulary.txt", "vocabulary.json"))]

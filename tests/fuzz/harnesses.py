"""Fuzz harnesses: bytes in; success or a UserError subclass out. Anything else (another
exception, a hang, a crash) is a bug. Shared by the atheris driver (fuzz.py) and the corpus
replay test, so a crash found by fuzzing becomes a regression seed by copying its input into
corpus/<harness>/.

Each harness also exercises what a caller does next with a successful load (reading every
weight, encoding and decoding text, packing the trace, computing the log-mel), so a file that
loads but breaks later is caught too.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import math
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from tensorplan.alloc import pack
from tensorplan.alloc.trace import read_trace, write_offsets
from tensorplan.cli import build_parser
from tensorplan.errors import UserError
from tensorplan.whisper.audio.constants import SAMPLE_RATE
from tensorplan.whisper.audio.decode import load_audio
from tensorplan.whisper.audio.mel import log_mel_spectrogram
from tensorplan.whisper.flags import from_args
from tensorplan.whisper.model_files.ct2_file import WHISPER_SPEC, read_model_bin
from tensorplan.whisper.model_files.ct2_weights import ModelDims, WhisperWeights, read_config
from tensorplan.whisper.options import TranscribeOptions, max_batch
from tensorplan.whisper.tokenizer import load_tokenizer

_WORK = Path(tempfile.mkdtemp(prefix="tensorplan-fuzz-"))
atexit.register(shutil.rmtree, _WORK, ignore_errors=True)


def _fresh(folder: str, name: str, data: bytes) -> Path:
    """Write `data` to <work>/<folder>/<name> through a rename, so a memory map of the
    previous input keeps its own (unchanged) file."""
    directory = _WORK / folder
    directory.mkdir(exist_ok=True)
    tmp = directory / f".{name}.tmp"
    tmp.write_bytes(data)
    os.replace(tmp, directory / name)
    return directory / name


def model_bin(data: bytes) -> None:
    path = _fresh("model", "model.bin", data)
    model = read_model_bin(path, spec=None)
    for name in [*model.variables, *model.aliases]:
        model.get(name)  # widens bfloat16, dequantizes int8/int16
        if math.prod(model.resolve(name).shape) == 1:
            model.scalar(name)
    if model.spec == WHISPER_SPEC:
        weights = WhisperWeights.load(path.parent)  # no config.json: the fallback heads
        weights.encoder_layer(0, "float32")
        weights.decoder_layer(0, "float32")


def tokenizer(data: bytes) -> None:
    path = _fresh("tokenizer", "tokenizer.json", data)
    tok = load_tokenizer(path.parent)
    ids = tok.encode("Hello world, ♪ 1.5% <|en|>")
    tok.decode(ids)
    tok.decode_with_timestamps([*ids, tok.eot])
    tok.split_to_word_tokens([*ids, tok.eot])
    tok.sot_sequence_including_notimestamps("en" if tok.is_multilingual else None)
    tok.non_speech_tokens  # noqa: B018 (a cached property that encodes symbols)


def trace(data: bytes) -> None:
    path = _fresh("trace", "trace.csv", data)
    rows = list(read_trace(path))
    for strategy, alignment in (("ggml", 1), ("offline", 8)):
        packing = pack(rows, alignment, strategy, budget_s=0.0)
        assert packing.size >= packing.lower_bound
    write_offsets(path.with_name("offsets.csv"), packing.offsets)


def audio(data: bytes) -> None:
    samples = load_audio(data)
    assert samples.ndim == 1 and samples.size > 0
    log_mel_spectrogram(samples[: 2 * SAMPLE_RATE])


# tiny.en's dims: config.json's ids and heads are checked against them
_TINY_DIMS = ModelDims(n_mels=80, n_audio_ctx=1500, n_audio_state=384, n_audio_head=6,
                       n_audio_layer=4, n_vocab=51864, n_text_ctx=448, n_text_state=384,
                       n_text_head=6, n_text_layer=4)


def config_json(data: bytes) -> None:
    path = _fresh("config", "config.json", data)
    config = read_config(path, _TINY_DIMS)
    for layer, head in config.alignment_heads:
        assert 0 <= layer < _TINY_DIMS.n_text_layer and 0 <= head < _TINY_DIMS.n_text_head
    for ids in (config.lang_ids, config.suppress_ids, config.suppress_ids_begin):
        assert all(0 <= t < _TINY_DIMS.n_vocab for t in ids)


def flags(data: bytes) -> None:
    """`tensorplan transcribe talk.wav ARGS`, ARGS the input's NUL-separated words: parsing
    may fail (argparse's exit 2, counted as a user error) or the options refuse the values;
    nothing else may happen."""
    words = data.decode("utf-8", errors="replace").split("\0")
    parser = build_parser()
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            args = parser.parse_args(["transcribe", "talk.wav", *words])
    except SystemExit as e:
        if e.code == 0:  # --help or --version: printed, nothing to check
            return
        if e.code == 2:
            raise UserError("argparse refused the flags") from None
        raise
    options = from_args(TranscribeOptions, args)
    max_batch(options)


HARNESSES: dict[str, Callable[[bytes], None]] = {
    "model_bin": model_bin,
    "tokenizer": tokenizer,
    "trace": trace,
    "audio": audio,
    "config_json": config_json,
    "flags": flags,
}


def run(harness: Callable[[bytes], None], data: bytes) -> bool:
    """True if the input was accepted, False if it was a UserError; anything else raises."""
    try:
        harness(data)
    except UserError as e:
        message = str(e)
        assert message and "\n" not in message, f"not one line: {message!r}"
        return False
    return True

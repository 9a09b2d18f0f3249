"""Model directories a user might pass as `--model DIR`: every corrupt kind is one error line
naming the file and the problem (exit 2), and costs at most a small multiple of the file.

Corrupt copies come from the real tiny.en (truncations and header patches) and from
ct2_writer (synthetic files, built field by field). Every case runs through `cli.main` in
process (tracemalloc measures it); a representative subset also runs the real CLI in a
subprocess, whose peak RSS is compared with a baseline run.
"""

from __future__ import annotations

import json
import shutil
import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ct2_writer as w
import numpy as np
import pytest
from clirun import assert_ok, assert_user_error, run_cli
from synth_audio import wav
from whisper_helpers import traced_peak

from tensorplan import cli

MODEL_FILES = ("model.bin", "config.json", "tokenizer.json", "vocabulary.txt")
CONFIG = {"alignment_heads": [[0, 0]], "lang_ids": [], "suppress_ids": [],
          "suppress_ids_begin": []}


class Dirs:
    """Builds model directories under one root: real tiny.en files are linked, not copied,
    except one full model.bin copy that header patches edit in place and then restore."""

    def __init__(self, root: Path, tiny: Path) -> None:
        self.root, self.tiny = root, tiny
        self.copy = root / "tiny-copy" / "model.bin"
        self.copy.parent.mkdir()
        shutil.copyfile(tiny / "model.bin", self.copy)

    def new(self, name: str, drop: tuple[str, ...] = (), model_bin: bytes | None = None,
            **files: str) -> Path:
        """tiny.en with files dropped, model.bin replaced, or text files (config_json=...).
        Built once per name: later calls return the same directory."""
        d = self.root / name
        if d.exists():
            return d
        d.mkdir()
        for file_name in MODEL_FILES:
            if file_name not in drop:
                (d / file_name).symlink_to(self.tiny / file_name)
        if model_bin is not None:
            (d / "model.bin").unlink(missing_ok=True)
            (d / "model.bin").write_bytes(model_bin)
        for key, text in files.items():
            file = d / key.replace("_", ".")
            file.unlink(missing_ok=True)
            file.write_text(text)
        return d

    def truncated(self, name: str, size: int) -> Path:
        with (self.tiny / "model.bin").open("rb") as f:
            return self.new(name, model_bin=f.read(size))

    @contextmanager
    def patched(self, offset: int, data: bytes) -> Iterator[Path]:
        """The full copy with `data` written at `offset`, restored afterwards."""
        d = self.root / "tiny-copy"
        for name in MODEL_FILES[1:]:
            if not (d / name).exists():
                (d / name).symlink_to(self.tiny / name)
        with self.copy.open("r+b") as f:
            f.seek(offset)
            old = f.read(len(data))
            f.seek(offset)
            f.write(data)
        try:
            yield d
        finally:
            with self.copy.open("r+b") as f:
                f.seek(offset)
                f.write(old)

    def synthetic(self, name: str, arrays: dict[str, np.ndarray] | None = None,
                  **dims: Any) -> Path:
        """A runnable-looking small Whisper (ct2_writer) with tiny.en's tokenizer."""
        d = self.root / name
        if d.exists():
            return d
        w.write_whisper(d, arrays if arrays is not None else w.whisper_arrays(**dims),
                        config=CONFIG)
        for file_name in ("tokenizer.json", "vocabulary.txt"):
            (d / file_name).symlink_to(self.tiny / file_name)
        return d

    def raw(self, name: str, data: bytes) -> Path:
        """A hand-built model.bin beside tiny.en's other files."""
        return self.new(name, model_bin=data)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory, tiny: Path) -> Dirs:
    return Dirs(tmp_path_factory.mktemp("models"), tiny)


def _var(name: str, dims: tuple[int, ...], dtype_id: int = 0, count: int = 0) -> w.Var:
    """A variable header declaring `dims` but carrying no payload."""
    return w.Var(name, np.zeros(0, np.float32), dtype_id=dtype_id, dims=dims, count=count)


def _arrays(**changes: np.ndarray) -> dict[str, np.ndarray]:
    return {**w.whisper_arrays(), **changes}


HUGE = 1 << 20  # (2^20, 2^20) float32 is 4 TiB

# kind -> (build the directory, words the error line must hold)
CASES: dict[str, tuple[Callable[[Dirs], Path], tuple[str, ...]]] = {
    "missing model.bin": (lambda d: d.new("no-bin", drop=("model.bin",)),
                          ("not a CTranslate2 model directory (no model.bin)",)),
    "missing tokenizer.json": (lambda d: d.new("no-tok", drop=("tokenizer.json",)),
                               ("tokenizer.json: missing",)),
    "truncated in the version": (lambda d: d.truncated("cut-2", 2),
                                 ("model.bin: truncated: binary version",)),
    "truncated in the spec name": (lambda d: d.truncated("cut-12", 12),
                                   ("model.bin: truncated: spec name",)),
    "truncated in the variable index": (lambda d: d.truncated("cut-1k", 1000),
                                        ("model.bin: num_variables 148 cannot fit",)),
    "truncated inside a payload": (lambda d: d.truncated("cut-1m", 1_000_000),
                                   ("model.bin: variable", "needs 39831552 bytes")),
    "shape x itemsize != byte count": (
        lambda d: d.raw("count", w.model_bin([w.Var("a", np.zeros((2, 3), np.float32),
                                                    count=20)])),
        ("model.bin: variable a has 20 bytes, shape (2, 3) float32 needs 24",)),
    "byte count beyond the file": (
        lambda d: d.raw("beyond", w.model_bin([_var("a", (1 << 15, 1 << 13), count=1 << 30)])),
        ("model.bin: variable a shape (32768, 8192) needs 1073741824 bytes",)),
    "absurd rank": (lambda d: d.raw("rank", w.model_bin([_var("a", (1,) * 200)])),
                    ("model.bin: variable a has rank 200",)),
    "absurd dims (2^40 elements)": (
        lambda d: d.raw("dims", w.model_bin([_var("a", (HUGE, HUGE), count=0)])),
        ("model.bin: variable a shape (1048576, 1048576) needs 4398046511104 bytes",)),
    "absurd variable count": (
        lambda d: d.raw("nvars", w.model_bin([], num_variables=2**32 - 1)),
        ("model.bin: num_variables 4294967295 cannot fit",)),
    "unknown dtype id": (
        lambda d: d.raw("dtype", w.model_bin([w.Var("a", np.zeros(2, np.float32), dtype_id=9)])),
        ("model.bin: variable a has unknown dtype id 9",)),
    "alias to a missing variable": (
        lambda d: d.raw("alias", w.model_bin([w.Var("a", np.zeros(2, np.float32))],
                                             aliases=[("b", "ghost")])),
        ("model.bin: alias 'b' points to missing variable 'ghost'",)),
    "config.json not JSON": (lambda d: d.new("cfg", config_json="{'heads': [0, 1"),
                             ("config.json: not valid JSON",)),
    "config.json nested too deeply": (lambda d: d.new("cfg-deep", config_json="[" * 100_000),
                                      ("config.json: not valid JSON (nested too deeply)",)),
    "tokenizer.json not JSON": (lambda d: d.new("tok", tokenizer_json="<html>404</html>"),
                                ("tokenizer.json: not valid JSON",)),
    "tokenizer.json with bad added_tokens": (
        lambda d: d.new("tok-added", tokenizer_json=json.dumps(
            {"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "added_tokens": 7})),
        ("tokenizer.json: 'added_tokens' must be a list of objects",)),
    "tokenizer.json with non-string merges": (
        lambda d: d.new("tok-merges", tokenizer_json=json.dumps(
            {"model": {"type": "BPE", "vocab": {"!": 0}, "merges": [[1, 2]]}})),
        ("tokenizer.json: merges must be",)),
    "tokenizer.json with a subword prefix (the library panics on it)": (
        lambda d: d.new("tok-prefix", tokenizer_json=json.dumps(
            {"model": {"type": "BPE", "vocab": {"!": 0}, "merges": [["!", "!"]],
                       "continuing_subword_prefix": "ě"}})),
        ("tokenizer.json: continuing_subword_prefix 'ě' is not Whisper's",)),
    "4 mel bins": (lambda d: d.synthetic("mels", n_mels=4),
                   ("model.bin: the model expects 4 mel bins",)),
    "3000 audio positions": (lambda d: d.synthetic("actx", audio_ctx=3000),
                             ("model.bin: encoder/position_encodings/encodings has 3000",)),
    "100000 text positions": (lambda d: d.synthetic("tctx", d=2, heads=1, text_ctx=100_000),
                              ("model.bin: decoder/position_encodings/encodings has 100000",)),
    "NaN heads": (lambda d: d.synthetic("heads", _arrays(**{
        "encoder/num_heads": np.array(np.nan, np.float32)})),
        ("model.bin: encoder/num_heads is nan, not a whole number",)),
    "layer index 40 million": (lambda d: d.synthetic("layers", _arrays(**{
        "encoder/layer_40000000/ffn/layer_norm/gamma": np.zeros(8, np.float16)})),
        ("model.bin: encoder layer 2 is missing (layers up to 40000000 exist)",)),
}
CLI_SUBSET = ("missing model.bin", "truncated inside a payload", "absurd dims (2^40 elements)",
              "tokenizer.json not JSON", "byte count beyond the file")


def _main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, int]:
    """cli.main in this process: (exit code, stderr, traced peak bytes)."""
    capsys.readouterr()
    rc, peak = traced_peak(lambda: cli.main(argv))
    return rc, capsys.readouterr().err, peak


def _size(d: Path) -> int:
    return sum((d / f).stat().st_size for f in MODEL_FILES if (d / f).exists())


@pytest.fixture(scope="module")
def warm(dirs: Dirs, talk: Path) -> None:
    """Import everything `transcribe` imports once, so tracemalloc sees only the load."""
    cli.main(["transcribe", "--model", str(dirs.root / "nowhere"), str(talk)])


@pytest.mark.parametrize("kind", list(CASES))
def test_corrupt_model_dir_is_one_line(kind: str, dirs: Dirs, talk: Path, warm: None,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    build, words = CASES[kind]
    d = build(dirs)
    rc, err, peak = _main(["transcribe", "--model", str(d), str(talk)], capsys)
    assert_user_error(rc, err, str(d), *words)
    # headers only: never the declared sizes, at most a few times what is on disk
    assert peak < 4 * _size(d) + (2 << 20), f"{peak} bytes traced for {_size(d)} on disk"


def test_wrong_binary_version_and_spec_of_the_real_model(
        dirs: Dirs, talk: Path, warm: None, capsys: pytest.CaptureFixture[str]) -> None:
    with dirs.patched(0, struct.pack("<I", 99)) as d:
        rc, err, _ = _main(["transcribe", "--model", str(d), str(talk)], capsys)
        assert_user_error(rc, err, "model.bin: binary version 99 is not supported (1..6)")
    with dirs.patched(6, b"WhisperSpeX") as d:  # u32 version, u16 length, then the name
        rc, err, _ = _main(["transcribe", "--model", str(d), str(talk)], capsys)
        assert_user_error(rc, err, "model.bin: spec 'WhisperSpeX' is not the expected")


def test_truncated_by_one_byte(dirs: Dirs, talk: Path, warm: None,
                               capsys: pytest.CaptureFixture[str]) -> None:
    size = dirs.copy.stat().st_size
    last = dirs.copy.read_bytes()[-1:]
    with dirs.copy.open("r+b") as f:
        f.truncate(size - 1)
    try:
        rc, err, _ = _main(["transcribe", "--model", str(dirs.copy.parent), str(talk)],
                           capsys)
        assert_user_error(rc, err, "model.bin: truncated: alias target")
    finally:
        with dirs.copy.open("ab") as f:
            f.write(last)


def test_no_such_model(talk: Path, warm: None, capsys: pytest.CaptureFixture[str]) -> None:
    rc, err, _ = _main(["transcribe", "--model", "./no-such-model", str(talk)], capsys)
    assert_user_error(rc, err, "no-such-model: no such model or directory")


def test_missing_config_json_falls_back(dirs: Dirs, tmp_path: Path) -> None:
    """No config.json is not an error: alignment heads default as CT2's converter does."""
    d = dirs.new("no-config", drop=("config.json",))
    one = tmp_path / "one.wav"
    one.write_bytes(wav(np.array([100], "<i2")))  # no full frame: nothing to decode
    assert_ok(run_cli("transcribe", "--model", d, one))


def test_tokenizer_larger_than_the_model(dirs: Dirs, talk: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    d = dirs.synthetic("vocab-11", vocab=11)  # tiny.en's tokenizer has 51864 ids
    rc, err, _ = _main(["transcribe", "--model", str(d), "--beam-size", "1", "--temperature",
                        "0", str(talk)], capsys)
    assert_user_error(rc, err, str(d), "vocabulary")


def test_cli_subset_in_a_subprocess_within_memory(dirs: Dirs, talk: Path) -> None:
    """The real CLI: one line, exit 2, and peak RSS within a few MB of a baseline run that
    fails before reading any model file."""
    baseline = run_cli("transcribe", "--model", dirs.root / "nowhere", talk)
    assert_user_error(baseline.rc, baseline.stderr, "no such model or directory")
    for kind in CLI_SUBSET:
        d = CASES[kind][0](dirs)
        run = run_cli("transcribe", "--model", d, talk)
        assert_user_error(run.rc, run.stderr, str(d), *CASES[kind][1])
        grown_kb = run.maxrss_kb - baseline.maxrss_kb
        assert grown_kb * 1024 < 2 * _size(d) + (16 << 20), f"{kind}: +{grown_kb} KB RSS"

"""The weight cache: a round trip, every kind of damage ignored, and loads that use it."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from tensorplan.whisper.model_files import weight_cache as wc


@pytest.fixture(autouse=True)
def _cache_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TENSORPLAN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TENSORPLAN_CACHE", raising=False)
    return tmp_path / "cache"


def _arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"w": rng.standard_normal((300, 70)).astype(np.float32),
            "q": rng.integers(-127, 127, (9, 5000), dtype=np.int8),
            "s": np.array(3.5, np.float32), "e^T": np.arange(7, dtype=np.float32)}


def test_round_trip_is_a_read_only_map() -> None:
    path = wc.write("k1", _arrays())
    assert path is not None and path.name == "k1.tpw"
    back = wc.read("k1")
    assert back is not None and back.keys() == _arrays().keys()
    for name, arr in _arrays().items():
        assert back[name].dtype == arr.dtype and np.array_equal(back[name], arr)
        assert not back[name].flags.writeable
        assert back[name].ctypes.data % wc.ALIGN == 0


def _damaged(offset_from: str, delta: int) -> None:
    path = wc.write("k1", _arrays())
    assert path is not None
    data = bytearray(path.read_bytes())
    at = {"start": 0, "header": wc._PREFIX.size + 5, "payload": len(data) - 1000}[offset_from]
    data[at + delta] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("where", ["start", "header", "payload"])
def test_a_flipped_byte_is_never_trusted(where: str) -> None:
    _damaged(where, 0)
    assert wc.read("k1") is None


def test_truncated_empty_and_foreign_files_are_ignored(_cache_in: Path) -> None:
    path = wc.write("k1", _arrays())
    assert path is not None
    whole = path.read_bytes()
    for data in (whole[:-1], whole[:10], b"", b"PK\x03\x04" + whole[4:]):
        path.write_bytes(data)
        assert wc.read("k1") is None
    path.write_bytes(whole)
    assert wc.read("k1") is not None
    os.rename(path, path.with_name("k2.tpw"))  # another key's name: its header says k1
    assert wc.read("k2") is None


def test_off_means_no_files(monkeypatch: pytest.MonkeyPatch, _cache_in: Path) -> None:
    monkeypatch.setenv("TENSORPLAN_CACHE", "0")
    assert wc.write("k1", _arrays()) is None and wc.read("k1") is None
    assert not _cache_in.exists()


def test_unwritable_directory_is_no_failure(monkeypatch: pytest.MonkeyPatch,
                                            tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("TENSORPLAN_CACHE_DIR", str(blocker / "cache"))
    assert wc.write("k1", _arrays()) is None


def test_key_follows_the_source_file_and_the_options(tmp_path: Path) -> None:
    src = tmp_path / "model.bin"
    src.write_bytes(b"x" * 100)
    key = wc.cache_key(src, compute_type="float32")
    assert wc.cache_key(src, compute_type="float32") == key
    assert wc.cache_key(src, compute_type="int8") != key
    os.utime(src, ns=(1, 1))
    assert wc.cache_key(src, compute_type="float32") != key
    src.write_bytes(b"y" * 100)
    assert wc.cache_key(src, compute_type="float32") not in (key,)


def test_loads_write_then_map_the_same_weights(_cache_in: Path) -> None:
    from tensorplan.whisper.api import load_model

    first = load_model("tiny.en", backend="numpy", compute_type="int8")
    entries = list((_cache_in / "weights").glob("*.tpw"))
    assert len(entries) == 1
    second = load_model("tiny.en", backend="numpy", compute_type="int8")
    a, b = first.model.param.arrays, second.model.param.arrays
    assert a.keys() == b.keys()
    for name in a:
        assert np.array_equal(a[name], b[name]), name
        assert not b[name].flags.writeable  # mapped from the cache, not converted
    entries[0].write_bytes(entries[0].read_bytes()[:-64])  # damaged: converted and rewritten
    third = load_model("tiny.en", backend="numpy", compute_type="int8")
    assert all(np.array_equal(a[n], third.model.param.arrays[n]) for n in a)
    assert wc.read(entries[0].stem) is not None

"""Round three (issue #31) through the Python API: the audio a request may decode, what its
fields may ask for, batched decoding under the same KV limit as sequential decoding, memory
given back after a request, and a closed session."""

from __future__ import annotations

import gc
import io
import os
import time
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest
from av_encode import encode_pcm16
from synth_audio import pcm16, silence_pieces, tone, write_flac

from tensorplan.errors import AudioTooLongError, UserError
from tensorplan.whisper.audio.decode import StreamedAudio
from tensorplan.whisper.limits import MAX_CLIP_SPANS, check_batch_budget
from tensorplan.whisper.options import TranscribeOptions

JFK = Path(__file__).resolve().parents[2] / "samples" / "jfk.wav"
FAST: dict[str, Any] = {"temperature": (0.0,), "beam_size": None, "sample_len": 8}


@pytest.fixture(scope="module")
def model() -> Any:
    from tensorplan.whisper import load_model

    return load_model("tiny.en")


def rss_mb() -> float:
    """This process's resident memory now (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def chained_ogg(seconds: tuple[float, ...]) -> bytes:
    """Opus streams chained one after another in one Ogg file: ffmpeg declares the last
    one's duration, and decodes them all (a header that understates the audio)."""
    parts = []
    for s in seconds:
        buf = io.BytesIO()
        with av.open(buf, "w", format="ogg") as out:
            pcm = pcm16(tone(s, rate=48000))
            encode_pcm16(out, "libopus", 48000, (pcm[i:i + 960] for i in range(0, pcm.size, 960)))
        parts.append(buf.getvalue())
    return b"".join(parts)


# --- 2. per-request bounds -----------------------------------------------------------------


def test_a_small_file_declaring_hours_is_refused_before_decoding(tmp_path: Path) -> None:
    flac = write_flac(tmp_path / "hour.flac", silence_pieces(3600))
    assert flac.stat().st_size < 2 << 20  # a small upload that expands to an hour
    with pytest.raises(AudioTooLongError, match="declares 3600 s of audio, more than the "
                                                "600 s limit"):
        StreamedAudio(flac, max_seconds=600)
    assert len(StreamedAudio(flac, max_seconds=3600)) == 3600 * 16000


def test_audio_beyond_its_declared_duration_is_counted_while_decoding() -> None:
    data = chained_ogg((20.0, 2.0))
    with pytest.raises(AudioTooLongError, match="decodes to more than 10 s"):
        StreamedAudio(data, max_seconds=10)
    assert len(StreamedAudio(data)) == pytest.approx(22 * 16000, rel=0.01)


def test_the_session_applies_the_duration_limit(model: Any) -> None:
    with model.session() as session:
        with pytest.raises(AudioTooLongError, match="jfk.wav"):
            session.transcribe(str(JFK), max_audio_seconds=5, **FAST)
        with pytest.raises(AudioTooLongError, match="array"):
            session.transcribe(np.zeros(16000 * 6, np.float32), max_audio_seconds=5, **FAST)
        assert session.transcribe(str(JFK), max_audio_seconds=12, **FAST).text


def test_clip_lists_are_bounded() -> None:
    TranscribeOptions(clip_timestamps=tuple(float(t) for t in range(2 * MAX_CLIP_SPANS)))
    with pytest.raises(ValueError, match=f"more than {MAX_CLIP_SPANS}"):
        TranscribeOptions(clip_timestamps=tuple(float(t) for t in range(2 * MAX_CLIP_SPANS + 2)))


def test_batched_decoding_is_held_to_the_kv_limit(model: Any) -> None:
    """64 windows x 64 beams asked for 22 GiB and ended in numpy's allocation error."""
    with pytest.raises(UserError, match="KV caches, more than the 4.00 GiB limit"):
        check_batch_budget(model.dims, 64, 64, "float32")
    before = rss_mb()
    with model.session() as session:
        with pytest.raises(UserError, match="batch_size 64 x 64 sequences"):
            session.transcribe(str(JFK), batch_size=64, beam_size=64)
        assert session.transcribe(str(JFK), batch_size=2, **FAST).text  # still usable
    assert rss_mb() - before < 500  # nothing of the 22 GiB was allocated


def test_a_batched_request_gives_its_memory_back(model: Any) -> None:
    """A window batch's caches (here 4 windows x 16 beams: 400 MB) were bound into the
    session for good: the server stayed GBs larger after batched requests had ended."""
    clips = (0.0, 2.5, 3.0, 5.5, 6.0, 8.5, 9.0, 11.0)  # four chunks: four windows
    with model.session() as session:
        session.transcribe(str(JFK), **FAST)
        gc.collect()
        held, before = session.nbytes, rss_mb()
        result = session.transcribe(str(JFK), batch_size=4, beam_size=16, sample_len=8,
                                     clip_timestamps=clips)
        assert len(result.segments) >= 2
        gc.collect()
        assert session.nbytes == held
        assert rss_mb() - before < 200  # generous: the batch's caches alone are 400 MB


# --- 6. misuse -----------------------------------------------------------------------------


def test_a_closed_session_says_so(model: Any) -> None:
    session = model.session()
    session.close()
    with pytest.raises(RuntimeError, match="Session is closed"):
        session.transcribe(str(JFK), **FAST)


# --- 4. the weight cache never serves wrong weights -------------------------------------------


@pytest.fixture()
def cache_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TENSORPLAN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TENSORPLAN_CACHE", raising=False)
    return tmp_path / "cache"


def test_damage_in_the_middle_of_an_entry_is_found(cache_in: Path) -> None:
    from tensorplan.whisper.model_files import weight_cache as wc

    big = np.arange(1 << 20, dtype=np.float32)  # 4 MB: its middle is far from both ends
    path = wc.write("k", {"w": big})
    assert path is not None and wc.read("k") is not None
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40
    path.write_bytes(bytes(data))
    assert wc.read("k") is None  # ignored: the weights are converted again


def test_an_edit_past_64_kib_with_its_mtime_set_back_changes_the_key(tmp_path: Path) -> None:
    from tensorplan.whisper.model_files import weight_cache as wc

    source = tmp_path / "model.bin"
    source.write_bytes(bytes(1 << 20))
    key = wc.cache_key(source, compute_type="float32")
    st = source.stat()
    time.sleep(0.01)  # a later ctime on file systems with coarse timestamps
    with open(source, "r+b") as f:
        f.seek(500_000)
        f.write(b"\x01")
    os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert source.stat().st_mtime_ns == st.st_mtime_ns
    assert wc.cache_key(source, compute_type="float32") != key


def test_cache_off_writes_nothing_and_makes_no_directory_0(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tensorplan.whisper.model_files import weight_cache as wc
    from tensorplan.whisper.model_files.find import cache_root

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TENSORPLAN_CACHE", "0")
    monkeypatch.delenv("TENSORPLAN_CACHE_DIR", raising=False)
    assert wc.cache_dir() is None and wc.write("k", {"w": np.zeros(3)}) is None
    root = cache_root()
    assert root.resolve() != (tmp_path / "0").resolve() and root.name != "0"
    assert list(tmp_path.iterdir()) == []

"""Audio in: decode any file to 16 kHz mono float32 (the log-mel features are mel.py's).

Decoding uses PyAV (its wheels bundle ffmpeg). Frames are resampled as they are decoded by
libswresample to signed 16-bit mono at 16 kHz, then divided by 32768: the same path as the
reference's `ffmpeg -ac 1 -ar 16000 -f s16le`. A WAV that already is 16-bit mono PCM at 16
kHz, which that path would not change, is read directly, without importing PyAV (40-50 ms of
a short run). The compressed input is streamed; the decoded
samples are kept whole (float32 at 16 kHz is 230 MB per hour), since the seek loop revisits
them. Truncation is caught three ways: decoder errors, a WAV whose data chunk runs past the
end of the file, and fewer samples than the container declares (by more than 10 % and 1 s, to
spare estimated durations). An Ogg file cut at a page boundary is indistinguishable from a
shorter one.
"""
from __future__ import annotations

import io
import os
import stat
import struct
import sys
from collections.abc import Iterator
from typing import IO, Any

import numpy as np

from tensorplan.errors import AudioError
from tensorplan.files import describe_mode, quote
from tensorplan.whisper.audio.constants import N_FFT, SAMPLE_RATE
from tensorplan.whisper.audio.containers import REFUSED, open_container, refused
from tensorplan.whisper.limits import check_audio_seconds

_FLOAT_FORMATS = ("flt", "fltp", "dbl", "dblp")
_MAX_WAV_CHUNKS = 64  # header chunks looked at before "data"; real files have a handful
_INITIAL_SECONDS_CAP = 4 * 3600  # reserve (virtual memory only) at most this much up front
MIN_SOURCE_RATE = 1000  # Hz; below this a tiny header would expand into hours at 16 kHz
# Hz; the highest rate real recordings use (768 kHz PCM). A header claiming more (a fuzzed
# WAV said 1.66 GHz) made libswresample spend 12 s and 1.8 GB building its filter.
MAX_SOURCE_RATE = 768_000


# --- decoding --------------------------------------------------------------------------------


def load_audio(source: str | os.PathLike[str] | bytes, sr: int = SAMPLE_RATE,
               stream: int | None = None) -> np.ndarray:
    """Decode a file path, raw file bytes, or "-" (stdin, read whole) to mono float32
    samples at `sr` Hz, all held (230 MB per hour); `open_audio` streams them instead.

    `stream`: the index among the audio streams (default: ffmpeg's best one). Returns shape
    (n_samples,). Raises AudioError naming the input for a missing, empty, unreadable,
    truncated or non-audio input, no samples, NaN/Inf samples, or a sample rate below
    MIN_SOURCE_RATE.
    """
    check_rate(sr)
    name, file = _open(source)
    with file, _decoder(file, name, sr, stream) as decoder:
        declared = decoder.declared
        samples = _Samples(int(min(declared or 30, _INITIAL_SECONDS_CAP) * sr) + sr)
        for pcm in decoder.chunks():
            samples.append(pcm)
        return samples.result()


def check_rate(sr: object, what: str = "sampling rate") -> None:
    """ValueError naming `what` unless `sr` is a whole number of Hz that a source may have:
    resampling 11 s to 5e7 Hz held 2.2 GB."""
    if isinstance(sr, bool) or not isinstance(sr, int | np.integer) or \
            not MIN_SOURCE_RATE <= sr <= MAX_SOURCE_RATE:
        raise ValueError(f"{what} {sr!r}: expected a whole number of Hz from "
                         f"{MIN_SOURCE_RATE} to {MAX_SOURCE_RATE}")


def open_audio(audio: str | os.PathLike[str] | bytes | np.ndarray | StreamedAudio,
               stream: int | None = None,
               max_seconds: float | None = None) -> np.ndarray | StreamedAudio:
    """What `Whisper.transcribe` reads: a file (path, bytes, "-") as a `StreamedAudio`, which
    never holds more than a few windows of samples; an array through `as_samples`.
    `max_seconds`: AudioTooLongError for more audio than that (a server's bound)."""
    if isinstance(audio, StreamedAudio):
        check_audio_seconds(audio.name, len(audio) / audio.sr, max_seconds, declared=False)
        return audio
    if isinstance(audio, np.ndarray):
        check_audio_seconds("<array>", audio.size / SAMPLE_RATE, max_seconds, declared=False)
        return as_samples(audio)
    return StreamedAudio(audio, stream=stream, max_seconds=max_seconds)


def as_samples(array: Any) -> np.ndarray:
    """Samples given to the API as 1-D float32 in [-1, 1]. Integer PCM is scaled by its
    dtype (int16 / 32768, int32 / 2^31, uint8 (x - 128) / 128), as ffmpeg reads it; floats
    are taken as they are. ValueError for another dtype or shape, or a NaN/inf sample."""
    samples = np.asarray(array)
    if samples.ndim != 1:
        raise ValueError(f"audio must be 1-D mono samples, got shape {samples.shape}")
    scale = _PCM_SCALES.get(samples.dtype.str.lstrip("<>|="))
    if scale is not None:
        offset, divisor = scale
        out = samples.astype(np.float32) if offset == 0 else \
            samples.astype(np.float32) - np.float32(offset)
        return out / np.float32(divisor)
    if samples.dtype.kind != "f":
        raise ValueError(f"audio samples of dtype {samples.dtype} are not PCM: give float "
                         "samples in [-1, 1], or int16, int32 or uint8 PCM")
    out32 = samples if samples.dtype == np.float32 else samples.astype(np.float32)
    finite = np.isfinite(out32)
    if not finite.all():
        at = int(np.argmin(finite))
        raise ValueError(f"audio sample {at} is {out32[at]}: samples must be finite")
    return out32


_PCM_SCALES = {"i2": (0, 32768), "i4": (0, 2**31), "u1": (128, 128)}  # dtype: (offset, scale)


class StreamedAudio:
    """A file's 16 kHz mono samples, decoded again each time they are read from the start.

    Opening decodes the whole file once, checking it (as `load_audio` does) and counting
    its samples, but keeping none. Reads (`audio[lo:hi]`) then decode forward, holding the
    samples from `KEEP_SECONDS` before the last read to its end: a window, its history and
    one decoded frame, whatever the file's length. A read behind what is held decodes from
    the start again (correct, slower); `MelFrames` reads forward twice (the maximum, then the
    windows), so a transcription decodes the file three times. Bytes and stdin are held
    compressed, as given. `np.asarray(audio)` decodes it whole (voice detection does).
    """

    KEEP_SECONDS = 60  # two windows: the seek loop never moves back more than one

    def __init__(self, source: str | os.PathLike[str] | bytes, sr: int = SAMPLE_RATE,
                 stream: int | None = None, max_seconds: float | None = None) -> None:
        stdin = not isinstance(source, (bytes, bytearray, memoryview)) and \
            os.fspath(source) == "-"
        if stdin:
            source = _read_stdin()
        self.source, self.sr, self.stream = source, sr, stream
        self.name = _source_name(source, stdin)
        self.buf: np.ndarray = np.zeros(0, np.float32)  # samples [start, start + buf.size)
        self.start = 0
        self.chunks: Iterator[np.ndarray] = iter(())
        self.size = 0
        self.head = np.zeros(0, np.float32)  # the first N_FFT samples: the STFT reflects them
        # max_seconds: refused from the declared duration before decoding, else counted here,
        # in the one pass that reads the whole file before any other work
        for pcm in self._pcm(max_seconds):
            if self.head.size < N_FFT:
                self.head = np.concatenate([self.head, _to_float(pcm[: N_FFT - self.head.size])])
            self.size += pcm.size
            check_audio_seconds(self.name, self.size / sr, max_seconds, declared=False)
        self._reset()

    def __len__(self) -> int:
        return self.size

    @property
    def held(self) -> int:
        """Samples in memory now (for tests of the bound)."""
        return self.buf.size

    def __getitem__(self, key: slice) -> np.ndarray:
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("StreamedAudio supports audio[lo:hi] only")
        lo, hi, _ = key.indices(self.size)
        if hi <= lo:
            return np.zeros(0, np.float32)
        if hi <= self.head.size:
            return self.head[lo:hi]
        if lo < self.start:
            self._reset()
        keep_from = lo - self.KEEP_SECONDS * self.sr  # what is held from now on
        end = self.start + self.buf.size
        first = max(self.start, min(keep_from, end))  # where the held samples will start
        parts = [self.buf[first - self.start:]]
        while end < hi:  # one concatenation per read: a copy per decoded frame is quadratic
            pcm = next(self.chunks, None)
            if pcm is None:
                raise AudioError(f"{self.name}: changed while being read (fewer samples)")
            if end + pcm.size <= keep_from:  # a read far ahead: skip, never hold, what it passes
                first = end = end + pcm.size
                parts = []
                continue
            parts.append(_to_float(pcm))
            end += pcm.size
        self.buf, self.start = np.concatenate(parts) if parts else self.buf[:0], first
        return self.buf[lo - self.start : hi - self.start]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        whole = load_audio(self.source, self.sr, self.stream)
        return whole if dtype is None else np.asarray(whole, dtype)

    def _reset(self) -> None:
        self.close()
        self.chunks = self._pcm()
        self.buf, self.start = np.zeros(0, np.float32), 0

    def close(self) -> None:
        """End the decoding under way: its container, file and ffmpeg threads go now, not
        when a garbage collection finds the suspended generator (a server leaked two
        threads and a file per request until one did)."""
        close = getattr(self.chunks, "close", None)
        if close is not None:
            close()
        self.chunks = iter(())

    def _pcm(self, max_seconds: float | None = None) -> Iterator[np.ndarray]:
        _, file = _open(self.source)
        with file, _decoder(file, self.name, self.sr, self.stream) as decoder:
            if decoder.declared is not None:
                check_audio_seconds(self.name, decoder.declared, max_seconds, declared=True)
            yield from decoder.chunks()


def _source_name(source: str | os.PathLike[str] | bytes, stdin: bool) -> str:
    if stdin:
        return "<stdin>"
    if isinstance(source, (bytes, bytearray, memoryview)):
        return "<bytes>"
    return quote(source)


def _to_float(pcm: np.ndarray) -> np.ndarray:
    # 1/32768 is a power of two, so this is exactly int16 / 32768
    out: np.ndarray = np.multiply(pcm, np.float32(1 / 32768), dtype=np.float32)
    return out


def _read_stdin() -> bytes:
    data = sys.stdin.buffer.read()
    if not data:
        raise AudioError("<stdin>: empty input")
    return data


def _open(source: str | os.PathLike[str] | bytes) -> tuple[str, IO[bytes]]:
    if isinstance(source, (bytes, bytearray, memoryview)):
        data, name = bytes(source), "<bytes>"
    elif os.fspath(source) == "-":  # only "-" itself: "./-" is a file named -
        data, name = _read_stdin(), "<stdin>"
    else:
        return _open_path(os.fspath(source))
    if not data:
        raise AudioError(f"{name}: empty input")
    return name, io.BytesIO(data)


def _open_path(path: str) -> tuple[str, IO[bytes]]:
    name = quote(path)
    try:
        info = os.stat(path)
        if stat.S_ISDIR(info.st_mode):
            raise AudioError(f"{name}: is a directory, not an audio file")
        if info.st_size == 0 and stat.S_ISREG(info.st_mode):
            raise AudioError(f"{name}: empty file")
        if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode):  # /dev/zero never ends
            raise AudioError(f"{name}: {describe_mode(info.st_mode)}, not an audio file")
        return name, open(path, "rb")  # noqa: SIM115 (closed by the caller's `with`)
    except FileNotFoundError:
        raise AudioError(f"{name}: no such file") from None
    except PermissionError:
        raise AudioError(f"{name}: permission denied") from None
    except OSError as e:
        raise AudioError(f"{name}: cannot read: {e.strerror or e}") from None


def _wav_truncated(file: IO[bytes]) -> str | None:
    """For RIFF/WAVE input: a description if the data chunk runs past the end of the file.

    ffmpeg silently clamps such a chunk to the bytes present, so decoding alone cannot tell.
    """
    problem = None
    for pos, chunk_id, chunk_size, size in _riff_chunks(file):
        if chunk_id == b"data":
            # streaming writers leave 0 or 0xFFFFFFFF when the length is unknown
            if 0 < chunk_size < 0xFFFFFFFF and pos + 8 + chunk_size > size:
                problem = f"data chunk declares {chunk_size} bytes, {size - pos - 8} present"
            break
    if file.seekable():
        file.seek(0)
    return problem


def _riff_chunks(file: IO[bytes]) -> Iterator[tuple[int, bytes, int, int]]:
    """(position, id, declared size, file size) of each chunk header of a seekable
    RIFF/WAVE file, the first _MAX_WAV_CHUNKS at most; nothing for anything else. The file
    stands at the chunk's payload as each is yielded; callers seek back to 0 after."""
    if not file.seekable():
        return
    size = file.seek(0, io.SEEK_END)
    file.seek(0)
    header = file.read(12)
    if len(header) < 12 or header[:4] != b"RIFF" or header[8:] != b"WAVE":
        return
    pos = 12
    for _ in range(_MAX_WAV_CHUNKS):
        if pos + 8 > size:
            return
        file.seek(pos)
        chunk_id, chunk_size = struct.unpack("<4sI", file.read(8))
        yield pos, chunk_id, chunk_size, size
        pos += 8 + chunk_size + (chunk_size & 1)  # chunks are padded to even sizes


def _decoder(file: IO[bytes], name: str, sr: int, stream: int | None) -> _Decoder | _WavDecoder:
    """A decoding pass over an opened file: a plain 16-bit mono WAV at `sr` Hz is read as it
    is (what ffmpeg would decode it to, with no resampling to do), anything else by ffmpeg."""
    data = _pcm16_wav(file, sr) if stream in (None, 0) else None
    if data is not None:
        return _WavDecoder(file, name, sr, *data)
    return _Decoder(file, name, sr, stream)


def plain_wav_seconds(path: str | os.PathLike[str]) -> float | None:
    """The duration of a file that is a plain 16-bit mono WAV at 16 kHz (read without
    PyAV), else None."""
    try:
        with open(path, "rb") as file:
            data = _pcm16_wav(file, SAMPLE_RATE)
    except OSError:
        return None
    return data[1] / SAMPLE_RATE if data is not None else None


def _pcm16_wav(file: IO[bytes], sr: int) -> tuple[int, int] | None:
    """(byte offset, samples) of the data of a RIFF/WAVE file of 16-bit mono PCM at `sr` Hz
    whose data chunk lies whole in the file; None for anything else (other formats, rates or
    layouts, a streaming writer's unknown length, a truncated or odd-sized chunk)."""
    found, plain = None, False
    for pos, chunk_id, chunk_size, size in _riff_chunks(file):
        if chunk_id == b"fmt " and chunk_size >= 16 and pos + 24 <= size:
            tag, channels, rate, _, align, bits = struct.unpack("<HHIIHH", file.read(16))
            plain = (tag, channels, rate, align, bits) == (1, 1, sr, 2, 16)
        elif chunk_id == b"data":
            if plain and 0 < chunk_size < 0xFFFFFFFF and chunk_size % 2 == 0 \
                    and pos + 8 + chunk_size <= size:
                found = (pos + 8, chunk_size // 2)
            break
    if file.seekable():
        file.seek(0)
    return found


class _WavDecoder:
    """A plain WAV's samples (see _pcm16_wav), as `_Decoder` yields them: no PyAV import (40-50
    ms of a run), no ffmpeg threads."""

    CHUNK_SAMPLES = 1 << 16

    def __init__(self, file: IO[bytes], name: str, sr: int, offset: int, n: int) -> None:
        self.file, self.name, self.sr, self.offset, self.n = file, name, sr, offset, n
        self.declared: float | None = n / sr

    def __enter__(self) -> _WavDecoder:
        return self

    def __exit__(self, *exc: object) -> None:
        pass  # the file is the caller's to close

    def chunks(self) -> Iterator[np.ndarray]:
        self.file.seek(self.offset)
        for start in range(0, self.n, self.CHUNK_SAMPLES):
            want = min(self.CHUNK_SAMPLES, self.n - start)
            data = self.file.read(2 * want)
            if len(data) != 2 * want:  # the file shrank since it was opened
                raise AudioError(f"{self.name}: truncated at {start / self.sr:.2f} s")
            yield np.frombuffer(data, "<i2")


class _Decoder:
    """One decoding pass over an opened file: `chunks()` yields int16 mono PCM at `sr`."""

    def __init__(self, file: IO[bytes], name: str, sr: int, stream: int | None) -> None:
        import av  # 40-50 ms: only for what ffmpeg must decode

        truncated = _wav_truncated(file)
        if truncated:
            raise AudioError(f"{name}: truncated WAV ({truncated})")
        self.name, self.sr = name, sr
        try:  # self-contained containers only: nothing that reads other files or URLs
            self.container = open_container(file, metadata_errors="ignore")
        except (av.FFmpegError, EOFError, OSError, ValueError) as e:
            if refused(e):
                raise AudioError(f"{name}: {REFUSED}") from None
            raise AudioError(f"{name}: not a readable audio file ({_reason(e)})") from None
        try:
            self.stream = _pick_stream(self.container, name, stream)
        except BaseException:
            self.container.close()
            raise
        self.declared = _declared_seconds(self.container, self.stream)

    def __enter__(self) -> _Decoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.container.close()

    def chunks(self) -> Iterator[np.ndarray]:
        import av

        name, sr = self.name, self.sr
        resampler = av.AudioResampler(format="s16", layout="mono", rate=sr)
        n = 0
        try:
            for frame in self.container.decode(self.stream):
                if frame.sample_rate < MIN_SOURCE_RATE:
                    raise AudioError(f"{name}: sample rate {frame.sample_rate} Hz is too low "
                                     f"for speech (at least {MIN_SOURCE_RATE} Hz)")
                if frame.sample_rate > MAX_SOURCE_RATE:
                    raise AudioError(f"{name}: sample rate {frame.sample_rate} Hz is beyond "
                                     f"any audio format's (at most {MAX_SOURCE_RATE} Hz)")
                if frame.format.name in _FLOAT_FORMATS:
                    _check_finite(frame, name)
                if len(frame.layout.channels) > _MAX_SWR_CHANNELS:
                    frame = _downmix(frame)
                for out in resampler.resample(frame):
                    pcm = out.to_ndarray().reshape(-1)
                    n += pcm.size
                    yield pcm
            for out in resampler.resample(None):
                pcm = out.to_ndarray().reshape(-1)
                n += pcm.size
                yield pcm
        except (av.FFmpegError, EOFError, ValueError) as e:
            raise AudioError(f"{name}: corrupt or truncated at {n / sr:.2f} s "
                             f"({_reason(e)})") from None
        if n == 0:
            raise AudioError(f"{name}: no audio samples")
        got, declared = n / sr, self.declared
        if declared is not None and got < 0.9 * declared and declared - got > 1.0:
            raise AudioError(f"{name}: truncated: decoded {got:.2f} s of {declared:.2f} s "
                             "declared")


def _pick_stream(container: Any, name: str, index: int | None) -> Any:
    """The audio stream `index` (counted among audio streams), else ffmpeg's choice
    (av_find_best_stream: the default-disposition stream, then the most channels and bit
    rate): what `ffmpeg -i FILE` transcodes, not merely the first, which may be silent
    commentary or a blank track."""
    streams = container.streams.audio
    if not streams:
        raise AudioError(f"{name}: no audio stream")
    if index is None:
        return container.streams.best("audio") or streams[0]
    if not 0 <= index < len(streams):
        raise AudioError(f"{name}: no audio stream {index} (--audio-stream): it has "
                         f"{len(streams)}, numbered from 0")
    return streams[index]


def _downmix(frame: Any) -> Any:
    """A frame of more channels than libswresample's layouts name, averaged to mono float.

    Whatever the channel count (9, 32, 255), every channel counts equally, as a mono downmix
    of unknown speaker positions should."""
    planes = frame.to_ndarray().astype(np.float32)
    n_channels = len(frame.layout.channels)
    if frame.format.is_planar:
        mixed = planes.mean(axis=0)
    else:  # packed: one row of interleaved samples
        mixed = planes.reshape(-1, n_channels).mean(axis=1)
    import av

    kind = frame.format.name.rstrip("p")
    if kind == "u8":
        mixed = (mixed - 128) / 128
    elif kind in _INT_FULL_SCALE:
        mixed = mixed / float(_INT_FULL_SCALE[kind])
    out = av.AudioFrame.from_ndarray(np.ascontiguousarray(mixed[None, :], np.float32),
                                     format="flt", layout="mono")
    out.sample_rate = frame.sample_rate
    out.pts, out.time_base = frame.pts, frame.time_base
    return out


_MAX_SWR_CHANNELS = 8  # layouts libswresample downmixes by itself (7.1 and fewer)
_INT_FULL_SCALE = {"s16": 32768, "s32": 2**31, "s64": 2**63}


def _reason(e: BaseException) -> str:
    text = getattr(e, "strerror", None) or str(e) or type(e).__name__
    return str(text).splitlines()[0]


def _declared_seconds(container: Any, stream: Any) -> float | None:
    import av

    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return float(container.duration / av.time_base)
    return None


def _check_finite(frame: Any, name: str) -> None:
    values = frame.to_ndarray()
    if not np.isfinite(values).all():
        at = float(frame.time) if frame.time is not None else 0.0
        raise AudioError(f"{name}: NaN or infinite samples near {at:.2f} s")


class _Samples:
    """A float32 buffer filled from int16 chunks, reserved from the declared duration (so a
    correct header means no copy) and grown by half when full."""

    def __init__(self, capacity: int) -> None:
        self.buf = np.empty(max(capacity, 1), np.float32)  # pages are committed when written
        self.n = 0

    def append(self, pcm: np.ndarray) -> None:
        pcm = pcm.reshape(-1)
        end = self.n + pcm.size
        if end > self.buf.size:
            grown = np.empty(max(end, self.buf.size * 3 // 2), np.float32)
            grown[: self.n] = self.buf[: self.n]
            self.buf = grown
        # 1/32768 is a power of two, so this is exactly int16 / 32768
        np.multiply(pcm, np.float32(1 / 32768), out=self.buf[self.n : end])
        self.n = end

    def result(self) -> np.ndarray:
        # a view: the unused tail was never written, so its pages were never committed
        return self.buf[: self.n]

"""Audio in: decode any file to 16 kHz mono float32, and compute the log-mel features Whisper
reads (reference/whisper.md §2.1).

Decoding uses PyAV (its wheels bundle ffmpeg). Frames are resampled as they are decoded by
libswresample to signed 16-bit mono at 16 kHz, then divided by 32768: the same path as the
reference's `ffmpeg -ac 1 -ar 16000 -f s16le`. The compressed input is streamed; the decoded
samples are kept whole (float32 at 16 kHz is 230 MB per hour), since the seek loop revisits
them. Truncation is caught three ways: decoder errors, a WAV whose data chunk runs past the
end of the file, and fewer samples than the container declares (by more than 10 % and 1 s, to
spare estimated durations). An Ogg file cut at a page boundary is indistinguishable from a
shorter one.

The spectrogram of long audio is never materialized. Each frame depends only on its own 400
samples, but the normalization uses the maximum over the whole recording, so `MelFrames`
makes two passes: construction computes the maximum chunk by chunk, and each window is then
recomputed on demand (one 30 s window costs milliseconds, far less than the encoder). The
STFT and mel product run in float64, so results agree with a float64 reference to ~1e-7, and
every frame is computed by the same fixed sequence of operations whatever the chunking, so
chunked windows equal `log_mel_spectrogram` of the whole file bit for bit.
"""

from __future__ import annotations

import io
import os
import stat
import struct
import sys
from functools import lru_cache
from typing import IO, Any

import av
import numpy as np
import scipy.fft
import scipy.sparse

from tensorplan.errors import AudioError

SAMPLE_RATE = 16000
N_FFT = 400  # 25 ms analysis window
HOP_LENGTH = 160  # 10 ms between frames
CHUNK_LENGTH = 30  # seconds per model window
N_SAMPLES = CHUNK_LENGTH * SAMPLE_RATE  # 480000 samples in a 30 s window
N_FRAMES = N_SAMPLES // HOP_LENGTH  # 3000 frames in a mel window
FRAMES_PER_SECOND = SAMPLE_RATE // HOP_LENGTH  # 100 frames (10 ms each) per second
N_FREQS = N_FFT // 2 + 1  # 201 rFFT bins
LOG_FLOOR = 1e-10  # mel power is clamped here before log10
DYNAMIC_RANGE = 8.0  # log10 units kept below the global maximum (80 dB)
CHUNK_FRAMES = 2000  # frames per STFT batch: bounds temporaries to ~20 MB
_PAD = N_FFT // 2  # reflect padding each side (torch.stft center=True)
_FLOAT_FORMATS = ("flt", "fltp", "dbl", "dblp")
_MAX_WAV_CHUNKS = 64  # header chunks looked at before "data"; real files have a handful
_INITIAL_SECONDS_CAP = 4 * 3600  # reserve (virtual memory only) at most this much up front
MIN_SOURCE_RATE = 1000  # Hz; below this a tiny header would expand into hours at 16 kHz


# --- decoding --------------------------------------------------------------------------------


def as_samples(array: np.ndarray) -> np.ndarray:
    """Samples given as an array -> mono float32 in [-1, 1]: float arrays as they are,
    integer PCM scaled by its dtype (int16 / 32768, int32 / 2**31, uint8 (x - 128) / 128).
    Raises ValueError for other dtypes, a shape that is not (n,), or a NaN/Inf sample
    (named by its index: one would poison every window after it)."""
    a = np.asarray(array)
    if a.ndim != 1:
        raise ValueError(f"audio samples must have shape (n,), got {a.shape}")
    if a.dtype.kind == "f":
        out = a.astype(np.float32, copy=False)
    elif a.dtype in (np.int16, np.int32):
        out = a.astype(np.float32) / np.float32(-np.iinfo(a.dtype).min)
    elif a.dtype == np.uint8:
        out = (a.astype(np.float32) - 128) / np.float32(128)
    else:
        raise ValueError(f"audio samples must be float, int16, int32 or uint8, not {a.dtype}")
    bad = np.flatnonzero(~np.isfinite(out))
    if bad.size:
        raise ValueError(f"audio sample {bad[0]} is {out[bad[0]]} (not a finite number)")
    return out


def load_audio(source: str | os.PathLike[str] | bytes, sr: int = SAMPLE_RATE) -> np.ndarray:
    """Decode a file path, raw file bytes, or "-" (stdin, read whole) to mono float32
    samples at `sr` Hz.

    Returns shape (n_samples,). Raises AudioError naming the input for a missing, empty,
    unreadable, truncated or non-audio input, no samples, NaN/Inf samples, or a sample rate
    below MIN_SOURCE_RATE.
    """
    name, file = _open(source)
    with file:
        truncated = _wav_truncated(file)
        if truncated:
            raise AudioError(f"{name}: truncated WAV ({truncated})")
        return _decode(file, name, sr)


def _open(source: str | os.PathLike[str] | bytes) -> tuple[str, IO[bytes]]:
    if isinstance(source, (bytes, bytearray, memoryview)):
        data, name = bytes(source), "<bytes>"
    elif os.fspath(source) == "-":  # also Path("-"), as the CLI passes it
        data, name = sys.stdin.buffer.read(), "<stdin>"
    else:
        return _open_path(os.fspath(source))
    if not data:
        raise AudioError(f"{name}: empty input")
    return name, io.BytesIO(data)


def _open_path(path: str) -> tuple[str, IO[bytes]]:
    try:
        info = os.stat(path)
        if stat.S_ISDIR(info.st_mode):
            raise AudioError(f"{path}: is a directory, not an audio file")
        if info.st_size == 0 and stat.S_ISREG(info.st_mode):
            raise AudioError(f"{path}: empty file")
        return path, open(path, "rb")  # noqa: SIM115 (closed by load_audio's `with`)
    except FileNotFoundError:
        raise AudioError(f"{path}: no such file") from None
    except PermissionError:
        raise AudioError(f"{path}: permission denied") from None
    except OSError as e:
        raise AudioError(f"{path}: cannot read: {e.strerror or e}") from None


def _wav_truncated(file: IO[bytes]) -> str | None:
    """For RIFF/WAVE input: a description if the data chunk runs past the end of the file.

    ffmpeg silently clamps such a chunk to the bytes present, so decoding alone cannot tell.
    """
    if not file.seekable():
        return None
    size = file.seek(0, io.SEEK_END)
    file.seek(0)
    header = file.read(12)
    if len(header) < 12 or header[:4] != b"RIFF" or header[8:] != b"WAVE":
        file.seek(0)
        return None
    pos, problem = 12, None
    for _ in range(_MAX_WAV_CHUNKS):
        if pos + 8 > size:
            break
        file.seek(pos)
        chunk_id, chunk_size = struct.unpack("<4sI", file.read(8))
        if chunk_id == b"data":
            # streaming writers leave 0 or 0xFFFFFFFF when the length is unknown
            if 0 < chunk_size < 0xFFFFFFFF and pos + 8 + chunk_size > size:
                problem = f"data chunk declares {chunk_size} bytes, {size - pos - 8} present"
            break
        pos += 8 + chunk_size + (chunk_size & 1)  # chunks are padded to even sizes
    file.seek(0)
    return problem


def _decode(file: IO[bytes], name: str, sr: int) -> np.ndarray:
    try:
        container = av.open(file, mode="r", metadata_errors="ignore")
    except (av.FFmpegError, EOFError, OSError, ValueError) as e:
        raise AudioError(f"{name}: not a readable audio file ({_reason(e)})") from None
    with container:
        if not container.streams.audio:
            raise AudioError(f"{name}: no audio stream")
        stream = container.streams.audio[0]
        declared = _declared_seconds(container, stream)
        samples = _Samples(int(min(declared or 30, _INITIAL_SECONDS_CAP) * sr) + sr)
        resampler = av.AudioResampler(format="s16", layout="mono", rate=sr)
        try:
            for frame in container.decode(stream):
                if frame.sample_rate < MIN_SOURCE_RATE:
                    raise AudioError(f"{name}: sample rate {frame.sample_rate} Hz is too low "
                                     f"for speech (at least {MIN_SOURCE_RATE} Hz)")
                if frame.format.name in _FLOAT_FORMATS:
                    _check_finite(frame, name)
                for out in resampler.resample(frame):
                    samples.append(out.to_ndarray())
            for out in resampler.resample(None):
                samples.append(out.to_ndarray())
        except (av.FFmpegError, EOFError, ValueError) as e:
            at = samples.n / sr
            raise AudioError(f"{name}: corrupt or truncated at {at:.2f} s ({_reason(e)})") from None
    if samples.n == 0:
        raise AudioError(f"{name}: no audio samples")
    got = samples.n / sr
    if declared is not None and got < 0.9 * declared and declared - got > 1.0:
        raise AudioError(f"{name}: truncated: decoded {got:.2f} s of {declared:.2f} s declared")
    return samples.result()


def _reason(e: BaseException) -> str:
    text = getattr(e, "strerror", None) or str(e) or type(e).__name__
    return str(text).splitlines()[0]


def _declared_seconds(container: Any, stream: Any) -> float | None:
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


# --- log-mel ---------------------------------------------------------------------------------


@lru_cache(maxsize=4)
def mel_filters(n_mels: int = 80) -> np.ndarray:
    """Slaney-style mel filterbank (librosa htk=False, norm="slaney", fmax 8 kHz).

    Returns (n_mels, 201) float32, read-only: the same values as openai/whisper's
    mel_filters.npz (to ~2e-9), computed in closed form instead of loaded.
    """
    if n_mels not in (80, 128):
        raise ValueError(f"n_mels must be 80 or 128, not {n_mels}")
    f_sp, min_log_hz = 200.0 / 3, 1000.0  # linear below 1 kHz, logarithmic above
    min_log_mel, logstep = min_log_hz / f_sp, np.log(6.4) / 27.0
    max_mel = min_log_mel + np.log(SAMPLE_RATE / 2 / min_log_hz) / logstep
    mels = np.linspace(0.0, max_mel, n_mels + 2)
    hz = np.where(
        mels < min_log_mel, f_sp * mels, min_log_hz * np.exp(logstep * (mels - min_log_mel))
    )
    freqs = np.fft.rfftfreq(N_FFT, 1.0 / SAMPLE_RATE)
    ramps = hz[:, None] - freqs[None, :]
    widths = np.diff(hz)
    rising = -ramps[:-2] / widths[:-1, None]
    falling = ramps[2:] / widths[1:, None]
    weights = np.maximum(0.0, np.minimum(rising, falling)) * (2.0 / (hz[2:] - hz[:-2]))[:, None]
    out: np.ndarray = weights.astype(np.float32)
    out.flags.writeable = False
    return out


def log_mel_spectrogram(audio: np.ndarray, n_mels: int = 80, padding: int = 0) -> np.ndarray:
    """Whisper's log-mel features of `audio` (16 kHz mono) followed by `padding` zeros.

    Returns (n_mels, n_frames) float32 with n_frames = (len(audio) + padding) // 160.
    """
    audio = _as_samples(audio)
    n_frames = (audio.size + padding) // HOP_LENGTH
    out = np.empty((n_mels, n_frames), np.float32)
    for start in range(0, n_frames, CHUNK_FRAMES):
        stop = min(start + CHUNK_FRAMES, n_frames)
        out[:, start:stop] = _log10_mel(audio, padding, start, stop, n_mels)
    if n_frames:
        _normalize(out, out.max(), out=out)
    return out


class MelFrames:
    """The normalized log-mel frames of a whole recording, served window by window.

    Frame for frame equal to `log_mel_spectrogram(audio, n_mels, padding)`, but only one
    chunk's temporaries and the requested window are ever in memory. The default `padding`
    is transcribe's: the mel of the audio followed by 30 s of zeros. Satisfies
    `transcribe.MelFrames`: `n_frames` counts the frames of the audio itself (the padding's
    frames are still served, and only shape the frames near the end and the maximum).
    """

    def __init__(self, audio: np.ndarray, n_mels: int = 80, padding: int = N_SAMPLES) -> None:
        self.audio = _as_samples(audio)  # kept by reference, not copied
        self.n_mels = n_mels
        self.padding = padding
        self.n_frames = self.audio.size // HOP_LENGTH  # content frames
        self.n_total = (self.audio.size + padding) // HOP_LENGTH  # including the padding's
        # pass 1: the global maximum the normalization needs
        peak = np.float32(np.log10(LOG_FLOOR))
        for start in range(0, self.n_total, CHUNK_FRAMES):
            stop = min(start + CHUNK_FRAMES, self.n_total)
            peak = max(peak, _log10_mel(self.audio, padding, start, stop, n_mels).max())
        self.max_log = np.float32(peak)

    def frames(self, start: int, stop: int) -> np.ndarray:
        """Normalized frames [start, stop) as (n_mels, stop - start) float32."""
        if not 0 <= start <= stop <= self.n_total:
            raise IndexError(f"frames [{start}, {stop}) outside [0, {self.n_total})")
        out = np.empty((self.n_mels, stop - start), np.float32)
        for a in range(start, stop, CHUNK_FRAMES):
            b = min(a + CHUNK_FRAMES, stop)
            out[:, a - start : b - start] = _log10_mel(self.audio, self.padding, a, b, self.n_mels)
        return _normalize(out, self.max_log, out=out)

    def window(self, seek: int, n: int = N_FRAMES) -> np.ndarray:
        """Frames [seek, seek + n) as (n_mels, n); frames past the end are 0.0 (the
        normalized-domain padding of openai/whisper's pad_or_trim)."""
        stop = min(seek + n, self.n_total)
        if seek >= stop:
            return np.zeros((self.n_mels, n), np.float32)
        out = self.frames(seek, stop)
        return out if stop - seek == n else np.pad(out, ((0, 0), (0, n - (stop - seek))))


def _as_samples(audio: np.ndarray) -> np.ndarray:
    samples: np.ndarray = np.asarray(audio)
    if samples.ndim != 1:
        raise ValueError(f"audio must be 1-D samples, got shape {samples.shape}")
    return samples if samples.dtype == np.float32 else samples.astype(np.float32)


def _normalize(log_mel: np.ndarray, peak: np.floating[Any], out: np.ndarray) -> np.ndarray:
    """Clamp to DYNAMIC_RANGE below the peak and scale to about [-1, 1], in float32."""
    np.maximum(log_mel, np.float32(peak) - np.float32(DYNAMIC_RANGE), out=out)
    out += np.float32(4.0)
    out /= np.float32(4.0)
    return out


@lru_cache(maxsize=4)
def _filters64(n_mels: int) -> scipy.sparse.csr_array:
    # Sparse: 391 of 16080 weights are nonzero (80 mels). Each output is then a sum in a fixed
    # order whatever the chunk's width (so chunked == whole, bit for bit), with ~40x fewer
    # flops than a dense product and no BLAS threads to contend for shared cores.
    return scipy.sparse.csr_array(mel_filters(n_mels).astype(np.float64))


@lru_cache(maxsize=1)
def _hann64() -> np.ndarray:
    return np.hanning(N_FFT + 1)[:-1]  # periodic Hann, as torch.hann_window(400)


def _log10_mel(audio: np.ndarray, padding: int, start: int, stop: int, n_mels: int) -> np.ndarray:
    """log10 of the clamped mel power of frames [start, stop), (n_mels, stop - start)."""
    segment = _padded(audio, padding, start * HOP_LENGTH, (stop - 1) * HOP_LENGTH + N_FFT)
    frames = np.lib.stride_tricks.sliding_window_view(segment, N_FFT)[::HOP_LENGTH]
    # scipy's pocketfft is ~1.5x numpy's here; the windowed copy may be overwritten
    spectrum = scipy.fft.rfft(frames * _hann64(), axis=-1, overwrite_x=True)
    power = spectrum.real**2 + spectrum.imag**2
    mel: np.ndarray = _filters64(n_mels) @ power.T
    log_mel: np.ndarray = np.log10(np.maximum(mel, LOG_FLOOR)).astype(np.float32)
    return log_mel


def _padded(audio: np.ndarray, padding: int, lo: int, hi: int) -> np.ndarray:
    """Samples [lo, hi) of reflect_pad(audio + `padding` zeros, 200), in float64.

    Built per chunk so that the padded signal is never materialized. Reflection repeats
    when the signal is shorter than the pad, as numpy's "reflect" does.
    """
    length = audio.size + padding
    out = np.zeros(hi - lo, np.float64)
    a, b = max(lo - _PAD, 0), min(hi - _PAD, audio.size)  # the directly copied part
    if a < b:
        out[a + _PAD - lo : b + _PAD - lo] = audio[a:b]
    for j0, j1 in ((lo - _PAD, min(hi - _PAD, 0)), (max(lo - _PAD, length), hi - _PAD)):
        if j0 < j1:
            src = _reflect(np.arange(j0, j1), length)
            inside = src < audio.size  # reflected indices landing in the zero padding stay 0
            out[j0 + _PAD - lo : j1 + _PAD - lo][inside] = audio[src[inside]]
    return out


def _reflect(j: np.ndarray, length: int) -> np.ndarray:
    if length == 1:
        return np.zeros_like(j)
    period = 2 * (length - 1)
    j = j % period
    return np.where(j >= length, period - j, j)

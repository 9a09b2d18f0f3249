"""Whisper's log-mel features (openai-whisper's log-mel front end, its audio.py).

The spectrogram of long audio is never materialized. Each frame depends only on its own 400
samples, but the normalization uses the maximum over the whole recording, so `MelFrames`
makes two passes: construction computes the maximum chunk by chunk, and each window is then
recomputed on demand (one 30 s window costs milliseconds, far less than the encoder) unless
the recording is short enough to keep the first pass's frames (KEEP_MEL_BYTES). The
STFT and mel product run in float64, so results agree with a float64 reference to ~1e-7, and
every frame is computed by the same fixed sequence of operations whatever the chunking, so
chunked windows equal `log_mel_spectrogram` of the whole file bit for bit.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from tensorplan.whisper.audio.constants import HOP_LENGTH, N_FFT, N_FRAMES, N_SAMPLES, SAMPLE_RATE
from tensorplan.whisper.audio.decode import StreamedAudio

N_FREQS = N_FFT // 2 + 1  # 201 rFFT bins
LOG_FLOOR = 1e-10  # mel power is clamped here before log10
DYNAMIC_RANGE = 8.0  # log10 units kept below the global maximum (80 dB)
CHUNK_FRAMES = 2000  # frames per STFT batch: bounds temporaries to ~20 MB
KEEP_MEL_BYTES = 16 << 20  # MelFrames keeps a recording's frames up to this (~8 min, 80 mels)
_PAD = N_FFT // 2  # reflect padding each side (torch.stft center=True)
_SILENT_LOG10 = np.float32(np.log10(LOG_FLOOR))  # a frame of zeros, after the clamp


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

    Frame for frame equal to `log_mel_spectrogram(audio, n_mels, padding)`. A recording whose
    frames fit KEEP_MEL_BYTES keeps them from the first pass (a short file's windows are not
    computed twice); a longer one holds only one chunk's temporaries and the requested
    window, each window recomputed on demand. The default `padding`
    is transcribe's: the mel of the audio followed by 30 s of zeros. Satisfies
    `transcribe.MelFrames`: `n_frames` counts the frames of the audio itself (the padding's
    frames are still served, and only shape the frames near the end and the maximum).
    """

    def __init__(self, audio: np.ndarray | StreamedAudio, n_mels: int = 80,
                 padding: int = N_SAMPLES) -> None:
        self.audio = _as_samples(audio)  # kept by reference, not copied; or read as streamed
        self.n_mels = n_mels
        self.padding = padding
        self.n_frames = self.audio.size // HOP_LENGTH  # content frames
        self.n_total = (self.audio.size + padding) // HOP_LENGTH  # including the padding's
        # pass 1: the global maximum the normalization needs; short audio keeps its frames
        keep = self.n_total * n_mels * 4 <= KEEP_MEL_BYTES
        self._kept = np.empty((n_mels, self.n_total), np.float32) if keep else None
        peak = _SILENT_LOG10
        for start in range(0, self.n_total, CHUNK_FRAMES):
            stop = min(start + CHUNK_FRAMES, self.n_total)
            chunk = self._log10_mel(start, stop)
            peak = max(peak, chunk.max())
            if self._kept is not None:
                self._kept[:, start:stop] = chunk
        self.max_log = np.float32(peak)

    def frames(self, start: int, stop: int) -> np.ndarray:
        """Normalized frames [start, stop) as (n_mels, stop - start) float32."""
        if not 0 <= start <= stop <= self.n_total:
            raise IndexError(f"frames [{start}, {stop}) outside [0, {self.n_total})")
        out = np.empty((self.n_mels, stop - start), np.float32)
        if self._kept is not None:  # the same frames pass 1 computed (chunking changes no bit)
            return _normalize(self._kept[:, start:stop], self.max_log, out=out)
        for a in range(start, stop, CHUNK_FRAMES):
            b = min(a + CHUNK_FRAMES, stop)
            out[:, a - start : b - start] = self._log10_mel(a, b)
        return _normalize(out, self.max_log, out=out)

    def _log10_mel(self, start: int, stop: int) -> np.ndarray:
        """_log10_mel of frames [start, stop), the frames that see only the padding's zeros
        filled in: their power is exactly 0, so each is log10(LOG_FLOOR), bit for bit what
        the transform gives (30 s of padding is 3000 of jfk.wav's 4100 frames)."""
        silent = self._first_silent_frame()
        if stop <= silent:
            return _log10_mel(self.audio, self.padding, start, stop, self.n_mels)
        out = np.full((self.n_mels, stop - start), _SILENT_LOG10, np.float32)
        if start < silent:
            out[:, : silent - start] = _log10_mel(self.audio, self.padding, start, silent,
                                                  self.n_mels)
        return out

    def _first_silent_frame(self) -> int:
        """The first frame whose window holds only padding zeros: past the audio by the
        window's half (its reflect padding), and with the far end's reflection also in the
        zeros (padding beyond that half); else none (n_total)."""
        n_total: int = self.n_total
        if self.padding <= _PAD:
            return n_total
        return min(n_total, -(-(int(self.audio.size) + _PAD) // HOP_LENGTH))

    def window(self, seek: int, n: int = N_FRAMES) -> np.ndarray:
        """Frames [seek, seek + n) as (n_mels, n); frames past the end are 0.0 (the
        normalized-domain padding of openai/whisper's pad_or_trim)."""
        stop = min(seek + n, self.n_total)
        if seek >= stop:
            return np.zeros((self.n_mels, n), np.float32)
        out = self.frames(seek, stop)
        return out if stop - seek == n else np.pad(out, ((0, 0), (0, n - (stop - seek))))


def _as_samples(audio: np.ndarray | StreamedAudio) -> Any:
    if isinstance(audio, StreamedAudio):
        return audio
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
def _filter_taps(n_mels: int) -> tuple[np.ndarray, np.ndarray]:
    """The filterbank as taps: (weights (W, n_mels) float64, bins (W, n_mels)), where tap t
    of mel i is its t-th nonzero weight and the rFFT bin it multiplies (each filter's
    nonzeros are one contiguous run of bins; a filter with fewer than W has 0 weights on
    its last bin). 391 of 16080 weights are nonzero (80 mels, W = 14)."""
    dense = mel_filters(n_mels).astype(np.float64)
    runs = [np.flatnonzero(row) for row in dense]
    width = max(len(r) for r in runs)
    weights = np.zeros((width, n_mels))
    bins = np.zeros((width, n_mels), np.intp)
    for i, run in enumerate(runs):
        weights[: len(run), i] = dense[i, run]
        bins[:, i] = np.minimum(run[0] + np.arange(width), N_FREQS - 1)
    return weights, bins


def _mel_power(power: np.ndarray, n_mels: int) -> np.ndarray:
    """power (frames, N_FREQS) float64 -> mel power (n_mels, frames): each mel a sum of its
    filter's terms in bin order, one tap at a time for all mels and frames at once.

    Every output is summed in the same fixed order whatever the number of frames (so chunked
    == whole, bit for bit), with ~40x fewer flops than a dense product, no BLAS threads to
    contend for shared cores, and no scipy (whose import cost ~0.1 s of every run)."""
    weights, bins = _filter_taps(n_mels)
    acc = np.multiply(power[:, bins[0]], weights[0])  # (frames, n_mels)
    term = np.empty_like(acc)
    for w, b in zip(weights[1:], bins[1:], strict=True):
        np.multiply(power[:, b], w, out=term)  # a padding tap adds 0 * power = +0.0
        acc += term
    out: np.ndarray = acc.T
    return out


@lru_cache(maxsize=1)
def _hann64() -> np.ndarray:
    return np.hanning(N_FFT + 1)[:-1]  # periodic Hann, as torch.hann_window(400)


def _log10_mel(audio: np.ndarray, padding: int, start: int, stop: int, n_mels: int) -> np.ndarray:
    """log10 of the clamped mel power of frames [start, stop), (n_mels, stop - start)."""
    segment = _padded(audio, padding, start * HOP_LENGTH, (stop - 1) * HOP_LENGTH + N_FFT)
    frames = np.lib.stride_tricks.sliding_window_view(segment, N_FFT)[::HOP_LENGTH]
    spectrum = np.fft.rfft(frames * _hann64(), axis=-1)  # scipy.fft's pocketfft, same bits
    power = spectrum.real**2 + spectrum.imag**2
    mel = _mel_power(power, n_mels)
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
            if inside.any():  # one slice, then local indices: `audio` may be StreamedAudio
                first, last = int(src[inside].min()), int(src[inside].max())
                span = audio[first : last + 1]
                out[j0 + _PAD - lo : j1 + _PAD - lo][inside] = span[src[inside] - first]
    return out


def _reflect(j: np.ndarray, length: int) -> np.ndarray:
    if length == 1:
        return np.zeros_like(j)
    period = 2 * (length - 1)
    j = j % period
    return np.where(j >= length, period - j, j)

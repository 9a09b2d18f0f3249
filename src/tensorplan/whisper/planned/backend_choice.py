"""What `--backend auto` runs: numpy unless PyTorch repays its own start-up.

PyTorch's kernels halve the float32 encoder (0.31 s against 0.59 per 30 s window, tiny.en)
but its decoder steps are no faster (beam 5: 23.7 ms against numpy's 19.6), and `import
torch` with the backend's set-up costs ~1.2 s and ~240 MB before the first window, plus
its teardown at exit. A CLI run of jfk.wav (11 s) took 2.47 s on torch against 1.46 on
numpy. So auto takes torch only where the work is big enough:
- int8: numpy's int8 kernel dequantizes block by block (a reference, several times slower
  than FBGEMM), so int8 always runs on torch when it is installed;
- audio of at least TORCH_MIN_AUDIO_S seconds in this process;
- unknown work (the Python API, batch workers, servers): a long-lived process, where the
  import is paid once.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from tensorplan import backends
from tensorplan.whisper.options import clip_spans

# Float32 break-even: ~0.15 s saved per 30 s window (encoder gain less the beam-5
# decoder loss) against ~1.2 s of start-up, i.e. 8 windows; rounded up because the saving
# shrinks on a busy machine (fewer threads for the encoder) and the import does not.
TORCH_MIN_AUDIO_S = 300.0


def resolve(name: str, compute_type: str = "float32",
            audio_seconds: float | None = None, device: str = "cpu") -> str:
    """The backend `name` means for this work: "numpy" or "torch" ("auto" decided here;
    anything else, and auto off the CPU, is passed through for make_backend to decide)."""
    if name != "auto" or device != "cpu":
        return name
    if not backends.torch_available():  # looked up here: tests patch it
        return "numpy"
    if compute_type == "int8" or audio_seconds is None or audio_seconds >= TORCH_MIN_AUDIO_S:
        return "torch"
    return "numpy"


def clipped_seconds(duration: float, clips: Sequence[float] = ()) -> float:
    """How much of a `duration`-second file `clip_timestamps` (start, end, start, ...; an
    odd count leaves the last clip open to the end) will transcribe."""
    return sum(max(0.0, end - start) for start, end in clip_spans(clips, duration))


def audio_seconds(
    paths: Sequence[str | os.PathLike[str]], clips: Sequence[float] = ()
) -> float | None:
    """The total duration these files declare (their containers' headers, not decoded),
    cut to what `clips` will transcribe of each, or None when any is unknown (unreadable,
    a stream without a duration)."""
    from tensorplan.whisper.audio.decode import plain_wav_seconds

    total = 0.0
    for path in paths:
        seconds = plain_wav_seconds(path)  # a plain WAV: its header, no PyAV import
        if seconds is not None:
            total += clipped_seconds(seconds, clips)
            continue
        import av  # needed to decode them anyway; the probe reads headers only

        from tensorplan.whisper.audio.containers import probe

        try:
            with probe(path) as container:  # never a playlist's references
                if container.duration is None:
                    return None
                total += clipped_seconds(float(container.duration / av.time_base), clips)
        except (av.FFmpegError, OSError, ValueError):
            return None
    return total

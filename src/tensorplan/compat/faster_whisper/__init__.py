"""faster-whisper's Python API on tensorplan: change one import line.

    from tensorplan.compat.faster_whisper import WhisperModel   # was: from faster_whisper

    model = WhisperModel("tiny.en", device="cpu", compute_type="int8")
    segments, info = model.transcribe("audio.wav", beam_size=5)
    for segment in segments:  # decoded window by window as the loop reads
        print(f"[{segment.start:.2f}s -> {segment.end:.2f}s] {segment.text}")

Arguments tensorplan cannot honour raise `Unsupported` (a ValueError) naming them; the
list is `arguments.REFUSED` and docs/compat.md.
"""

from tensorplan.compat.faster_whisper.arguments import REFUSED, Unsupported
from tensorplan.compat.faster_whisper.audio import decode_audio
from tensorplan.compat.faster_whisper.model import BatchedInferencePipeline, WhisperModel
from tensorplan.compat.faster_whisper.names import download_model
from tensorplan.compat.faster_whisper.types import (
    Segment,
    TranscriptionInfo,
    TranscriptionOptions,
    Word,
)
from tensorplan.whisper.audio.vad import VadOptions

__all__ = ["BatchedInferencePipeline", "REFUSED", "Segment", "TranscriptionInfo",
           "TranscriptionOptions", "Unsupported", "VadOptions", "WhisperModel", "Word",
           "__version__", "available_models", "decode_audio", "download_model",
           "format_timestamp"]

# the faster-whisper release whose API this layer follows (code that checks the version
# of the API it calls reads it here); tensorplan's own is tensorplan.__version__
__version__ = "1.2.1"


def available_models() -> list[str]:
    """The model names that load here without a path (installed or not: a missing one
    raises a ModelError that says which package to install)."""
    return ["tiny.en", "base", "small"]


def format_timestamp(seconds: float, always_include_hours: bool = False,
                     decimal_marker: str = ".") -> str:
    """[HH:]MM:SS.mmm, as faster-whisper's utility writes it."""
    if seconds < 0:
        raise ValueError("non-negative timestamp expected")
    ms = round(seconds * 1000.0)
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    secs, ms = divmod(ms, 1000)
    hours_marker = f"{hours:02d}:" if always_include_hours or hours > 0 else ""
    return f"{hours_marker}{minutes:02d}:{secs:02d}{decimal_marker}{ms:03d}"

"""What `tensorplan serve` was asked to do: one frozen value the app is built from."""

from __future__ import annotations

from dataclasses import dataclass, field

from tensorplan.serve.limits import (
    BODY_IDLE_TIMEOUT_S,
    BODY_TIMEOUT_S,
    DEFAULT_ENGINE_WINDOWS,
    DEFAULT_MAX_LIVE_STREAMS,
    HEADER_TIMEOUT_S,
    KEEP_ALIVE_S,
)
from tensorplan.whisper.limits import DEFAULT_MAX_AUDIO_SECONDS
from tensorplan.whisper.options import TranscribeOptions, group_sizes

ALIASES = ("whisper-1",)  # OpenAI's model name, so unmodified clients work


@dataclass(frozen=True)
class ServeConfig:
    model: str = "tiny.en"
    sessions: int = 1
    engine_windows: int = DEFAULT_ENGINE_WINDOWS  # decoding together on the step engine (0: off)
    # instead of engine_windows: the most windows whose planned engine fits this many MiB
    engine_memory_mb: float | None = None
    threads: int = 1  # the process's pools: each session's, or the engine's (serve/threads.py)
    api_key: str | None = field(default=None, repr=False)  # never printed
    max_upload_bytes: int = 100 << 20
    max_queue: int = 64
    max_live_streams: int = DEFAULT_MAX_LIVE_STREAMS  # realtime connections open at once
    defaults: TranscribeOptions = field(default_factory=TranscribeOptions)
    spool_dir: str | None = None  # temp files for uploads (default: the system's)
    max_audio_seconds: float | None = DEFAULT_MAX_AUDIO_SECONDS  # decoded per request
    header_timeout_s: float = HEADER_TIMEOUT_S
    body_idle_timeout_s: float = BODY_IDLE_TIMEOUT_S
    body_timeout_s: float = BODY_TIMEOUT_S
    keep_alive_s: float = KEEP_ALIVE_S

    @property
    def engine_groups(self) -> tuple[int, ...]:
        """The group sizes the engine decodes with at the defaults."""
        return group_sizes(self.defaults)

    @property
    def model_names(self) -> tuple[str, ...]:
        return (self.model, *ALIASES)


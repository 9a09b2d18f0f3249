"""What `tensorplan serve` was asked to do: one frozen value the app is built from."""

from __future__ import annotations

from dataclasses import dataclass, field

from tensorplan.whisper.options import TranscribeOptions

ALIASES = ("whisper-1",)  # OpenAI's model name, so unmodified clients work


@dataclass(frozen=True)
class ServeConfig:
    model: str = "tiny.en"
    sessions: int = 1
    engine_windows: int = 8  # requests decoding together on the step engine (0: off)
    threads_per_session: int = 1
    api_key: str | None = field(default=None, repr=False)  # never printed
    max_upload_bytes: int = 100 << 20
    max_queue: int = 64
    defaults: TranscribeOptions = field(default_factory=TranscribeOptions)
    spool_dir: str | None = None  # temp files for uploads (default: the system's)

    @property
    def model_names(self) -> tuple[str, ...]:
        return (self.model, *ALIASES)

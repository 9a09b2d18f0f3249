"""What a batch transcribes and what one worker does with it.

`collect_inputs` expands directories into audio files and gives each input its output key
(the output path under OUT, without extension). `probe_seconds` estimates a file's duration
cheaply, for longest-first scheduling. `Worker` holds one loaded model and turns a `Task`
into an `Outcome`; every pool (in-process, local processes, Ray actors) runs one per worker.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from tensorplan.errors import UserError
from tensorplan.whisper.options import TranscribeOptions
from tensorplan.whisper.planned.load_options import ModelOptions
from tensorplan.whisper.result import TranscriptionResult

# what a directory is searched for; files named directly are taken whatever their name
AUDIO_EXTENSIONS = (".wav", ".flac", ".mp3", ".m4a", ".mp4", ".ogg", ".opus", ".webm", ".mkv",
                    ".aac")
MAX_ATTEMPTS = 2  # a file that fails this many times in one run is reported and skipped
BYTES_PER_SECOND_GUESS = 16_000  # 128 kbit/s: the duration guess when a file cannot be probed
CRASH_HOOK = "TENSORPLAN_TEST_CRASH"  # tests: a pool worker dies on its 1st attempt at this name
BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                    "VECLIB_MAXIMUM_THREADS")


# --- inputs ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Input:
    path: Path
    key: str  # outputs go to OUT/<key>.<fmt>; "talk", or "2023/talk" for a file in a subfolder


def collect_inputs(args: Sequence[str | os.PathLike[str]]) -> list[Input]:
    """Files as given, and each directory's audio files (searched recursively, sorted).

    A file found in DIR/sub/ keeps its place under OUT (key "sub/name"). Raises UserError for
    a missing path, no audio at all, or two inputs that would write the same outputs.
    """
    inputs: dict[Path, Input] = {}
    for arg in args:
        if os.fspath(arg) == "-":
            raise UserError("-: stdin cannot be part of a batch (name the files, or a "
                            "directory)")
        path = Path(os.path.abspath(arg)) if Path(arg) == Path("-") else Path(arg)  # ./-
        if path.is_dir():
            found = sorted(_audio_files(path))
            for f in found:
                key = f.relative_to(path).with_suffix("").as_posix()
                inputs.setdefault(f.resolve(), Input(f, key))
        elif path.exists():
            inputs.setdefault(path.resolve(), Input(path, path.stem))
        else:
            raise UserError(f"{path}: no such file or directory")
    if not inputs:
        raise UserError("no audio files found (searched for " + " ".join(AUDIO_EXTENSIONS) + ")")
    by_key: dict[str, Input] = {}
    for item in inputs.values():
        if item.key in by_key:
            raise UserError(f"{by_key[item.key].path} and {item.path} would both write "
                            f"{item.key}.*: rename one or transcribe them separately")
        by_key[item.key] = item
    return list(inputs.values())


def _audio_files(directory: Path) -> Iterator[Path]:
    for root, dirs, files in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in files:
            if not name.startswith(".") and name.lower().endswith(AUDIO_EXTENSIONS):
                yield Path(root) / name


def output_names(key: str, formats: Sequence[str]) -> list[str]:
    """The output paths of one input, relative to OUT."""
    return [f"{key}.{fmt}" for fmt in formats]


def output_dir(out_dir: Path, key: str) -> Path:
    return out_dir / PurePosixPath(key).parent


def probe_seconds(path: Path) -> float:
    """The duration the container declares, or a guess from the file size; never raises."""
    import av

    from tensorplan.whisper.audio.containers import probe

    try:
        with probe(path) as container:  # never a playlist's references
            if container.duration is not None:
                return float(container.duration / av.time_base)
            for stream in container.streams.audio:
                if stream.duration is not None and stream.time_base is not None:
                    return float(stream.duration * stream.time_base)
    except (av.FFmpegError, OSError, ValueError, EOFError):
        pass
    try:
        return path.stat().st_size / BYTES_PER_SECOND_GUESS
    except OSError:
        return 0.0


# --- one worker ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """What every worker loads: a model name or path and its ModelOptions (picklable, so
    worker processes and Ray actors receive it as it is)."""

    name: str = "tiny.en"
    options: ModelOptions | None = None  # None: the defaults, for `name`
    # None: tensorplan.whisper.api.load. Tests put a module-level fake here; it must
    # return an object with `transcribe(samples, options) -> TranscriptionResult`.
    loader: Callable[[ModelSpec], Any] | None = None

    @classmethod
    def of(cls, options: ModelOptions) -> ModelSpec:
        return cls(options.model, options)

    def load(self) -> Any:
        if self.loader is not None:
            return self.loader(self)
        from tensorplan.whisper.api import load

        return load((self.options or ModelOptions()).replace(model=self.name))


@dataclass(frozen=True, slots=True)
class Task:
    key: str
    path: str  # as the driver sees it
    attempt: int  # 1 for the first try in this run


@dataclass(frozen=True, slots=True)
class Done:
    key: str
    result: TranscriptionResult
    audio_seconds: float  # decoded duration
    seconds: float  # wall time in the worker, decoding included


@dataclass(frozen=True, slots=True)
class Failed:
    key: str
    error: str  # one line, naming the file
    crashed: bool = False  # the worker died: the pool replaced it


Outcome = Done | Failed


class Worker:
    """One loaded model; `run` transcribes one file and never raises for a bad file."""

    def __init__(self, spec: ModelSpec, options: TranscribeOptions) -> None:
        self.model = spec.load()
        self.options = options

    def run(self, task: Task, data: bytes | None = None, *, in_pool: bool = True) -> Outcome:
        """Transcribe `data` (the file's bytes, when the driver ships them) or task.path."""
        from tensorplan.whisper.audio.constants import SAMPLE_RATE
        from tensorplan.whisper.audio.decode import open_audio

        if in_pool and task.attempt == 1 and os.environ.get(CRASH_HOOK) == Path(task.path).name:
            os._exit(70)  # a deterministic worker crash for the tests
        start = time.perf_counter()
        try:
            samples = open_audio(data if data is not None else task.path,
                                 stream=self.options.audio_stream)  # streamed, not held
            result = self.model.transcribe(samples, self.options)
        except Exception as e:  # any failure belongs to this file: reported, then retried
            return Failed(task.key, describe(e).replace("<bytes>", task.path))
        return Done(task.key, result, len(samples) / SAMPLE_RATE, time.perf_counter() - start)


def describe(e: BaseException) -> str:
    """An exception as one line: a UserError's message, else its type and message."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    if isinstance(e, UserError):
        return text
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def blas_env(threads: int) -> dict[str, str]:
    return dict.fromkeys(BLAS_THREAD_VARS, str(threads))


def limit_blas_threads(threads: int) -> None:
    """Cap BLAS/OpenMP threads in this process: through the environment for libraries not
    loaded yet, and through threadpoolctl (when installed) for those already loaded."""
    os.environ.update(blas_env(threads))
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    threadpool_limits(threads)
